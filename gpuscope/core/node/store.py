"""A bounded time-series store: one ring per series, a cap on the number of series.

Memory per tracked series is bounded (at most `capacity` samples) however long gpuscope runs;
series that stop receiving samples are dropped after `idle_ttl` seconds, and when more than
`max_series` are live the least recently updated go first.

The samples are kept compactly, and exactly: the series fed at the same times (every process's
RSS, read in one host scan) share one `Clock` holding those times once, and each ring keeps runs
of equal values (an idle process's memory does not change for hours) as one entry: a run is the
clock position of its first sample, its number of samples and the value. A series whose every
sample differs costs about what one (time, value) pair per sample would.
"""

from __future__ import annotations

import math
import threading
from array import array
from bisect import bisect_left
from collections.abc import Hashable

MISSING = math.nan  # a sample that could not be read (N/A) is stored as NaN

# Entries dropped from the front of an array are removed in one go once this many have gathered
# (and they are at least half of it), so trimming costs O(1) per sample, amortised.
_COMPACT_AT = 256


class Clock:
    """The distinct sample times of the series that share it, oldest first, each with a position
    (`seq`) that stays the same while older times are dropped."""

    __slots__ = ("_times", "_base")

    def __init__(self) -> None:
        self._times = array("d")
        self._base = 0  # seq of _times[0]

    @property
    def start(self) -> int:
        """The seq of the oldest time held."""
        return self._base

    @property
    def last(self) -> float | None:
        return self._times[-1] if self._times else None

    def time(self, seq: int) -> float:
        return self._times[seq - self._base]

    def times(self, start: int, end: int) -> array:
        """The times at positions start to end (excluded)."""
        return self._times[start - self._base:end - self._base]

    def seq_of(self, t: float, after: int) -> int | None:
        """The first position after `after` holding time t, t appended when it is later than every
        time held (or equal to the latest, held at or before `after`: a time repeated); None when
        t falls between the times held there."""
        times, base = self._times, self._base
        i = max(after + 1 - base, 0)
        if i < len(times) and times[i] == t:  # the usual case: the next time of the clock
            return base + i
        if not times or t > times[-1]:
            times.append(t)
            return base + len(times) - 1
        i = bisect_left(times, t, i)
        if i < len(times) and times[i] == t:
            return base + i
        if t == times[-1]:
            times.append(t)
            return base + len(times) - 1
        return None

    def first_at_or_after(self, t: float) -> int:
        return self._base + bisect_left(self._times, t)

    def drop_before(self, seq: int) -> None:
        """Forget the times before position `seq` (no ring holds them any more)."""
        n = seq - self._base
        if n >= _COMPACT_AT and 2 * n >= len(self._times):
            del self._times[:n]
            self._base = seq


