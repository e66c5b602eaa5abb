"""One reader thread per source, with coalesced requests and a deadline on every read.

`request()` never blocks. Requests that arrive while a read is in flight collapse into a single
pending one (memray's Event pattern), so there is never a backlog and never two reads of the same
source at once. A read that outlives its deadline is reported once as an error value; the thread
stays with it (a thread cannot be killed) but no second thread is ever started, so a hung NVML or
/proc read costs one thread, not one per tick.

`pace()` is how often to ask: the refresh interval, or longer while a source is slow, so a slow
source is not kept busy back to back (and a slow link is not sent a frame per read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Reading:
    """The outcome of one read: a value, or an error message (never an exception)."""

    source: str
    value: Any = None
    error: str | None = None
    took_s: float = 0.0
    late: bool = False  # finished after its deadline was already reported


SLOW_FACTOR = 2.0  # a source busy for t seconds is asked at most every SLOW_FACTOR x t ...
MAX_SLOWDOWN = 8.0  # ... but at least every MAX_SLOWDOWN x the refresh interval


def pace(interval: float, pollers: Sequence[Poller]) -> float:
    """Seconds until the next round of requests."""
    busy = max((p.busy_s() for p in pollers), default=0.0)
    return min(MAX_SLOWDOWN * interval, max(interval, SLOW_FACTOR * busy))


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Poller:
    def __init__(
        self,
        name: str,
        read: Callable[[], Any],
        on_reading: Callable[[Reading], None],
        *,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._read = read
        self._on_reading = on_reading
        self.timeout = timeout
        self._clock = clock
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._started_at: float | None = None
        self._overdue_reported = False
        self._last_took_s = 0.0
        self._thread = threading.Thread(target=self._run, name=f"gpuscope-{name}", daemon=True)

    @property
    def in_flight(self) -> bool:
        return self._started_at is not None

    def busy_s(self) -> float:
        """How long the last read took, or the one in flight has taken so far if longer."""
        with self._lock:
            started = self._started_at
            running = self._clock() - started if started is not None else 0.0
            return max(self._last_took_s, running)

    def start(self) -> None:
        self._thread.start()

    def stop(self, join_timeout: float = 1.0) -> None:
        self._stopping.set()
        self._wanted.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(join_timeout)

    def request(self) -> None:
        """Ask for a read as soon as the current one (if any) is done."""
        overdue = None
        with self._lock:
            started = self._started_at
            if started is not None and not self._overdue_reported:
                waited = self._clock() - started
                if waited > self.timeout:
                    self._overdue_reported = True
                    overdue = waited
            self._wanted.set()
        if overdue is not None:
            self._on_reading(
                Reading(self.name, error=f"{self.name} has not answered for {overdue:.1f} s", took_s=overdue)
            )

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            if self._stopping.is_set():
                return
            self._wanted.clear()
            with self._lock:
                self._started_at = self._clock()
                self._overdue_reported = False
            started = self._started_at
            try:
                value, error = self._read(), None
            except Exception as exc:  # a collector bug must not kill the thread: report it
                value, error = None, describe_error(exc)
            took = self._clock() - started
            with self._lock:
                late = self._overdue_reported
                self._started_at = None
                self._last_took_s = took
            if self._stopping.is_set():
                return
            self._on_reading(Reading(self.name, value, error, took, late))
