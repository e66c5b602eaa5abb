"""Collecting the evidence for a diagnosis: watch one process (and its GPU, and the service)
for a while, look for its allocation sites meanwhile, and hand the diagnosis engine what was seen.

`duration` is the whole budget: the first 30 % is watched with nothing inside the process
(samples the memory trend can be judged on), allocation trackers then run for at most 40 % of
it (`TRACK_FRACTION`, at most `TRACK_MAX_S`; sooner where what they see is clear: a site's held
bytes rising steadily, or the memory in use flat or levelled off), and the rest is watched again
after the tracker has stopped and given its memory back. A rung that fails hands what is left of
the budget to the next. A tracker that ends late is still followed by `AFTER_MIN_S` of watching,
up to `STOP_GRACE_S` past the budget.
The watch ends early when the process exits; what was gathered until then is diagnosed.

Everything started here is stopped here (the node and serving sources, the attribution thread;
the ladder itself never leaves anything attached to the target).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

import psutil

from gpuscope.core.diagnosis import ladder as allocations
from gpuscope.core.diagnosis.endpoint import serves_endpoint
from gpuscope.core.diagnosis.recorded import source_evidence
from gpuscope.core.diagnosis.steps import Evidence
from gpuscope.core.node.model import Frame
from gpuscope.core.node.live import NodeSource
from gpuscope.core.serving.source import ServingSource
from gpuscope.core.serving.model import ServingSnapshot


HISTORY_MARGIN_S = 5.0
SAMPLE_INTERVAL_S = 0.5  # the trend is judged on half the window: twice a second keeps samples enough
BEFORE_FRACTION = 0.3  # of the duration, watched before any tracker runs
TRACK_FRACTION = 0.4  # of the duration, the longest the trackers run
TRACK_MAX_S = 30.0
STOP_GRACE_S = 4.0  # a tracker's reply (its capture read, its memory given back) may end this late
# The memory trend is judged on the samples before a tracker and after it: one that ended late (a
# loaded machine, a slow reply) is still watched this long after, within STOP_GRACE_S.
AFTER_MIN_S = 4.0


def schedule(duration: float) -> tuple[float, float]:
    """(seconds before tracking, seconds of tracking) for a diagnosis of `duration` seconds."""
    return BEFORE_FRACTION * duration, min(TRACK_MAX_S, TRACK_FRACTION * duration)


def investigate(
    pid: int,
    duration: float,
    *,
    serving: ServingSource | None = None,
    use_memray: bool = True,
    progress: Callable[[str], None] = lambda line: None,
    stop: threading.Event | None = None,
    settle: bool = True,
) -> Evidence:
    """Watch `pid` for `duration` seconds (2 samples/s) and look for its allocation sites.

    `settle`: a tracker stops as soon as the held bytes' trend is clear (rising, levelled off or
    flat), and the watch after it gets the time saved; without it, trackers run their full time."""
    stop = stop or threading.Event()
    frames: list[Frame] = []
    snapshots: list[ServingSnapshot] = []
    node = NodeSource(interval=SAMPLE_INTERVAL_S, focus_pid=pid)
    node.start(lambda f: frames.__setitem__(slice(None), [f]))
    if serving is not None:
        serving.start(snapshots.append)

    def memory(p: int) -> float | None:
        # Weight stack samples by the memory that matters: the process's GPU memory if it has any.
        rows = [r for r in (frames[-1].processes if frames else ()) if r.pid == p and r.gpu_memory_bytes is not None]
        return float(sum(r.gpu_memory_bytes or 0 for r in rows)) if rows else allocations.rss_of(p)

    before, track = schedule(duration) if use_memray else (0.0, duration)
    attribution: list = []

    def climb() -> None:
        if stop.wait(before):
            return
        attribution.append(allocations.attribute(
            pid, track, use_memray=use_memray, memory=memory, cancelled=stop.is_set,
            budget=duration - before, progress=lambda rung, f: None, said=lambda line: progress(line),
            settle=settle))

    ladder = threading.Thread(target=climb, name="gpuscope-attribution", daemon=True)
    started = time.monotonic()
    progress(f"watching process {pid} for {duration:g} s and looking for its allocation sites…")
    ladder.start()
    exited_after = None
    climbed_at = None  # when the ladder ended (its tracker stopped and gave its memory back)
    try:
        while not stop.wait(0.5):
            elapsed = time.monotonic() - started
            if climbed_at is None and not ladder.is_alive():
                climbed_at = elapsed
            if elapsed >= _watch_end(duration, climbed_at, attribution):
                break
            if not _alive(pid):
                exited_after = elapsed
                progress(f"process {pid} exited after {elapsed:.0f} s: diagnosing what was gathered until then")
                break
        elapsed = time.monotonic() - started
        ladder.join(max(0.0, duration + STOP_GRACE_S - elapsed) if exited_after is None else 1.0)
    finally:
        stop.set()
        ladder.join(STOP_GRACE_S)
        node.stop()
        if serving is not None:
            serving.stop()
    ok = [s for s in snapshots if s.ok]
    evidence = source_evidence(node, pid, time.monotonic() - started + HISTORY_MARGIN_S)
    att = attribution[0] if attribution else None
    instrumented: tuple[tuple[float, float], ...] = ()
    if att is not None and att.window is not None and frames:
        now = frames[-1].time
        instrumented = ((att.window[0] - now, att.window[1] - now),)
    return replace(
        evidence,
        serves=serves_endpoint(pid, snapshots[-1].target) if snapshots else None,
        serving_start=first_measured(ok) if ok else (snapshots[0] if snapshots else None),
        serving_end=snapshots[-1] if snapshots else None,
        attribution=att,
        instrumented=instrumented,
        exited=evidence.exited or exited_after is not None,
        asked_s=duration,
    )


def _watch_end(duration: float, climbed_at: float | None, attribution: list) -> float:
    """When the watch ends, in seconds since it began: at `duration`, later only while the ladder's
    reply is awaited (it ends within its budget), and to watch `AFTER_MIN_S` after a tracker that
    ended late."""
    if climbed_at is None:
        return duration + STOP_GRACE_S
    tracked = bool(attribution) and attribution[0].window is not None
    late = climbed_at + AFTER_MIN_S if tracked else 0.0
    return min(duration + STOP_GRACE_S, max(duration, late))


def first_measured(snapshots: list[ServingSnapshot]) -> ServingSnapshot:
    """The earliest snapshot with latencies measured (a source's first read has no rates yet)."""
    return next((s for s in snapshots if s.signals.e2e_latency_p95_s is not None
                 or any(st.p95_s is not None for st in s.stages)), snapshots[0])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
