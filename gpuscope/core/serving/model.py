"""Immutable values the serving-metrics sources hand to whatever renders them.

A `ServingSnapshot` is what the service looks like at one instant: the ten signals of
`gpuscope metrics --json`, the per-stage latencies, where they came from, whether the source is
healthy, a short history of the signals for charts, and what the core found in that history (a
P99 jump). Nothing here imports a UI library.

Every number is a float or None. None means "cannot be computed" (no such metric, no
observations in the window, a rate with fewer than two samples): never 0, never a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from gpuscope.core.serving.changepoint import Jump
from gpuscope.core.common.printable import printable
from gpuscope.errors import GpuscopeError

SCHEMA = "gpuscope.metrics/1"


def finite_or_none(value: float | None) -> float | None:
    """NaN and infinities are "no data" (an idle histogram, a 0/0 ratio): None."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True, slots=True)
class Signals:
    """The service's headline numbers, in the order of the `metrics --json` contract. Seconds for
    latencies, per second for rates, a 0-1 fraction for error_rate and kv_cache_usage, a number
    of requests for queue_depth."""

    e2e_latency_p50_s: float | None = None
    e2e_latency_p95_s: float | None = None
    e2e_latency_p99_s: float | None = None
    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    tokens_per_s: float | None = None
    requests_per_s: float | None = None
    error_rate: float | None = None
    queue_depth: float | None = None
    kv_cache_usage: float | None = None

    def get(self, name: str) -> float | None:
        if name not in SIGNAL_NAMES:
            raise KeyError(name)
        return getattr(self, name)

    def to_json(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in SIGNAL_NAMES}


SIGNAL_NAMES = tuple(f.name for f in fields(Signals))


@dataclass(frozen=True, slots=True)
class StageStats:
    """One pipeline stage (RAG retriever/reranker/llm, or a server's queue/prefill/decode phase).

    `share` is the stage's fraction of the time spent in all stages over the window (from the
    histograms' `_sum`), so the shares of one snapshot add up to 1."""

    name: str
    p50_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    share: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", printable(self.name))  # a label value: the service's text

    def to_json(self) -> dict[str, float | None]:
        return {"p50_s": self.p50_s, "p95_s": self.p95_s, "p99_s": self.p99_s, "share": self.share}


@dataclass(frozen=True, slots=True)
class FleetRow:
    """One GPU of the fleet, from dcgm-exporter through Prometheus: where memory grows fastest.
    `growth_mib_per_s` is PromQL `deriv()` of DCGM_FI_DEV_FB_USED over the fleet window."""

    host: str | None
    gpu: str | None
    uuid: str | None
    pod: str | None
    namespace: str | None
    used_mib: float | None
    growth_mib_per_s: float | None

    def __post_init__(self) -> None:
        for name in ("host", "gpu", "uuid", "pod", "namespace"):  # label values: the exporters' text
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, printable(value))


@dataclass(frozen=True, slots=True)
class SignalPoint:
    """The signals as of one evaluation, for charts."""

    time: float
    signals: Signals


@dataclass(frozen=True, slots=True)
class ServingSnapshot:
    """What the serving source knows at one instant.

    - `time`: when this snapshot was made (seconds since the epoch).
    - `source`: "scrape" (gpuscope read /metrics itself) or "prometheus" (PromQL).
    - `target`: the URL(s) or Prometheus server and filters; credentials are never in it.
    - `profile`: the server family detected from the metric names ("vllm", "rag", ...) or None.
    - `window_s`: the rate/quantile window; 0 = quantiles over cumulative buckets, rates None.
    - `signals`, `stages`: as of `as_of` (the last good evaluation; None before the first).
    - `state`: "ok", or why not: "unreachable since HH:MM:SS, retrying (...)" or an error text.
      When it is not "ok", `signals` and `stages` are the last good ones, not current.
    - `malformed_lines`: lines of the latest scrape(s) that could not be parsed and were skipped.
    - `history`: the signals of recent good evaluations, oldest first (bounded).
    - `fleet`: GPUs by memory growth (Prometheus source with dcgm-exporter only; else empty).
    - `format`: the exposition format read, per target joined by "," like `target` (scrape
      source, e.g. "text/plain; version=0.0.4"); None from Prometheus or before a good read.
    - `p99_jump`: the latest upward shift of the e2e P99 in the history
      (gpuscope.core.serving.changepoint), found when the snapshot was made; None: no jump.
    """

    time: float
    source: str
    target: str
    profile: str | None
    window_s: float
    signals: Signals
    stages: tuple[StageStats, ...] = ()
    state: str = "ok"
    malformed_lines: int = 0
    as_of: float | None = None
    history: tuple[SignalPoint, ...] = ()
    fleet: tuple[FleetRow, ...] = ()
    format: str | None = None
    p99_jump: Jump | None = None

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def stage(self, name: str) -> StageStats | None:
        return next((s for s in self.stages if s.name == name), None)

    def series(self, name: str) -> tuple[tuple[float, float | None], ...]:
        """One signal over the history, (time, value) oldest first: what a chart plots."""
        return tuple((p.time, p.signals.get(name)) for p in self.history)

    def to_json(self) -> dict:
        """The `gpuscope metrics --json` object (the gpuscope.metrics/1 contract; `format` and
        `p99_jump` were added after the first seven keys)."""
        return {
            "schema": SCHEMA,
            "source": self.source,
            "target": self.target,
            "profile": self.profile,
            "window_s": self.window_s,
            "signals": self.signals.to_json(),
            "stages": {s.name: s.to_json() for s in self.stages},
            "format": self.format,
            "p99_jump": self.p99_jump.to_json() if self.p99_jump else None,
        }


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one evaluation of a source's data gives (before it becomes a snapshot)."""

    profile: str | None
    signals: Signals
    stages: tuple[StageStats, ...] = ()


class SourceError(GpuscopeError):
    """A read that produced nothing usable, as one plain line (credentials already redacted).

    `unreachable`: nothing answered (refused, no route, timed out), as opposed to an answer that
    was wrong (HTTP 500, not metrics, a rejected query)."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable
