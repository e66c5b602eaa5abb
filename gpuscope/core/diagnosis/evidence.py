"""What a diagnosis rests on, measured once when it is made, and the readable lines that say it.

`VerdictEvidence` holds the numbers behind the verdict and the steps: each memory series' floor
trend, the service's latencies and throughput at the start and the end of the window (steps 3
and 5), which process grew fastest (step 4), the held bytes of each tracked allocation site, which
samples the memory trend was judged on, how the allocation-site search went, and what the
tracker inside the process cost (`InstrumentCost`). It travels inside the `Diagnosis` (and so in
recordings); `evidence_lines` turns it into the short lines the report and the console both show:
sizes and rates with units, at most three significant digits, moments as clock times with their
age.

Times are kept as seconds before the end of the watched window (never below 0) plus the wall
clock of that end, so a recording's reader sees the same moments the live console did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuscope.core.diagnosis.attribution import Rung
from gpuscope.core.leak import LeakAssessment
from gpuscope.core.common.printable import printable_line
from gpuscope.core.serving.model import Signals
from gpuscope.core.target.stacks import Suspect
from gpuscope.core.common.units import (
    format_ago,
    format_clock,
    format_duration,
    format_latency,
    format_size,
    format_speed,
)

VERDICT = 0  # the key of the verdict's own lines in `evidence_lines`; the steps are 1 to 7


@dataclass(frozen=True, slots=True)
class MemoryTrend:
    """One memory series as the leak detector judged it (its floor, not its raw samples)."""

    what: str  # "GPU0 (NVIDIA H200)", "RSS"
    pattern: str
    start_bytes: float | None = None
    end_bytes: float | None = None
    total_bytes: float | None = None
    growth_bytes_per_s: float | None = None
    began_s_before_end: float | None = None  # when the growth (or the step) began
    time_to_full_s: float | None = None
    samples: int = 0
    span_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SiteTrend:
    """What one allocation site held over the tracking, and the trend of it."""

    function: str
    file: str
    line: int
    trend: str  # "rising" | "levelled" | "balanced" | ...
    growth_bytes_per_s: float
    held_bytes: int

    def to_json(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line, "trend": self.trend,
                "growth_bytes_per_s": round(self.growth_bytes_per_s, 1), "held_bytes": self.held_bytes}


@dataclass(frozen=True, slots=True)
class StageChange:
    name: str
    p95_start_s: float | None = None
    p95_end_s: float | None = None
    share: float | None = None


@dataclass(frozen=True, slots=True)
class ServiceNumbers:
    """The service's signals at the start and the end of the window (steps 3 and 5): `end` the
    latest snapshot's, `start` each signal's earliest point in the window's history (or the first
    snapshot's); each stage's P95 at both ends."""

    profile: str | None = None
    start: Signals = Signals()
    end: Signals = Signals()
    stages: tuple[StageChange, ...] = ()

    @property
    def tokens_per_request(self) -> float | None:
        """Tokens per request at the end of the window (None where either rate is unknown or 0)."""
        end = self.end
        return end.tokens_per_s / end.requests_per_s if end.tokens_per_s and end.requests_per_s else None


@dataclass(frozen=True, slots=True)
class ProcessGrowth:
    pid: int
    growth_bytes_per_s: float


@dataclass(frozen=True, slots=True)
class InstrumentCost:
    """What an allocation tracker inside the process cost it, and what it could not keep."""

    method: str | None = None
    seconds: float | None = None  # how long it tracked
    loaded_from: str | None = None  # where its module came from, when not the service's environment
    sees: str | None = None
    cut_short: bool = False  # its capture reached its size cap: tracking stopped early
    rss_before: int | None = None
    rss_tracking: int | None = None
    rss_after: int | None = None
    added_bytes: int | None = None
    left_bytes: int | None = None
    planned_seconds: float | None = None  # the longest it could have tracked
    stopped_because: str | None = None  # why it stopped before that: what it saw was clear

    def to_json(self) -> dict:
        """The diagnosis JSON's "instrument" object ({} where no tracker ran)."""
        if self.method is None and self.seconds is None:
            return {}
        out: dict = {"method": self.method, "seconds": self.seconds}
        if self.loaded_from is not None:
            out["from"] = self.loaded_from
        if self.sees is not None:
            out["sees"] = self.sees
        out["cut_short"] = self.cut_short
        out.update(rss_before=self.rss_before, rss_tracking=self.rss_tracking, rss_after=self.rss_after,
                   added_bytes=self.added_bytes, left_bytes=self.left_bytes,
                   planned_seconds=self.planned_seconds, stopped_early=self.stopped_because is not None,
                   stopped_because=self.stopped_because)
        return out


