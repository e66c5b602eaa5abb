"""The scrape source: gpuscope reads /metrics itself and computes what Prometheus would.

Each target keeps, per series, the samples of its recent scrapes (only the series the detected
profile reads, over `window_s` plus a margin), stamped with the time the scrape started, as
Prometheus stamps its samples: a small TSDB. The profile's query plan
(gpuscope.core.serving.profiles.plan) is then evaluated the way PromQL would evaluate it over those
samples, at the time of the newest scrape:

- `rate(x[w])`: per series, the samples with t in [at - w, at] (a 2.x closed range), through
  gpuscope.core.serving.promql.rate (extrapolation, counter resets);
- `sum by (le, ...)`: series of all targets added by the grouping labels (several --metrics-url
  combine as several instances of one job would in `sum by (le)`);
- instant values (window 0, gauges): the series of each target's newest scrape. A target whose
  newest scrape failed has none, as Prometheus marks its series stale after a failed scrape;
  a series exposed twice in one scrape keeps its first sample, as Prometheus's TSDB does.

Each scrape is one bounded GET (gpuscope.core.serving.fetch: a deadline on the whole exchange, the body
capped once decompressed, credentials to the URL's own origin only), and an exposition of more
than MAX_LINES lines, or with a line over MAX_LINE_CHARS, is refused before it is parsed: a
hostile or broken endpoint costs one error line a refresh, never the node's memory.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field

from gpuscope.core.serving import fetch
from gpuscope.core.serving.exposition import ACCEPT, Endpoint, Exposition, Labels, ScrapeError, not_metrics, parse_exposition
from gpuscope.core.serving.profiles import (
    Answer,
    CounterSum,
    GaugeAggregate,
    MetricRef,
    Profile,
    Quantile,
    Query,
    assemble,
    detect,
    kept_names,
    plan,
    resolve,
    sample_names,
)
from gpuscope.core.serving.promql import histogram_quantile, in_range, parse_le, rate
from gpuscope.core.serving.model import Evaluation, FleetRow, Signals

RETENTION_MARGIN_S = 5.0  # samples kept beyond the window: the range must find its first sample
MAX_POINTS = 4096  # per series, whatever the window (an hour at one scrape a second fits)
# What one exposition may hold. A busy vLLM server beside the dcgm-exporter of a large node sends
# ~5 MB in ~30,000 lines. Parsing costs ~40 us and a few kB a line (every line is parsed when no
# profile is detected), and an unparseable line costs several copies of itself.
MAX_BYTES = 16 << 20  # decompressed
MAX_LINES = 50_000
MAX_LINE_CHARS = 64 << 10

Points = deque  # of (time, value), oldest first


@dataclass
class _Target:
    endpoint: Endpoint
    series: dict[str, dict[Labels, Points]] = field(default_factory=dict)  # name -> labels -> points
    newest_at: float | None = None  # when the newest good scrape started
    names: frozenset[str] = frozenset()  # every name of the newest good scrape (for detection)
    up: bool = False  # the newest scrape succeeded
    malformed: int = 0
    format: str | None = None  # of the newest good scrape

    def add(self, at: float, exposition: Exposition, keep: Iterable[str], oldest: float) -> None:
        for name in keep:
            by_labels = self.series.setdefault(name, {})
            for labels, value in exposition.series.get(name, ()):
                points = by_labels.get(labels)
                if points is None:
                    by_labels[labels] = deque([(at, value)])
                elif points[-1][0] != at:  # a series twice in one scrape: the first sample wins
                    points.append((at, value))
        for name in list(self.series):
            by_labels = self.series[name]
            for labels in list(by_labels):
                points = by_labels[labels]
                while points and (points[0][0] < oldest or len(points) > MAX_POINTS):
                    points.popleft()
                if not points:
                    del by_labels[labels]  # a series gone for longer than the window
            if not by_labels:
                del self.series[name]
        self.newest_at = at


class ScrapeCollector:
    """Scrapes of one or more /metrics endpoints and the signals computed from them.

    `readers()` are the blocking reads (one per target; run them on pollers or in turn);
    hand each result to `record()`, then `evaluate()`. Thread-safe.
    """

    source = "scrape"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        window_s: float,
        profiles: Sequence[Profile],
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not urls:
            raise ValueError("no --metrics-url to scrape")
        self.window_s = window_s
        self.timeout = timeout
        self._profiles = tuple(profiles)
        self._clock = clock
        for url in urls:
            fetch.check_url(url)  # ValueError: one line, before any connection
        self._targets = [_Target(Endpoint.parse(u)) for u in urls]
        self._lock = threading.Lock()
        self.target = ",".join(t.endpoint.display for t in self._targets)

    @property
    def target_names(self) -> list[str]:
        return [t.endpoint.display for t in self._targets]

    def readers(self) -> list[Callable[[], tuple[float, Exposition]]]:
        return [self._reader(t.endpoint) for t in self._targets]

    def _reader(self, endpoint: Endpoint) -> Callable[[], tuple[float, Exposition]]:
        def read() -> tuple[float, Exposition]:
            started = self._clock()  # Prometheus stamps a scrape's samples with its start
            return started, scrape(endpoint, self.timeout, self._wanted)

        return read

    def _wanted(self, names: frozenset[str]) -> set[str] | None:
        """The sample names worth parsing in a scrape holding `names`: those of the profile its
        names detect; all of them (None) when they detect none, so that an answer that is not
        an exposition at all is still found out (every line malformed)."""
        profile = detect(self._profiles, names)
        return kept_names(profile, names) if profile else None

    def record(self, index: int, reading: tuple[float, Exposition]) -> None:
        """Keep a successful scrape of target `index`."""
        at, exposition = reading
        with self._lock:
            target = self._targets[index]
            target.names = exposition.names
            target.up = True
            target.malformed = exposition.malformed
            target.format = exposition.format
            profile = detect(self._profiles, self._all_names())
            kept = kept_names(profile, exposition.names) if profile else ()
            target.add(at, exposition, kept, oldest=at - self.window_s - RETENTION_MARGIN_S)

    def record_failure(self, index: int) -> None:
        with self._lock:
            self._targets[index].up = False

    @property
    def malformed_lines(self) -> int:
        with self._lock:
            return sum(t.malformed for t in self._targets if t.up)

    @property
    def format(self) -> str | None:
        """The format of each target's newest good scrape, joined by "," like `target`."""
        with self._lock:
            formats = [t.format for t in self._targets]
        return ",".join(f or "-" for f in formats) if any(formats) else None

    @property
    def fleet(self) -> tuple[FleetRow, ...]:
        return ()  # the fleet view needs Prometheus (dcgm-exporter across nodes)

    def close(self) -> None:
        pass  # nothing held between scrapes

    def _all_names(self) -> set[str]:
        return set().union(*(t.names for t in self._targets))

    def evaluate(self) -> Evaluation:
        """The signals at the time of the newest scrape (all None before any scrape)."""
        with self._lock:
            names = self._all_names()
            profile = detect(self._profiles, names)
            newest = [t.newest_at for t in self._targets if t.newest_at is not None]
            if profile is None or not newest:
                return Evaluation(profile.name if profile else None, Signals())
            resolved = resolve(profile, names)
            queries = plan(resolved, self.window_s)
            answers = _Evaluator(self._targets, self.window_s, max(newest)).run(queries)
        signals, stages = assemble(resolved, self.window_s, answers)
        return Evaluation(profile.name, signals, stages)


