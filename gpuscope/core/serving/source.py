"""Serving metrics as a source: the service's signals, live (console) or once (headless).

Two collectors behind one interface:
- `ScrapeCollector` (gpuscope.core.serving.scrape): GET each --metrics-url, compute locally with
  Prometheus's semantics;
- `PrometheusCollector` (gpuscope.core.serving.prometheus): PromQL against a Prometheus server.

`ServingSource` runs a collector live: one Poller per target (gpuscope.core.common.poller: coalesced
requests, a deadline on every read, errors as values), a ticker that asks every `interval`, and an
immutable `ServingSnapshot` handed to a plain callback after every read, like NodeSource:

    source = ServingSource(make_collector(metrics_urls=["http://127.0.0.1:8000/metrics"], window_s=30))
    source.start(on_snapshot)   # called from a background thread
    ...
    source.stop()

`observe(collector)` is the synchronous form for `gpuscope metrics`: one read per target with a
window of 0 (or with Prometheus, which holds the history itself), else reads spread over the
window (about one a second, or as many as asked: two for "now"), then one evaluation.

Every snapshot carries what the core finds in its history (a P99 jump, gpuscope.core.serving.changepoint),
so whatever shows or records a snapshot shows the same finding.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from gpuscope.core.settings import Config
from gpuscope.core.serving.changepoint import latency_jump
from gpuscope.core.common.poller import Poller, Reading
from gpuscope.core.serving.profiles import load_profiles
from gpuscope.core.serving.scrape import ScrapeCollector
from gpuscope.core.serving.model import (
    Evaluation,
    FleetRow,
    ServingSnapshot,
    SignalPoint,
    Signals,
    SourceError,
)

if TYPE_CHECKING:
    from gpuscope.core.serving.prometheus import PrometheusCollector

HISTORY_LEN = 300  # signal points kept for charts: five minutes at one read a second


class Collector(Protocol):
    """What ServingSource and observe() need from a collector."""

    source: str  # "scrape" | "prometheus"
    target: str  # shown; credentials redacted
    window_s: float

    @property
    def target_names(self) -> list[str]: ...  # one per reader

    def readers(self) -> list[Callable[[], Any]]: ...  # blocking; raise SourceError

    def record(self, index: int, reading: Any) -> None: ...

    def record_failure(self, index: int) -> None: ...

    def evaluate(self) -> Evaluation: ...

    @property
    def malformed_lines(self) -> int: ...

    @property
    def format(self) -> str | None: ...  # the exposition format(s) read; None from Prometheus

    @property
    def fleet(self) -> tuple[FleetRow, ...]: ...

    def close(self) -> None: ...


def make_collector(
    *,
    window_s: float,
    metrics_urls: Sequence[str] | None = None,
    prometheus: str | None = None,
    job: str | None = None,
    instance: str | None = None,
    config: Config | None = None,
    env: Mapping[str, str] = os.environ,
    timeout: float = 5.0,
) -> ScrapeCollector | PrometheusCollector:
    """The collector for the command-line options. ValueError (one plain line) on bad input;
    gpuscope.core.settings.ConfigError from a bad profile section of the configuration file."""
    profiles = load_profiles(config)
    if metrics_urls:
        if job or instance:
            raise ValueError("--job and --instance filter a Prometheus server's series: use them with --prometheus")
        return ScrapeCollector(metrics_urls, window_s=window_s, profiles=profiles, timeout=timeout)
    if prometheus is None:
        raise ValueError("give --metrics-url URL or --prometheus URL")
    # requests and prometheus-api-client load only for a Prometheus source (~0.1 s of imports)
    from gpuscope.core.serving.prometheus import PrometheusAuth, PrometheusCollector  # noqa: PLC0415

    url, auth = PrometheusAuth.resolve(prometheus, env, config.prometheus if config else None)
    return PrometheusCollector(
        url, window_s=window_s, profiles=profiles, job=job, instance=instance, auth=auth, timeout=timeout
    )


@dataclass
class _TargetState:
    answered: bool = False  # its newest read succeeded
    error: str | None = None
    unreachable_since: float | None = None

    def describe(self) -> str:
        if self.error is None:
            return "ok"
        if self.unreachable_since is not None:
            since = time.strftime("%H:%M:%S", time.localtime(self.unreachable_since))
            return f"unreachable since {since}, retrying ({self.error})"
        return self.error


class ServingSource:
    """A collector, read live; immutable snapshots to a callback. Never blocks the caller."""

    kind = "serving"

    def __init__(
        self,
        collector: Collector,
        *,
        interval: float = 1.0,
        read_timeout: float | None = None,
        history_len: int = HISTORY_LEN,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.collector = collector
        self.interval = interval
        self._clock = clock
        timeout = read_timeout if read_timeout is not None else max(5.0, 3 * interval)
        names = collector.target_names
        self._states = [_TargetState() for _ in names]
        self._pollers = [
            Poller(name, _as_value(read), partial(self._on_reading, i), timeout=timeout)
            for i, (name, read) in enumerate(zip(names, collector.readers()))
        ]
        self._rest_until = [0.0] * len(self._pollers)  # time.monotonic() before which not to ask
        self._history: deque[SignalPoint] = deque(maxlen=history_len)
        self._last_good: tuple[float, Evaluation] | None = None
        self._latest: ServingSnapshot | None = None
        self._on_snapshot: Callable[[ServingSnapshot], None] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="gpuscope-serving-ticker", daemon=True)

    @property
    def latest(self) -> ServingSnapshot | None:
        """The newest snapshot (None before the first read finished)."""
        return self._latest

    def start(self, on_snapshot: Callable[[ServingSnapshot], None]) -> None:
        """Begin reading; `on_snapshot` is called from a background thread after every read."""
        self._on_snapshot = on_snapshot
        for p in self._pollers:
            p.start()
        self._ticker.start()

    def stop(self) -> None:
        """Stop reading and emitting. A read in flight ends at its own timeout, on its thread."""
        self._stopping.set()
        for p in self._pollers:
            p.stop()
        if self._ticker.is_alive():
            self._ticker.join(1.0)
        self.collector.close()

    def _tick(self) -> None:
        while not self._stopping.is_set():
            now = time.monotonic()
            for p, rest_until in zip(self._pollers, self._rest_until):
                # A read still in flight is asked again all the same: that is how the poller
                # notices it is overdue.
                if now >= rest_until or p.in_flight:
                    p.request()
            self._stopping.wait(self.interval)

    def _on_reading(self, index: int, reading: Reading) -> None:
        started = time.monotonic()
        try:
            self._accept(index, reading)
        finally:
            # A target whose read and evaluation take long (a 5 MB exposition: most of a
            # second) rests as long as they took, so this source stays under half a core and
            # the console stays responsive; a fast target is read on every tick.
            self._rest_until[index] = time.monotonic() + reading.took_s + (time.monotonic() - started)

    def _accept(self, index: int, reading: Reading) -> None:
        now = self._clock()
        with self._lock:
            state = self._states[index]
            failure = reading.error if reading.error is not None else reading.value
            if isinstance(failure, (str, SourceError)):
                self.collector.record_failure(index)
                if isinstance(failure, SourceError) and failure.unreachable:
                    state.unreachable_since = state.unreachable_since or now
                else:
                    state.unreachable_since = None
                state.error = str(failure)
                state.answered = False
            else:
                self.collector.record(index, reading.value)
                state.error = state.unreachable_since = None
                state.answered = True
            if any(s.answered for s in self._states):
                evaluation = self.collector.evaluate()
                self._last_good = (now, evaluation)
                self._history.append(SignalPoint(now, evaluation.signals))
            snapshot = self._snapshot(now)
            self._latest = snapshot
            if self._on_snapshot is not None and not self._stopping.is_set():
                self._on_snapshot(snapshot)

    def _snapshot(self, now: float) -> ServingSnapshot:
        as_of, evaluation = self._last_good if self._last_good else (None, Evaluation(None, Signals()))
        state = next((s.describe() for s in self._states if s.error is not None), "ok")
        return _make_snapshot(self.collector, now, evaluation, state, as_of, tuple(self._history))


def _as_value(read: Callable[[], Any]) -> Callable[[], Any]:
    """A read whose SourceError comes back as its value: the Poller reports exceptions as bare
    text, and the source needs to know whether the target was unreachable or answered wrongly."""

    def guarded() -> Any:
        try:
            return read()
        except SourceError as exc:
            return exc

    return guarded


def _make_snapshot(
    collector: Collector,
    now: float,
    evaluation: Evaluation,
    state: str,
    as_of: float | None,
    history: tuple[SignalPoint, ...],
) -> ServingSnapshot:
    return ServingSnapshot(
        time=now,
        source=collector.source,
        target=collector.target,
        profile=evaluation.profile,
        window_s=collector.window_s,
        signals=evaluation.signals,
        stages=evaluation.stages,
        state=state,
        malformed_lines=collector.malformed_lines,
        as_of=as_of,
        history=history,
        fleet=collector.fleet,
        format=collector.format,
        p99_jump=latency_jump([(p.time, p.signals.e2e_latency_p99_s) for p in history]),
    )


def scrape_schedule(window_s: float, reads: int | None = None) -> list[float]:
    """Offsets (s from the first read) at which observe() reads for a window: `reads` reads, or
    by default about one a second and at least five; the last a little (5 % of a step) before
    the window ends so that the first read still falls inside the range `[last - window, last]`."""
    if window_s <= 0:
        return [0.0]
    intervals = max(1, reads - 1) if reads else max(4, math.ceil(window_s))
    step = window_s / intervals
    span = window_s - 0.05 * step
    return [span * k / intervals for k in range(intervals + 1)]


def observe(
    collector: Collector,
    *,
    reads: int | None = None,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.time,
    keep_open: bool = False,
) -> ServingSnapshot:
    """Read the target(s) and compute the signals once (the headless command).

    The scrape source with a window W > 0 reads over W seconds (`scrape_schedule`, with `reads`);
    Prometheus and a window of 0 need one read. The first failed read ends the observation at
    once: the snapshot's `state` is then the reason (one plain line), and its signals are empty.
    `progress` hears one line once the first read succeeded. The collector is closed afterwards
    unless `keep_open` (to go on reading it live).
    """
    offsets = scrape_schedule(collector.window_s, reads) if collector.source == "scrape" else [0.0]
    readers = collector.readers()
    started = time.monotonic()
    try:
        for n, offset in enumerate(offsets):
            delay = started + offset - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for i, read in enumerate(readers):
                try:
                    collector.record(i, read())
                except SourceError as exc:
                    empty = Evaluation(None, Signals())
                    return _make_snapshot(collector, clock(), empty, str(exc), None, ())
            if n == 0 and progress is not None and len(offsets) > 1:
                progress(
                    f"observing {collector.target} for {collector.window_s:g} s "
                    f"({len(offsets)} scrapes, {offsets[1] - offsets[0]:.1f} s apart)"
                )
        now = clock()
        evaluation = collector.evaluate()
        return _make_snapshot(collector, now, evaluation, "ok", now, (SignalPoint(now, evaluation.signals),))
    finally:
        if not keep_open:
            collector.close()