@dataclass(frozen=True, slots=True)
class VerdictEvidence:
    """Which evidence decided the verdict, on which samples, and the numbers behind each step."""

    decided_by: str = "memory trend"  # "memory trend" | "allocation sites" | "both"
    confidence: float = 0.0
    memory_samples: str = "all samples"
    excluded_s_before_end: tuple[float, float] | None = None  # the samples a tracker distorted
    tracker_left_bytes: int | None = None
    samples_after_tracker: int | None = None  # memory samples taken after the tracker stopped
    sites: tuple[SiteTrend, ...] = ()
    ended_at: float | None = None  # wall clock of the window's end
    memory_source: str = "rss"
    device: MemoryTrend | None = None
    host: MemoryTrend | None = None
    service: ServiceNumbers | None = None
    ranking: tuple[ProcessGrowth, ...] = ()
    rungs: tuple[Rung, ...] = ()
    prometheus_node: str | None = None  # read from Prometheus history of this node, not from the process
    unseen_growth: dict | None = None  # the memory grew where the tracker did not see (diagnosis.UnseenGrowth)
    # Whether the first rising site's rise counted as leak evidence, by which rule and why
    # ({counts, rule, reason, site}; a tracker without held bytes over time: {counts, rule, reason}).
    site_rule: dict | None = None
    settle_s: float | None = None  # an inconclusive verdict: the --duration that would settle it

    def to_json(self) -> dict:
        """The diagnosis JSON's "evidence" object."""
        out: dict = {"decided_by": self.decided_by, "confidence": self.confidence,
                     "memory_samples": self.memory_samples}
        if self.excluded_s_before_end is not None:
            out["excluded_s"] = [round(-self.excluded_s_before_end[0], 1), round(-self.excluded_s_before_end[1], 1)]
        if self.tracker_left_bytes is not None:
            out["tracker_left_bytes"] = self.tracker_left_bytes
        if self.sites:
            out["sites"] = [s.to_json() for s in self.sites]
        if self.prometheus_node is not None:
            out["from"], out["node"] = "prometheus", self.prometheus_node
        if self.unseen_growth is not None:
            out["unseen_growth"] = self.unseen_growth
        if self.site_rule is not None:
            out["site_rule"] = self.site_rule
        if self.settle_s is not None:
            out["settle_s"] = self.settle_s
        return out


# -- the readable lines ---------------------------------------------------------------------------


class Diagnosed(Protocol):
    """What the lines read of a diagnosis (gpuscope.core.diagnosis.steps.Diagnosis, which imports this module)."""

    @property
    def duration_s(self) -> float: ...
    @property
    def pattern(self) -> str: ...
    @property
    def memory(self) -> LeakAssessment: ...
    @property
    def suspects(self) -> Sequence[Suspect]: ...
    @property
    def evidence(self) -> VerdictEvidence: ...
    @property
    def instrument(self) -> InstrumentCost | None: ...


def evidence_lines(diagnosis: Diagnosed, now: float | None = None) -> dict[int, tuple[str, ...]]:
    """The evidence as short lines: `VERDICT` (0) for the verdict's, 1 to 7 for each step's.

    `now` (wall clock) gives moments their age ("18 s ago"); without it they are clock times only."""
    ev = diagnosis.evidence
    moment = _Moments(ev.ended_at, now)
    verdict = [f"decided by {ev.decided_by}, confidence {ev.confidence:.0%}",
               f"memory judged on {ev.memory_samples}"]
    if ev.excluded_s_before_end is not None:
        first, last = ev.excluded_s_before_end
        verdict.append(f"left out while the tracker ran: {moment.span(first, last)}")
        if ev.samples_after_tracker is not None and ev.samples_after_tracker < 2:
            verdict.append("nothing was watched after the tracker stopped (it and the reading of its capture took the "
                           "rest of the time): the memory trend rests on the samples before it")
    if ev.settle_s is not None:
        verdict.append(f"not settled: --duration {ev.settle_s:g} would settle it")
    if ev.site_rule is not None:
        counted = "counts" if ev.site_rule.get("counts") else "does not count"
        whose = f"{ev.site_rule['site']}'s rise {counted}" if ev.site_rule.get("site") else f"sites: {counted}"
        verdict.append(printable_line(f"allocation sites: {whose} ({ev.site_rule.get('rule')}): "
                                      f"{ev.site_rule.get('reason')}", 400))
    if diagnosis.instrument is not None and diagnosis.instrument.method is not None:
        verdict += instrument_lines(diagnosis.instrument)
    if ev.ended_at is not None:
        verdict.append(f"window: {format_duration(diagnosis.duration_s)} ending {moment.at(0.0)}")
    lines: dict[int, list[str]] = {VERDICT: verdict, **{n: [] for n in range(1, 8)}}
    if ev.device is not None:
        lines[1] += _trend_lines(ev.device, moment)
    if ev.host is not None:
        lines[2] += _trend_lines(ev.host, moment)
    service = ev.service
    if service is not None:
        lines[3] += _service_lines(service)
        lines[5] += [_stage_line(st) for st in service.stages]
    if ev.ranking:
        lines[4].append("fastest growing: " + ", ".join(
            f"PID {g.pid} {format_speed(g.growth_bytes_per_s)}" for g in ev.ranking))
    lines[6].append(f"judged on {'GPU' if ev.memory_source == 'gpu' else 'RSS'} memory: {diagnosis.pattern}, "
                    f"confidence {diagnosis.memory.confidence:.0%}")
    if service is not None and service.end.kv_cache_usage is not None:
        lines[6].append(f"KV cache {service.end.kv_cache_usage:.0%} full")
    lines[6] += [_site_line(s) for s in ev.sites]
    lines[7] += [f"{r.method}: {r.status} — {printable_line(r.detail, 400)}" for r in ev.rungs]
    for i, s in enumerate(diagnosis.suspects[:5], start=1):
        held = format_size(s.bytes) if s.bytes is not None else "bytes unknown"
        lines[7].append(f"suspect {i}: {_where(s.function, s.file, s.line)} {s.share:.0%}, {held} [{s.method}]")
    return {n: tuple(v) for n, v in lines.items()}


