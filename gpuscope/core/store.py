"""A bounded time-series store: one ring per series, a cap on the number of series.

Memory per tracked series is bounded (at most `capacity` samples of two doubles) however long
gpuscope runs; series that stop receiving samples are dropped after `idle_ttl` seconds, and when
more than `max_series` are live the least recently updated go first.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Hashable

MISSING = math.nan  # a sample that could not be read (N/A) is stored as NaN


class Ring:
    """A ring of (time, value) samples holding at most `capacity`, oldest first when read.

    The arrays grow with the samples until the ring is full, so a process seen for a few
    seconds costs a few samples, not a whole preallocated ring.
    """

    __slots__ = ("_times", "_values", "_start", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError("a ring needs room for at least two samples")
        self.capacity = capacity
        self._times = array("d")
        self._values = array("d")
        self._start = 0  # index of the oldest sample once the ring is full

    def __len__(self) -> int:
        return len(self._times)

    def append(self, t: float, value: float | None) -> None:
        v = MISSING if value is None else float(value)
        if len(self._times) < self.capacity:
            self._times.append(t)
            self._values.append(v)
            return
        i = self._start
        self._times[i] = t
        self._values[i] = v
        self._start = (i + 1) % self.capacity

    def last_time(self) -> float | None:
        if not self._times:
            return None
        return self._times[(self._start - 1) % len(self._times)]

    def since(self, t0: float) -> tuple[list[float], list[float]]:
        """Samples with time >= t0, oldest first (values may be NaN)."""
        times: list[float] = []
        values: list[float] = []
        size = len(self._times)
        # Walk backwards from the newest sample: windows are short compared with the ring.
        for k in range(size - 1, -1, -1):
            i = (self._start + k) % size
            t = self._times[i]
            if t < t0:
                break
            times.append(t)
            values.append(self._values[i])
        times.reverse()
        values.reverse()
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
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rings)

    def add(self, key: Hashable, t: float, value: float | None) -> None:
        with self._lock:
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = Ring(self.capacity)
            ring.append(t, value)

    def window(self, key: Hashable, t0: float) -> tuple[list[float], list[float]]:
        with self._lock:
            ring = self._rings.get(key)
            return ring.since(t0) if ring is not None else ([], [])

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._rings)

    def prune(self, now: float) -> None:
        """Drop series idle for longer than idle_ttl, then the stalest beyond max_series."""
        with self._lock:
            stale = [k for k, r in self._rings.items() if (r.last_time() or 0.0) < now - self.idle_ttl]
            for k in stale:
                del self._rings[k]
            excess = len(self._rings) - self.max_series
            if excess > 0:
                by_age = sorted(self._rings, key=lambda k: self._rings[k].last_time() or 0.0)
                for k in by_age[:excess]:
                    del self._rings[k]
