"""Leak or not: a detector over one memory series (device memory, a process's GPU memory, RSS).

A trend on raw samples raises false alarms (every batch buffer, every GC pause); memory that
*stays* shows in the floor: the minimum of each slice of the window. So the detector works on
floors, with the robust slope of `growth.theil_sen` through them, and tells what kind of change it
sees before it calls anything a leak:

- **steady-growth**: the floor keeps rising (a leak when fast enough for long enough, see below);
- **step-then-plateau**: a one-time rise, then flat (model load, KV-cache or CUDA context warm-up);
  a step wins over a ramp when a one-break piecewise-constant fit leaves under `step_ratio` (0.7)
  of the residuals of the Theil-Sen line; a ramp that stopped is found the same way (a line, then
  a constant); either is "no-leak" once the flat part is long enough, "inconclusive" before;
- **sawtooth**: big swings that fall back to a flat floor (batch buffers filled and freed);
- **flat**: the floor moves less than the noise (or `flat_bytes`);
- **falling**: the floor went down;
- **cache-growth**: torch's reserved memory grows while allocated does not (only when the caller
  passes both series): the caching allocator keeping freed blocks, not a leak;
- **insufficient-data**: too few samples or too short a span to say anything.

When is growth a leak? The floor slope must reach the alert rate for the time it has lasted,
`LeakThresholds.alert_rate(duration)`: 5 MB/s sustained for 10 s (a fast leak), 1 GB over 2 h
(~0.14 MB/s, a slow leak), and in between and beyond on the straight line through those two
points in log-log space (rate ~ duration^-0.545: the longer the growth lasts, the lower the rate
that counts, down to `min_rate`). And the growth must be real: a confidence of `min_confidence`
or more (it rises with the evidence: the agreement of the slope's sign across the floors -
Kendall's tau, i.e. Mann-Kendall's S over the number of pairs - the number of floors and the
time span); a slope `min_z` standard errors clear of the series' own sample noise; the same
without the newest floor (a burst that just began is not a leak); and no single floor-to-floor
jump carrying most of the rise (bursts back to back are not a ramp). Growth that falls short is
"inconclusive", with its rate, its confidence and what it lacks.

Samples are summarised as they arrive into a bounded, multi-resolution sketch (`FloorSketch`):
fine buckets for the last minute, coarser ones further back, each keeping its minimum (and when),
its maximum, its sum and its largest fall. (`growth.floor_points` slices raw samples afresh on
every call; the sketch keeps the same windowed minima incrementally, in bounded memory.) A series is judged over several horizons (10 s, 40 s, 160 s,
... and the whole window) so that a leak that started a minute ago is seen in a long, quiet
history; a short horizon's "leak" is ignored when a longer one sees a sawtooth (its fill phase).
`assess()` does this once over given samples; `LeakWatch` keeps one sketch per series and
re-judges incrementally, which costs O(buckets), not O(samples), per tick.

Pure Python; no numpy. Sizes are bytes; rates bytes per second; the texts read them as `units` does.
"""

from __future__ import annotations

import functools
import itertools
from array import array
import math
import statistics
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from gpuscope.core.growth import floor_growth, theil_sen
from gpuscope.core.units import format_duration, format_size, format_speed

VERDICTS = ("leak", "no-leak", "inconclusive")
PATTERNS = (
    "steady-growth",
    "step-then-plateau",
    "sawtooth",
    "flat",
    "falling",
    "cache-growth",
    "insufficient-data",
)
GROWING = "steady-growth"