class Ring:
    """At most `capacity` (time, value) samples of one series, oldest first when read.

    Stored as runs of equal consecutive values over the positions of a `Clock` (its own unless
    one is given to share); the arrays grow with the runs, so a process seen for a few seconds
    costs a few entries, and one whose memory never changes costs one.
    """

    __slots__ = ("_clock", "_own_clock", "_seqs", "_counts", "_values", "_head", "_size", "capacity")

    def __init__(self, capacity: int, clock: Clock | None = None) -> None:
        if capacity < 2:
            raise ValueError("a ring needs room for at least two samples")
        self.capacity = capacity
        self._clock = clock if clock is not None else Clock()
        self._own_clock = clock is None  # then this ring trims it; a shared one, its store
        self._seqs = array("q")  # clock position of each run's first sample
        self._counts = array("l")  # samples in each run (at consecutive clock positions)
        self._values = array("d")
        self._head = 0  # index of the oldest run still held (those before it wait to be removed)
        self._size = 0  # samples held

    def __len__(self) -> int:
        return self._size

    @property
    def clock(self) -> Clock:
        return self._clock

    def runs(self) -> int:
        """Runs held (the memory bound in practice)."""
        return len(self._seqs) - self._head

    def oldest_seq(self) -> int | None:
        return self._seqs[self._head] if self._size else None

    def append(self, t: float, value: float | None) -> None:
        v = MISSING if value is None else float(value)
        last = len(self._seqs) - 1
        after = self.last_seq()
        seq = self._clock.seq_of(t, after)
        if seq is None:
            self._move_to_own_clock()
            seq = self._clock.seq_of(t, self.last_seq())
            if seq is None:  # earlier than the latest sample held: out of order, not kept
                return
        if (self._size and seq == after + 1
                and (v == self._values[last] or (v != v and self._values[last] != self._values[last]))):
            self._counts[last] += 1
        else:
            self._seqs.append(seq)
            self._counts.append(1)
            self._values.append(v)
        self._size += 1
        if self._size > self.capacity:
            self._drop_oldest()

    def last_seq(self) -> int:
        """Clock position of the latest sample (before every time the clock holds when empty)."""
        return self._seqs[-1] + self._counts[-1] - 1 if self._size else self._clock.start - 1

    def _drop_oldest(self) -> None:
        h = self._head
        self._size -= 1
        if self._counts[h] > 1:
            self._counts[h] -= 1
            self._seqs[h] += 1
        else:
            self._head = h = h + 1
            if h >= _COMPACT_AT and 2 * h >= len(self._seqs):
                del self._seqs[:h], self._counts[:h], self._values[:h]
                self._head = 0
        if self._own_clock:
            self._clock.drop_before(self._seqs[self._head])

    def _move_to_own_clock(self) -> None:
        """Samples at times the shared clock does not hold in order (a series fed at other
        times than those it shares them with): this ring keeps its own clock from now on."""
        times, values = self.since(-math.inf)
        self._clock, self._own_clock = Clock(), True
        self._seqs, self._counts, self._values = array("q"), array("l"), array("d")
        self._head = self._size = 0
        for t, v in zip(times, values):
            self.append(t, v)

    def last_time(self) -> float | None:
        return self._clock.time(self.last_seq()) if self._size else None

    def since(self, t0: float) -> tuple[list[float], list[float]]:
        """Samples with time >= t0, oldest first (values may be NaN)."""
        if not self._size:
            return [], []
        clock = self._clock
        first = clock.first_at_or_after(t0)
        runs: list[tuple[int, int, float]] = []
        # Walk backwards from the newest run: windows are short compared with the ring.
        for r in range(len(self._seqs) - 1, self._head - 1, -1):
            start, end = self._seqs[r], self._seqs[r] + self._counts[r]
            if end <= first:
                break
            runs.append((max(start, first), end, self._values[r]))
        times: list[float] = []
        values: list[float] = []
        for start, end, v in reversed(runs):
            times.extend(clock.times(start, end))
            values.extend([v] * (end - start))
        return times, values


class SeriesStore:
    """Thread-safe map of series key -> Ring, bounded in count and per-series length."""

    # 2048 series: a node of 8 GPUs x 200 processes keeps ~620 live (RSS, GPU per device and in all,
    # for each process); fewer would evict and re-create them every tick, and no growth would show.
    def __init__(self, capacity: int = 3600, max_series: int = 2048, idle_ttl: float = 120.0) -> None:
        self.capacity = capacity
        self.max_series = max_series
        self.idle_ttl = idle_ttl
        self._rings: dict[Hashable, Ring] = {}
        self._clocks: list[Clock] = []  # those new series may join (see `_clock_for`)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rings)

    def add(self, key: Hashable, t: float, value: float | None) -> None:
        with self._lock:
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = Ring(self.capacity, self._clock_for(t))
            ring.append(t, value)

    def _clock_for(self, t: float) -> Clock:
        # A new series joins the clock whose latest time is its first (it is read with the others
        # fed at that time), or starts one: series fed at different times do not share a clock.
        for clock in self._clocks:
            if clock.last == t:
                return clock
        clock = Clock()
        self._clocks.append(clock)
        return clock

    def window(self, key: Hashable, t0: float) -> tuple[list[float], list[float]]:
        with self._lock:
            ring = self._rings.get(key)
            return ring.since(t0) if ring is not None else ([], [])

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._rings)

    def prune(self, now: float) -> None:
        """Drop series idle for longer than idle_ttl, then the stalest beyond max_series; then
        the clocks' times that no series holds any more."""
        with self._lock:
            stale = [k for k, r in self._rings.items() if (r.last_time() or 0.0) < now - self.idle_ttl]
            for k in stale:
                del self._rings[k]
            excess = len(self._rings) - self.max_series
            if excess > 0:
                by_age = sorted(self._rings, key=lambda k: self._rings[k].last_time() or 0.0)
                for k in by_age[:excess]:
                    del self._rings[k]
            oldest: dict[int, int] = {}
            used: dict[int, Clock] = {}
            for ring in self._rings.values():
                seq = ring.oldest_seq()
                if seq is not None:
                    key = id(ring.clock)
                    used[key] = ring.clock
                    oldest[key] = min(oldest.get(key, seq), seq)
            for key, clock in used.items():
                clock.drop_before(oldest[key])
            self._clocks = [c for c in self._clocks if id(c) in used]
