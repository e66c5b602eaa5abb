"""Collecting the evidence for a diagnosis: watch one process (and its GPU, and the service)
for a while, look for its allocation sites meanwhile, and hand the diagnosis engine what was seen.

Everything started here is stopped here (the node and serving sources, the attribution thread;
the ladder itself never leaves anything attached to the target).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from gpuscope.core import allocations
from gpuscope.core.diagnosis import Evidence
from gpuscope.core.model import Frame
from gpuscope.core.node import NodeSource
from gpuscope.core.serving import ServingSource
from gpuscope.core.serving_model import ServingSnapshot

HISTORY_MARGIN_S = 5.0


def investigate(
    pid: int,
    duration: float,
    *,
    serving: ServingSource | None = None,
    use_memray: bool = True,
    progress: Callable[[str], None] = lambda line: None,
    stop: threading.Event | None = None,
) -> Evidence:
    """Watch `pid` for `duration` seconds (1 sample/s) and look for its allocation sites."""
    stop = stop or threading.Event()
    frames: list[Frame] = []
    snapshots: list[ServingSnapshot] = []
    node = NodeSource(interval=1.0, focus_pid=pid)
    node.start(lambda f: frames.__setitem__(slice(None), [f]))
    if serving is not None:
        serving.start(snapshots.append)

    def memory(p: int) -> float | None:
        # Weight stack samples by the memory that matters: the process's GPU memory if it has any.
        rows = [r for r in (frames[-1].processes if frames else ()) if r.pid == p and r.gpu_memory_bytes is not None]
        return float(sum(r.gpu_memory_bytes for r in rows)) if rows else allocations.rss_of(p)

    attribution: list = []
    ladder = threading.Thread(
        target=lambda: attribution.append(
            allocations.attribute(pid, duration, use_memray=use_memray, memory=memory, cancelled=stop.is_set,
                                  progress=lambda rung, f: None)
        ),
        name="gpuscope-attribution",
        daemon=True,
    )
    started = time.monotonic()
    progress(f"watching process {pid} for {duration:g} s and looking for its allocation sites…")
    ladder.start()
    try:
        stop.wait(duration + 0.5)
        ladder.join(max(5.0, duration))  # memray's capture can end a moment after the window
    finally:
        stop.set()
        node.stop()
        if serving is not None:
            serving.stop()
    ok = [s for s in snapshots if s.ok]
    return replace(
        node.evidence(pid, time.monotonic() - started + HISTORY_MARGIN_S),
        serving_start=ok[0] if ok else (snapshots[0] if snapshots else None),
        serving_end=snapshots[-1] if snapshots else None,
        attribution=attribution[0] if attribution else None,
    )
