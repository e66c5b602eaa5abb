"""The memory gate of `gpuscope check`: what a round measured, the baseline file, the verdict.

A check drives a service through rounds (gpuscope.core.gate.run) and records, per round and per
memory series ("rss": the resident memory of the service's process tree; "gpu0", "gpu1", ...:
its GPU memory per device), the **floor**: the lowest memory in the round's last, quiet seconds
(after the load command has exited), i.e. what the round left behind. Round 0 is the reference:
the last warm-up round, or the idle service before round 1 when there is no warm-up.

Growth per round is the Theil-Sen slope through the floors of round 0 and the judged rounds (one
odd round cannot move it); the **noise** of a run is the largest distance of a floor from that
line, and the slope's **uncertainty** the floors' robust scatter about it (1.4826 x the median
absolute distance) over the spread of the rounds (sqrt(sum (round - mean round)^2)), as for a
least-squares slope: it shrinks as rounds are added. A series fails when its growth per round
exceeds the baseline's by more than the **allowance**:

    allowance = max(tolerance x the baseline's round-0 floor, NOISE_FACTOR x max(uncertainty of
                    the baseline, uncertainty of this run))

so the tolerance is a share of the memory the service holds (a few percent), and a service whose
floors scatter (noisy temporaries) is given room for what that scatter can do to the slope over
this many rounds, not for the scatter itself: a steady rise fails however noisy the floors once
there are rounds enough to see it.

The allocation sites decide where the floors cannot: memray, inside the service, reports per
round what the round allocated and still held at its end. A site that kept a steady amount in
every tracked judged round (each at least STEADY_SHARE of its largest) is memory kept round after
round; the `sites` criterion fails when such sites keep more per round than in the baseline by
more than the tolerance's share of the floor, and the floor itself did not stay flat or fall (so
an object replaced by one of the same size each round, whose memory the floor does not show, is
not counted: its floor trend is about zero, which for noisy floors it may not read as).
When both runs counted requests, the baseline's growth is scaled to this run's requests per
round (the comparison is per request, whatever the speed of the machine). Without a baseline,
the rounds are compared with a service that does not grow.

A second criterion needs no baseline: the leak detector (gpuscope.core.leak) over every sample
of the judged rounds, which calls a leak "outright" when the floor climbs fast and steadily.

Pure functions and plain data; nothing here starts a process or prints.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuscope.core.leak.growth import theil_sen
from gpuscope.core.leak import LeakAssessment
from gpuscope.core.common.atomic import RefusedPath, read_regular
from gpuscope.core.common.json_depth import MAX_VALUES, too_large
from gpuscope.core.common.units import format_size, whole_number
from gpuscope.errors import UsageError

BASELINE_SCHEMA = "gpuscope.check-baseline/1"
RESULT_SCHEMA = "gpuscope.check/1"
DEFAULT_TOLERANCE_PCT = 3.0
NOISE_FACTOR = 2.0  # a straight line through floors that scatter by e can rise ~e per round
MAX_BASELINE_BYTES = 16 << 20
MAX_BASELINE_ROUNDS = 10_000  # a check judges at most 1000 rounds (its warm-up rounds come first)
MAX_BASELINE_DEPTH = 16  # a baseline nests 6 deep (rounds, a round, its sites, a site)
SITES_PER_ROUND = 10  # allocation sites kept per round (largest first)
SITES_SHOWN = 5
MIN_SITE_EXCESS = 64 << 10  # a site must hold this much more per round than in the baseline to count
STEADY_SHARE = 0.9  # a steady site kept at least this share of its largest amount in every judged round
MIN_STEADY_ROUNDS = 2  # judged rounds with sites that a steady site needs
ROBUST_SIGMA = 1.4826  # median absolute deviation -> standard deviation, for normal scatter


class BaselineError(UsageError):
    """The baseline file cannot be used; the message is one line that says what to do."""


# -- what a round measured --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Site:
    """An allocation site of memory that stayed: allocated during a round and still held at its end."""

    function: str
    file: str
    line: int
    bytes: int
    count: int = 0
    # the code path to it (function, file, line), innermost first: the heaviest stack behind it
    stack: tuple[tuple[str, str, int], ...] = field(default=(), compare=False)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.function, self.file, self.line)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def to_json(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line, "bytes": self.bytes, "count": self.count}

    @classmethod
    def from_json(cls, data: object) -> Site:
        if not isinstance(data, dict):
            raise ValueError("a site is not an object")
        return cls(str(data["function"]), str(data["file"]), _int(data["line"]), _int(data["bytes"]),
                   _int(data.get("count", 0)))


@dataclass(frozen=True, slots=True)
class Memory:
    """One memory series in one round: its floor (what the round left behind) and its peak."""

    floor: int | None
    peak: int | None = None

    def to_json(self) -> dict:
        return {"floor": self.floor, "peak": self.peak}


@dataclass(frozen=True)
class Round:
    """What one round measured. `number` 1..N for the judged rounds; 0 for the reference (the
    last warm-up round, or the idle service before round 1), negative for earlier warm-ups."""

    number: int
    warmup: bool
    duration_s: float
    memory: Mapping[str, Memory]  # series ("rss", "gpu0", ...) -> figures
    requests: int | None = None  # requests the service counted during the round
    p95_s: float | None = None  # P95 latency of those requests
    load_exit: int | None = None  # the load command's exit status (None: no load command)
    sites: tuple[Site, ...] | None = None  # None: allocations were not tracked in this round
    completed: bool = True  # False: the round was cut short (the service exited, the load failed)
    note: str | None = None  # why sites are missing, or what cut the round short

    def floor(self, series: str) -> int | None:
        figures = self.memory.get(series)
        return figures.floor if figures is not None else None

    def to_json(self) -> dict:
        return {
            "round": self.number,
            "warmup": self.warmup,
            "completed": self.completed,
            "duration_s": round(self.duration_s, 3),
            "load_exit": self.load_exit,
            "memory": {name: figures.to_json() for name, figures in sorted(self.memory.items(), key=_series_order)},
            "requests": self.requests,
            "p95_s": _finite(self.p95_s),
            "sites": None if self.sites is None else [s.to_json() for s in self.sites],
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: object) -> Round:
        if not isinstance(data, dict):
            raise ValueError("a round is not an object")
        memory = data["memory"]
        if not isinstance(memory, dict):
            raise ValueError("a round's memory is not an object")
        sites = data.get("sites")
        return cls(
            number=_int(data["round"]),
            warmup=bool(data.get("warmup", False)),
            duration_s=_number(data["duration_s"]),
            memory={str(k): Memory(_optional_int(v.get("floor")), _optional_int(v.get("peak")))
                    for k, v in memory.items() if isinstance(v, dict)},
            requests=_optional_int(data.get("requests")),
            p95_s=_optional_number(data.get("p95_s")),
            load_exit=_optional_int(data.get("load_exit")),
            sites=None if sites is None else tuple(Site.from_json(s) for s in sites),
            completed=bool(data.get("completed", True)),
            note=data.get("note") if isinstance(data.get("note"), str) else None,
        )


@dataclass(frozen=True)
class CheckRun:
    """Everything a check measured."""

    command: str  # shown (redacted)
    settings: Mapping[str, object]  # how the rounds were driven (mode, load, round_s, settle_s, ...)
    rounds: tuple[Round, ...]
    leak: Mapping[str, LeakAssessment] = field(default_factory=dict)  # series -> the detector's word
    exit_status: int | None = None  # the service's, when it exited before the rounds ended
    stopped: str | None = None  # why the rounds ended early (one line), None when all ran
    stopped_by: str | None = None  # "service" (it exited, or never got ready) | "load" (failed, timed out)
    notes: tuple[str, ...] = ()
    # The first round whose floor holds the memory of every instrument loaded into the service
    # (memray, loaded once before round 0, or at the start of the round where a process's probe
    # first showed): the floors of earlier rounds lack it, so the growth line starts here.
    comparable_from: int = 0

    @property
    def judged(self) -> tuple[Round, ...]:
        return tuple(r for r in self.rounds if not r.warmup and r.completed)

    def series(self) -> list[str]:
        names = {name for r in self.rounds for name in r.memory}
        return sorted(names, key=lambda n: _series_order((n, None)))


# -- the baseline file -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    path: str
    rounds: tuple[Round, ...]
    settings: Mapping[str, object]
    command: str = ""
    created: str | None = None
    comparable_from: int = 0  # as in CheckRun

    @property
    def judged(self) -> tuple[Round, ...]:
        return tuple(r for r in self.rounds if not r.warmup and r.completed)

    @property
    def reference(self) -> Round | None:
        return next((r for r in self.rounds if r.number == 0), None)


def baseline_json(run: CheckRun, *, version: str, created: str) -> dict:
    """The baseline file's object for a known-good run."""
    return {
        "schema": BASELINE_SCHEMA,
        "gpuscope": version,
        "created": created,
        "command": run.command,
        "settings": dict(run.settings),
        "rounds": [r.to_json() for r in run.rounds if r.number >= 0],
        "comparable_from": run.comparable_from,
    }