def instrument_lines(cost: InstrumentCost) -> list[str]:
    """What the tracker inside the process was, what it cost, and what it could not keep."""
    what = f"instrument: {cost.method} tracked for {format_duration(cost.seconds or 0.0)}"
    if cost.planned_seconds is not None:
        planned = format_duration(cost.planned_seconds)
        what += (f" ({planned} planned; stopped early: {cost.stopped_because})" if cost.stopped_because
                 else f" ({planned} planned)" if cost.cut_short
                 else f" (all of the {planned} planned: the held bytes' trend was not clear sooner)")
    if cost.loaded_from and cost.loaded_from != "the service's environment":
        what += f", loaded from {cost.loaded_from}"
    if cost.sees:
        what += f"; sees {cost.sees}"
    out = [what]
    spent = []
    if cost.added_bytes is not None:
        spent.append(f"added {format_size(cost.added_bytes)} to the RSS while tracking")
    if cost.left_bytes is not None:
        spent.append(f"{format_size(cost.left_bytes)} still there after")
    if spent:
        out.append("instrument cost: " + ", ".join(spent))
    if cost.cut_short:
        out.append("instrument cut short: its capture reached its size cap, so tracking stopped early "
                   "(allocations after that were not kept)")
    return out


class _Moments:
    """Seconds before the window's end as clock times with their age."""

    def __init__(self, ended_at: float | None, now: float | None) -> None:
        self.ended_at = ended_at
        self.now = now

    def at(self, before_end: float) -> str:
        if self.ended_at is None:
            return f"{format_duration(max(0.0, before_end))} before the end"
        t = self.ended_at - max(0.0, before_end)
        if self.now is None:
            return format_clock(t)
        return f"{format_clock(t, self.now)} ({format_ago(self.now - t)})"

    def span(self, first: float, last: float) -> str:
        length = format_duration(max(0.0, first - last))
        if self.ended_at is None:
            return f"{length}, ending {format_duration(max(0.0, last))} before the end"
        return f"{length} from {format_clock(self.ended_at - first, self.now)}"


def _trend_lines(trend: MemoryTrend, moment: _Moments) -> list[str]:
    size = f"{format_size(trend.start_bytes)} → {format_size(trend.end_bytes)}"
    if trend.total_bytes:
        size += f" of {format_size(trend.total_bytes)}"
    out = [f"{trend.what}: {size} over {format_duration(trend.span_s)} ({trend.samples} samples)"]
    floor = f"floor {trend.pattern}, {format_speed(trend.growth_bytes_per_s, na='rate unknown')}"
    if trend.began_s_before_end is not None and trend.pattern not in ("flat", "sawtooth", "insufficient-data"):
        floor += f" since {moment.at(trend.began_s_before_end)}"
    if trend.time_to_full_s is not None:
        floor += f", full in {format_duration(trend.time_to_full_s, na='never at this rate')}"
    return [*out, floor]


def _change(name: str, start: float | None, end: float | None, fmt) -> str | None:
    if start is None and end is None:
        return None
    if start is None or start == end:
        return f"{name} {fmt(end)}"
    return f"{name} {fmt(start)} → {fmt(end)}"


def _service_lines(s: ServiceNumbers) -> list[str]:
    def per_s(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"

    parts = [_change("P95", s.start.e2e_latency_p95_s, s.end.e2e_latency_p95_s, format_latency),
             _change("TTFT P95", s.start.ttft_p95_s, s.end.ttft_p95_s, format_latency),
             _change("tokens/s", s.start.tokens_per_s, s.end.tokens_per_s, per_s)]
    line = ", ".join(p for p in parts if p)
    if s.tokens_per_request is not None:
        line += f"{', ' if line else ''}{per_s(s.tokens_per_request)} tokens per request"
    return [f"{s.profile or 'service'}: {line or 'no latencies measured'}"]


def _stage_line(st: StageChange) -> str:
    share = f", {st.share:.0%} of request time" if st.share is not None else ""
    return f"{_change(st.name + ' P95', st.p95_start_s, st.p95_end_s, format_latency) or st.name + ' P95 -'}{share}"


def _site_line(s: SiteTrend) -> str:
    return (f"site {_where(s.function, s.file, s.line)}: {s.trend}, {format_speed(s.growth_bytes_per_s)}, "
            f"{format_size(s.held_bytes)} held at the end")


def _where(function: str, file: str, line: int) -> str:
    """A code location from the process (its text is the process's): printable, bounded."""
    return f"{printable_line(function, 80)} ({printable_line(file, 120)}:{line})"