def scrape(
    endpoint: Endpoint, timeout: float, wanted: Callable[[frozenset[str]], Container[str] | None] | None = None
) -> Exposition:
    """GET and parse one exposition (see parse_exposition for `wanted`) within `timeout` seconds.
    Raises SourceError (one printable line): no answer, an error status, too big, not metrics."""
    headers = {"Accept": ACCEPT}
    if endpoint.authorization:
        headers["Authorization"] = endpoint.authorization
    where = endpoint.display
    answer = fetch.get(endpoint.url, where=where, timeout=timeout, max_bytes=MAX_BYTES, headers=headers)
    if not answer.ok:
        raise ScrapeError(f"{where} answered HTTP {answer.status} {answer.reason}".rstrip(), unreachable=False)
    text = answer.body.decode("utf-8", errors="replace")
    _check_size(text, where)
    exposition = parse_exposition(text, answer.content_type, wanted)
    reason = not_metrics(text, exposition)
    if reason is not None:
        raise ScrapeError(f"{where}: not metrics ({reason})", unreachable=False)
    return exposition


def _check_size(text: str, where: str) -> None:
    lines = text.count("\n")
    if lines > MAX_LINES:
        raise ScrapeError(f"{where} sent {lines:,} lines; gpuscope reads at most {MAX_LINES:,}: refused", unreachable=False)
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if end - start > MAX_LINE_CHARS:
            raise ScrapeError(f"{where} sent a line of over {MAX_LINE_CHARS:,} characters: refused", unreachable=False)
        start = end + 1