def load_baseline(path: str) -> Baseline:
    """Read and check a baseline file. BaselineError (one line) when it is missing, unreadable,
    not JSON, of another schema, or without the rounds a comparison needs."""
    try:
        if os.path.isdir(path):
            raise IsADirectoryError
        raw = read_regular(path, MAX_BASELINE_BYTES)  # a FIFO or a device is refused, not waited on
    except RefusedPath as exc:
        raise BaselineError(f"baseline {exc}") from None
    except FileNotFoundError:
        raise BaselineError(
            f"baseline {path} does not exist: write one from a known-good run with --update-baseline"
        ) from None
    except IsADirectoryError:
        raise BaselineError(f"baseline {path} is a folder, not a file") from None
    except OSError as exc:
        raise BaselineError(f"cannot read baseline {path}: {exc.strerror or exc}") from None
    if too_large(raw, MAX_BASELINE_DEPTH) is not None:
        raise BaselineError(
            f"baseline {path} is not valid JSON (corrupt or truncated), or is nested deeper than {MAX_BASELINE_DEPTH} "
            f"or holds more than {MAX_VALUES:,} values, as no baseline gpuscope writes does: write it again with "
            "--update-baseline"
        )
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BaselineError(
            f"baseline {path} is not valid JSON (corrupt or truncated): write it again with --update-baseline"
        ) from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != BASELINE_SCHEMA:
        what = f"schema {schema!r}" if isinstance(schema, str) else "no schema"
        hint = " (a check result, not a baseline)" if schema == RESULT_SCHEMA else ""
        raise BaselineError(
            f"baseline {path} has {what}{hint}, expected {BASELINE_SCHEMA!r}: write one with --update-baseline"
        )
    listed = data.get("rounds")
    if isinstance(listed, list) and len(listed) > MAX_BASELINE_ROUNDS:
        raise BaselineError(f"baseline {path} holds {len(listed):,} rounds; a check writes at most "
                            f"{MAX_BASELINE_ROUNDS:,}: not a gpuscope baseline")
    try:
        rounds = tuple(Round.from_json(r) for r in data["rounds"])
        settings = data.get("settings") or {}
        if not isinstance(settings, dict):
            raise ValueError("settings is not an object")
        comparable_from = _int(data.get("comparable_from", 0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BaselineError(f"baseline {path} is damaged ({_why(exc)}): write it again with --update-baseline") from None
    baseline = Baseline(path, rounds, settings, str(data.get("command") or ""), data.get("created"), comparable_from)
    batch = baseline.settings.get("mode") == "batch"
    if not baseline.judged or (not batch and (baseline.reference is None or baseline.reference.floor("rss") is None)):
        raise BaselineError(
            f"baseline {path} holds no completed rounds to compare with: write it again with --update-baseline"
        )
    return baseline


# -- the verdict -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Growth:
    """How one series grew over the rounds of one run."""

    per_round: float | None  # bytes per round (Theil-Sen slope through the floors)
    noise: float  # bytes: the largest distance of a floor from that line
    reference_floor: int | None  # round 0's floor
    requests_per_round: float | None  # mean over the judged rounds, when every one counted
    uncertainty: float = 0.0  # bytes per round: the slope's robust standard error

    def to_json(self) -> dict:
        return {
            "per_round_bytes": _round(self.per_round),
            "noise_bytes": _round(self.noise),
            "uncertainty_bytes": _round(self.uncertainty),
            "reference_floor_bytes": self.reference_floor,
            "requests_per_round": _round(self.requests_per_round, 2),
            "per_request_bytes": _round(self.per_request, 2),
        }

    @property
    def per_request(self) -> float | None:
        if self.per_round is None or not self.requests_per_round:
            return None
        return self.per_round / self.requests_per_round


@dataclass(frozen=True)
class Criterion:
    """One thing the gate checks. `passed` None: it could not be judged (said why in `message`)."""

    name: str
    passed: bool | None
    message: str
    figures: Mapping[str, object] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return {True: "pass", False: "fail", None: "skipped"}[self.passed]

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "message": self.message, "figures": dict(self.figures)}


@dataclass(frozen=True)
class GrownSite:
    site: Site  # the run's figures (bytes: the most held at the end of a round)
    per_round: float  # bytes held at the end of a round, mean over the tracked judged rounds
    baseline_per_round: float  # the same in the baseline (0 when the baseline never saw it)

    @property
    def excess(self) -> float:
        return self.per_round - self.baseline_per_round

    def to_json(self) -> dict:
        return {"function": self.site.function, "file": self.site.file, "line": self.site.line,
                "bytes_per_round": round(self.per_round), "baseline_bytes_per_round": round(self.baseline_per_round)}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    criteria: tuple[Criterion, ...]
    growth: Mapping[str, Growth]  # series -> this run's growth
    baseline_growth: Mapping[str, Growth]  # series -> the baseline's (empty without a baseline)
    allowance: Mapping[str, float]  # series -> the allowance the growth was judged with
    sites: tuple[GrownSite, ...]  # sites holding more per round than in the baseline, most first
    round_failures: Mapping[int, str]  # round number -> why that round counts as failed

    @property
    def failed(self) -> tuple[Criterion, ...]:
        return tuple(c for c in self.criteria if c.passed is False)


def growth_of(rounds: Sequence[Round], series: str, since: int = 0) -> Growth:
    """Growth per round and noise of one series over round `since` (0: the reference) and the
    completed judged rounds after it."""
    points = [(float(r.number), float(f)) for r in rounds
              if r.completed and r.number >= since and (f := r.floor(series)) is not None]
    reference = next((r.floor(series) for r in rounds if r.number == 0), None)
    judged = [r for r in rounds if r.number > 0 and r.completed]
    counted = [r.requests for r in judged if r.requests is not None]
    requests = sum(counted) / len(counted) if judged and len(counted) == len(judged) else None
    slope = theil_sen(points) if len(points) >= 2 else None
    if slope is None:
        return Growth(None, 0.0, reference, requests)
    intercept = _median([v - slope * t for t, v in points])
    residuals = [abs(v - (intercept + slope * t)) for t, v in points]
    mean_t = sum(t for t, _ in points) / len(points)
    spread = math.sqrt(sum((t - mean_t) ** 2 for t, _ in points))
    uncertainty = ROBUST_SIGMA * _median(residuals) / spread if len(points) > 2 else 0.0
    return Growth(slope, max(residuals), reference, requests, uncertainty)


def judge(run: CheckRun, baseline: Baseline | None, tolerance_pct: float = DEFAULT_TOLERANCE_PCT, *,
          compare: bool = True) -> Verdict:
    """The gate's verdict on a run, against a baseline (or against no growth without one).

    `compare` False: the run is to become the baseline; its growth is recorded, not judged (the
    other criteria still are: a run that crashed or leaks outright is no known-good run)."""
    tolerance = tolerance_pct / 100.0
    if run.settings.get("mode") == "batch":
        return _judge_batch(run, baseline, tolerance, tolerance_pct, compare)
    criteria: list[Criterion] = [_command_criterion(run)]
    if run.settings.get("load"):
        criteria.append(_load_criterion(run))
    growth: dict[str, Growth] = {}
    base_growth: dict[str, Growth] = {}
    allowance: dict[str, float] = {}
    round_failures: dict[int, str] = {r.number: r.note or "cut short" for r in run.rounds if not r.completed}
    for series in run.series():
        g = growth_of(run.rounds, series, run.comparable_from)
        growth[series] = g
        b = growth_of(baseline.rounds, series, baseline.comparable_from) if baseline is not None else None
        if b is not None and b.per_round is not None:
            base_growth[series] = b
        if not compare:
            criteria.append(Criterion(f"{series}-growth", None, f"{label(series)} floor {_moved(g.per_round)} "
                                      "per round: recorded for the baseline, not judged"))
            continue
        criterion, allowed, expected = _growth_criterion(series, g, b if b and b.per_round is not None else None,
                                                         tolerance, tolerance_pct, len(run.judged))
        criteria.append(criterion)
        if allowed is not None:
            allowance[series] = allowed
        if criterion.passed is False and allowed is not None:
            previous = {r.number: r.floor(series) for r in run.rounds if r.completed}
            for r in run.judged:
                before, now = previous.get(r.number - 1), r.floor(series)
                if before is not None and now is not None and now - before > expected + allowed:
                    round_failures.setdefault(
                        r.number, f"{label(series)} floor grew {format_size(now - before)} in this round "
                                  f"(allowed {format_size(expected + allowed)})")
    criteria.append(_leak_criterion(run))
    criteria.append(_sites_criterion(run, baseline, growth.get("rss"), tolerance, tolerance_pct, compare))
    sites = grown_sites(run.rounds, baseline.rounds if baseline is not None else ())
    passed = all(c.passed is not False for c in criteria)
    return Verdict(passed, tuple(criteria), growth, base_growth, allowance, sites, round_failures)


def _growth_criterion(series: str, g: Growth, b: Growth | None, tolerance: float, tolerance_pct: float,
                      judged: int) -> tuple[Criterion, float | None, float]:
    name = f"{series}-growth"
    if g.per_round is None or judged == 0:
        return Criterion(name, None, f"{label(series)}: no completed round to judge"), None, 0.0
    reference = b.reference_floor if b is not None and b.reference_floor else g.reference_floor
    noise = max(g.noise, b.noise if b is not None else 0.0)
    uncertainty = max(g.uncertainty, b.uncertainty if b is not None else 0.0)
    share = tolerance * (reference or 0)
    allowed = max(share, NOISE_FACTOR * uncertainty)
    expected = 0.0
    if b is not None:
        expected = max(0.0, b.per_round or 0.0)
        if g.requests_per_round and b.requests_per_round:
            expected *= g.requests_per_round / b.requests_per_round  # per request, at this run's load
    limit = expected + allowed
    figures = {
        "growth_per_round_bytes": _round(g.per_round),
        "baseline_growth_per_round_bytes": _round(b.per_round) if b is not None else None,
        "expected_growth_per_round_bytes": _round(expected),
        "allowance_bytes": _round(allowed),
        "noise_bytes": _round(noise),
        "uncertainty_bytes": _round(uncertainty),
        "tolerance_pct": tolerance_pct,
        "reference_floor_bytes": reference,
        "growth_per_request_bytes": _round(g.per_request, 2),
    }
    if b is None:
        against = "no baseline: compared with no growth"
    elif expected != max(0.0, b.per_round or 0.0):
        against = (f"baseline {format_size(b.per_round, sign=True)}/round, {format_size(expected, sign=True)} "
                   "at this run's requests per round")
    else:
        against = f"baseline {format_size(b.per_round, sign=True)}/round"
    why_allowed = (f"{tolerance_pct:g}% of {format_size(reference)}" if allowed == share
                   else f"{NOISE_FACTOR:g} x the trend's uncertainty of {format_size(uncertainty)} over these rounds")
    per_request = f", {format_size(g.per_request, sign=True)} per request" if g.per_request is not None else ""
    message = (f"{label(series)} floor {_moved(g.per_round)} per round{per_request} "
               f"({against}; allowed {format_size(limit, sign=True)}: {why_allowed})")
    return Criterion(name, g.per_round <= limit, message, figures), allowed, expected


def _judge_batch(run: CheckRun, baseline: Baseline | None, tolerance: float, tolerance_pct: float,
                 compare: bool) -> Verdict:
    """A batch command, run once per round: every run must succeed, and the medians of its peaks
    and of what each run held at its end (its `floor`) must stay within the tolerance of the
    baseline's, as pytest-memray's `limit_memory` and `limit_leaks` do for a test. What was held
    at the end is judged only against a baseline that recorded it the same way."""
    if run.stopped_by == "service":
        command = Criterion("command", False, run.stopped or "the command failed", {"exit_status": run.exit_status})
    else:
        command = Criterion("command", True, f"the command succeeded in each of the {len(run.judged)} runs", {})
    criteria = [command]
    same_end = baseline is None or baseline.settings.get("retained_from_last") == run.settings.get("retained_from_last")
    for series in run.series():
        criteria.append(_batch_criterion(series, "peak", "peak", run, baseline, tolerance, tolerance_pct, compare))
        criteria.append(_batch_criterion(
            series, "retained", "held at its end", run, baseline, tolerance, tolerance_pct, compare,
            unjudged=None if same_end else ("the baseline did not record what its runs held at their end: "
                                            "write it again with --update-baseline")))
    passed = all(c.passed is not False for c in criteria)
    return Verdict(passed, tuple(criteria), {}, {}, {}, (), {r.number: r.note or "failed" for r in run.rounds
                                                           if not r.completed})


def _batch_figure(rounds: Sequence[Round], series: str, kind: str) -> float | None:
    values = [m.peak if kind == "peak" else m.floor for r in rounds
              if r.number > 0 and r.completed and (m := r.memory.get(series)) is not None]
    known = [float(v) for v in values if v is not None]
    return _median(known) if known else None


def _batch_criterion(series: str, kind: str, what: str, run: CheckRun, baseline: Baseline | None, tolerance: float,
                     tolerance_pct: float, compare: bool, unjudged: str | None = None) -> Criterion:
    """`unjudged`: why the baseline's figure is not comparable (said in place of a judgement)."""
    name = f"{series}-{kind}"
    mine = _batch_figure(run.rounds, series, kind)
    theirs = _batch_figure(baseline.rounds, series, kind) if baseline is not None else None
    figures = {"median_bytes": _round(mine), "baseline_median_bytes": _round(theirs), "tolerance_pct": tolerance_pct}
    if mine is None:
        return Criterion(name, None, f"{label(series)}: no completed run to judge", figures)
    said = f"{label(series)} {what}: {format_size(mine)} (median of the runs)"
    if not compare:
        return Criterion(name, None, f"{said}: recorded for the baseline, not judged", figures)
    if theirs is None:
        return Criterion(name, None, f"{said}: no baseline to compare with", figures)
    if unjudged is not None:
        return Criterion(name, None, f"{said}: {unjudged}", figures)
    limit = theirs * (1 + tolerance)
    figures["limit_bytes"] = _round(limit)
    return Criterion(name, mine <= limit, f"{said}; baseline {format_size(theirs)}, allowed {format_size(limit)} "
                     f"(+{tolerance_pct:g}%)", figures)


def _command_criterion(run: CheckRun) -> Criterion:
    if run.stopped_by == "service":
        return Criterion("command", False, run.stopped or "the service stopped", {"exit_status": run.exit_status})
    if run.stopped is not None:
        return Criterion("command", True, "the service kept running until the rounds stopped", {"exit_status": None})
    return Criterion("command", True, f"the service ran through all {run.settings.get('rounds')} rounds",
                     {"exit_status": None})


def _load_criterion(run: CheckRun) -> Criterion:
    if run.stopped_by == "load":
        return Criterion("load", False, run.stopped or "the load command failed",
                         {"exit_status": next((r.load_exit for r in run.rounds if not r.completed), None)})
    ran = sum(1 for r in run.rounds if r.load_exit == 0)
    if ran == 0:
        return Criterion("load", None, f"the load command never ran ({run.stopped or 'no round ran'})", {})
    return Criterion("load", True, f"the load command succeeded in each of the {ran} rounds it ran", {})


def _leak_criterion(run: CheckRun) -> Criterion:
    if not run.leak:
        return Criterion("leak", None, "the leak detector had no samples of the judged rounds")
    leaking = {s: a for s, a in run.leak.items() if a.is_leak}
    figures = {s: a.to_json() for s, a in run.leak.items()}
    if leaking:
        series, a = max(leaking.items(), key=lambda kv: kv[1].growth_bytes_per_s or 0.0)
        return Criterion("leak", False, f"the leak detector calls {label(series)} a leak: {a.reason}", figures)
    words = "; ".join(f"{label(s)}: {a.verdict} ({a.pattern})" for s, a in run.leak.items())
    return Criterion("leak", True, f"no leak found outright ({words})", figures)


def steady_sites(rounds: Sequence[Round], baseline_rounds: Sequence[Round]) -> tuple[list[GrownSite], int]:
    """(sites that kept a steady amount in every tracked judged round, beyond the baseline's per
    round, most first; how many judged rounds were tracked)."""
    tracked = [r for r in rounds if r.number > 0 and r.completed and r.sites is not None]
    theirs, _ = _per_round(baseline_rounds)
    kept: dict[tuple, list[Site]] = {}
    for r in tracked:
        for s in r.sites or ():
            kept.setdefault(s.key, []).append(s)
    out = []
    for key, seen in kept.items():
        if len(seen) != len(tracked) or len(tracked) < MIN_STEADY_ROUNDS:
            continue
        amounts = [float(s.bytes) for s in seen]
        middle = _median(amounts)
        if middle <= 0 or min(amounts) < STEADY_SHARE * max(amounts):
            continue
        g = GrownSite(max(seen, key=lambda s: s.bytes), middle, theirs.get(key, 0.0))
        if g.excess >= MIN_SITE_EXCESS:
            out.append(g)
    out.sort(key=lambda g: -g.excess)
    return out, len(tracked)


def _sites_criterion(run: CheckRun, baseline: Baseline | None, rss: Growth | None, tolerance: float,
                     tolerance_pct: float, compare: bool) -> Criterion:
    steady, tracked = steady_sites(run.judged, baseline.rounds if baseline is not None else ())
    if tracked < MIN_STEADY_ROUNDS:
        return Criterion("sites", None, f"allocation sites were tracked in {tracked} judged "
                         f"{'round' if tracked == 1 else 'rounds'}: {MIN_STEADY_ROUNDS} are needed")
    reference = (baseline.reference.floor("rss") if baseline is not None and baseline.reference is not None
                 else None) or (rss.reference_floor if rss is not None else None) or 0
    allowed = tolerance * reference
    kept = sum(g.excess for g in steady)
    floor_rose = rss is not None and rss.per_round is not None and rss.per_round > 0
    figures = {"steady_bytes_per_round": round(kept), "allowance_bytes": round(allowed), "rounds": tracked,
               "sites": [g.to_json() for g in steady[:SITES_SHOWN]]}
    if not steady:
        return Criterion("sites", True if compare else None,
                         f"no allocation site kept a steady amount in each of the {tracked} tracked rounds", figures)
    top = steady[0]
    against = f", baseline {format_size(top.baseline_per_round)}" if baseline is not None else ""
    what = (f"{_site_name(top.site)} kept {format_size(top.per_round)} in each of the {tracked} tracked rounds"
            f"{against}; steady sites keep {format_size(kept, sign=True)} a round"
            f"{' beyond the baseline' if baseline is not None else ''} (allowed {format_size(allowed)}: "
            f"{tolerance_pct:g}% of {format_size(reference)})")
    if not compare:
        return Criterion("sites", None, f"{what}: recorded for the baseline, not judged", figures)
    if kept > allowed and floor_rose:
        return Criterion("sites", False, what, figures)
    why = "within the allowance" if kept <= allowed else "but the floor did not rise"
    return Criterion("sites", True, f"{what}: {why}", figures)


def _site_name(site: Site) -> str:
    return f"{site.function} ({site.where})"


def _moved(per_round: float | None) -> str:
    """'grew +1.0 MiB', 'fell 144 KiB', 'grew N/A'."""
    if per_round is not None and per_round < 0:
        return f"fell {format_size(-per_round)}"
    return f"grew {format_size(per_round, sign=True)}"


def grown_sites(rounds: Sequence[Round], baseline_rounds: Sequence[Round]) -> tuple[GrownSite, ...]:
    """Allocation sites that hold more at the end of a judged round than in the baseline, most first."""
    mine, examples = _per_round(rounds)
    theirs, _ = _per_round(baseline_rounds)
    grown = [GrownSite(examples[k], v, theirs.get(k, 0.0)) for k, v in mine.items()]
    grown = [g for g in grown if g.excess >= MIN_SITE_EXCESS]
    grown.sort(key=lambda g: -g.excess)
    return tuple(grown[:SITES_SHOWN])


def _per_round(rounds: Sequence[Round]) -> tuple[dict[tuple, float], dict[tuple, Site]]:
    tracked = [r for r in rounds if r.number > 0 and r.completed and r.sites is not None]
    totals: dict[tuple, float] = {}
    examples: dict[tuple, Site] = {}
    for r in tracked:
        for s in r.sites or ():
            totals[s.key] = totals.get(s.key, 0.0) + s.bytes
            if s.key not in examples or s.bytes > examples[s.key].bytes:
                examples[s.key] = s
    return {k: v / len(tracked) for k, v in totals.items()}, examples


# -- words -------------------------------------------------------------------------------------------


def label(series: str) -> str:
    """'rss' -> 'RSS', 'gpu0' -> 'GPU 0'."""
    if series == "rss":
        return "RSS"
    if series.startswith("gpu") and series[3:].isdigit():
        return f"GPU {series[3:]}"
    return series


def _series_order(item: tuple[str, object]) -> tuple[int, int, str]:
    name = item[0]
    if name == "rss":
        return (0, 0, name)
    index = whole_number(name[3:], 3) if name.startswith("gpu") else None
    if index is not None:
        return (1, index, name)
    return (2, 0, name)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _round(x: float | None, digits: int = 0) -> float | int | None:
    if x is None or not math.isfinite(x):
        return None
    return round(x) if digits == 0 else round(x, digits)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a number, not {value!r}")
    return int(value)


def _optional_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a number, not {value!r}")
    return float(value)


def _optional_number(value: object) -> float | None:
    return None if value is None else _number(value)


def _why(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"{exc.args[0]!r} is missing"
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
