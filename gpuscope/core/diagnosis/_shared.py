"""What the allocation-site rungs share: the refusal, the waits while a tracker runs, a probe's
stack groups as records."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gpuscope.errors import GpuscopeError


class AttachRefused(GpuscopeError):
    """memray will not be attached; the message says why and what to do instead."""


GROUPS = 200  # stacks asked of the probe (largest first)


def _wait(duration: float, cancelled: Callable[[], bool], progress: Callable[[float], None]) -> bool:
    """Wait `duration` seconds unless cancelled (False then), reporting progress."""
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        if cancelled():
            return False
        if elapsed >= duration:
            progress(1.0)
            return True
        progress(elapsed / duration if duration else 1.0)
        time.sleep(min(0.1, duration - elapsed))


def group_records(groups: Sequence[dict], size_key: str) -> list[tuple[tuple, int, int]]:
    out = []
    for g in groups:
        frames = tuple(tuple(f) for f in g.get("frames") or () if isinstance(f, (list, tuple)) and len(f) == 3)
        out.append((frames, int(g.get(size_key) or 0), int(g.get("count") or 0)))
    return out
