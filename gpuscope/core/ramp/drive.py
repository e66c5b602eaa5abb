"""Driving a ramp: rising load in steps, one measuring interval at a time, until the rule or a limit stops it.

The first step holds the starting load for the stop rule's whole baseline (`baseline_points`
intervals); each later step lasts `step_s` and adds `step_rps`. After every interval: the
client's counts and latencies, the service's signals over the interval (one scrape of its
/metrics at each end: PromQL's rate and histogram_quantile over exactly that span; or, with a
Prometheus server, the same asked of it over the span), its memory
(RSS of the process tree, GPU memory per device through NVML), and the interval's P99 judged by
the rule. A break holds the load where it is (no step up while breaks run in a row); the rule's
watch holds it too.

It ends at the first of: the rule's stop (the P99 broke: the knee), the error rate of the step so
far above `max_error_rate` (once MIN_FINISHED requests finished in the step: the knee), the next
step above `max_rps`, `max_time_s`, the service exiting, the load command failing, or an
interrupt (Ctrl+C, SIGTERM: the load stops at once). Whatever ends it, what was measured is kept
and returned.

While the baseline runs, memray (through the probe of each Python process of the service, as
`gpuscope check` does) tracks the allocations that stay: the code that keeps memory per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol
from dataclasses import dataclass, field

from gpuscope.core.gate.run import Service, TreeMemory, Tracking, prime_memray
from gpuscope.core.ramp.load import ClientInterval, ClientTally, LoadCommand, RequestLoad
from gpuscope.core.ramp.result import (
    Interval,
    MemoryFinding,
    RampResult,
    Site,
    Step,
    find_knee,
    memory_slope,
)
from gpuscope.core.ramp.rule import STOPPED, BreakWatch, StopRule
from gpuscope.core.serving.model import Signals, SourceError
from gpuscope.core.serving.source import Collector
from gpuscope.errors import Signalled

class Spans(Protocol):
    """The service's signals between two readings: `RoundMetrics` (its /metrics, read at each end)
    or `PrometheusSpans` (asked of Prometheus at the end, over the span)."""

    def read(self) -> tuple[list, str | None]: ...

    def signals(self, start: list, end: list) -> tuple[Signals, float] | None: ...


class PrometheusSpans:
    """The signals over a span asked of a Prometheus server once it ends: its rate and
    histogram_quantile over the span's length (which must hold two of its scrapes of the service).
    A reading is the time it was taken."""

    def __init__(self, collector: Callable[[float], Collector]) -> None:
        self._collector = collector

    def read(self) -> tuple[list, str | None]:
        return [time.time()], None

    def signals(self, start: list, end: list) -> tuple[Signals, float] | None:
        window = max(1.0, end[0] - start[0])
        collector = self._collector(window)
        try:
            collector.record(0, collector.readers()[0]())
            return collector.evaluate().signals, window
        except SourceError:
            return None
        finally:
            collector.close()


MIN_FINISHED = 10  # requests finished in a step before its error rate can end the ramp
MAX_STEP_LATENCIES = 200_000
TICK_S = 0.1  # how often the limits are looked at inside an interval
TRACK_SHARE = 0.9  # of the baseline tracked by memray: it answers before the first step up
GPU_WAIT_S = 0.5  # for NVML's answer at an interval's end (a slower one leaves the interval without a GPU figure)


@dataclass(frozen=True)
class Plan:
    """How to ramp."""

    start_rps: float = 1.0
    step_rps: float = 1.0
    step_s: float = 15.0
    max_rps: float = 100.0
    max_time_s: float = 600.0
    max_error_rate: float = 0.05
    rule: StopRule = field(default_factory=StopRule)
    memray: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.start_rps <= self.max_rps:
            raise ValueError(f"the starting load ({self.start_rps:g}/s) must be above 0 and at most the maximum ({self.max_rps:g}/s)")
        if not self.step_rps > 0:
            raise ValueError(f"the step must add some load, not {self.step_rps:g}/s")
        if not 0 <= self.max_error_rate <= 1:
            raise ValueError(f"the error-rate limit is a fraction from 0 to 1, not {self.max_error_rate:g}")

    @property
    def step_intervals(self) -> int:
        return max(1, round(self.step_s / self.rule.interval_s))

    def to_json(self) -> dict:
        return {"start_rps": self.start_rps, "step_rps": self.step_rps, "step_s": self.step_intervals * self.rule.interval_s,
                "max_rps": self.max_rps, "max_time_s": self.max_time_s, "max_error_rate": self.max_error_rate,
                "rule": self.rule.to_json()}


class _StepFigures:
    """The current step's running figures."""

    def __init__(self, number: int, rate: float, readings: list | None, rss: int | None, gpu: int | None) -> None:
        self.number, self.rate = number, rate
        self.readings = readings
        self.rss, self.gpu = rss, gpu
        self.intervals: list[Interval] = []
        self.latencies: list[float] = []
        self.tokens: int | None = None
        self.last_error: str | None = None

    def add(self, interval: Interval, client: ClientInterval) -> None:
        self.intervals.append(interval)
        self.last_error = client.last_error or self.last_error
        room = MAX_STEP_LATENCIES - len(self.latencies)
        self.latencies.extend(client.latencies[:max(0, room)])
        if client.tokens is not None:
            self.tokens = (self.tokens or 0) + client.tokens

    @property
    def finished(self) -> int:
        return sum(_finished(i)[0] for i in self.intervals)

    @property
    def errors(self) -> int:
        return sum(_finished(i)[1] for i in self.intervals)

    def close(self, service: Signals | None, mode: str) -> Step:
        its = self.intervals
        duration = sum(i.duration_s for i in its)
        ok = sum(i.ok for i in its)
        ordered = sorted(self.latencies)
        end_rss = next((i.rss_bytes for i in reversed(its) if i.rss_bytes is not None), None)
        end_gpu = next((i.gpu_bytes for i in reversed(its) if i.gpu_bytes is not None), None)
        # NVML answers after it is asked: without a reading at the step's start, its first in the step
        start_gpu = self.gpu if self.gpu is not None else next((i.gpu_bytes for i in its if i.gpu_bytes is not None), None)
        rss_growth = end_rss - self.rss if end_rss is not None and self.rss is not None else None
        gpu_growth = end_gpu - start_gpu if end_gpu is not None and start_gpu is not None else None
        per_request = rss_growth / ok if rss_growth is not None and ok else None
        turns = sum(i.turns for i in its)
        return Step(self.number, self.rate, duration, sum(i.sent for i in its), ok, sum(i.errors for i in its),
                    _rank(ordered, 0.95), _rank(ordered, 0.99), service,
                    self.tokens / duration if self.tokens is not None and duration > 0 else None,
                    rss_growth, gpu_growth, per_request,
                    rss_growth / turns if rss_growth is not None and turns and mode == "chat" else None,
                    turns, any(i.broke for i in its), self.last_error)


