"""The seven-step diagnosis: from a memory-growth alert to the process and the code path.

Each step is a plain function over immutable `Evidence` (what was observed of one process, its
GPU, the service and the allocation sites) and returns a `Step`: a status (ok / warn / alert /
skipped), one sentence of finding, what to do next, and the evidence behind it. `diagnose()` runs
the seven and names the verdict. Where a source is missing, the step says so ("skipped: no metrics
source") rather than guessing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gpuscope.core.diagnosis.attribution import Attribution, Site
from gpuscope.core.diagnosis.evidence import (
    InstrumentCost,
    MemoryTrend,
    ProcessGrowth,
    ServiceNumbers,
    SiteTrend,
    StageChange,
    VerdictEvidence,
    evidence_lines,
)
from gpuscope.core.leak.growth import theil_sen
from gpuscope.core.leak import (WARMUP_S, FloorSketch, HeldTrend, LeakAssessment, LeakThresholds, as_ended_run, assess,
                                 ended_run, floor_growth, held_trend, kendall_tau, rising_evidence, warming_up)
from gpuscope.core.common.markdown import md_code as _md_code, md_text as _md_text
from gpuscope.core.common.printable import printable
from gpuscope.core.node.command_display import short_command
from gpuscope.core.node.model import ProcessRow
from gpuscope.core.serving.profiles import is_model_stage, model_stages
from gpuscope.core.serving.model import SIGNAL_NAMES, FleetRow, ServingSnapshot, Signals
from gpuscope.core.target.stacks import Suspect, stack_json
from gpuscope.core.common.units import format_bytes, format_duration, format_rate, format_size, format_speed

SCHEMA = "gpuscope.diagnosis/1"
OK, WARN, ALERT, SKIPPED = "ok", "warn", "alert", "skipped"
TITLES = (
    "Device memory trend",
    "Host memory overlay",
    "Throughput per request",
    "Locate the process",
    "Backpressure check",
    "Classify",
    "Code path",
)
DEGRADED = 1.25  # a latency this much above its level at the start of the window is degrading
STAGE_DOMINATES = 0.5  # a stage other than the model's taking this share of the request time is a bottleneck
INSTRUMENT_MARGIN_S = 0.5  # samples this close after a tracker stopped may still carry its memory
# Memory that rises after a tracker at this share of its rate before it or more kept growing
# through the tracker's window (a filled cache's stretch after it is flat).
GROWTH_WENT_ON = 0.25
GROWTH_STEADY_TAU = 0.6  # ... and whose samples, in each stretch, rise this steadily (Kendall's tau)


@dataclass(frozen=True, slots=True)
class Series:
    times: tuple[float, ...]
    values: tuple[float | None, ...]

    def known(self) -> list[float]:
        return [v for v in self.values if v is not None and not math.isnan(v)]


@dataclass(frozen=True, slots=True)
class DeviceEvidence:
    index: int
    name: str
    total_bytes: int | None
    used: Series


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the steps read. Collected live (gpuscope.core.diagnosis.investigation) or from a recording."""

    pid: int
    command: str
    duration_s: float
    rss: Series
    gpu: Series | None = None  # the process's GPU memory (all devices), None without NVML data
    device: DeviceEvidence | None = None  # the GPU the process uses most
    processes: tuple[ProcessRow, ...] = ()  # the node's process table at the end
    serving_start: ServingSnapshot | None = None
    serving_end: ServingSnapshot | None = None
    attribution: Attribution | None = None
    allocated: Series | None = None  # torch allocated / reserved at the same times as `gpu`
    reserved: Series | None = None
    nvml_status: str | None = None
    exited: bool = False
    # When an allocation tracker ran inside the process, on the clock of `rss.times`: its own
    # memory is in the RSS samples taken meanwhile, which the memory trend leaves out.
    instrumented: tuple[tuple[float, float], ...] = ()
    ended_at: float | None = None  # wall clock of time 0 on the clock of the series (the window's end)
    started_at: float | None = None  # wall clock of the process's start, where known
    # Whether the process serves the service's signals (it or its tree listens on the metrics
    # endpoint): False skips steps 3 and 5; None (not known) has them say what they judge.
    serves: bool | None = None
    runs_in: str = ""  # the process's systemd unit or container, short ("vllm.service")
    # The --duration asked for, where the evidence was collected for it: what a short window asks
    # of its untouched samples scales with it, not with a window that a late tracker lengthened.
    asked_s: float | None = None


