"""What a ramp measured, and what it concludes: the intervals, the steps, the knee, memory per request.

An interval is one P99 of the stop rule (gpuscope.core.ramp.rule); a step is the intervals at one
load. Quantiles of a step are over the step's own requests (client-side) or the service's
histograms over the step (PromQL's `histogram_quantile` of the step's bucket increase), never an
average of the intervals' quantiles.

The critical throughput, with its uncertainty:
- when the service served clearly less than it was sent at the step that broke (it was saturated:
  a queue grew, or it answered with errors), its capacity is what it served there: the mean of
  that step's per-interval throughputs of successful requests (its first interval left out: it
  still holds the step before's), give or take their standard error (at least one request over
  the time measured);
- otherwise the knee lies between the last step that held and the one that broke: the middle of
  their throughputs, give or take half the gap.

Memory per request is the robust slope (Theil-Sen, gpuscope.core.leak.growth) of the service's
memory against the requests it had served, over every interval of the ramp: memory that stays
grows with requests, and what each request holds only while it runs does not. Per step, the
growth over the step divided by its requests.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuscope.core.leak.growth import theil_sen
from gpuscope.core.serving.model import Signals

SCHEMA = "gpuscope.ramp/1"
SATURATED_SHARE = 0.97  # served below this share of what was sent: the service could not keep up
MAX_SLOPE_POINTS = 400  # memory points through which the slope is drawn (evenly thinned beyond)
STOPPED_BY = ("p99", "error-rate", "max-rate", "max-time", "interrupted", "service", "load")


@dataclass(frozen=True)
class Interval:
    """One measuring interval."""

    index: int
    step: int
    rate: float  # the load asked for (requests/s)
    offset_s: float  # from the ramp's start
    duration_s: float
    sent: int
    ok: int
    errors: int
    client_p95_s: float | None
    client_p99_s: float | None
    tokens: int | None  # in the successful answers (chat usage)
    turns: int
    service: Signals | None  # over the interval, from the service's /metrics
    rss_bytes: int | None
    gpu_bytes: int | None
    served_total: int  # successful requests since the ramp began, at the interval's end
    p99_s: float | None  # the one judged (service's or client's, as the result says)
    score: float | None
    broke: bool

    @property
    def throughput_rps(self) -> float:
        return _served(self.sent, self.ok, self.duration_s, self.service)

    @property
    def error_rate(self) -> float | None:
        done = self.ok + self.errors
        return self.errors / done if done else None

    def to_json(self) -> dict:
        return {"index": self.index, "step": self.step, "rate": self.rate, "offset_s": round(self.offset_s, 3),
                "duration_s": round(self.duration_s, 3), "sent": self.sent, "ok": self.ok, "errors": self.errors,
                "client_p95_s": self.client_p95_s, "client_p99_s": self.client_p99_s, "tokens": self.tokens,
                "turns": self.turns, "service": self.service.to_json() if self.service else None,
                "rss_bytes": self.rss_bytes, "gpu_bytes": self.gpu_bytes, "p99_s": self.p99_s,
                "score": None if self.score is None else round(self.score, 3), "broke": self.broke}


@dataclass(frozen=True)
class Step:
    """The intervals at one load."""

    number: int
    rate: float
    duration_s: float
    sent: int
    ok: int
    errors: int
    client_p95_s: float | None
    client_p99_s: float | None
    service: Signals | None  # over the whole step
    tokens_per_s: float | None  # client-side (chat usage); the service's is in `service`
    rss_growth_bytes: int | None
    gpu_growth_bytes: int | None
    memory_per_request_bytes: float | None
    memory_per_turn_bytes: float | None
    turns: int
    broke: bool
    last_error: str | None = None  # what the last failed request met (the client's words)

    @property
    def throughput_rps(self) -> float:
        return _served(self.sent, self.ok, self.duration_s, self.service)

    @property
    def error_rate(self) -> float | None:
        done = self.ok + self.errors
        return self.errors / done if done else (self.service.error_rate if self.service else None)

    @property
    def generated_tokens_per_s(self) -> float | None:
        """Tokens generated a second: the service's own count where it has one, else the chat usage
        gpuscope read in its answers."""
        own = self.service.tokens_per_s if self.service is not None else None
        return own if own is not None else self.tokens_per_s

    def to_json(self) -> dict:
        return {"number": self.number, "rate": self.rate, "duration_s": round(self.duration_s, 3), "sent": self.sent,
                "ok": self.ok, "errors": self.errors, "throughput_rps": round(self.throughput_rps, 4),
                "error_rate": self.error_rate, "client_p95_s": self.client_p95_s, "client_p99_s": self.client_p99_s,
                "service": self.service.to_json() if self.service else None, "tokens_per_s": self.tokens_per_s,
                "rss_growth_bytes": self.rss_growth_bytes, "gpu_growth_bytes": self.gpu_growth_bytes,
                "memory_per_request_bytes": _round(self.memory_per_request_bytes),
                "memory_per_turn_bytes": _round(self.memory_per_turn_bytes), "turns": self.turns, "broke": self.broke,
                "last_error": self.last_error}


@dataclass(frozen=True)
class Moved:
    """A signal at the step before the knee and at the knee."""

    name: str
    before: float | None
    at: float | None
    unit: str  # "s", "bytes", "fraction", "requests", "tokens/s"

    def to_json(self) -> dict:
        return {"name": self.name, "before": self.before, "at": self.at, "unit": self.unit}


@dataclass(frozen=True)
class Knee:
    """Where the service stopped keeping up: the critical throughput and what moved there."""

    critical_rps: float
    uncertainty_rps: float
    step: int
    rate: float
    method: str  # "saturated" | "between-steps"
    moved: tuple[Moved, ...] = ()

    def to_json(self) -> dict:
        return {"critical_rps": round(self.critical_rps, 4), "uncertainty_rps": round(self.uncertainty_rps, 4),
                "step": self.step, "rate": self.rate, "method": self.method, "moved": [m.to_json() for m in self.moved]}


@dataclass(frozen=True)
class Site:
    """Code whose allocations stayed while the ramp ran (memray through the service's probe)."""

    function: str
    file: str
    line: int
    bytes: int
    count: int
    bytes_per_request: float | None
    stack: tuple[tuple[str, str, int], ...] = ()  # the code path to it (function, file, line), innermost first

    def to_json(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line, "bytes": self.bytes, "count": self.count,
                "bytes_per_request": _round(self.bytes_per_request),
                "stack": [{"function": f, "file": file, "line": line} for f, file, line in self.stack]}


@dataclass(frozen=True)
class MemoryFinding:
    """Memory grown per request (and per conversation turn) over the ramp, and the code that kept it."""

    per_request_bytes: float | None = None
    per_turn_bytes: float | None = None
    gpu_per_request_bytes: float | None = None
    sites: tuple[Site, ...] = ()
    sites_requests: int | None = None  # the requests served while the sites were tracked
    note: str | None = None

    def to_json(self) -> dict:
        return {"per_request_bytes": _round(self.per_request_bytes), "per_turn_bytes": _round(self.per_turn_bytes),
                "gpu_per_request_bytes": _round(self.gpu_per_request_bytes), "sites": [s.to_json() for s in self.sites],
                "sites_requests": self.sites_requests, "note": self.note}


@dataclass(frozen=True)
class RampResult:
    target: str
    mode: str  # "http" | "chat" | "command"
    settings: dict
    started: float  # seconds since the epoch
    duration_s: float
    p99_source: str  # "service" | "client": which P99 the stop rule judged
    intervals: tuple[Interval, ...]
    steps: tuple[Step, ...]
    stopped_by: str
    stop_reason: str
    knee: Knee | None
    memory: MemoryFinding = field(default_factory=MemoryFinding)
    notes: tuple[str, ...] = ()

    @property
    def found_knee(self) -> bool:
        return self.knee is not None

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "target": self.target, "mode": self.mode, "settings": self.settings,
                "started": self.started, "duration_s": round(self.duration_s, 3), "p99_source": self.p99_source,
                "stopped_by": self.stopped_by, "stop_reason": self.stop_reason,
                "knee": self.knee.to_json() if self.knee else None, "memory": self.memory.to_json(),
                "steps": [s.to_json() for s in self.steps], "intervals": [i.to_json() for i in self.intervals],
                "notes": list(self.notes)}