def _finished(i: Interval) -> tuple[int, int]:
    """Requests finished in an interval and how many failed: counted by gpuscope when it sent
    them, else (the user's load command) as the service counted them."""
    if i.sent == 0 and i.service is not None and i.service.requests_per_s is not None:
        done = i.service.requests_per_s * i.duration_s
        return round(done), round(done * (i.service.error_rate or 0.0))
    return i.ok + i.errors, i.errors


def _rank(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.999999) - 1))]


def drive(
    plan: Plan,
    load: RequestLoad | LoadCommand,
    tally: ClientTally,
    *,
    target: str,
    mode: str,
    memory: TreeMemory | None = None,
    metrics: Spans | None = None,
    service: Service | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> RampResult:
    """Ramp until something stops it; whatever stops it (an interrupt included), the load is stopped
    and what was measured comes back."""
    rule = plan.rule
    watch = BreakWatch(rule)
    notes: list[str] = []
    intervals: list[Interval] = []
    steps: list[Step] = []
    stopped_by, reason = "", ""
    knee_step: int | None = None
    served_total = 0
    p99_source = "client" if metrics is None else ""
    tracking: Tracking | None = None

    if memory is not None and plan.memray:
        notes += prime_memray(memory, set(), 0.0)[1]
        tracking = Tracking(memory.pids(), TRACK_SHARE * rule.baseline_points * rule.interval_s)
        if not tracking.started:
            tracking = None
    readings = _read(metrics, notes)
    rss, gpu = _memory(memory)
    current = _StepFigures(1, plan.start_rps, readings, rss, gpu)
    step_length = max(plan.step_intervals, rule.baseline_points)  # the first step is the baseline
    epoch, started = time.time(), time.monotonic()  # the load starts now (memray tracks from a moment before)
    load.set_rate(current.rate)
    if isinstance(load, RequestLoad):
        load.start()
    progress(f"step 1: {current.rate:g} requests/s for {step_length} intervals of {rule.interval_s:g} s "
             f"(the baseline: the first {rule.baseline_points})")
    interval_started = time.monotonic()
    try:
        while True:
            ended = _wait_interval(interval_started + rule.interval_s, started + plan.max_time_s, load, service)
            now = time.monotonic()
            client = tally.take()
            served_total += client.ok
            readings_now = _read(metrics, notes)
            service_signals = None
            if metrics is not None and readings is not None and readings_now is not None:
                between = metrics.signals(readings, readings_now)
                service_signals = between[0] if between else None
            readings = readings_now if readings_now is not None else readings
            rss, gpu = _memory(memory)
            if p99_source == "" and service_signals is not None and service_signals.e2e_latency_p99_s is not None:
                p99_source = "service"
            if p99_source == "" and client.ok and intervals and len(intervals) >= rule.baseline_points // 2:
                p99_source = "client"
                notes.append("the service's signals hold no end-to-end latency histogram gpuscope knows: "
                             "the stop rule judges the client-side P99")
            p99 = (service_signals.e2e_latency_p99_s if service_signals else None) if p99_source == "service" \
                else client.quantile(0.99)
            index = len(intervals)
            score = watch.add(index, p99, now - interval_started)
            interval = Interval(index, current.number, current.rate, interval_started - started, now - interval_started,
                                client.sent, client.ok, client.errors, client.quantile(0.95), client.quantile(0.99),
                                client.tokens, client.turns, service_signals, rss, gpu, served_total, p99, score.score,
                                score.broke)
            intervals.append(interval)
            current.add(interval, client)
            interval_started = now
            progress(_interval_line(interval, watch.state))
            if ended:
                stopped_by, reason = ended
                break
            if watch.state == STOPPED:
                stopped_by = "p99"
                knee_step = current.number
                reason = (f"the P99 broke {watch.in_a_row} intervals in a row at {current.rate:g} requests/s "
                          f"(step {current.number}), the last during the {rule.watch_s:g} s watch")
                break
            finished = current.finished
            if finished >= MIN_FINISHED and current.errors > plan.max_error_rate * finished:
                stopped_by = "error-rate"
                knee_step = current.number
                last = f"; the last: {current.last_error}" if current.last_error else ""
                reason = (f"errors in {current.errors} of {finished} requests at {current.rate:g} requests/s "
                          f"(step {current.number}): over the {plan.max_error_rate:.0%} limit{last}")
                break
            if len(current.intervals) >= step_length and watch.state != "watching" and watch.in_a_row == 0:
                nxt = round(current.rate + plan.step_rps, 6)
                if nxt > plan.max_rps + 1e-9:
                    stopped_by = "max-rate"
                    reason = f"the next step ({nxt:g} requests/s) would pass the {plan.max_rps:g} requests/s limit"
                    break
                steps.append(_close(current, metrics, readings, mode))
                rss0, gpu0 = _memory_at(current)
                current = _StepFigures(current.number + 1, nxt, readings, rss0, gpu0)
                step_length = plan.step_intervals
                load.set_rate(nxt)
                progress(f"step {current.number}: {nxt:g} requests/s")
    except (KeyboardInterrupt, Signalled) as exc:
        what = "Ctrl+C" if isinstance(exc, KeyboardInterrupt) else str(exc)
        stopped_by, reason = "interrupted", f"interrupted ({what}): the load was stopped at once"
    finally:
        load.stop()
        if tracking is not None and not tracking.answered():
            tracking.cancel()
    if current.intervals:
        steps.append(_close(current, metrics, readings, mode))
    sites: tuple[Site, ...] = ()
    sites_note = None
    tracked_served: int | None = None
    if tracking is not None:
        found, why = tracking.finish(2.0)
        tracked_served = _served_within(intervals, tracking.seconds)
        per = tracked_served or None
        sites = tuple(Site(s.function, s.file, s.line, s.bytes, s.count, s.bytes / per if per else None, s.stack)
                      for s in (found or ()))
        sites_note = why
    elif memory is not None and plan.memray:
        sites_note = "no process of the service has gpuscope's probe: allocation sites were not tracked"
    per_request = memory_slope(intervals)
    finding = MemoryFinding(per_request, per_request if mode == "chat" else None, memory_slope(intervals, gpu=True),
                            sites, tracked_served, sites_note)
    if memory is not None and memory.gpu_status and all(i.gpu_bytes is None for i in intervals):
        notes.append(f"no GPU figures: {memory.gpu_status}")
    knee = find_knee(steps, intervals, knee_step)
    settings = {**plan.to_json(), "mode": mode}
    return RampResult(target, mode, settings, epoch, time.monotonic() - started, p99_source or "client",
                      tuple(intervals), tuple(steps), stopped_by, reason, knee, finding, tuple(dict.fromkeys(notes)))


def _read(metrics: Spans | None, notes: list[str]) -> list | None:
    """One reading of the service's signals; a failure is noted once (the ramp goes on)."""
    if metrics is None:
        return None
    readings, problem = metrics.read()
    if problem and not any(n.startswith("the service's signals could not be read") for n in notes):
        notes.append(f"the service's signals could not be read at times: {problem}")
    return readings


def _served_within(intervals: list[Interval], seconds: float) -> int:
    """Requests served in the ramp's first `seconds` (an interval across the end counted in part)."""
    served = 0.0
    for i in intervals:
        if i.duration_s > 0:
            served += i.ok * min(1.0, max(0.0, (seconds - i.offset_s) / i.duration_s))
    return round(served)


def _wait_interval(until: float, max_time: float, load: RequestLoad | LoadCommand,
                   service: Service | None) -> tuple[str, str] | None:
    """Sleep to the interval's end; (stopped_by, reason) when a limit or a failure ends the ramp first."""
    while True:
        now = time.monotonic()
        if now >= max_time:
            return "max-time", "the time limit was reached"
        if service is not None and service.exited():
            return "service", f"the service {service.describe_exit()}"
        if isinstance(load, LoadCommand):
            failed = load.failed()
            if failed:
                return "load", failed
        if now >= until:
            return None
        time.sleep(min(TICK_S, until - now, max_time - now))


def _memory(memory: TreeMemory | None) -> tuple[int | None, int | None]:
    if memory is None:
        return None, None
    gpu = memory.gpu_now(GPU_WAIT_S)  # read now: paired with the requests served so far
    return memory.rss(), (sum(gpu.values()) if gpu else None)


def _memory_at(step: _StepFigures) -> tuple[int | None, int | None]:
    """The memory at the end of a step (where the next one starts)."""
    rss = next((i.rss_bytes for i in reversed(step.intervals) if i.rss_bytes is not None), step.rss)
    gpu = next((i.gpu_bytes for i in reversed(step.intervals) if i.gpu_bytes is not None), step.gpu)
    return rss, gpu


def _close(step: _StepFigures, metrics: Spans | None, end: list | None, mode: str) -> Step:
    """The step's figures, with the service's signals between its first and its last reading."""
    service = None
    if metrics is not None and step.readings is not None and end is not None and end is not step.readings:
        between = metrics.signals(step.readings, end)
        service = between[0] if between else None
    return step.close(service, mode)


def _interval_line(i: Interval, state: str) -> str:
    p99 = "N/A" if i.p99_s is None else f"{i.p99_s * 1000:.0f} ms"
    score = "" if i.score is None else f", score {i.score:.1f}{' BREAK' if i.broke else ''}"
    watching = " (watching)" if state == "watching" else ""
    return (f"  {i.offset_s + i.duration_s:6.0f} s  {i.rate:g}/s asked, {i.throughput_rps:.1f}/s served, "
            f"{i.errors} errors, P99 {p99}{score}{watching}")