@dataclass(frozen=True, slots=True)
class Step:
    number: int
    title: str
    status: str
    finding: str
    next: str = ""
    evidence: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        evidence = dict(self.evidence)
        if self.next:
            evidence["next"] = self.next
        return {"number": self.number, "title": self.title, "status": self.status, "finding": self.finding, "evidence": evidence}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    pid: int
    command: str
    duration_s: float
    verdict: str
    pattern: str
    memory_source: str  # "gpu" | "rss"
    memory: LeakAssessment
    steps: tuple[Step, ...]
    suspects: tuple[Suspect, ...]
    evidence: VerdictEvidence = VerdictEvidence()  # which evidence decided, on which samples, the numbers
    instrument: InstrumentCost | None = None  # what the tracker inside the process cost
    runs_in: str = ""  # the process's systemd unit or container, short ("vllm.service")

    def to_json(self) -> dict:
        """The gpuscope.diagnosis/1 JSON object (with "evidence" and "instrument" added)."""
        return {
            "schema": SCHEMA,
            "pid": self.pid,
            "command": self.command,
            "runs_in": self.runs_in,
            "duration_s": round(self.duration_s, 1),
            "verdict": self.verdict,
            "pattern": self.pattern,
            "memory": {
                "source": self.memory_source,
                "start_bytes": _int(self.memory.start_bytes),
                "end_bytes": _int(self.memory.end_bytes),
                "growth_bytes_per_s": _round(self.memory.growth_bytes_per_s),
                "samples": self.memory.samples,
            },
            "steps": [s.to_json() for s in self.steps],
            "suspects": [s.to_json() for s in self.suspects],
            "evidence": self.evidence.to_json(),
            "instrument": self.instrument.to_json() if self.instrument is not None else {},
        }

    def to_text(self, now: float | None = None, *, markdown: bool = True) -> str:
        """The report as Markdown; every text from the process or a recording escaped. `now`
        (wall clock) dates the evidence's moments ("18 s ago"). Without `markdown` (for a
        terminal), the same lines with nothing escaped: only made printable."""
        md_text, md_code = (_md_text, _md_code) if markdown else (_plain_text, _plain_code)
        mark = {OK: "ok", WARN: "warn", ALERT: "ALERT", SKIPPED: "skipped"}
        evidence = evidence_lines(self, now)
        lines = [
            f"# gpuscope diagnosis of PID {self.pid}",
            "",
            f"command: {md_code(self.command, empty='not known')}",
            *([f"runs in: {md_code(self.runs_in)}"] if self.runs_in else []),
            f"verdict: **{md_text(self.verdict)}** ({md_text(self.pattern)}), {md_text(self.memory_source)} memory "
            f"{format_bytes(self.memory.start_bytes)} -> {format_bytes(self.memory.end_bytes)} over {self.duration_s:.0f} s, "
            f"{format_rate(self.memory.growth_bytes_per_s, na='-')} MB/s",
            "",
            *(f"- {md_text(line)}" for line in evidence[0]),
            "",
        ]
        for step in self.steps:
            lines.append(f"## {step.number}. {md_text(step.title)} [{mark.get(step.status, '?')}]")
            lines.append(md_text(step.finding, line_start=True))
            if step.next:
                lines.append(f"next: {md_text(step.next)}")
            lines += [f"- {md_text(line)}" for line in evidence.get(step.number, ())]
            lines.append("")
        if self.suspects:
            lines.append("## Suspects")
            for i, s in enumerate(self.suspects, start=1):
                size = format_bytes(s.bytes) if s.bytes is not None else "bytes unknown"
                lines.append(f"{i}. {md_code(s.function)} ({md_code(f'{s.file}:{s.line}')}) {s.share * 100:.0f}% {size} "
                             f"[{md_text(s.method)}]")
        return "\n".join(lines).rstrip() + "\n"


def _plain_text(text: object, *, line_start: bool = False) -> str:
    return printable(str(text))


def _plain_code(text: str, *, empty: str = "(none)") -> str:
    return printable(text) or empty


def _int(v: float | None) -> int | None:
    return None if v is None or math.isnan(v) else int(v)