def _served(sent: int, ok: int, duration_s: float, service: Signals | None) -> float:
    """Successful requests a second: counted by gpuscope when it sent the load, else (the user's
    load command) the service's own count."""
    if sent == 0 and service is not None and service.requests_per_s is not None:
        return service.requests_per_s * (1 - (service.error_rate or 0.0))
    return ok / duration_s if duration_s > 0 else 0.0


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# -- the conclusions --------------------------------------------------------------------------------


def find_knee(steps: Sequence[Step], intervals: Sequence[Interval], knee_step: int | None) -> Knee | None:
    """The critical throughput at step `knee_step` (where the P99 broke or errors passed the limit)."""
    if knee_step is None:
        return None
    at = next((s for s in steps if s.number == knee_step), None)
    if at is None:
        return None
    before = next((s for s in reversed(steps) if s.number < knee_step), None)
    own = [i for i in intervals if i.step == knee_step and i.duration_s > 0]
    saturated = at.sent > 0 and at.ok < SATURATED_SHARE * at.sent  # queued, or refused with errors
    if saturated or before is None:
        # the breaking intervals say what it serves at its limit (those before the first break
        # may still have been filling the queue)
        broken = [i for i in own if i.broke] or own
        if len(broken) > 1 and broken[0] is own[0]:
            broken = broken[1:]  # the step's first interval still holds the step before's requests
        rates = [i.throughput_rps for i in broken]
        critical = statistics.fmean(rates) if rates else at.throughput_rps
        spread = statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) > 1 else 0.0
        floor = 1.0 / max(sum(i.duration_s for i in broken), 1e-9)  # one request over the time measured
        knee = Knee(critical, max(spread, floor), at.number, at.rate, "saturated")
    else:
        low, high = before.throughput_rps, at.throughput_rps
        knee = Knee((low + high) / 2, abs(high - low) / 2, at.number, at.rate, "between-steps")
    return Knee(knee.critical_rps, knee.uncertainty_rps, knee.step, knee.rate, knee.method, what_moved(before, at))


