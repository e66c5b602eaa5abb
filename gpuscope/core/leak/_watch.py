"""The live watch: many series fed as samples arrive, re-judged incrementally, alerts raised."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace

from gpuscope.core.leak._assessment import LeakAssessment, LeakThresholds
from gpuscope.core.leak._floors import floor_growth
from gpuscope.core.leak._sketch import FloorSketch
from gpuscope.core.leak._life import SERVICE_LIFE_S, WARMUP_S, as_ended_run, as_warming_up, ended_run, warming_up
from gpuscope.core.leak._analysis import _View, _finish, _judge, _with_torch


# --- live -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeakAlert:
    """A series the watch currently calls a leak."""

    key: Hashable
    assessment: LeakAssessment
    raised_at: float  # data time of the first assessment of this run of "leak" verdicts
    # No sample came for this series at the latest time any series was fed: its process exited
    # (or left the device). Such an alert is listed after every live one, and goes once the series
    # has been silent for `LeakWatch.forget_after_s`.
    ended: bool = False

    @property
    def growth_bytes_per_s(self) -> float:
        return self.assessment.growth_bytes_per_s or 0.0

    @property
    def since(self) -> float | None:
        return self.assessment.since

    @property
    def time_to_full_s(self) -> float | None:
        return self.assessment.time_to_full_s


class _Watched:
    __slots__ = ("sketch", "allocated", "reserved", "total", "fresh", "assessed_at", "views", "assessment",
                 "raised_at", "phase", "pending", "fed_at", "started")

    def __init__(self, sketch: FloorSketch, phase: float) -> None:
        self.sketch = sketch
        self.phase = phase  # in [0, 1): spreads the series' horizon refreshes over time
        self.allocated: FloorSketch | None = None
        self.reserved: FloorSketch | None = None
        self.total: float | None = None
        self.fresh = False  # data arrived since the last assessment
        self.assessed_at: float | None = None
        self.views: dict[tuple[str, int], tuple[float, _View | None]] = {}  # (series, horizon) -> (time, view)
        self.assessment: LeakAssessment | None = None
        self.raised_at: float | None = None
        # A young leak awaiting confirmation: (first, latest) time it was called a leak.
        self.pending: tuple[float, float] | None = None
        self.fed_at: float | None = None  # the latest time given to add(), available value or not
        self.started: float | None = None  # when the series' process started, where known


@dataclass
class LeakWatch:
    """Many memory series watched live: feed samples with `add()`, call `update()` once per tick.

    Each series is re-assessed only when new samples arrived and at most once per
    `min_interval_s` of its own data time. A horizon of length h is recomputed at most every
    max(min_interval_s, refresh_fraction x h x (1 + phase)) seconds, the phase in [0, 1) differing
    between series so that their refreshes do not fall on the same tick (a 2 h horizon every 6 to
    12 minutes, the 10 s one every second): a tick costs a few small fits per series, not a pass
    over its samples.
    Memory is bounded: each series is a `FloorSketch` over `window_s`; at most `max_series`
    series are kept (the least recently fed go first). A series that is no longer fed (its
    process exited) is forgotten `forget_after_s` after its last sample, on the data clock of the
    other series: its alert, marked `ended` meanwhile, is never listed above a live one.

    Alerts: a leak whose growth has lasted under three times the fast rule's duration (30 s) is
    raised once it has been called a leak over `confirm_s` seconds of data, with no gap longer
    than that between the calls (until then its verdict reads "inconclusive", confirming): a
    burst that happens to follow a rise of the noise looks like a ramp for a second or two, a
    leak keeps looking like one.

    A process's age and its life count (for series fed with `started`, their process's start):
    growth that began in a process's first `warmup_s` seconds (loading, a warm-up) is not raised
    before the process is twice that old, as long again to see whether it stops (until then it
    reads "inconclusive", warming up; a warm-up that stopped reads "no-leak" by then). A leak whose growth ended with its process, when that
    process lived under `service_life_s` (a `pip install`, a test run, a batch job), is withdrawn:
    the series reads "no-leak", its growth ended with the process. A service that lived longer and
    exited while leaking (killed for its memory) keeps its alert, ended. An alert, once raised,
    is held while later readings are "inconclusive" (the rate dipping under the alert rate, a
    jump too recent to judge) and clears on "no-leak". Not thread-safe: feed and update from one
    thread.
    """

    thresholds: LeakThresholds = LeakThresholds()
    window_s: float = 6 * 3600.0
    bucket_s: float = 1.0
    min_interval_s: float = 1.0
    refresh_fraction: float = 0.05
    confirm_s: float = 3.0
    max_series: int = 2048  # as SeriesStore's: a big node's every process keeps its verdict
    forget_after_s: float = 60.0
    warmup_s: float = WARMUP_S
    service_life_s: float = SERVICE_LIFE_S
    _series: dict[Hashable, _Watched] = field(default_factory=dict, init=False, repr=False, compare=False)
    _born: int = field(default=0, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self._series)

    def keys(self) -> list[Hashable]:
        return list(self._series)

    def footprint(self) -> int:
        """Buckets held over all series (each a dozen numbers): the memory bound in practice."""
        return sum(len(s.sketch) + len(s.allocated or ()) + len(s.reserved or ()) for s in self._series.values())

    def _sketch(self) -> FloorSketch:
        return FloorSketch(bucket_s=self.bucket_s, window_s=self.window_s)

    def add(self, key: Hashable, t: float, value: float | None, *, allocated: float | None = None,
            reserved: float | None = None, total_bytes: float | None = None,
            started: float | None = None) -> None:
        """One sample of series `key` at time t (seconds). None/NaN: not available this time.

        `started`: when the series' process started, on the clock of t (for its age: see above).
        `allocated` / `reserved`: torch's figures for the same process at the same time, when known.
        `total_bytes`: the device's total memory, for the time to full (the latest one is used).
        """
        s = self._series.pop(key, None)  # re-inserted last: dict order is recency of feeding
        if s is None:
            self._born += 1
            s = _Watched(self._sketch(), (self._born * 0.6180339887) % 1.0)
            if len(self._series) >= self.max_series:
                del self._series[next(iter(self._series))]
        self._series[key] = s
        if s.fed_at is None or t > s.fed_at:
            s.fed_at = t
        if s.sketch.add(t, value):
            s.fresh = True
        if allocated is not None:
            s.allocated = s.allocated or self._sketch()
            s.allocated.add(t, allocated)
        if reserved is not None:
            s.reserved = s.reserved or self._sketch()
            s.reserved.add(t, reserved)
        if total_bytes is not None:
            s.total = float(total_bytes)
        if started is not None:
            s.started = started

    def forget(self, key: Hashable) -> None:
        self._series.pop(key, None)

    def recent_growth(self, key: Hashable, window_s: float) -> float | None:
        """Growth per second of the series' floor over its last `window_s` seconds of data (the
        console's GROW column), or None while there is too little data: `floor_growth` of the
        sketch the alerts are judged on, the slope the detector fits through the same floors."""
        s = self._series.get(key)
        last = s.sketch.last_time if s is not None else None
        if s is None or last is None:
            return None
        return floor_growth(s.sketch, last - window_s, self.thresholds)

    def assessment(self, key: Hashable) -> LeakAssessment | None:
        s = self._series.get(key)
        return s.assessment if s is not None else None

    def assessments(self) -> dict[Hashable, LeakAssessment]:
        return {k: s.assessment for k, s in self._series.items() if s.assessment is not None}

    def update(self) -> list[LeakAlert]:
        """Re-assess the series that need it; the current alerts, fastest growth first."""
        newest = self._newest_fed()
        if newest is not None:
            for key in [k for k, s in self._series.items()
                        if s.fed_at is not None and s.fed_at < newest - self.forget_after_s]:
                del self._series[key]
            for s in self._series.values():
                if s.raised_at is not None and s.fed_at is not None and s.fed_at < newest:
                    self._ended(s)
        for s in self._series.values():
            now = s.sketch.last_time
            if not s.fresh or now is None:
                continue
            if s.assessed_at is not None and now - s.assessed_at < self.min_interval_s:
                continue
            s.fresh = False
            s.assessed_at = now
            previous = s.assessment
            a = self._assess(s, now)
            raised = previous is not None and previous.verdict == "leak"
            if s.pending is not None and (a.verdict == "no-leak" or now - s.pending[1] > self.confirm_s):
                s.pending = None  # not called a leak again soon enough: start over
            if a.verdict == "leak" and not raised:
                s.pending = (s.pending[0] if s.pending is not None else now, now)
                young = a.since is not None and now - a.since < 3 * self.thresholds.fast_duration_s
                if young and now - s.pending[0] < self.confirm_s:
                    a = replace(a, verdict="inconclusive", reason=f"{a.reason}; confirming")
            if a.verdict == "leak" and not raised and s.started is not None and warming_up(s.started, a.since, now,
                                                                                       self.warmup_s):
                a = as_warming_up(a, s.started, now)
            if raised and previous is not None and a.verdict == "inconclusive":
                # Hysteresis: a raised alert is held while the readings are inconclusive (the rate
                # dipping under the alert rate, a jump too recent to judge), rather than flickering;
                # it clears on "no-leak". Held, it keeps its figures and says what is read now.
                a = replace(previous, start_bytes=a.start_bytes, end_bytes=a.end_bytes, samples=a.samples,
                            span_s=a.span_s, reason=f"{previous.reason.split('; held')[0]}; held (now: {a.reason})")
            s.assessment = a
            if a.verdict == "leak":
                if previous is None or previous.verdict != "leak":
                    s.raised_at = now
            else:
                s.raised_at = None
        return self.alerts()

    def _ended(self, s: _Watched) -> None:
        """A raised alert whose process has gone: withdrawn when the process lived too short a
        life to be a service (its growth was a run's, ended with it)."""
        a = s.assessment
        if s.started is None or a is None or s.fed_at is None:
            return
        life = s.fed_at - s.started
        if not ended_run(life, self.service_life_s):
            return
        s.assessment = as_ended_run(a, life)
        s.raised_at = None
        s.pending = None

    def _newest_fed(self) -> float | None:
        return max((s.fed_at for s in self._series.values() if s.fed_at is not None), default=None)

    def alerts(self) -> list[LeakAlert]:
        """The series called a leak now: live ones first, then ended ones; fastest growth first in each."""
        newest = self._newest_fed()
        out = [LeakAlert(k, s.assessment, s.raised_at, ended=s.fed_at is not None and newest is not None and s.fed_at < newest)
               for k, s in self._series.items()
               if s.assessment is not None and s.assessment.verdict == "leak" and s.raised_at is not None]
        out.sort(key=lambda a: (a.ended, -a.growth_bytes_per_s))
        return out

    def _judge(self, s: _Watched, name: str, sketch: FloorSketch, now: float) -> _View | None:
        def cache(i: int, h: float, compute: Callable[[], _View | None]) -> _View | None:
            kept = s.views.get((name, i))
            if kept is not None and now - kept[0] < max(self.min_interval_s, self.refresh_fraction * h * (1 + s.phase)):
                return kept[1]
            view = compute()
            s.views[(name, i)] = (now, view)
            return view

        return _judge(sketch, self.thresholds, cache)

    def _assess(self, s: _Watched, now: float) -> LeakAssessment:
        primary = _finish(self._judge(s, "value", s.sketch, now), s.sketch, s.total)
        if s.allocated is None:
            return primary
        allocated = _finish(self._judge(s, "allocated", s.allocated, now), s.allocated, None)
        reserved = None
        if s.reserved is not None:
            reserved = _finish(self._judge(s, "reserved", s.reserved, now), s.reserved, None)
        return _with_torch(primary, allocated, reserved)
