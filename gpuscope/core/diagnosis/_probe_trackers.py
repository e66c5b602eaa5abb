"""The memray and tracemalloc rungs through the probe inside the process: held bytes per site read
over time, stopped early once what they see is clear."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass


from gpuscope.core.target import probe_client

from gpuscope.core.target import pyspy
from gpuscope.core.diagnosis.attribution import (
    Site,
    sites_from_records,
    suspects_from_records,
)
from gpuscope.core.leak import Settled, tracking_settled
from gpuscope.core.target.stacks import Suspect
from gpuscope.core.diagnosis._shared import GROUPS, group_records


HELD_INTERVAL_S = 1.0  # how often a tracker's held bytes per site are read
# memray's memory snapshots cost it one read of the RSS: 4 a second, so that temporaries built and
# dropped about once a second are seen falling, not aliased into a slow rise (tracemalloc's
# snapshots walk every trace: once a second, and the floors of what it holds are trended instead).
MEMRAY_HELD_INTERVAL_S = 0.25
# What tracking costs the service, as benchmarks/diagnosis_cost.py and benchmarks/bare_services.py
# measured it on an allocation-heavy service (shown where the operator is asked before anything
# runs inside it). What stays after memray is mostly memray itself: its modules (rich among them)
# and native libraries, loaded once for the process's life (a later capture adds nothing).
TRACKING_COST = ("expected cost: the service runs up to ~10% slower while it is tracked (memray or "
                 "tracemalloc; stack sampling takes ~20% of a small machine's CPU instead), and keeps "
                 "~15 MB after its first memray capture (memray's code and the libraries it loads stay; "
                 "a later one adds nothing), ~7 MB after tracemalloc")


@dataclass(frozen=True, slots=True)
class Tracked:
    """What one tracking rung found: suspects, held bytes per site over time, and its cost."""

    suspects: tuple[Suspect, ...]
    times: tuple[float, ...]
    sites: tuple[Site, ...]
    cost: dict
    seen: int = 0  # allocation stacks the tracker reported (those left out of its reply included)
    heap_times: tuple[float, ...] = ()  # the allocator's bytes in use while tracking, at these times
    heap: tuple[int, ...] = ()
    heap_blocks: tuple[int, ...] = ()  # Python's small-object blocks handed out, at the same times


MAX_HEAP_POINTS = 10_000  # points of the heap series read from a reply (4 a second for 40 minutes)


def heap_series(reply: dict) -> tuple[tuple[float, ...], tuple[int, ...], tuple[int, ...]]:
    """The reply's `heap` {times, bytes, blocks} as three aligned tuples (the process's data:
    checked and bounded; points without a measure are left out; () where there is none)."""
    heap = reply.get("heap")
    if not isinstance(heap, dict):
        return (), (), ()
    times, values, blocks = heap.get("times"), heap.get("bytes"), heap.get("blocks")
    if not isinstance(times, list) or not isinstance(values, list) or len(times) != len(values):
        return (), (), ()
    if not isinstance(blocks, list) or len(blocks) != len(times):
        blocks = [0] * len(times)

    def count(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    n = MAX_HEAP_POINTS
    points = [(float(t), v, b) for t, v, b in zip(times[:n], values[:n], blocks[:n])
              if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and count(v) and count(b)]
    return tuple(p[0] for p in points), tuple(p[1] for p in points), tuple(p[2] for p in points)


PROBE_FILE = os.sep + os.path.join("gpuscope", "probe.py")


def _probes_own(group: dict) -> bool:
    """Whether a tracker's record is the probe's own work (its reply, its socket): a stack that
    passes through the probe's file, which runs no code of the service's."""
    frames = group.get("frames") or ()
    return any(isinstance(f, (list, tuple)) and len(f) == 3 and str(f[1]).endswith(PROBE_FILE) for f in frames)


def _grown(group: dict) -> dict | None:
    """`group` with its size replaced by the least it held over the last quarter of tracking above
    the most it held in the first half (None where that is not more): memory a site still adds to,
    not the working set it keeps (which comes and goes: a query's array alive during each call)."""
    held = [int(h or 0) for h in group.get("held") or () if isinstance(h, (int, float))]
    if len(held) < 4 or len(held) != len(group.get("held") or ()):
        return None
    growth = min(held[-max(2, len(held) // 4):]) - max(held[: len(held) // 2])
    return {**group, "size": growth} if growth > 0 else None


# What a tracker's reply may hold; the process sends it, so it is checked before any work on it.
MAX_TRACK_POINTS = 3600  # held-bytes readings (one a second: an hour; a diagnosis tracks for minutes)
MAX_FRAMES = 128  # frames of one allocation stack (the probe sends at most 64)


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: object) -> int:
    """A byte or allocation count from the process: a finite number, else 0."""
    number = _finite(value)
    return int(number) if number is not None and abs(number) < 2**63 else 0


def _frame(frame: object) -> list | None:
    if not isinstance(frame, (list, tuple)) or len(frame) != 3:
        return None
    function, file, line = frame
    if not isinstance(function, str) or not isinstance(file, str):
        return None
    return [function[:500], file[:4096], _count(line)]


def _record(group: object, points: int) -> dict | None:
    """One allocation stack of a tracker's reply, only with what the diagnosis reads, each value
    of the type it reads it as (None: not a record)."""
    if not isinstance(group, dict):
        return None
    frames = group.get("frames")
    checked = {"frames": [f for f in map(_frame, frames[:MAX_FRAMES]) if f is not None] if isinstance(frames, list) else [],
               "size": _count(group.get("size")), "count": _count(group.get("count"))}
    held = group.get("held")
    if isinstance(held, list) and len(held) == points:
        checked["held"] = [_count(h) for h in held]
    return checked


def _track_times(values: object, who: str) -> tuple[float, ...]:
    """The times a tracker read held bytes at; ProbeError where they are not a bounded list of
    numbers."""
    if values is None:
        return ()
    if not isinstance(values, list) or len(values) > MAX_TRACK_POINTS:
        raise probe_client.ProbeError(f"{who} sent {len(values) if isinstance(values, list) else 'no list of'} "
                                      f"reading times; gpuscope reads at most {MAX_TRACK_POINTS}")
    times = [_finite(t) for t in values]
    if any(t is None for t in times):
        raise probe_client.ProbeError(f"{who} sent a reading time that is not a number")
    return tuple(t for t in times if t is not None)


def _tracked(reply: dict, pid: int, method: str, sees: str, *, growing: bool = False,
             planned: float | None = None, early: EarlyStop | None = None) -> Tracked:
    roots = pyspy.own_roots(pid)
    times = _track_times(reply.get("times"), f"process {pid}'s probe")
    records = reply.get("records")
    records = records[:GROUPS] if isinstance(records, list) else []  # GROUPS were asked for
    groups = [g for g in (_record(r, len(times)) for r in records) if g is not None and not _probes_own(g)]
    reported = reply.get("rss")
    rss = reported if isinstance(reported, dict) else {}
    cost = {"rss_before": rss.get("before"), "rss_tracking": rss.get("tracking"), "rss_after": rss.get("after"),
            "seconds": reply.get("seconds"), "from": reply.get("from") or "the standard library", "sees": sees,
            "cut_short": bool(reply.get("cut_short")), "planned_s": planned}
    if reply.get("stopped_early") and early is not None and early.settled is not None:
        cost["stopped"] = early.settled.reason
    if growing:
        live = [g for g in map(_grown, groups) if g is not None]
    else:
        live = [g for g in groups if int(g.get("size") or 0) > 0]
    seen = len(groups) + max(0, _count(reply.get("omitted")))
    heap_times, heap, blocks = heap_series(reply)
    return Tracked(suspects_from_records(group_records(live, "size"), roots, method),
                   times, sites_from_records(groups, times, roots) if times else (), cost, seen, heap_times, heap,
                   blocks)


def own_memray_path() -> str | None:
    """The folder gpuscope's own memray is imported from (None: gpuscope has none)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("memray")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))




def _while_waiting(duration: float, cancelled: Callable[[], bool],
                   progress: Callable[[float, int | None], None],
                   early: EarlyStop | None = None) -> Callable[[], bool]:
    """`cancelled`, also reporting how much of `duration` has passed each time it is asked (a
    request to the probe asks it several times a second while it waits for the reply), and
    letting `early` look at the capture's progress."""
    started = time.monotonic()

    def asked() -> bool:
        progress(min(0.99, (time.monotonic() - started) / duration) if duration > 0 else 0.99, None)
        if early is not None:
            early.poll()
        return cancelled()

    return asked


class EarlyStop:
    """Watches a capture running in the process through a second connection to its probe, once a
    second, and asks it to stop once what it has seen is clear (`leak.tracking_settled`): the
    time saved goes to watching the process with nothing inside it. Anything unexpected ends the
    watching, never the capture (it then runs its full time)."""

    def __init__(self, client: probe_client.ProbeClient, every: float = HELD_INTERVAL_S) -> None:
        self.path, self.pid, self.every = client.path, client.pid, every
        self.side: probe_client.ProbeClient | None = None
        self.next_at = time.monotonic() + every
        self.settled: Settled | None = None
        self.done = False

    def poll(self) -> None:
        if self.done or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every
        try:
            if self.side is None:
                self.side = probe_client.ProbeClient(self.path, pid=self.pid, timeout=5.0)
            settled = settled_of(self.side.track_progress())
            if settled is not None:
                self.settled = settled
                self.side.track_stop()
                self.done = True
        except (probe_client.ProbeError, OSError):
            self.done = True

    def close(self) -> None:
        if self.side is not None:
            self.side.close()


def _numbers(values: object, n: int) -> list[float | None] | None:
    if not isinstance(values, list) or len(values) != n:
        return None
    return [_finite(v) for v in values]


MAX_PROGRESS_SITES = 10  # sites of a progress reply looked at (the probe sends its largest first)


def settled_of(progress: dict) -> Settled | None:
    """`tracking_settled` over a probe's `track_progress` reply (the process's data: checked)."""
    raw_times = progress.get("times")
    if not isinstance(raw_times, list) or len(raw_times) > MAX_TRACK_POINTS:
        return None
    times = _numbers(raw_times, len(raw_times))
    if not progress.get("tracking") or not times or any(t is None for t in times):
        return None
    n = len(times)
    sites = []
    listed = progress.get("sites")
    for site in listed[:MAX_PROGRESS_SITES] if isinstance(listed, list) else ():
        held = _numbers(site.get("held"), n) if isinstance(site, dict) else None
        if held is not None:
            sites.append(("a site's held bytes", held))
    heap, rss, blocks = (_numbers(progress.get(key), n) or [] for key in ("heap", "rss", "blocks"))
    resident = _finite(progress.get("rss_before"))
    return tracking_settled([t for t in times if t is not None], sites, heap, rss, blocks=blocks,
                            resident_before=resident)


def probe_memray_suspects(
    client: probe_client.ProbeClient, pid: int, duration: float, *, hello: dict | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float, int | None], None] = lambda fraction, sites: None,
    settle: bool = False,
) -> Tracked:
    """memray's tracker run by the probe inside the process for `duration`, held bytes read every
    second: no injection. When the service's environment has no memray and its interpreter is
    gpuscope's version, gpuscope's own memray is offered (the probe loads it only if it can).

    `progress(fraction, sites)`: the part of the window passed while memray tracks (sites None:
    the probe reads its capture when tracking ends), then (1.0, allocation sites seen) once read.
    `settle`: stop tracking as soon as its trend is clear (`EarlyStop`)."""
    path = None
    if hello is not None and not hello.get("memray"):
        ours = "%d.%d" % sys.version_info[:2]
        if str(hello.get("python") or "").startswith(ours + "."):
            path = own_memray_path()
    duration = max(0.1, duration)
    early = EarlyStop(client) if settle else None
    try:
        reply = client.memray_track(duration, limit=GROUPS, interval=MEMRAY_HELD_INTERVAL_S, memray_path=path,
                                    cancelled=_while_waiting(duration, cancelled, progress, early))
    finally:
        if early is not None:
            early.close()
    tracked = _tracked(reply, pid, "memray", "every allocation of Python and native code made through malloc",
                       planned=duration, early=early)
    progress(1.0, tracked.seen)
    return tracked


def probe_tracemalloc_suspects(
    client: probe_client.ProbeClient, pid: int, duration: float, *, cancelled: Callable[[], bool] = lambda: False,
    settle: bool = False,
) -> Tracked:
    """The standard library's tracemalloc, run by the probe for `duration`, a snapshot every second.

    Its suspects are the sites whose held memory still grew over the second half of tracking,
    ranked by that growth: tracemalloc sees only the Python domain, so where a service's memory
    grows in native code (a FAISS index) what it sees at the end is the working set of Python
    objects (the current query), which must not be named as the leak."""
    duration = max(0.1, duration)
    early = EarlyStop(client) if settle else None
    try:
        reply = client.tracemalloc_track(duration, interval=HELD_INTERVAL_S, limit=GROUPS,
                                         cancelled=_while_waiting(duration, cancelled, lambda f, n: None, early))
    finally:
        if early is not None:
            early.close()
    return _tracked(reply, pid, "tracemalloc", TRACEMALLOC_SEES, growing=True, planned=duration, early=early)


TRACEMALLOC_SEES = ("Python-domain allocations only: memory that C, C++ or Rust code allocates itself "
                    "(a FAISS index, a tokenizer's buffers) is not seen")
