"""A diagnosis's evidence from what a source recorded: the live node's histories or a recording's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, cast

from gpuscope.core.diagnosis.attribution import Attribution

from gpuscope.core.diagnosis.steps import DeviceEvidence, Evidence, Series
from gpuscope.core.node.model import Frame, MemorySeries


class RecordingSource(Protocol):
    """A source that keeps what it sampled: the live node (`NodeSource`), or a test's own."""

    def latest_frame(self) -> tuple[Frame | None, float]: ...

    def history(self, pid: int, seconds: float, now: float | None = None) -> MemorySeries | None: ...

    def device_history(self, index: int, seconds: float, now: float | None = None) -> tuple[list[float], list[float | None]]: ...


def source_evidence(source: RecordingSource, pid: int, seconds: float) -> Evidence:
    """What the live source recorded of `pid`, its GPU and the node over the last `seconds`, for a
    diagnosis (without the service's signals or allocation sites: those come from other sources)."""
    frame, now = source.latest_frame()
    return evidence_of(pid, seconds, frame, now, source.history, source.device_history)


def evidence_of(
    pid: int,
    seconds: float,
    frame: Frame | None,
    now: float,
    history: Callable[..., MemorySeries | None],
    device_history: Callable[..., tuple[list[float], list[float | None]]],
) -> Evidence:
    """A diagnosis's evidence from a source's latest frame and its recorded series (live or replay)."""
    series = history(pid, seconds, now=now)
    times = tuple(-a for a in series.ages) if series else ()
    has_gpu = series is not None and any(v is not None for v in series.gpu_bytes)
    rows = frame.processes if frame else ()
    devices = frame.nvml.devices if frame else ()
    mine = [r for r in rows if r.pid == pid and r.gpu is not None]
    device = None
    if mine:
        index = cast(int, max(mine, key=lambda r: r.gpu_memory_bytes or 0).gpu)  # GPU rows only
        info = next((d for d in devices if d.index == index), None)
        dev_times, dev_used = device_history(index, seconds, now=now)
        device = DeviceEvidence(
            index=index,
            name=info.name if info else f"GPU {index}",
            total_bytes=info.memory_total if info else None,
            used=Series(tuple(t - now for t in dev_times), tuple(dev_used)),
        )
    focus = frame.focus if frame and frame.focus and frame.focus.pid == pid else None
    row = next((r for r in rows if r.pid == pid), None)
    torch: dict[str, Any] = {}
    if series is not None and any(v is not None for v in series.allocated_bytes):
        torch = dict(allocated=Series(times, series.allocated_bytes), reserved=Series(times, series.reserved_bytes))
    return Evidence(
        **torch,
        pid=pid,
        command=focus.command if focus else (row.command if row else ""),
        runs_in=focus.runs_in if focus else (row.runs_in if row else ""),
        duration_s=(times[-1] - times[0]) if len(times) > 1 else 0.0,
        rss=Series(times, series.rss_bytes if series else ()),
        gpu=Series(times, series.gpu_bytes) if has_gpu and series is not None else None,
        device=device,
        processes=rows,
        nvml_status=frame.nvml.status if frame else None,
        exited=bool(focus and focus.exited) or (row is None and series is not None),
        ended_at=now,
        started_at=series.started if series is not None else None,
    )


def with_attribution(evidence: Evidence, attribution: Attribution | None) -> Evidence:
    """`evidence` with the allocation sites of a search, and the window its tracker ran inside the
    process on the evidence's clock: the memory trend then leaves out what the tracker itself added,
    and the diagnosis never says both that no tracker ran and that one tracked for seconds."""
    instrumented = evidence.instrumented
    if attribution is not None and attribution.window is not None and evidence.ended_at is not None:
        start, end = attribution.window
        instrumented = ((start - evidence.ended_at, end - evidence.ended_at),)
    return replace(evidence, attribution=attribution, instrumented=instrumented)
