"""The floor sketch: bounded, mergeable, multi-resolution summaries of one memory series."""

from __future__ import annotations

import itertools
from array import array
import math
import statistics
from collections import deque
from collections.abc import Iterator, Sequence
from typing import cast



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

    @classmethod
    def of(cls, times: Sequence[float], values: Sequence[float | None]) -> FloorSketch:
        """A sketch of given samples (None or NaN where not available), buckets one sampling
        interval wide: finer than the live watch's (it is built once), so a step two hours back is
        placed to within 16 samples' time, not 256."""
        valid = [(t, v) for t, v in zip(times, values) if v is not None and not math.isnan(v)]
        width = 1.0
        if len(valid) >= 2 and valid[-1][0] > valid[0][0]:
            width = (valid[-1][0] - valid[0][0]) / (len(valid) - 1)
        sketch = cls(bucket_s=max(width, 1e-6), per_level=1024)
        for t, v in valid:
            sketch.add(t, v)
        return sketch

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


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs)