def _round(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else round(v, 1)


def _assess(series: Series | None, thresholds: LeakThresholds, total: float | None = None, *,
            allocated: Series | None = None, reserved: Series | None = None) -> LeakAssessment | None:
    if series is None or len(series.known()) < 2:
        return None
    torch = ({"allocated": allocated.values, "reserved": reserved.values}
             if allocated is not None and reserved is not None else {})
    return assess(series.times, series.values, thresholds=thresholds, total_bytes=total, **torch)


def _rate(a: LeakAssessment | None) -> str:
    return f"{format_rate(a.growth_bytes_per_s if a else None, na='?')} MB/s"


# -- what the instruments added ------------------------------------------------------------------


def uninstrumented(series: Series, windows: Sequence[tuple[float, float]]) -> tuple[Series, dict]:
    """The samples of `series` taken while no tracker ran in the process, and what was done.

    Samples inside a tracker's window (and `INSTRUMENT_MARGIN_S` after it) are left out and the
    two stretches joined end to end (the detector's floors need a series without a hole): the
    later stretch moves back in time by the length of the hole, and down by what its start stands
    above the earlier stretch's end carried on across the hole — the growth during the hole,
    which no uninstrumented sample saw, and what the tracker left behind (its module, heap the
    allocator keeps). The latter is reported. Each stretch's level at its edge is read from its
    floors (Theil-Sen over pairs of samples within one stretch)."""
    if not windows:
        return series, {"memory_samples": "all samples (no tracker ran inside the process)"}
    start = min(w[0] for w in windows)
    end = max(w[1] for w in windows) + INSTRUMENT_MARGIN_S
    pre = [(t, v) for t, v in zip(series.times, series.values) if v is not None and not math.isnan(v) and t < start]
    post = [(t, v) for t, v in zip(series.times, series.values) if v is not None and not math.isnan(v) and t > end]
    note: dict = {"memory_samples": f"{len(pre)} samples before the tracker ran and {len(post)} after it stopped",
                  "excluded_s": [round(start, 1), round(end, 1)], "samples_after": len(post)}
    if len(pre) < 2 or len(post) < 2:
        kept = pre + post
        return Series(tuple(t for t, _ in kept), tuple(v for _, v in kept)), note
    floors = [_floors_of(seg, min(4.0, (seg[-1][0] - seg[0][0]) / 3) or 1.0) for seg in (pre, post)]
    each = [theil_sen(seg) or 0.0 if len(seg) >= 2 else None for seg in floors]
    step = statistics.median(b[0] - a[0] for seg in (pre, post) for a, b in zip(seg, seg[1:]))
    hole = post[0][0] - pre[-1][0] - step
    before, after = each
    if before is not None and after is not None and before * after > 0 \
            and abs(after) >= GROWTH_WENT_ON * abs(before) \
            and min(abs(kendall_tau(pre)), abs(kendall_tau(post))) >= GROWTH_STEADY_TAU:
        # The memory kept changing steadily after the tracker as before it (if slower: a leak whose
        # work slows as what it keeps grows): each stretch's own trend read at its edge, the
        # hole's at the mean of the two.
        own, slope = [before, after], (before + after) / 2
    else:
        # One stretch flat or swinging, or they disagree: a cache that filled, batches filled and
        # freed, a tracker's heap settling. The gentler slope through both (none where they
        # disagree in sign) carries over the hole, so a cache that filled is never carried on as
        # growth, and the stretches' levels are their medians, which swings do not move.
        known = [b for b in each if b is not None]
        slope = 0.0 if not known or (len(known) == 2 and known[0] * known[1] <= 0) else min(known, key=abs)
        # Where both stretches rise steadily under their spikes, each is read at its edge on its own
        # trend: read on the gentler slope, a steeper stretch's median would stand for its middle,
        # and the later stretch would be joined below where the earlier one ended (a fall that never
        # happened, read as a sawtooth). Steadiness is judged on every sample, short spikes taken
        # out, not on a stretch's two or three floors, which a sawtooth raises by chance.
        own = [slope, slope]
        if before is not None and after is not None and slope > 0 \
                and min(kendall_tau(_under_spikes(seg)) for seg in (pre, post)) >= GROWTH_STEADY_TAU:
            own = [before, after]
    edge = [statistics.median(v - own[i] * t for t, v in floors[i]) + own[i] * at
            for i, at in ((0, pre[-1][0]), (1, post[0][0]))]
    left = max(0.0, edge[1] - edge[0] - slope * (hole + step))  # above the trend on the real clock: the tracker's
    joined = max(0.0, edge[1] - edge[0] - slope * step)  # above it once joined: the hole's growth too
    note["tracker_left_bytes"] = int(left)
    note["joined"] = (pre[-1][0], hole)  # later than this on the joined clock: `hole` seconds later really
    if int(left) > 0:
        note["memory_samples"] += f" (the {format_size(left)} the tracker left in the RSS taken out)"
    times = [t for t, _ in pre] + [t - hole for t, _ in post]
    values = [v for _, v in pre] + [v - joined for _, v in post]
    return Series(tuple(times), tuple(values)), note


def _under_spikes(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each sample as the lowest of it and its two neighbours: a spike one or two samples long (a
    buffer copied as it grows) is gone, a sawtooth's ramps (many samples long) are not."""
    return [(t, min(v for _, v in samples[max(0, i - 1):i + 2])) for i, (t, _) in enumerate(samples)]


def _floors_of(samples: list[tuple[float, float]], width_s: float = 4.0) -> list[tuple[float, float]]:
    """The lowest sample of each `width_s` slice (batch buffers filled and freed leave the floor
    where it is; the median of a stretch shorter than their cycle would not)."""
    t0 = samples[0][0]
    whole = int((samples[-1][0] - t0) // width_s)  # a last slice shorter than the others is left out
    slices: dict[int, tuple[float, float]] = {}
    for t, v in samples:
        k = int((t - t0) // width_s)
        if (k < whole or whole == 0) and (k not in slices or v < slices[k][1]):
            slices[k] = (t, v)
    return [slices[k] for k in sorted(slices)]


def site_trends(att: Attribution | None, thresholds: LeakThresholds) -> list[tuple[Site, HeldTrend]]:
    """Each tracked site's held-bytes trend, rising sites first (fastest first)."""
    if att is None or not att.times or not att.sites:
        return []
    trends = [(site, held_trend(att.times, site.held, thresholds)) for site in att.sites]
    return sorted(trends, key=lambda st: (st[1].kind != "rising", -st[1].growth_bytes_per_s))


SHORT_SPAN_SHARE = 0.4  # of a short window, the span of untouched samples asked for (a tracker had the rest)
SHORT_SPAN_MIN_S = 3.0
SHORT_MIN_Z = 4.0  # a short window's slope, in standard errors of its sample scatter (see `window_thresholds`)
UNTOUCHED_SHARE = 0.55  # of a diagnosis's window, about what is watched with no tracker inside


def window_thresholds(th: LeakThresholds, duration_s: float) -> LeakThresholds:
    """`th` for a diagnosis of `duration_s` seconds: a short one (`--duration 10`) has a few seconds
    of untouched samples, not the `min_span_s` a long one asks, so what it needs scales with the
    window, and so does how long a fast leak must have lasted (5 MB/s over the untouched span).
    Its slope is asked to stand fewer standard errors clear of the sample scatter: on a few seconds
    of samples of a leak that keeps memory in bursts (a query at a time, on a busy machine), the
    leak's own bursts are most of that scatter, and the slope of a handful of floors stands
    fewer errors clear of it than the same leak's over a longer window."""
    need = max(SHORT_SPAN_MIN_S, SHORT_SPAN_SHARE * duration_s)
    if need >= th.min_span_s:
        return th
    return replace(th, min_span_s=need, fast_duration_s=min(th.fast_duration_s, need), min_z=min(th.min_z, SHORT_MIN_Z))


def settle_seconds(th: LeakThresholds, growth_bytes_per_s: float | None, duration_s: float) -> float | None:
    """The --duration that would settle a growth of `growth_bytes_per_s` one way or the other: long
    enough that growth at that rate counts as a leak (`LeakThresholds.alert_rate`) on the untouched
    part of the window. None where no growth could count (under `min_rate`)."""
    rate = growth_bytes_per_s or 0.0
    if rate < th.min_rate:
        return None
    lasted = th.fast_duration_s
    while lasted < th.slow_window_s * 4 and th.rate_margin * th.alert_rate(lasted) > rate:
        lasted *= 1.25
    return float(max(math.ceil(duration_s * 2), math.ceil(lasted / UNTOUCHED_SHARE)))


def rising_sites(att: Attribution | None,
                 trends: list[tuple[Site, HeldTrend]]) -> tuple[list[tuple[Site, HeldTrend]], dict | None]:
    """The rising sites whose rise is leak evidence (`leak.rising_evidence`: the process's memory in
    use rose with them, apportioned fastest first, or they outlasted any turnover), and the rule that decided for the first
    rising site (None where no site rose). A tracker with no held bytes over time says so: the
    memory trend decides alone."""
    if att is not None and att.method in ("memray", "tracemalloc") and not att.times:
        return [], {"counts": False, "rule": "no held-bytes series",
                    "reason": f"{att.method} read only what was held at the end, not over time: the memory trend decides"}
    rising = [(site, trend) for site, trend in trends if trend.kind == "rising"]
    if att is None or not rising:
        return [], None
    resident = att.cost.get("rss_before")
    judged = rising_evidence([(trend, att.times, site.held) for site, trend in rising], att.heap_times, att.heap,
                             att.heap_blocks, float(resident) if isinstance(resident, (int, float)) else None)
    first = {**judged[0].to_json(), "site": rising[0][0].function}
    return [st for st, evidence in zip(rising, judged) if evidence.counts], first


# -- the seven steps -------------------------------------------------------------------------------


def step_device(ev: Evidence, th: LeakThresholds) -> tuple[Step, LeakAssessment | None]:
    title = TITLES[0]
    if ev.device is None:
        why = ev.nvml_status or "the process has no memory on any GPU NVML can see"
        return Step(1, title, SKIPPED, f"skipped: {why}.", "Follow the host memory (step 2)."), None
    d = ev.device
    a = _assess(d.used, th, d.total_bytes)
    evidence = {"gpu": d.index, "name": d.name, "total_bytes": d.total_bytes, "assessment": a.to_json() if a else None}
    if a is None:
        return Step(1, title, SKIPPED, f"skipped: too few samples of GPU{d.index}.", evidence=evidence), None
    full = f", full in {format_duration(a.time_to_full_s, na='never at this rate')}" if a.time_to_full_s is not None else ""
    if a.is_leak:
        return Step(1, title, ALERT, f"GPU{d.index} ({d.name}) is filling at {_rate(a)}{full}: {a.reason}.",
                    "Find which process grows on it (step 4).", evidence), a
    if a.pattern in ("steady-growth", "cache-growth") or (a.growth_bytes_per_s or 0) > th.min_rate:
        return Step(1, title, WARN, f"GPU{d.index} memory grows at {_rate(a)} ({a.pattern}, not yet a leak): {a.reason}.",
                    "Keep watching; a longer window tells a slow leak from warm-up.", evidence), a
    return Step(1, title, OK, f"GPU{d.index} memory is {a.pattern}: {a.reason}.", evidence=evidence), a


def lived(ev: Evidence, a: LeakAssessment | None, series: Series) -> LeakAssessment | None:
    """A process's life counts, as in the live watch: a leak that ended with a short-lived process
    (an install, a test run) is that run's growth, not a leak."""
    if a is None or not a.is_leak or not ev.exited or ev.started_at is None or ev.ended_at is None or not series.times:
        return a
    life = series.times[-1] - (ev.started_at - ev.ended_at)  # on the series' clock (0: the window's end)
    return as_ended_run(a, life) if ended_run(life) else a


def warm_up_note(ev: Evidence, memory: LeakAssessment | None) -> str:
    """A process's age counts too: a leak that began in its first seconds, in a process not yet
    twice that old, may be its warm-up (the live watch does not alert on it yet); said, not ruled."""
    if memory is None or not memory.is_leak or ev.exited or ev.started_at is None or ev.ended_at is None:
        return ""
    started = ev.started_at - ev.ended_at
    if not warming_up(started, memory.since, 0.0):
        return ""
    return (f" The process started {max(0.0, -started):.0f} s ago and grew from its first seconds: this may be "
            f"it warming up (the console alerts once it is {2 * WARMUP_S:.0f} s old); diagnose again then to be sure.")


def step_host(ev: Evidence, th: LeakThresholds, gpu: LeakAssessment | None) -> tuple[Step, LeakAssessment | None]:
    title = TITLES[1]
    a = lived(ev, _assess(ev.rss, th), ev.rss)
    evidence = {"assessment": a.to_json() if a else None}
    if a is None:
        return Step(2, title, SKIPPED, "skipped: too few samples of the process's RSS.", evidence=evidence), None
    if a.is_leak:
        with_gpu = " alongside its GPU memory" if gpu is not None and gpu.is_leak else ""
        return Step(2, title, ALERT, f"The process's RSS grows{with_gpu} at {_rate(a)}: a host-side leak (Python objects, "
                    f"pinned or CPU tensors) — {a.reason}.", "Find the allocating code (step 7).", evidence), a
    if gpu is not None and gpu.is_leak:
        return Step(2, title, OK, f"RSS does not follow the GPU growth ({a.pattern}): the memory that grows is on the GPU.",
                    "Look at GPU allocations (steps 6 and 7).", evidence), a
    status = WARN if a.pattern == "steady-growth" else OK
    return Step(2, title, status, f"RSS is {a.pattern} ({_rate(a)}): {a.reason}.", evidence=evidence), a


def service_numbers(ev: Evidence) -> ServiceNumbers | None:
    """The service's signals at the start and the end of the window (None: no answer at all): at
    the start, each signal's earliest point in the end snapshot's history, else the start
    snapshot's."""
    end = ev.serving_end
    if end is None or (not end.ok and end.as_of is None):
        return None
    before = ev.serving_start.signals if ev.serving_start else None

    def first(name: str) -> float | None:
        points = [v for _, v in end.series(name) if v is not None]
        return points[0] if points else (before.get(name) if before else None)

    start = {st.name: st for st in ev.serving_start.stages} if ev.serving_start else {}
    return ServiceNumbers(
        profile=end.profile, start=Signals(**{name: first(name) for name in SIGNAL_NAMES}), end=end.signals,
        stages=tuple(StageChange(st.name, start[st.name].p95_s if st.name in start else None, st.p95_s, st.share)
                     for st in end.stages))


def _not_the_service(ev: Evidence, number: int, title: str) -> Step | None:
    """Steps 3 and 5 judge the service: skipped for a process known not to serve it."""
    end = ev.serving_end
    if ev.serves is False and end is not None:
        return Step(number, title, SKIPPED,
                    f"skipped: PID {ev.pid} is not the service (neither it nor its parent or children listen on "
                    f"{end.target}): the service's signals do not bear on it.")
    return None


def _whose(ev: Evidence) -> str:
    """Said where it is not known that the process serves the signals a step judges."""
    if ev.serves:
        return ""
    return f" These are the service's signals ({ev.serving_end.target if ev.serving_end else '?'}): they bear on " \
           f"PID {ev.pid} only if it serves them."


def step_throughput(ev: Evidence, service: ServiceNumbers | None = None) -> Step:
    title = TITLES[2]
    end = ev.serving_end
    if end is None:
        return Step(3, title, SKIPPED, "skipped: no metrics source (give --metrics-url or --prometheus).")
    if (other := _not_the_service(ev, 3, title)) is not None:
        return other
    if not end.ok and end.as_of is None:
        return Step(3, title, SKIPPED, f"skipped: the metrics source did not answer ({end.state}).")
    n = service or service_numbers(ev)
    assert n is not None  # the source answered
    per_request = n.tokens_per_request
    p95_then, p95_now = n.start.e2e_latency_p95_s, n.end.e2e_latency_p95_s
    ttft_then, ttft_now = n.start.ttft_p95_s, n.end.ttft_p95_s
    tps_then, tps_now = n.start.tokens_per_s, n.end.tokens_per_s
    evidence = {
        "profile": n.profile, "signals": n.end.to_json(), "tokens_per_request": per_request,
        "p95_start_s": p95_then, "ttft_p95_start_s": ttft_then, "tokens_per_s_start": tps_then,
    }
    worse = []
    if p95_then and p95_now and p95_now > DEGRADED * p95_then:
        worse.append(f"P95 {p95_then:.2f}→{p95_now:.2f} s")
    if ttft_then and ttft_now and ttft_now > DEGRADED * ttft_then:
        worse.append(f"TTFT P95 {ttft_then:.2f}→{ttft_now:.2f} s")
    if tps_then and tps_now and tps_now < tps_then / DEGRADED:
        worse.append(f"tokens/s {tps_then:.0f}→{tps_now:.0f}")
    summary = (f"P95 {p95_now:.2f} s, TTFT P95 {ttft_now:.2f} s, " if p95_now is not None and ttft_now is not None else "")
    summary += f"{tps_now:.0f} tokens/s" if tps_now is not None else "tokens/s unknown"
    if per_request is not None:
        summary += f", {per_request:.0f} tokens per request"
    evidence["serves"] = ev.serves
    if worse:
        return Step(3, title, ALERT if ev.serves else WARN,
                    f"The service is degrading: {', '.join(worse)} ({summary}).{_whose(ev)}",
                    "Check whether a stage is the bottleneck (step 5).", evidence)
    return Step(3, title, OK, f"The service holds steady over the window: {summary}.{_whose(ev)}", evidence=evidence)


def growth_ranking(ev: Evidence, source: str) -> list[tuple[int, float]]:
    """(PID, growth) of the five fastest-growing processes: on the process's GPU, or on the host."""
    device = ev.device.index if ev.device else None
    growth: dict[int, float | None]
    if source == "gpu":
        growth = {r.pid: r.gpu_growth_bytes_per_s for r in ev.processes if r.gpu == device}
    else:
        growth = {r.pid: r.rss_growth_bytes_per_s for r in {r.pid: r for r in ev.processes}.values()}
    return sorted(((pid, g) for pid, g in growth.items() if g is not None), key=lambda x: -x[1])[:5]


def step_locate(ev: Evidence, memory: LeakAssessment | None, source: str,
                ranking: list[tuple[int, float]] | None = None) -> Step:
    title = TITLES[3]
    device = ev.device.index if ev.device else None
    ranking = growth_ranking(ev, source) if ranking is None else ranking
    evidence: dict = {"ranking": [{"pid": pid, "growth_bytes_per_s": round(g, 1)} for pid, g in ranking]}
    fleet = ev.serving_end.fleet if ev.serving_end else ()
    if fleet:
        evidence["fleet"] = [_fleet_json(row) for row in fleet[:5]]
    if ev.exited:
        return Step(4, title, WARN, f"PID {ev.pid} exited during the diagnosis.", evidence=evidence)
    if not ranking:
        return Step(4, title, OK, f"PID {ev.pid} is the process under diagnosis (no other process's growth is known).",
                    evidence=evidence)
    top_pid, top_growth = ranking[0]
    where = f"on GPU{device}" if source == "gpu" else "on this host"
    if top_pid == ev.pid:
        status = ALERT if memory is not None and memory.is_leak else OK
        return Step(4, title, status, f"{_named(ev, ev.pid)} grows fastest {where} ({format_rate(top_growth)} MB/s).",
                    "Confirm it is the service you expect, then classify the growth (step 6).", evidence)
    return Step(4, title, WARN, f"{_named(ev, top_pid)} grows faster {where} ({format_rate(top_growth)} MB/s) "
                f"than {_named(ev, ev.pid)}.",
                f"Diagnose PID {top_pid} as well: gpuscope diagnose --pid {top_pid}", evidence)


NAME_CHARS = 60  # a process's name in a finding: enough to tell one service from another


def _named(ev: Evidence, pid: int) -> str:
    """`PID 123 (serve.py --port 8000 · vllm.service · /usr/bin/python3)`: what the process runs
    first, then where, so the operator can confirm it is the service they expect; the PID alone
    where its command is not known."""
    if pid == ev.pid:
        command, runs_in = ev.command, ev.runs_in
    else:
        row = next((r for r in ev.processes if r.pid == pid), None)
        command, runs_in = (row.command, row.runs_in) if row is not None else ("", "")
    if not command:
        return f"PID {pid}"
    return f"PID {pid} ({short_command(command, NAME_CHARS, runs_in)})"


def _fleet_json(row: FleetRow) -> dict:
    return {"host": row.host, "gpu": row.gpu, "pod": row.pod, "namespace": row.namespace,
            "used_mib": row.used_mib, "growth_mib_per_s": row.growth_mib_per_s}


def step_backpressure(ev: Evidence, service: ServiceNumbers | None = None) -> Step:
    title = TITLES[4]
    end = ev.serving_end
    if end is None:
        return Step(5, title, SKIPPED, "skipped: no metrics source (give --metrics-url or --prometheus).")
    if (other := _not_the_service(ev, 5, title)) is not None:
        return other
    if not end.stages:
        return Step(5, title, SKIPPED, f"skipped: the service ({end.profile or 'unknown profile'}) exports no stage latencies.")
    start = {st.name: st for st in ev.serving_start.stages} if ev.serving_start else {}
    evidence: dict = {"stages": {st.name: st.to_json() for st in end.stages},
                "stages_start": {name: st.to_json() for name, st in start.items()}}
    slowing = []
    n = service or service_numbers(ev)
    for change in n.stages if n is not None else ():
        then, now = change.p95_start_s, change.p95_end_s
        if then and now and now > DEGRADED * then:
            slowing.append(f"{change.name} P95 {then * 1000:.0f}→{now * 1000:.0f} ms")
    busiest = max(end.stages, key=lambda st: st.share or 0.0)
    # The model's own stages (vLLM's prefill/decode, TGI's inference, the RAG pipeline's llm)
    # taking the time is a service at work, not backpressure.
    evidence["model_stages"] = list(model_stages(end.profile))
    bottleneck = not is_model_stage(end.profile, busiest.name) and (busiest.share or 0.0) >= STAGE_DOMINATES
    shares = ", ".join(f"{st.name} {100 * (st.share or 0):.0f}%" for st in end.stages)
    if slowing or bottleneck:
        what = "; ".join(slowing) if slowing else f"{busiest.name} takes {100 * (busiest.share or 0):.0f}% of request time"
        return Step(5, title, WARN, f"Backpressure: {what} ({shares}).{_whose(ev)}",
                    f"Look at {slowing[0].split()[0] if slowing else busiest.name}: the memory growth may be a backlog there.", evidence)
    return Step(5, title, OK, f"No stage is slowing the pipeline ({shares}).{_whose(ev)}", evidence=evidence)


def step_classify(ev: Evidence, memory: LeakAssessment | None, source: str) -> tuple[Step, str, str]:
    """The verdict and pattern of the diagnosis, with the evidence for them."""
    title = TITLES[5]
    if memory is None:
        return Step(6, title, SKIPPED, "skipped: too little memory data to classify."), "inconclusive", "insufficient-data"
    evidence: dict = {"source": source, "assessment": memory.to_json()}
    kv = ev.serving_end.signals.kv_cache_usage if ev.serving_end else None
    if kv is not None:
        evidence["kv_cache_usage"] = kv
    if memory.pattern == "cache-growth":
        return (Step(6, title, WARN, "The caching allocator keeps freed blocks (reserved grows, allocated flat): not a leak.",
                     "If memory is short: torch.cuda.empty_cache(), or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
                     evidence), "no-leak", memory.pattern)
    if memory.is_leak and kv is not None and kv >= 0.9 and source == "gpu":
        return (Step(6, title, WARN, f"GPU memory grows while the KV cache is {kv * 100:.0f}% full: a KV-cache fill, not a leak "
                     "(the server sizes the cache to the memory it may use).", "Check the server's memory limits.", evidence),
                "no-leak", "kv-cache-fill")
    if memory.is_leak:
        return (Step(6, title, ALERT, f"A leak: {memory.reason} (confidence {memory.confidence:.0%}).",
                     "Find the code path (step 7).", evidence), "leak", memory.pattern)
    if memory.verdict == "inconclusive":
        return (Step(6, title, WARN, f"Not conclusive yet: {memory.reason} (confidence {memory.confidence:.0%}).",
                     "Diagnose over a longer window (--duration).", evidence), "inconclusive", memory.pattern)
    plain = {"step-then-plateau": "a warm-up step, then a plateau", "sawtooth": "a sawtooth around a flat floor",
             "flat": "flat"}.get(memory.pattern, memory.pattern)
    return Step(6, title, OK, f"Not a leak: {plain} — {memory.reason}.", evidence=evidence), "no-leak", memory.pattern


def step_code_path(ev: Evidence, verdict: str, suspects: tuple[Suspect, ...] | None = None,
                   unseen: UnseenGrowth | None = None, withheld: str | None = None) -> Step:
    """`unseen`: the memory grows where the tracker does not see (its sites are not named);
    `withheld`: why the ladder's suspects are not named (stack samples of a process that does not leak)."""
    title = TITLES[6]
    att = ev.attribution
    if att is None:
        return Step(7, title, SKIPPED, "skipped: the allocation sites were not looked for.")
    evidence: dict = {
        "method": att.method, "confidence": att.confidence,
        "rungs": [{"method": r.method, "status": r.status, "detail": r.detail} for r in att.rungs],
        "stacks": [{"function": s.function, "frames": stack_json(s.stack)} for s in (suspects or att.suspects)[:5]],
    }
    suspects = att.suspects if suspects is None else suspects
    failed = [f"{r.method} {r.status}: {r.detail}" for r in att.rungs if r.status == "failed"]
    if unseen is not None and not suspects:
        evidence["unseen_growth"] = unseen.to_json()
        return Step(7, title, WARN, f"No suspect named: {unseen.finding()}.", unseen.next(), evidence)
    if withheld is not None:
        evidence["withheld"] = withheld
        failures = f" ({'; '.join(failed)})" if failed else ""
        return Step(7, title, OK, f"No suspect named: {withheld}{failures}.", evidence=evidence)
    if not suspects:
        why = "; ".join(f"{r.method}: {r.detail}" for r in att.rungs if r.status != "used")
        return Step(7, title, WARN if verdict == "leak" else OK, f"No suspect named ({why}).", evidence=evidence)
    top = suspects[0]
    size = f", {format_bytes(top.bytes)} still held" if top.bytes is not None else ""
    how = {"memray": "memray's allocation tracking", "torch-history": "PyTorch's allocation history",
           "tracemalloc": "tracemalloc (Python allocations only: native memory is not seen)",
           "stack-sampling": "stack sampling (low confidence: where the process was while memory grew)"}.get(
               top.method, top.method)
    status = ALERT if verdict == "leak" and att.confidence in ("high", "medium") else WARN
    also = f" ({'; '.join(failed)})" if failed and att.confidence != "high" else ""
    return Step(7, title, status,
                f"First suspect: {top.function} ({top.file}:{top.line}), {top.share * 100:.0f}%{size}, by {how}{also}.",
                f"Read {top.file}:{top.line}: what keeps what it allocates?", evidence)


NATIVE_SHARE = 0.1  # a tracker that saw less than this share of the memory's growth did not see the leak
STEADY_TAU = 0.8  # a site's held bytes this steady (Kendall's tau) over tracking: still growing


@dataclass(frozen=True, slots=True)
class UnseenGrowth:
    """The memory grows, but the allocations the tracker saw grow far slower: the growth is where
    the tracker does not look (native code under tracemalloc; memory allocated before tracking
    and filled in place, or allocated outside malloc, under memray)."""

    tracker: str  # "tracemalloc" | "memray"
    memory_bytes_per_s: float  # the memory trend's growth (the samples no tracker distorted)
    tracked_bytes_per_s: float  # what the sites the tracker saw gained, per second of tracking
    growing: tuple[tuple[Site, float], ...] = ()  # sites that still gained steadily (may own native memory)

    def finding(self) -> str:
        seen = (f"the RSS grows {format_speed(self.memory_bytes_per_s)}, the allocations {self.tracker} saw only "
                f"{format_speed(self.tracked_bytes_per_s)}")
        if self.tracker == "tracemalloc":
            where = ("the growth is outside Python's allocator: native code, e.g. a C extension, allocates it, "
                     "which tracemalloc does not see")
        else:
            where = ("the growth is not in memory allocated while memray tracked: memory allocated before and "
                     "filled in place (a native buffer or index growing into capacity it reserved), or allocated "
                     "outside malloc")
        out = f"{seen}: {where}"
        if self.growing:
            site, rate = self.growing[0]
            out += (f"; Python objects that kept growing meanwhile may hold that memory, or be unrelated: "
                    f"{site.function} ({site.file}:{site.line}) {format_speed(rate)}")
        return out

    def next(self) -> str:
        if self.tracker == "tracemalloc":
            return ("Install memray into the service's environment (pip install memray) and diagnose again: "
                    "it sees what native code allocates through malloc.")
        return "Diagnose again with a longer --duration: the tracker then sees more of the native growth."

    def to_json(self) -> dict:
        return {"tracker": self.tracker, "memory_bytes_per_s": round(self.memory_bytes_per_s, 1),
                "tracked_bytes_per_s": round(self.tracked_bytes_per_s, 1),
                "growing": [{"function": site.function, "file": site.file, "line": site.line,
                             "growth_bytes_per_s": round(rate, 1)} for site, rate in self.growing[:5]]}


def unseen_growth(att: Attribution | None, memory: LeakAssessment | None, source: str) -> UnseenGrowth | None:
    """Where the RSS leaks but the tracker's sites gained under `NATIVE_SHARE` of that growth
    while it tracked (None otherwise, and where the tracker read no held bytes over time)."""
    if att is None or source != "rss" or memory is None or not memory.is_leak or len(att.times) < 2:
        return None
    growth = memory.growth_bytes_per_s or 0.0
    trackers = [r.method for r in att.rungs if r.method in ("memray", "tracemalloc") and r.status in ("used", "failed")]
    # What each site gained: its held bytes at the end over the floor of its first quarter of
    # reads, the tracker's first read (taken as it started) left out. A working set caught alive
    # at the end counts too (at most a request's buffers: far under a leak's growth), and so does
    # a native buffer reallocated bigger however late.
    kept = [i for i, t in enumerate(att.times) if t >= 1.0] or list(range(len(att.times)))
    span = att.times[kept[-1]] - att.times[kept[0]]
    if growth <= 0 or span <= 0 or not trackers or not att.sites:
        return None
    q = max(1, len(kept) // 4)
    seen = sum(max(0, site.held[kept[-1]] - min(site.held[i] for i in kept[:q]))
               for site in att.sites if len(site.held) == len(att.times)) / span
    if seen >= NATIVE_SHARE * growth:
        return None
    growing = []
    for site in att.sites:
        points = list(zip(att.times, site.held))
        if len(points) >= 6 and site.held[-1] > site.held[0]:
            slope, late = theil_sen(points) or 0.0, theil_sen(points[len(points) // 2:]) or 0.0
            if kendall_tau(points) >= STEADY_TAU and late >= 0.4 * slope > 0:
                growing.append((site, slope))
    return UnseenGrowth(trackers[-1], growth, seen, tuple(sorted(growing, key=lambda g: -g[1])))


def _ranked_suspects(att: Attribution | None, rising: list[tuple[Site, HeldTrend]]) -> tuple[Suspect, ...]:
    """The tracker's suspects, the sites whose held bytes kept rising first (fastest first): what
    is still held at the end may be a large temporary caught alive; what keeps rising is not."""
    if att is None:
        return ()
    rates = {(site.function, site.file, site.line): trend.growth_bytes_per_s for site, trend in rising}
    if not rates:
        return att.suspects

    def rank(s: Suspect) -> tuple:
        rate = rates.get((s.function, s.file, s.line))
        # Equal rates are one allocation seen at several frames: the innermost (the function that
        # allocates, its callers after it) comes first.
        return (1, 0.0, 0) if rate is None else (0, -rate, -len(s.stack))

    return tuple(sorted(att.suspects, key=rank))


def _instrument(att: Attribution | None, note: dict) -> InstrumentCost | None:
    if att is None or att.window is None:
        return None
    cost = att.cost
    before, tracking, after = (_whole(cost.get(k)) for k in ("rss_before", "rss_tracking", "rss_after"))
    trackers = [r.method for r in att.rungs if r.status != "skipped" and r.method != "stack-sampling"]
    method = att.method if att.method in trackers else ", ".join(trackers) or None
    seconds = cost.get("seconds")  # the tracker's own measure, else the window it ran in
    return InstrumentCost(
        method=method,
        seconds=float(seconds) if isinstance(seconds, (int, float)) else round(att.window[1] - att.window[0], 1),
        loaded_from=cost.get("from"), sees=cost.get("sees"), cut_short=bool(cost.get("cut_short")),
        rss_before=before, rss_tracking=tracking, rss_after=after,
        added_bytes=tracking - before if tracking is not None and before is not None else None,
        left_bytes=note.get("tracker_left_bytes"),
        planned_seconds=round(float(planned), 1) if isinstance(planned := cost.get("planned_s"), (int, float)) else None,
        stopped_because=str(cost["stopped"]) if cost.get("stopped") else None)


def _whole(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _trend(what: str, a: LeakAssessment | None, total: float | None = None,
           joined: tuple[float, float] | None = None) -> MemoryTrend | None:
    """A series' assessment with its moments as seconds before the window's end (time 0 of the
    evidence's clock); `joined`: the series had a hole taken out (`uninstrumented`)."""
    if a is None:
        return None
    since = a.since
    if since is not None and joined is not None and since > joined[0]:
        since += joined[1]  # back on the real clock
    began = None if since is None or math.isnan(since) else max(0.0, -since)
    return MemoryTrend(what=what, pattern=a.pattern, start_bytes=a.start_bytes, end_bytes=a.end_bytes,
                       total_bytes=total, growth_bytes_per_s=a.growth_bytes_per_s, began_s_before_end=began,
                       time_to_full_s=a.time_to_full_s, samples=a.samples, span_s=a.span_s)


def diagnose(ev: Evidence, thresholds: LeakThresholds = LeakThresholds()) -> Diagnosis:
    """Run the seven steps over the evidence.

    The memory trend is judged on the samples no tracker distorted (`uninstrumented`); the held
    bytes per allocation site, where a tracker read them over time, are evidence of their own: a
    site whose held bytes rise steadily to the end is a leak even where RSS is flat (the allocator
    reuses freed heap, which hides a slow leak from RSS for minutes). A short window asks less of
    its untouched samples (`window_thresholds`)."""
    asked = ev.asked_s if ev.asked_s is not None else ev.duration_s
    base, thresholds = thresholds, window_thresholds(thresholds, asked)
    device_step, device_assessment = step_device(ev, thresholds)
    gpu_assessment = None
    if ev.gpu is not None and ev.gpu.known():
        gpu_assessment = lived(ev, _assess(ev.gpu, thresholds, allocated=ev.allocated, reserved=ev.reserved), ev.gpu)
    rss, note = uninstrumented(ev.rss, ev.instrumented)
    host_step, rss_assessment = step_host(replace(ev, rss=rss), thresholds, gpu_assessment)
    if rss_assessment is not None and rss_assessment.growth_bytes_per_s is None and len(rss.known()) >= 4:
        # Too short a stretch to judge (a short --duration less the tracking): its floor's slope is
        # still the best measure of the growth there is.
        rss_assessment = replace(rss_assessment,
                                 growth_bytes_per_s=floor_growth(FloorSketch.of(rss.times, rss.values), None, thresholds))
    source, memory = ("gpu", gpu_assessment) if gpu_assessment is not None else ("rss", rss_assessment)
    trends = site_trends(ev.attribution, thresholds)
    rising, site_rule = rising_sites(ev.attribution, trends)
    counted = {(site.function, site.file, site.line) for site, _ in rising}
    classify_step, verdict, pattern = step_classify(ev, memory, source)
    if note_young := warm_up_note(ev, memory):
        classify_step = replace(classify_step, finding=classify_step.finding + note_young)
    sites = tuple(SiteTrend(site.function, site.file, site.line,
                            "turnover" if t.kind == "rising" and (site.function, site.file, site.line) not in counted
                            else t.kind, t.growth_bytes_per_s, site.held[-1])
                  for site, t in trends[:5])
    decided_by, confidence = "memory trend", round(memory.confidence, 2) if memory else 0.0
    if rising and verdict == "leak":
        decided_by = "both"
    elif rising and pattern not in ("cache-growth", "kv-cache-fill"):
        site, t = rising[0]
        verdict, pattern = "leak", "steady-growth"
        decided_by, confidence = "allocation sites", round(t.confidence, 2)
        classify_step = Step(6, TITLES[5], ALERT,
                             f"A leak by its allocation sites: {site.function}'s {t.reason}, while the "
                             f"{source.upper() if source == 'gpu' else 'RSS'} trend reads "
                             f"{memory.pattern if memory else 'nothing'} (confidence {t.confidence:.0%}); "
                             f"{(site_rule or {}).get('reason', '')}.",
                             "Find the code path (step 7).", {**classify_step.evidence, "site": sites[0].to_json()})
    elif trends and verdict != "leak" and any(t.kind == "levelled" for _, t in trends):
        decided_by = "both"  # the tracker saw a cache fill to its bound
    ranking = growth_ranking(ev, source)
    suspects = _ranked_suspects(ev.attribution, rising)
    # No suspect without evidence: sites of a tracker that did not see the growth are not its
    # cause, and stack samples (where time went, not what allocated) blame nothing when memory
    # does not leak.
    unseen = None if rising else unseen_growth(ev.attribution, memory, source)
    if unseen is not None and suspects and suspects[0].method in ("memray", "tracemalloc"):
        suspects = ()
    withheld = None
    if verdict == "no-leak" and suspects and suspects[0].method == "stack-sampling":
        withheld = (f"the memory does not leak ({pattern}), and stack samples show where the process spent its "
                    "time, not what allocated memory")
        suspects = ()
    settle = None
    if verdict == "inconclusive" and memory is not None:
        # Not settled yet: the suspects stay (a lead), and how long would settle it is said.
        settle = settle_seconds(base, memory.growth_bytes_per_s, asked)
        if settle is not None:
            classify_step = replace(
                classify_step, next=f"Diagnose again with --duration {settle:g}: growth at "
                f"{format_speed(memory.growth_bytes_per_s)} counts as a leak once it has lasted that long.",
                evidence={**classify_step.evidence, "settle_s": settle})
    service = service_numbers(ev)
    steps = (
        device_step,
        host_step,
        step_throughput(ev, service),
        step_locate(ev, memory, source, ranking),
        step_backpressure(ev, service),
        classify_step,
        step_code_path(ev, verdict, suspects, unseen, withheld),
    )
    excluded = note.get("excluded_s")
    device = ev.device
    evidence = VerdictEvidence(
        decided_by=decided_by, confidence=confidence, memory_samples=note["memory_samples"],
        excluded_s_before_end=(max(0.0, -excluded[0]), max(0.0, -excluded[1])) if excluded else None,
        tracker_left_bytes=note.get("tracker_left_bytes"), samples_after_tracker=note.get("samples_after"), sites=sites, ended_at=ev.ended_at, memory_source=source,
        device=_trend(f"GPU{device.index} ({device.name})", device_assessment, device.total_bytes)
        if device is not None else None,
        host=_trend("RSS", rss_assessment, joined=note.get("joined")),
        service=service,
        ranking=tuple(ProcessGrowth(pid, g) for pid, g in ranking),
        rungs=ev.attribution.rungs if ev.attribution is not None else (),
        unseen_growth=unseen.to_json() if unseen is not None else None,
        site_rule=site_rule,
        settle_s=settle,
    )
    empty = LeakAssessment("inconclusive", "insufficient-data", None, 0.0, None, None, None, None, 0, 0.0, "no data")
    return Diagnosis(
        pid=ev.pid,
        command=ev.command,
        runs_in=ev.runs_in,
        duration_s=ev.duration_s,
        verdict=verdict,
        pattern=pattern,
        memory_source=source,
        memory=memory or empty,
        steps=steps,
        suspects=suspects,
        evidence=evidence,
        instrument=_instrument(ev.attribution, note),
    )