@dataclass(frozen=True)
class LeakThresholds:
    """What counts as a leak. Defaults from practice; every one can be changed.

    The alert rate for growth that has lasted `d` seconds is `alert_rate(d)`: `fast_rate` at
    `fast_duration_s`, `slow_bytes / slow_window_s` at `slow_window_s`, a power law between them
    and beyond (never under `min_rate`); none under `fast_duration_s`. A floor slope counts when
    it reaches `rate_margin` x that rate (the slope of a noisy floor, measured over the rule's own
    duration, scatters by a few percent around the truth: a leak exactly at the documented rate
    must still alert).
    """

    fast_rate: float = 5e6  # bytes/s ...
    fast_duration_s: float = 10.0  # ... sustained this long: a fast leak
    slow_bytes: float = 1e9  # this much ...
    slow_window_s: float = 7200.0  # ... over this long: a slow leak (~0.14 MB/s)
    min_rate: float = 1e4  # bytes/s: slower growth is never a leak, however long (~0.9 GB/day)
    rate_margin: float = 0.9
    min_confidence: float = 0.5  # a leak needs at least this confidence ...
    min_z: float = 6.0  # ... and a slope this many standard errors above zero (sample noise) ...
    max_jump_share: float = 0.45  # ... and no single floor-to-floor jump above this share of the rise
    min_samples: int = 6  # fewer valid samples: insufficient data
    min_span_s: float = 10.0  # a shorter span: insufficient data
    samples_per_floor: int = 8  # a floor is the minimum of this many samples, give or take, ...
    min_floors: int = 6  # ... but a horizon has at least this many floors ...
    max_floors: int = 24  # ... and at most this many (2 h: 5-minute floors)
    step_ratio: float = 0.7  # a step wins when its residuals are < step_ratio x the line's ...
    bend_ratio: float = 0.5  # ... a bend (flat then rising, rising then flat: 4 parameters), < this
    flat_bytes: float = 16e6  # a floor change under this is flat, whatever the noise ...
    noise_factor: float = 3.0  # ... and so is one under noise_factor x the floor's own noise
    plateau_fraction: float = 1 / 3  # a ramp that stopped: flat for this part of the horizon ...
    min_plateau_s: float = 10.0  # ... and at least this long, before it is "no-leak"
    sawtooth_min_swing: float = 16e6  # swings smaller than this are noise, not a sawtooth

    def __post_init__(self) -> None:
        for name in ("fast_rate", "fast_duration_s", "slow_bytes", "slow_window_s", "min_span_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.rate_margin <= 1 or not 0 <= self.min_confidence <= 1:
            raise ValueError("rate_margin must be in (0, 1] and min_confidence in [0, 1]")
        if self.min_samples < 3 or self.samples_per_floor < 1 or not 4 <= self.min_floors <= self.max_floors:
            raise ValueError("need min_samples >= 3, samples_per_floor >= 1, 4 <= min_floors <= max_floors")

    @property
    def slow_rate(self) -> float:
        return self.slow_bytes / self.slow_window_s

    def alert_rate(self, duration_s: float) -> float:
        """The floor growth (bytes/s) that is a leak when it has lasted `duration_s` seconds."""
        if duration_s < self.fast_duration_s - 1e-9:
            return math.inf
        if self.slow_window_s > self.fast_duration_s and self.fast_rate > self.slow_rate:
            exponent = math.log(self.fast_rate / self.slow_rate) / math.log(self.slow_window_s / self.fast_duration_s)
            rate = self.fast_rate * (duration_s / self.fast_duration_s) ** -exponent
        else:
            rate = min(self.fast_rate, self.slow_rate)
        return max(rate, self.min_rate)


@dataclass(frozen=True)
class LeakAssessment:
    """What the detector concluded about one memory series.

    - `verdict`: "leak" | "no-leak" | "inconclusive" (see `VERDICTS`).
    - `pattern`: one of `PATTERNS` (the diagnosis JSON's "pattern").
    - `growth_bytes_per_s`: the floor's current slope: over the growth for "steady-growth", over
      the flat part for "step-then-plateau", over the horizon otherwise (None: too little data).
    - `confidence`: in [0, 1], how sure the detector is of `pattern` (hence of the verdict);
      0 for insufficient data.
    - `since`: when the change began (the growth's start, the step's time), on the clock of the
      input times; for a flat or sawtooth series, the start of the horizon judged. Its resolution
      is the floor bucket's width (seconds for recent events, minutes for hours-old ones).
    - `time_to_full_s`: for growth, seconds until `total_bytes` is reached from the recent peak
      at the growth rate (None without a total, or without growth; 0 when already there).
    - `start_bytes`, `end_bytes`: the first and the latest valid sample assessed.
    - `samples`: valid (non-NaN) samples assessed; `span_s`: seconds from first to latest.
    - `reason`: one plain sentence saying why.
    """

    verdict: str
    pattern: str
    growth_bytes_per_s: float | None
    confidence: float
    since: float | None
    time_to_full_s: float | None
    start_bytes: float | None
    end_bytes: float | None
    samples: int
    span_s: float
    reason: str

    @property
    def is_leak(self) -> bool:
        return self.verdict == "leak"

    def to_json(self) -> dict:
        """Plain JSON types; NaN/inf never appear (None instead)."""
        return {
            "verdict": self.verdict,
            "pattern": self.pattern,
            "growth_bytes_per_s": _finite(self.growth_bytes_per_s),
            "confidence": round(self.confidence, 3),
            "since": _finite(self.since),
            "time_to_full_s": _finite(self.time_to_full_s),
            "start_bytes": _finite(self.start_bytes),
            "end_bytes": _finite(self.end_bytes),
            "samples": self.samples,
            "span_s": self.span_s,
            "reason": self.reason,
        }


# --- the sketch: bounded, mergeable summaries of the samples ------------------------------------


class _Bucket:
    """Summary of consecutive samples: floor, peak, and what the sawtooth test needs.

    `max_drop` is the largest single fall between samples that ends in this bucket; `s1` the sum
    of (value - ref).
    """

    __slots__ = ("key", "n", "t_first", "t_last", "v_first", "v_last", "t_min", "v_min", "v_max",
                 "s1", "max_drop")

    def __init__(self, key: int, t: float, v: float, dv: float, ref: float) -> None:
        self.key = key
        self.n = 1
        self.t_first = self.t_last = self.t_min = t
        self.v_first = self.v_last = self.v_min = self.v_max = v
        self.s1 = v - ref if v != ref else 0.0  # a flat series shares the constant, not a float per bucket
        self.max_drop = -dv if dv < 0 else 0.0

    def add(self, t: float, v: float, dv: float, ref: float) -> None:
        self.n += 1
        self.t_last = t
        self.v_last = v
        if v < self.v_min:
            self.v_min = v
            self.t_min = t
        if v > self.v_max:
            self.v_max = v
        if v != ref:  # a flat series adds 0: keep the float held rather than make another
            self.s1 += v - ref
        if -dv > self.max_drop:
            self.max_drop = -dv

    def merge(self, later: _Bucket) -> None:
        """Absorb the bucket that follows this one in time."""
        self.n += later.n
        self.t_last = later.t_last
        self.v_last = later.v_last
        if later.v_min < self.v_min:
            self.v_min = later.v_min
            self.t_min = later.t_min
        if later.v_max > self.v_max:
            self.v_max = later.v_max
        if later.s1:
            self.s1 += later.s1
        if later.max_drop > self.max_drop:
            self.max_drop = later.max_drop

    def copy(self) -> _Bucket:
        b = _Bucket.__new__(_Bucket)
        b.key, b.n = self.key, self.n
        b.t_first, b.t_last, b.v_first, b.v_last = self.t_first, self.t_last, self.v_first, self.v_last
        b.t_min, b.v_min, b.v_max = self.t_min, self.v_min, self.v_max
        b.s1, b.max_drop = self.s1, self.max_drop
        return b


_FIELDS = _Bucket.__slots__
_WIDTH = len(_FIELDS)
_KEY, _N = _FIELDS.index("key"), _FIELDS.index("n")


class _Level:
    """The buckets of one coarser level of a `FloorSketch`, oldest first, their fields side by side
    in one array of doubles (the counts and keys are integers far below 2**53: exact): 88 bytes a
    bucket, not an object of a dozen references. These levels hold the older samples, nearly all
    the buckets of a long run; level 0 (recent, changed by every sample) stays a deque of
    `_Bucket`. Reading gives `_Bucket` copies; a change goes through `merge_last`.
    """

    __slots__ = ("_data", "_head")

    def __init__(self) -> None:
        self._data = array("d")
        self._head = 0  # index of the oldest bucket held (those before it wait to be removed in one go)

    def __len__(self) -> int:
        return len(self._data) // _WIDTH - self._head

    def __getitem__(self, i: int) -> _Bucket:
        k = (self._head + i if i >= 0 else len(self._data) // _WIDTH + i) * _WIDTH
        b = _Bucket.__new__(_Bucket)
        for name, value in zip(_FIELDS, self._data[k:k + _WIDTH]):
            setattr(b, name, value)
        b.key, b.n = int(b.key), int(b.n)
        return b

    def __iter__(self) -> Iterator[_Bucket]:
        return (self[i] for i in range(len(self)))

    def __reversed__(self) -> Iterator[_Bucket]:
        return (self[-1 - i] for i in range(len(self)))

    @property
    def last_key(self) -> int:
        return int(self._data[_KEY - _WIDTH])

    def append(self, b: _Bucket) -> None:
        self._data.extend([getattr(b, name) for name in _FIELDS])

    def merge_last(self, later: _Bucket) -> None:
        b = self[-1]
        b.merge(later)
        self._data[-_WIDTH:] = array("d", [getattr(b, name) for name in _FIELDS])

    def popleft(self) -> _Bucket:
        b = self[0]
        self._head += 1
        # Removed in one go once an eighth is dead: a level holds at most ~1/8 more than its buckets.
        if self._head >= 8 and 8 * self._head >= len(self._data) // _WIDTH:
            del self._data[:self._head * _WIDTH]
            self._head = 0
        return b


class _Runs:
    """The latest `maxlen` numbers added, as runs of equal numbers in two arrays: the steps
    between the samples of an idle series (all 0) cost one run, not a reference each."""

    __slots__ = ("_values", "_counts", "_head", "_size", "maxlen")

    def __init__(self, maxlen: int) -> None:
        self._values = array("d")
        self._counts = array("q")
        self._head = 0  # index of the oldest run held (those before it wait to be removed in one go)
        self._size = 0
        self.maxlen = maxlen

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[float]:
        for i in range(self._head, len(self._values)):
            yield from itertools.repeat(self._values[i], self._counts[i])

    def append(self, x: float) -> None:
        if self._size and self._values[-1] == x:
            self._counts[-1] += 1
        else:
            self._values.append(x)
            self._counts.append(1)
        self._size += 1
        if self._size > self.maxlen:
            self._size -= 1
            h = self._head
            self._counts[h] -= 1
            if not self._counts[h]:
                self._head = h = h + 1
                if h >= 32 and 2 * h >= len(self._values):
                    del self._values[:h], self._counts[:h]
                    self._head = 0


class FloorSketch:
    """A bounded summary of one memory series: time buckets, finer for recent samples.

    Level 0 holds up to `per_level` buckets `bucket_s` wide; when it overflows, its oldest bucket
    moves to level 1, whose buckets are `factor` times wider (aligned, so moved buckets merge),
    and so on. With the defaults (1 s, 64 per level, factor 4) the last minute is kept per second,
    the last ~4 minutes per 4 s, ~17 minutes per 16 s, ~1.1 h per 64 s, ~4.5 h per 256 s...
    Buckets that ended more than `window_s` before the latest sample are dropped, so the memory
    held is bounded by the window whatever the number of samples. NaN and None samples (not
    available) are skipped; samples older than the latest are ignored.
    """

    def __init__(self, bucket_s: float = 1.0, per_level: int = 64, factor: int = 4,
                 window_s: float | None = None) -> None:
        if bucket_s <= 0 or per_level < 2 or factor < 2:
            raise ValueError("need bucket_s > 0, per_level >= 2, factor >= 2")
        self.bucket_s = bucket_s
        self.per_level = per_level
        self.factor = factor
        self.window_s = window_s
        self._levels: list[deque[_Bucket] | _Level] = [deque()]
        # Level 0's buckets leave their `key` at 0: past 256 a key is an int object of its own, 64
        # of them per series. The newest bucket's key is kept here; an older one's is worked out
        # from its first sample's time when it moves up (the computation that made it: exact).
        self._newest_key: int | None = None
        self._origin: float | None = None
        self._ref = 0.0
        self._last_t: float | None = None
        self._last_v: float | None = None
        self._count = 0
        self._added = 0
        self._noise: tuple[int, float] | None = None  # (samples added when computed, value)
        self._steps = _Runs(maxlen=256)  # the latest steps between samples
        self._flat_since = math.inf  # time of the first of the latest samples that all have one value

    def __len__(self) -> int:
        """Number of buckets held (the memory bound)."""
        return sum(len(level) for level in self._levels)

    @property
    def last_time(self) -> float | None:
        return self._last_t

    @property
    def samples(self) -> int:
        """Valid samples held (within the window)."""
        return self._count

    @property
    def flat_since(self) -> float:
        """Every sample from this time on has the same value (inf before any sample)."""
        return self._flat_since

    def _oldest(self) -> _Bucket | None:
        for level in reversed(self._levels):
            if level:
                return level[0]
        return None

    @property
    def first_value(self) -> float | None:
        b = self._oldest()
        return b.v_first if b is not None else None

    @property
    def span_s(self) -> float:
        """Seconds from the oldest sample held to the latest."""
        b = self._oldest()
        return self._last_t - b.t_first if b is not None and self._last_t is not None else 0.0

    @property
    def last_value(self) -> float | None:
        return self._last_v

    @property
    def origin(self) -> float:
        """Time of the first sample ever added (0.0 before any)."""
        return self._origin if self._origin is not None else 0.0

    @property
    def ref(self) -> float:
        """The value bucket sums are taken relative to (the first sample's)."""
        return self._ref

    def add(self, t: float, value: float | None) -> bool:
        """Add one sample; False if it was skipped (not available, or older than the latest)."""
        if value is None:
            return False
        v = float(value)
        if math.isnan(v) or math.isnan(t):
            return False
        if self._last_t is not None and t < self._last_t:
            return False
        if self._origin is None:
            self._origin = t
            self._ref = v
        if v == self._last_v:
            # The same value again (most samples of most series): the objects already held are
            # shared, not one more float for the value and its step per sample.
            v, dv = self._last_v, 0.0
        else:
            dv = 0.0 if self._last_v is None else v - self._last_v
            self._flat_since = t
        if self._last_v is not None:
            self._steps.append(dv)
        self._count += 1
        self._added += 1
        self._last_t = t
        self._last_v = v
        key = self._key(t)
        level0 = self._levels[0]
        if level0 and self._newest_key == key:
            level0[-1].add(t, v, dv, self._ref)
        else:
            level0.append(_Bucket(0, t, v, dv, self._ref))
            self._newest_key = key
            if len(level0) > self.per_level:
                self._cascade()
        if self.window_s is not None:
            self._evict(t - self.window_s)
        return True

    def _key(self, t: float) -> int:
        """The level-0 bucket of a sample at time t."""
        return int((t - cast(float, self._origin)) // self.bucket_s)

    def _cascade(self) -> None:
        levels = self._levels
        j = 0
        while len(levels[j]) > self.per_level:
            moved = levels[j].popleft()
            moved.key = (self._key(moved.t_first) if j == 0 else moved.key) // self.factor
            if j + 1 == len(levels):
                levels.append(_Level())
            up = cast(_Level, levels[j + 1])  # levels above 0 are all `_Level`s
            if up and up.last_key == moved.key:
                up.merge_last(moved)
            else:
                up.append(moved)
            j += 1

    def _evict(self, horizon: float) -> None:
        levels = self._levels
        for j in range(len(levels) - 1, -1, -1):
            level = levels[j]
            while level and level[0].t_last < horizon:
                self._count -= level.popleft().n
            if level:
                break
        while len(levels) > 1 and not levels[-1]:
            levels.pop()

    def noise(self) -> float:
        """Sample-to-sample noise (a standard deviation, bytes) from the latest 256 steps between
        samples: the lower quartile of their absolute deviations from the median step, which is
        0.3186 sqrt(2) sigma for independent normal samples. Deviations from the median step ignore
        steady growth (a leak's); the lower quartile ignores up to three steps in four that are
        not noise: bursts, a sawtooth's falls and uneven fills. Recomputed every 8 new samples."""
        if self._noise is not None and self._added - self._noise[0] < 8:
            return self._noise[1]
        noise = 0.0
        if len(self._steps) >= 4:
            steps = list(self._steps)
            mid = _median(steps)
            deviations = sorted(abs(d - mid) for d in steps)
            noise = deviations[len(deviations) // 4] / (0.3186 * math.sqrt(2))
        self._noise = (self._added, noise)
        return noise

    def buckets(self) -> Iterator[_Bucket]:
        """Oldest first."""
        for level in reversed(self._levels):
            yield from level

    def recent(self, t0: float) -> list[_Bucket]:
        """Buckets that start at or after t0, oldest first."""
        out: list[_Bucket] = []
        for level in self._levels:
            for b in reversed(level):
                if b.t_first < t0:
                    out.reverse()
                    return out
                out.append(b)
        out.reverse()
        return out


# --- one horizon ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _View:
    """The judgement of one horizon, with what the combination needs."""

    assessment: LeakAssessment
    horizon_s: float
    duration_s: float  # how long the growth (or the horizon) lasted
    swinging: bool  # big swings back to the floor seen in this horizon
    peak: float  # highest value in the horizon's last floor
    change: bool = False  # a real change of the floor (a step, or growth clear of the noise)


def _horizons(sketch: FloorSketch, th: LeakThresholds) -> list[float]:
    """The horizons to judge: 10 s, 40 s, 160 s, ... (x4) while shorter than the data, then all
    of it (the last one; empty without data)."""
    if not sketch.samples:
        return []
    span = sketch.span_s
    out = []
    h = th.fast_duration_s
    while h < 0.8 * span:
        out.append(h)
        h *= 4
    out.append(span)
    return out


def _judge(sketch: FloorSketch, th: LeakThresholds,
           cache: Callable[[int, float, Callable[[], _View | None]], _View | None] | None = None) -> _View | None:
    """Judge every horizon of the sketch and combine. With a `cache`, horizon i (-1: the whole
    series) of length h is `cache(i, h, compute)`: a kept judgement while still fresh, else
    `compute()`'s, kept. A judgement of None (a short horizon all alike) has no say."""
    horizons = _horizons(sketch, th)
    noise: list[float] = []  # computed once, and only if a horizon is judged afresh

    def compute(h: float, whole: bool) -> _View | None:
        if whole:
            buckets = list(sketch.buckets())
        else:
            t_end = sketch.last_time or 0.0  # horizons exist only for a sketch with samples
            t0 = t_end - h - 1e-9 * max(1.0, abs(t_end))
            if sketch.flat_since <= t0:
                # Every sample of this horizon alike: its view would be "flat" (or too little data),
                # which never changes what `_combine` chooses (not a leak, no change, no swings).
                return None
            buckets = sketch.recent(t0)
        flat = _analyse_flat(buckets, h, th)
        if flat is not None:
            return flat
        if not noise:
            noise.append(sketch.noise())
        return _analyse(buckets, h, th, sketch.ref, noise[0], sketch.origin)

    views = []
    for i, h in enumerate(horizons):
        whole = i == len(horizons) - 1
        if cache is None:
            view = compute(h, whole)
        else:
            view = cache(-1 if whole else i, h, functools.partial(compute, h, whole))
        if view is not None:
            views.append(view)
    return _combine(views) if views else None


def _floors(buckets: Sequence[_Bucket], count: int) -> list[_Bucket]:
    """Merge buckets into `count` equal time slices (empty slices are skipped): the floors."""
    t0 = buckets[0].t_first
    width = (buckets[-1].t_last - t0) / count
    out: list[_Bucket] = []
    last_k = -1
    for b in buckets:
        k = min(int((b.t_first - t0) / width), count - 1) if width > 0 else 0
        if k == last_k:
            out[-1].merge(b)
        else:
            out.append(b.copy())
            last_k = k
    return out


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def kendall_tau(points: Sequence[tuple[float, float]]) -> float:
    """Kendall's tau of value against time (Mann-Kendall S / number of pairs), in [-1, 1]."""
    s = pairs = 0
    for i, (_, v1) in enumerate(points):
        for _, v2 in points[i + 1:]:
            pairs += 1
            if v2 > v1:
                s += 1
            elif v2 < v1:
                s -= 1
    return s / pairs if pairs else 0.0


def _floor_noise(values: Sequence[float]) -> float:
    """Robust scale of the floor's jitter: MAD of successive differences, trend removed."""
    diffs = [b - a for a, b in zip(values, values[1:])]
    if len(diffs) < 2:
        return 0.0
    mid = _median(diffs)
    mad = _median([abs(d - mid) for d in diffs])
    return 1.4826 * mad / math.sqrt(2)


class _Sums:
    """Prefix sums over points (x, y) for O(1) least-squares residuals of any run [i, j)."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.n = [0.0]
        self.x = [0.0]
        self.y = [0.0]
        self.xx = [0.0]
        self.xy = [0.0]
        self.yy = [0.0]
        for x, y in zip(xs, ys):
            self.n.append(self.n[-1] + 1)
            self.x.append(self.x[-1] + x)
            self.y.append(self.y[-1] + y)
            self.xx.append(self.xx[-1] + x * x)
            self.xy.append(self.xy[-1] + x * y)
            self.yy.append(self.yy[-1] + y * y)

    def constant(self, i: int, j: int) -> float:
        n = self.n[j] - self.n[i]
        sy = self.y[j] - self.y[i]
        return max(self.yy[j] - self.yy[i] - sy * sy / n, 0.0)

    def line(self, i: int, j: int) -> float:
        n = self.n[j] - self.n[i]
        sx = self.x[j] - self.x[i]
        sy = self.y[j] - self.y[i]
        cxx = self.xx[j] - self.xx[i] - sx * sx / n
        cxy = self.xy[j] - self.xy[i] - sx * sy / n
        cyy = self.yy[j] - self.yy[i] - sy * sy / n
        if cxx <= 0:
            return max(cyy, 0.0)
        return max(cyy - cxy * cxy / cxx, 0.0)

    def mean(self, i: int, j: int) -> float:
        return (self.y[j] - self.y[i]) / (self.n[j] - self.n[i])

    def at(self, i: int, j: int, x: float) -> float:
        """The least-squares line through run [i, j), evaluated at x."""
        n = self.n[j] - self.n[i]
        sx = self.x[j] - self.x[i]
        sy = self.y[j] - self.y[i]
        cxx = self.xx[j] - self.xx[i] - sx * sx / n
        slope = (self.xy[j] - self.xy[i] - sx * sy / n) / cxx if cxx > 0 else 0.0
        return sy / n + slope * (x - sx / n)


def _best_break(m: int, cost, left_min: int, right_min: int) -> tuple[float, int]:
    best = (math.inf, -1)
    for k in range(left_min, m - right_min + 1):
        c = cost(k)
        if c < best[0]:
            best = (c, k)
    return best


def _evidence(floors: int, duration: float, th: LeakThresholds) -> float:
    """How much data backs a judgement, in (0, 1): more floors and a longer time, more."""
    return math.sqrt(floors / (floors + 3) * duration / (duration + th.fast_duration_s / 2))


def _analyse_flat(buckets: list[_Bucket], horizon: float, th: LeakThresholds) -> _View | None:
    """`_analyse`'s judgement of a horizon whose samples are all the same value, without its fits
    (None for any other horizon). Most series of a node are such (an idle process's GPU memory):
    judging them is most of the watch's work. For such a horizon `_analyse` finds no fall, floors
    all alike, no candidate shape better than the line, a line with no rise: "flat", the same
    view this returns (a test holds the two equal)."""
    v = buckets[0].v_first
    for b in buckets:
        if b.v_min != v or b.v_max != v:
            return None
    n = sum(b.n for b in buckets)
    t_start, t_end = buckets[0].t_first, buckets[-1].t_last
    span = t_end - t_start
    if n < th.min_samples or span < th.min_span_s - 1e-9:
        return None  # too little data: `_analyse` says so
    count = max(th.min_floors, min(th.max_floors, n // th.samples_per_floor))
    m = _floor_count(buckets, count)
    if m < 4:
        return None
    tol = max(th.flat_bytes, th.noise_factor * 0.0)
    a = LeakAssessment("no-leak", "flat", 0.0, min(max(_evidence(m, span, th), 0.0), 1.0), t_start, None, v, v, n,
                       span, f"floor flat (within {format_size(tol)}) for {format_duration(span)}")
    return _View(a, horizon, span, False, v, False)


def _floor_count(buckets: Sequence[_Bucket], count: int) -> int:
    """How many floors `_floors(buckets, count)` makes."""
    t0 = buckets[0].t_first
    width = (buckets[-1].t_last - t0) / count
    m = 0
    last_k = -1
    for b in buckets:
        k = min(int((b.t_first - t0) / width), count - 1) if width > 0 else 0
        if k != last_k:
            m += 1
            last_k = k
    return m


def _analyse(buckets: list[_Bucket], horizon: float, th: LeakThresholds, ref_value: float, noise: float,
             origin: float) -> _View:
    """Judge one horizon. `ref_value` is the sketch's reference (bucket sums are relative to it);
    `noise` the sample-to-sample noise of the series (`FloorSketch.noise`); `origin` the time of
    its first sample (events are told as "at <time since origin>")."""
    n = sum(b.n for b in buckets)
    t_start, t_end = buckets[0].t_first, buckets[-1].t_last
    span = t_end - t_start
    first, last = buckets[0].v_first, buckets[-1].v_last
    peak = buckets[-1].v_max

    def view(verdict: str, pattern: str, growth: float | None, confidence: float, since: float | None,
             reason: str, duration: float = span, swinging: bool = False, change: bool = False) -> _View:
        a = LeakAssessment(verdict, pattern, growth, min(max(confidence, 0.0), 1.0), since, None, first, last,
                           n, span, reason)
        return _View(a, horizon, duration, swinging, peak, change)

    if n < th.min_samples or span < th.min_span_s - 1e-9:
        return view("inconclusive", "insufficient-data", None, 0.0, None,
                    f"only {n} sample{'s' if n != 1 else ''} over {format_duration(span)}; "
                    f"need {th.min_samples} over {format_duration(th.min_span_s)}")
    # A sawtooth (batch buffers filled and freed): memory falls back by a big step again and again
    # - steps that noise does not make: 8 sample sigmas, and at least `sawtooth_min_swing` - and
    # between two falls it sits well above where they landed: in the median cycle, on average by
    # at least 0.3 of a typical fall (a filled-then-freed buffer: about half) and by more than noise
    # puts a mean above a minimum (4 sigmas). A cycle is measured from the middle of the two landings that bracket it, so a floor
    # that rises does not count as lift. Occasional bursts fall back too, but between them memory
    # is rarely up. It takes three falls (two cycles), spread over a third of the horizon at least.
    big = max(th.sawtooth_min_swing, 8 * noise)
    falls = [b for b in buckets if b.max_drop >= big]
    swing = 0.0
    if len(falls) >= 3 and falls[-1].t_last - falls[0].t_first >= span / 3:
        lifts = []
        cycle_n = cycle_sum = 0.0
        landed = None
        for b in buckets:
            if landed is not None:
                cycle_n += b.n
                cycle_sum += b.s1
            if b.max_drop >= big:
                if landed is not None:
                    lifts.append(ref_value + cycle_sum / cycle_n - (landed + b.v_min) / 2)
                landed = b.v_min
                cycle_n = cycle_sum = 0.0
        typical = _median([b.max_drop for b in falls])
        if _median(lifts) >= max(0.3 * typical, 4 * noise):
            swing = typical
    swinging = swing > 0
    count = max(th.min_floors, min(th.max_floors, n // th.samples_per_floor))
    if swinging and len(falls) >= 3:
        # Each floor must hold a whole cycle, or floors catch fill phases: about span / falls long
        # (a coarse bucket holding several falls counts once, but floors are that wide anyway).
        count = max(4, min(count, int(len(falls) / 1.5)))
    floors = _floors(buckets, count)
    m = len(floors)
    if m < 4:
        return view("inconclusive", "insufficient-data", None, 0.0, None,
                    f"samples in only {m} stretches of {format_duration(span)} (gaps); need 4")
    peak = floors[-1].v_max
    points = [(f.t_min, f.v_min) for f in floors]
    xs = [t - t_start for t, _ in points]
    base = points[0][1]  # fits work on values relative to the first floor
    ys = [v - base for _, v in points]
    tol = max(th.flat_bytes, th.noise_factor * _floor_noise(ys))

    # Candidate shapes of the floor: a line, a step, flat-then-line (onset), line-then-flat (plateau).
    slope = theil_sen(points) or 0.0
    intercept = _median([y - slope * x for x, y in zip(xs, ys)])
    rss_line = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    sums = _Sums(xs, ys)
    rss_step, k_step = _best_break(m, lambda k: sums.constant(0, k) + sums.constant(k, m), 1, 1)
    shapes = [("line", rss_line, 0)]
    if rss_step < th.step_ratio * rss_line:
        shapes.insert(0, ("step", rss_step, k_step))
    if m >= 8:
        onset = _best_break(m, lambda k: sums.constant(0, k) + sums.line(k, m), 2, 3)
        plateau = _best_break(m, lambda k: sums.line(0, k) + sums.constant(k, m), 3, 2)
        name, (rss, k) = min((("onset", onset), ("plateau", plateau)), key=lambda s: s[1][0])
        if rss < th.bend_ratio * shapes[0][1]:
            shapes.insert(0, (name, rss, k))

    def trend(i: int, j: int) -> tuple[float, float]:
        """Theil-Sen slope and rise over floors [i, j)."""
        seg = points[i:j]
        if len(seg) < 2:
            return 0.0, 0.0
        b = theil_sen(seg) or 0.0
        return b, b * (seg[-1][0] - seg[0][0])

    def z_score(seg: Sequence[tuple[float, float]], b: float) -> float:
        """The slope in standard errors of a slope through these floor times with the series'
        sample noise (an upper bound for floors of many samples, right for short horizons)."""
        mean_x = sum(t for t, _ in seg) / len(seg)
        sxx = sum((t - mean_x) ** 2 for t, _ in seg)
        return b * math.sqrt(sxx) / noise if noise > 0 else math.inf

    def growth(i: int, since: float, prefix: str = "") -> _View:
        seg = points[i:]
        b, _ = trend(i, m)
        duration = t_end - since
        tau = kendall_tau(seg)
        confidence = max(tau, 0.0) * _evidence(len(seg), duration, th)
        needed = th.alert_rate(duration)
        z = z_score(seg, b)
        fast_enough = b >= th.rate_margin * needed
        if len(seg) >= 4:
            # Sustained: the growth must hold without the newest floor too (a burst that has just
            # begun, on top of noise that happened to rise, is not a leak).
            b_before = theil_sen(seg[:-1]) or 0.0
            z = min(z, z_score(seg[:-1], b_before))
            fast_enough = fast_enough and b_before >= th.rate_margin * needed
        # Growth made of one or two big jumps (bursts back to back, a staircase) is not a ramp yet.
        # Floors further apart than usual (samples left out between them, while a tracker ran)
        # rise further without jumping: the trend over the extra time is not counted as a jump.
        rise = seg[-1][1] - seg[0][1]
        spacing = _median([t2 - t1 for (t1, _), (t2, _) in zip(seg, seg[1:])])
        jumpy = max(v2 - v1 - max(b, 0.0) * max(0.0, t2 - t1 - spacing)
                    for (t1, v1), (t2, v2) in zip(seg, seg[1:])) > th.max_jump_share * rise
        how = "steadily" if tau >= 0.8 else "mostly" if tau >= 0.5 else "unevenly"
        if jumpy:
            how = "in a few jumps"
        what = f"floor of a sawtooth (swings of {format_size(swing)})" if swinging else "floor"
        text = f"{prefix}{what} rose {format_speed(b)} for {format_duration(duration)}, {how}"
        clear = len(seg) >= 3 and confidence >= th.min_confidence and z >= th.min_z and not jumpy
        if clear and fast_enough:
            return view("leak", GROWING, b, confidence, since, text, duration, swinging, True)
        if math.isinf(needed):
            text += f"; too short to call a leak (needs {format_duration(th.fast_duration_s)})"
        elif not fast_enough:
            text += f"; below the {format_speed(needed)} that makes a leak over {format_duration(duration)}"
        elif z < th.min_z:
            text += f"; not yet clear of the noise (samples scatter by {format_size(noise)})"
        elif jumpy:
            text += "; not a steady rise yet"
        else:
            text += f"; not yet sure enough to call it a leak (confidence {confidence:.2f})"
        return view("inconclusive", GROWING, b, confidence, since, text, duration, swinging, clear)

    def level(b: float) -> _View:
        """No real change of the floor over the horizon: flat, or a sawtooth."""
        confidence = _evidence(m, span, th) * (1 - abs(kendall_tau(points)) / 2)
        if swinging:
            return view("no-leak", "sawtooth", b, confidence, t_start,
                        f"swings of {format_size(swing)} over a flat floor for {format_duration(span)} "
                        "(buffers filled and freed)", swinging=True)
        return view("no-leak", "flat", b, confidence, t_start,
                    f"floor flat (within {format_size(tol)}) for {format_duration(span)}")

    def falling(b: float, drop: float) -> _View:
        return view("no-leak", "falling", b, _evidence(m, span, th), t_start,
                    f"floor fell {format_size(-drop)} over {format_duration(span)}", swinging=swinging)

    def settled(i: int, since: float, stopped: float, rise: float, step: bool) -> _View:
        """A rise, then a flat floor from floor i (at time `stopped`) on."""
        b, _ = trend(i, m)
        flat_for = t_end - stopped
        confidence = _evidence(m - i, flat_for, th) * (1 - abs(kendall_tau(points[i:])) / 2)
        head = (f"a {format_size(rise, sign=True)} step at {format_duration(since - origin)}" if step
                else f"rose {format_size(rise)} in {format_duration(stopped - since)} (warm-up)")
        long_enough = flat_for >= th.min_plateau_s and m - i >= 2
        if not step:
            long_enough = long_enough and flat_for >= th.plateau_fraction * span
        if long_enough:
            return view("no-leak", "step-then-plateau", b, confidence, since, f"{head}, flat since",
                        flat_for, swinging, True)
        return view("inconclusive", "step-then-plateau", b, confidence * 0.5, since,
                    f"{head}, flat for {format_duration(flat_for)} so far: too soon to say", flat_for, swinging, True)

    for name, _, k in shapes:
        if name == "step":
            jump = sums.mean(k, m) - sums.mean(0, k)
            if abs(jump) <= tol or abs(jump) < th.min_z * noise * math.sqrt(1 / k + 1 / (m - k)):
                continue  # within the noise
            if abs(jump) < swing / 2:
                continue  # within the swings of a sawtooth
            stepped = _step_time(buckets, points[k - 1][0], base + sums.mean(0, k) + jump / 2, jump > 0)
            rate, rise = trend(k, m)
            if m - k >= 3 and rise > tol:
                return growth(k, stepped, f"after a {format_size(jump, sign=True)} step, ")
            if jump > 0:
                return settled(k, stepped, stepped, jump, step=True)
            return falling(rate, jump)
        if name == "onset":
            rate, rise = trend(k, m)
            if rise > tol and rate > 0:
                flat_level = sums.mean(0, k)
                jump = sums.at(k, m, xs[k]) - flat_level
                began = _step_time(buckets, points[k - 1][0], base + flat_level + max(tol, jump / 2), True)
                return growth(k, min(began, points[k][0]),
                              f"after a {format_size(jump, sign=True)} step, " if jump > tol else "")
        if name == "plateau":
            b_up, rise_up = trend(0, k)
            b_flat, rise_flat = trend(k, m)
            if rise_up > max(tol, swing / 2) and abs(rise_flat) <= tol and b_flat <= 0.25 * b_up:
                return settled(k, t_start, points[k][0], sums.mean(k, m) - ys[0], step=False)
        if name == "line":
            rise = slope * (xs[-1] - xs[0])
            if rise > tol:
                return growth(0, t_start)
            if rise < -max(tol, swing / 2):
                return falling(slope, rise)
            return level(slope)
    raise AssertionError("the line always decides")  # pragma: no cover


def _step_time(buckets: Sequence[_Bucket], after: float, mid: float, up: bool) -> float:
    """When a step happened: the first bucket after `after` wholly on the new side of `mid`."""
    for b in buckets:
        if b.t_first <= after:
            continue
        if (b.v_min >= mid) if up else (b.v_max <= mid):
            return b.t_first
    return after


def _combine(views: Sequence[_View]) -> _View:
    """One judgement from the horizons (shortest first, the whole series last).

    A short horizon is not heard when a longer one sees a sawtooth (it saw a fill phase, or a
    burst on one; a leak in a sawtoothing process shows in the longer horizon's floors). Then:
    the leak that has lasted longest (its start and rate are the best measured); with no leak,
    the whole series' view - unless that saw no change and a shorter horizon did (a step or
    growth too recent to show in the long view's floors), then the longest such horizon.
    """
    heard = [v for i, v in enumerate(views) if not any(w.swinging for w in views[i + 1:])]
    leaks = [v for v in heard if v.assessment.verdict == "leak"]
    if leaks:
        return max(leaks, key=lambda v: (v.duration_s, v.assessment.confidence))
    whole = views[-1]
    if whole.change or whole.assessment.pattern == "insufficient-data":
        return whole
    recent = [v for v in heard[:-1] if v.change]
    return recent[-1] if recent else whole


def _finish(chosen: _View | None, sketch: FloorSketch, total_bytes: float | None) -> LeakAssessment:
    """The chosen horizon's judgement, with the whole series' extent and the time to full."""
    if chosen is None or not sketch.samples:
        return LeakAssessment("inconclusive", "insufficient-data", None, 0.0, None, None, None, None, 0, 0.0,
                              "no samples with a value")
    a = chosen.assessment
    ttf = None
    if total_bytes is not None and a.pattern == GROWING and a.growth_bytes_per_s and a.growth_bytes_per_s > 0:
        high = max(chosen.peak, sketch.last_value if sketch.last_value is not None else chosen.peak)
        ttf = max(total_bytes - high, 0.0) / a.growth_bytes_per_s
        if a.verdict == "leak":
            a = replace(a, reason=f"{a.reason}; full in {format_duration(ttf)} at this rate")
    # Every series, every tick: built directly (dataclasses.replace costs several times more).
    return LeakAssessment(a.verdict, a.pattern, a.growth_bytes_per_s, a.confidence, a.since, ttf, sketch.first_value,
                          sketch.last_value, sketch.samples, sketch.span_s, a.reason)


def _with_torch(primary: LeakAssessment, allocated: LeakAssessment | None,
                reserved: LeakAssessment | None) -> LeakAssessment:
    """Read the primary series in the light of torch's allocated and reserved memory."""
    if allocated is None or allocated.pattern == "insufficient-data":
        return primary

    def growing(a: LeakAssessment) -> bool:
        return a.pattern == GROWING and (a.growth_bytes_per_s or 0.0) > 0

    primary_rate = primary.growth_bytes_per_s or 0.0
    allocated_flat = not growing(allocated) or (allocated.growth_bytes_per_s or 0.0) < 0.1 * primary_rate
    if growing(primary) and allocated_flat:
        if reserved is not None and growing(reserved):
            return replace(
                primary, verdict="no-leak", pattern="cache-growth",
                confidence=min(primary.confidence, reserved.confidence),
                reason=(f"torch reserved grew {format_speed(reserved.growth_bytes_per_s)} while allocated stayed "
                        f"{'flat' if allocated.pattern != GROWING else 'nearly flat'}: the caching allocator "
                        "keeping freed blocks, not a leak"))
        if reserved is not None and reserved.pattern != "insufficient-data":
            return replace(primary, reason=f"{primary.reason}; outside PyTorch's allocator (reserved flat)")
        return primary
    if allocated.verdict == "leak" and primary.verdict != "leak":
        return replace(allocated, reason=f"torch allocated: {allocated.reason}")
    return primary


# --- one-shot -------------------------------------------------------------------------------------


def _sketch_of(times: Sequence[float], values: Sequence[float | None]) -> FloorSketch:
    valid = [(t, v) for t, v in zip(times, values) if v is not None and not math.isnan(v)]
    width = 1.0
    if len(valid) >= 2 and valid[-1][0] > valid[0][0]:
        width = (valid[-1][0] - valid[0][0]) / (len(valid) - 1)
    # Finer than the live watch's sketch (it is built once): a step two hours back is placed to
    # within 16 samples' time, not 256.
    sketch = FloorSketch(bucket_s=max(width, 1e-6), per_level=1024)
    for t, v in valid:
        sketch.add(t, v)
    return sketch


def assess(
    times: Sequence[float],
    values: Sequence[float | None],
    *,
    thresholds: LeakThresholds = LeakThresholds(),
    total_bytes: float | None = None,
    allocated: Sequence[float | None] | None = None,
    reserved: Sequence[float | None] | None = None,
) -> LeakAssessment:
    """Judge one memory series: is it leaking, and what does it look like?

    `times` are seconds (any clock, ascending), `values` bytes at those times; NaN or None where
    the value was not available. `total_bytes` (a device's total memory) gives `time_to_full_s`.
    `allocated` and `reserved` are torch's `memory_allocated()` / `memory_reserved()` at the same
    `times` (same length, NaN where missing): with them, growth of the series while reserved grows
    and allocated does not is "cache-growth", not a leak.
    """
    if len(times) != len(values):
        raise ValueError("times and values must have the same length")
    for name, extra in (("allocated", allocated), ("reserved", reserved)):
        if extra is not None and len(extra) != len(times):
            raise ValueError(f"{name} must have one value per time")
    sketch = _sketch_of(times, values)
    primary = _finish(_judge(sketch, thresholds), sketch, total_bytes)
    if allocated is None:
        return primary

    def side(series: Sequence[float | None] | None) -> LeakAssessment | None:
        if series is None:
            return None
        s = _sketch_of(times, series)
        return _finish(_judge(s, thresholds), s, None)

    return _with_torch(primary, side(allocated), side(reserved))


# --- held bytes of one allocation site --------------------------------------------------------------

HELD_MIN_RISE = 1e6  # bytes: a site must gain at least this much over the tracking window to count


@dataclass(frozen=True)
class HeldTrend:
    """What the bytes one allocation site held over a tracking window look like.

    - `kind`: "rising" (held bytes rise steadily to the end: a leak, whatever RSS shows, since
      the tracker sees what the allocator's reuse of freed heap hides), "levelled" (they rose,
      then stopped: a cache filling up to its bound), "balanced" (what is allocated is freed),
      or "insufficient-data".
    - `growth_bytes_per_s`: the Theil-Sen slope of the held bytes; `confidence` in [0, 1].
    """

    kind: str
    growth_bytes_per_s: float
    confidence: float
    reason: str


def held_trend(times: Sequence[float], held: Sequence[float], thresholds: LeakThresholds = LeakThresholds()) -> HeldTrend:
    """Judge one site's held bytes over time (memory allocated since tracking began, still held).

    There is no sample noise to beat here (the tracker counts bytes exactly): what matters is
    that the rise is steady (Kendall's tau), lasts to the end (the last half of the window rises
    at least 40 % as fast as the whole), and adds up (`HELD_MIN_RISE`, `min_rate`)."""
    points = [(t, float(v)) for t, v in zip(times, held)]
    if len(points) < 4 or points[-1][0] - points[0][0] < 2.0:
        return HeldTrend("insufficient-data", 0.0, 0.0, f"held bytes read at only {len(points)} times")
    slope = theil_sen(points) or 0.0
    tau = kendall_tau(points)
    half = len(points) // 2
    late = theil_sen(points[half:]) or 0.0
    early = theil_sen(points[: half + 1]) or 0.0
    rise = points[-1][1] - points[0][1]
    peak = max(v for _, v in points)
    span = points[-1][0] - points[0][0]
    confidence = max(tau, 0.0) * min(1.0, len(points) / 10)
    if (rise >= HELD_MIN_RISE and slope >= thresholds.min_rate and tau >= 0.6 and late >= 0.4 * slope):
        return HeldTrend("rising", slope, confidence,
                         f"held bytes rose {format_speed(slope)} steadily for {format_duration(span)} (to {format_size(points[-1][1])})")
    if peak - points[0][1] >= HELD_MIN_RISE and early > 0 and late < 0.25 * early:
        return HeldTrend("levelled", late, confidence or 0.5,
                         f"held bytes rose to {format_size(peak)}, then levelled off (a cache filling to its bound)")
    return HeldTrend("balanced", slope, 1 - abs(tau) / 2,
                     f"held bytes at {format_size(points[-1][1])}, not rising steadily")


# --- when a running tracker has seen enough ---------------------------------------------------------

SETTLE_SKIP_S = 1.0  # the tracker's own start (its buffers, its module) is in its first second
SETTLE_MIN_S = 6.0  # a tracker is never stopped sooner: fewer points make no trend
SETTLE_MIN_POINTS = 6
SETTLE_TAU = 0.8  # a rise this steady (Kendall's tau) over the points so far is clear
SETTLE_HORIZON_S = 12.0  # what a default diagnosis (30 s) tracks: "flat" means no site could rise
# HELD_MIN_RISE over it, so the floors of each third of the points must stay within it and their
# slope, carried over this horizon, too.


@dataclass(frozen=True)
class Settled:
    """Why a tracker may stop before its time: "rising" (a site's held bytes rise steadily),
    "levelled" (the memory in use rose, then levelled off) or "flat"."""

    kind: str
    reason: str


def tracking_settled(times: Sequence[float], sites: Sequence[tuple[str, Sequence[float | None]]],
                     totals: Sequence[tuple[str, Sequence[float | None]]],
                     thresholds: LeakThresholds = LeakThresholds()) -> Settled | None:
    """Whether what a running tracker has seen so far is clear enough to stop it (None: not yet).

    `sites`: held bytes of allocation sites; `totals`: the process's memory in use (the heap
    malloc has handed out, the RSS), each at `times` (seconds since tracking began). A site or the
    heap rising steadily is a clear leak; every total flat, or risen and then levelled off, is
    clearly none (a cache filling to its bound). Anything else: keep tracking."""
    kept = [i for i, t in enumerate(times) if t >= SETTLE_SKIP_S]
    if len(kept) < SETTLE_MIN_POINTS or times[kept[-1]] < SETTLE_MIN_S:
        return None

    def points(held: Sequence[float | None]) -> list[tuple[float, float]]:
        return [(times[i], float(v)) for i in kept if i < len(held) and (v := held[i]) is not None]

    for name, held in [*sites, *totals[:1]]:  # the RSS rises with a tracker's own buffers: not a leak's sign
        pts = points(held)
        if len(pts) < SETTLE_MIN_POINTS:
            continue
        trend = held_trend([t for t, _ in pts], [v for _, v in pts], thresholds)
        if trend.kind == "rising" and kendall_tau(pts) >= SETTLE_TAU:
            return Settled("rising", f"{name} rose {format_speed(trend.growth_bytes_per_s)} steadily for "
                                     f"{format_duration(pts[-1][0] - pts[0][0])}")
    shapes = []
    for name, held in totals:
        pts = points(held)
        if len(pts) < SETTLE_MIN_POINTS:
            continue
        third = len(pts) // 3
        parts = (pts[:third], pts[third:2 * third], pts[2 * third:])
        floors = [min(parts[k], key=lambda p: p[1]) for k in range(3)]
        drift = abs(theil_sen(floors) or 0.0) * SETTLE_HORIZON_S
        if max(v for _, v in floors) - min(v for _, v in floors) <= HELD_MIN_RISE and drift <= HELD_MIN_RISE:
            shapes.append((name, "flat"))
        elif floors[1][1] - floors[0][1] >= HELD_MIN_RISE and abs(floors[2][1] - floors[1][1]) <= HELD_MIN_RISE / 4:
            shapes.append((name, "levelled"))
        else:
            return None  # still moving: keep tracking
    if not shapes:
        return None
    span = format_duration(times[kept[-1]] - times[kept[0]])
    levelled = [name for name, shape in shapes if shape == "levelled"]
    if levelled:
        return Settled("levelled", f"{levelled[0]} rose, then stayed level for {span} (a cache filling to its bound)")
    return Settled("flat", f"{' and '.join(name for name, _ in shapes)} flat for {span}")


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
                 "raised_at", "phase", "pending", "fed_at")

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
    leak keeps looking like one. An alert, once raised,
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
            reserved: float | None = None, total_bytes: float | None = None) -> None:
        """One sample of series `key` at time t (seconds). None/NaN: not available this time.

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

    def forget(self, key: Hashable) -> None:
        self._series.pop(key, None)

    def recent_growth(self, key: Hashable, window_s: float) -> float | None:
        """Growth per second of the series' floor over its last `window_s` seconds of data (the
        console's GROW column), or None while there is too little data: `growth.floor_growth`
        through the minima of the sketch's buckets, the floors the alerts are judged on."""
        s = self._series.get(key)
        last = s.sketch.last_time if s is not None else None
        if s is None or last is None:
            return None
        buckets = s.sketch.recent(last - window_s)
        return floor_growth([b.t_min for b in buckets], [b.v_min for b in buckets])

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


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