class _Evaluator:
    """PromQL semantics over the targets' scrapes, at one evaluation time.

    Vectors are computed once per evaluation: p50, p95 and p99 of a histogram share one
    `sum by (le) (rate(...))`, which is where the time goes on a big scrape."""

    def __init__(self, targets: Sequence[_Target], window_s: float, at: float) -> None:
        self.window_s = window_s
        self.at = at
        self.start = at - window_s
        self._targets = targets
        self._present = set().union(*(t.names for t in targets))
        self._buckets_memo: dict[tuple[MetricRef, str | None], dict[str | None, dict[str, float]]] = {}

    def run(self, queries: dict[str, Query]) -> dict[str, Answer]:
        return {key: self._answer(query) for key, query in queries.items()}

    def _answer(self, query: Query) -> Answer:
        if isinstance(query, Quantile):
            return self._quantile(query)
        if isinstance(query, CounterSum):
            return self._counter_sum(query)
        return self._gauge(query)

    # -- series access -------------------------------------------------------------------------

    def _series(self, kind: str, ref: MetricRef) -> Iterable[tuple[_Target, Labels, Points]]:
        names = sample_names(kind, ref.selector, self._present)
        matchers = ref.selector.label_matchers
        for target in self._targets:
            for name in names:
                for labels, points in target.series.get(name, {}).items():
                    if not matchers or ref.selector.matches_labels(dict(labels)):
                        yield target, labels, points

    def _instant(self, kind: str, ref: MetricRef) -> Iterable[tuple[Labels, float]]:
        """The value of every matching series in its target's newest scrape (if that is up)."""
        for target, labels, points in self._series(kind, ref):
            if target.up and points[-1][0] == target.newest_at:
                yield labels, points[-1][1]

    def _rates(self, kind: str, ref: MetricRef) -> Iterable[tuple[Labels, float]]:
        """`rate(x[w])` of every matching series that has two samples in the range."""
        for _, labels, points in self._series(kind, ref):
            value = rate(in_range(points, self.start, self.at), self.start, self.at)
            if value is not None:
                yield labels, value

    def _values(self, kind: str, ref: MetricRef) -> Iterable[tuple[Labels, float]]:
        return self._rates(kind, ref) if self.window_s > 0 else self._instant(kind, ref)

    # -- the three query shapes ------------------------------------------------------------------

    def _buckets(self, ref: MetricRef, by: str | None) -> dict[str | None, dict[str, float]]:
        """`sum by (le[, by])` of the histogram's buckets (rated over the window if any)."""
        memo = self._buckets_memo.get((ref, by))
        if memo is None:
            grouped: dict[str | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            for labels, value in self._values("histogram", ref):
                as_dict = dict(labels)
                grouped[as_dict.get(by, "") if by else None][as_dict.get("le", "")] += value
            memo = self._buckets_memo[(ref, by)] = grouped
        return memo

    def _quantile(self, query: Quantile) -> Answer:
        answer: Answer = {}
        for group, by_le in self._buckets(query.histogram, query.by).items():
            buckets = [(bound, count) for le, count in by_le.items() if (bound := parse_le(le)) is not None]
            if buckets:  # Prometheus outputs nothing for a group with no parseable `le`
                answer[group] = histogram_quantile(query.q, buckets)
        return answer

    def _counter_sum(self, query: CounterSum) -> Answer:
        answer: dict[str | None, float] = defaultdict(float)
        for labels, value in self._values("counter", query.counter):
            answer[dict(labels).get(query.by, "") if query.by else None] += value
        return dict(answer)

    def _gauge(self, query: GaugeAggregate) -> Answer:
        values = [v for _, v in self._instant("gauge", query.gauge)]
        if not values:
            return {}
        total = sum(values) if query.how == "sum" else sum(values) / len(values)
        return {None: total}