def what_moved(before: Step | None, at: Step) -> tuple[Moved, ...]:
    """The signals of the step before the knee beside the knee's own (those known at either)."""
    def service(step: Step | None, name: str) -> float | None:
        return step.service.get(name) if step is not None and step.service is not None else None

    rows = [
        Moved("service P99", service(before, "e2e_latency_p99_s"), service(at, "e2e_latency_p99_s"), "s"),
        Moved("client P99", before.client_p99_s if before else None, at.client_p99_s, "s"),
        Moved("TTFT P95", service(before, "ttft_p95_s"), service(at, "ttft_p95_s"), "s"),
        Moved("queue", service(before, "queue_depth"), service(at, "queue_depth"), "requests"),
        Moved("KV-cache", service(before, "kv_cache_usage"), service(at, "kv_cache_usage"), "fraction"),
        Moved("tokens/s", before.generated_tokens_per_s if before else None, at.generated_tokens_per_s, "tokens/s"),
        Moved("error rate", before.error_rate if before else None, at.error_rate, "fraction"),
        Moved("memory per request", before.memory_per_request_bytes if before else None, at.memory_per_request_bytes,
              "bytes"),
        Moved("GPU memory grown", before.gpu_growth_bytes if before else None, at.gpu_growth_bytes, "bytes"),
    ]
    return tuple(m for m in rows if m.before is not None or m.at is not None)


def memory_slope(intervals: Sequence[Interval], gpu: bool = False) -> float | None:
    """Bytes the service kept per request it served: the Theil-Sen slope of memory over requests served."""
    values = [(i.served_total, i.gpu_bytes if gpu else i.rss_bytes) for i in intervals]
    points = [(float(n), float(v)) for n, v in values if v is not None]
    if len({p[0] for p in points}) < 3:
        return None
    if len(points) > MAX_SLOPE_POINTS:  # Theil-Sen is quadratic in its points
        stride = len(points) / MAX_SLOPE_POINTS
        points = [points[int(k * stride)] for k in range(MAX_SLOPE_POINTS)]
    return theil_sen(points)
