"""The torch-history rung: the allocator's stacks of CUDA blocks allocated while recording and still
alive, through the probe."""

from __future__ import annotations

from collections.abc import Callable


from gpuscope.core.target import probe_client

from gpuscope.core.target import pyspy
from gpuscope.core.diagnosis.attribution import (
    suspects_from_records,
)
from gpuscope.core.target.stacks import Suspect
from gpuscope.core.diagnosis._shared import GROUPS, AttachRefused, group_records, _wait


# -- through the probe inside the process ----------------------------------------------------------

HISTORY_MAX_ENTRIES = 100_000  # bounded: with enabled="state" torch keeps stacks of live blocks only


def torch_unavailable(hello: dict) -> str | None:
    """Why the torch-history rung cannot run in the process that said `hello` (None: it can)."""
    if not hello.get("torch"):
        return "torch is not imported in the process"
    if not (hello.get("cuda") or {}).get("initialized"):
        return "CUDA not available in the process (torch has not initialised CUDA)"
    return None


def torch_history_suspects(
    client: probe_client.ProbeClient,
    pid: int,
    duration: float,
    *,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float], None] = lambda fraction: None,
) -> tuple[Suspect, ...]:
    """CUDA blocks allocated during `duration` and still alive at the end, by owning frame.

    Recording is started (live blocks' Python stacks only, bounded) and always stopped again; the
    first snapshot is taken once recording is on, so blocks alive before are in both and drop out
    of the diff."""
    client.history_start(max_entries=HISTORY_MAX_ENTRIES)
    try:
        first = client.snapshot(limit=0)
        if not _wait(duration, cancelled, progress):
            raise AttachRefused("cancelled")
        last = client.snapshot(limit=0)
        diff = client.diff(before=first["id"], after=last["id"], limit=GROUPS)
    finally:
        try:
            client.history_stop()
        except probe_client.ProbeError:
            pass
    return suspects_from_records(group_records(diff.get("groups") or (), "bytes"), pyspy.own_roots(pid), "torch-history")
