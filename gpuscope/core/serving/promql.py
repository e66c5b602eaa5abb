"""Prometheus's own arithmetic, for the scrapes gpuscope makes itself.

When gpuscope scrapes a /metrics endpoint directly there is no Prometheus server to ask, so the
two functions operators read every day are reimplemented here with Prometheus 2.42's exact rules
(Debian's `prometheus` package; `promql/quantile.go` and `promql/functions.go` of that release):

- `histogram_quantile(q, buckets)`: classic-bucket `bucketQuantile`.
- `rate()` / `increase()`: `extrapolatedRate`, with counter-reset handling and extrapolation to
  the edges of the range. A 2.x range is closed: samples with start <= t <= end count.

`Selector` is a PromQL vector selector (`name{label="v",other=~"re"}`): profiles name metrics
with it, the local evaluator matches samples with it, and the Prometheus source sends it as is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Go's strconv.ParseFloat accepts what Python's float() accepts, except surrounding whitespace
# and digit-group underscores (which float() allows and Go rejects without a base prefix).
_GO_FLOAT = re.compile(r"^[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)$", re.IGNORECASE)


def parse_float(text: str) -> float | None:
    """A float as Go's strconv.ParseFloat reads it (decimal forms, Inf, NaN), else None."""
    if not _GO_FLOAT.match(text):
        return None
    return float(text)


def parse_le(text: str | None) -> float | None:
    """A bucket's upper bound from its `le` label ("1", "1.0", "1e0", "+Inf"), else None.

    Prometheus skips a bucket whose `le` does not parse. A NaN bound is skipped too: Go's sort
    puts it wherever its pivots happen to land, so no result would be Prometheus's result.
    """
    if text is None:
        return None
    value = parse_float(text)
    return None if value is None or math.isnan(value) else value


def _search(n: int, at_least_rank) -> int:
    """Go's sort.Search: the smallest i in [0, n) for which at_least_rank(i) is true, else n.

    Reproduced step for step (not with bisect) so that NaN counts, which break the monotonic
    premise, still land on the index Prometheus would pick.
    """
    i, j = 0, n
    while i < j:
        h = (i + j) >> 1
        if not at_least_rank(h):
            i = h + 1
        else:
            j = h
    return i


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The q-quantile of classic histogram buckets, (upper bound, cumulative count) pairs.

    Exactly Prometheus 2.42's bucketQuantile (the caller has already summed series by `le`):
    q NaN -> NaN, q < 0 -> -Inf, q > 1 -> +Inf; buckets sorted by upper bound; no +Inf bucket
    -> NaN; buckets with the same bound coalesced (counts summed); counts forced monotonic; fewer
    than two buckets or zero observations -> NaN; a rank beyond every finite bucket -> the
    highest finite bound; a rank in the lowest bucket when its bound is <= 0 -> that bound;
    otherwise linear interpolation inside the bucket, from 0 for the lowest one.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda b: b[0])
    if not ordered or ordered[-1][0] != math.inf:
        return math.nan

    # coalesceBuckets: one bucket per upper bound ("0.2" and "2e-1" are the same bucket).
    bounds: list[float] = []
    counts: list[float] = []
    for bound, count in ordered:
        if bounds and bound == bounds[-1]:
            counts[-1] += count
        else:
            bounds.append(bound)
            counts.append(count)

    # ensureMonotonic: a bucket never holds fewer observations than the one below it (scrapes
    # are not atomic, and rate() over them can dip a bucket below its neighbour).
    highest = counts[0]
    for i in range(1, len(counts)):
        if counts[i] > highest:
            highest = counts[i]
        elif counts[i] < highest:
            counts[i] = highest

    if len(bounds) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = _search(len(counts) - 1, lambda i: counts[i] >= rank)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0
    end = bounds[b]
    count = counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * _go_divide(rank, count)


def _go_divide(a: float, b: float) -> float:
    """a / b with IEEE 754 results where Python raises: x/0 is +-Inf, 0/0 is NaN (as in Go).

    Reached when rank 0 (q = 0) falls in an empty lowest bucket: Prometheus returns NaN."""
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _extrapolated_rate(
    points: Sequence[tuple[float, float]], range_start: float, range_end: float, *, is_counter: bool, is_rate: bool
) -> float | None:
    """Prometheus 2.42's extrapolatedRate over (time s, value) points already inside the range.

    None where Prometheus returns no sample (fewer than two points).
    """
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    result = last_v - first_v
    if is_counter:
        prev = first_v
        for _, v in points[1:]:
            if v < prev:  # a counter reset: the counter restarted from 0 after `prev`
                result += prev
            prev = v

    duration_to_start = first_t - range_start
    duration_to_end = range_end - last_t
    sampled = last_t - first_t
    if sampled <= 0:
        return None  # two samples at one instant: Go would divide by zero (+Inf/NaN); say nothing
    average_step = sampled / (len(points) - 1)

    if is_counter and result > 0 and first_v >= 0:
        # A counter is never negative: do not extrapolate back past the moment it was zero.
        duration_to_zero = sampled * (first_v / result)
        if duration_to_zero < duration_to_start:
            duration_to_start = duration_to_zero

    # Extrapolate to a range edge only when the next sample would have been expected there;
    # a series that starts or stops inside the range gets half a step.
    threshold = average_step * 1.1
    interval = sampled
    interval += duration_to_start if duration_to_start < threshold else average_step / 2
    interval += duration_to_end if duration_to_end < threshold else average_step / 2
    factor = interval / sampled
    if is_rate:
        factor /= range_end - range_start
    return result * factor


def in_range(points: Iterable[tuple[float, float]], range_start: float, range_end: float) -> list[tuple[float, float]]:
    """The points a 2.x range selector `[range]` evaluated at `range_end` sees (closed range)."""
    return [(t, v) for t, v in points if range_start <= t <= range_end]


def rate(points: Sequence[tuple[float, float]], range_start: float, range_end: float) -> float | None:
    """PromQL `rate()` of a counter's in-range points: per-second increase, extrapolated."""
    return _extrapolated_rate(points, range_start, range_end, is_counter=True, is_rate=True)


def increase(points: Sequence[tuple[float, float]], range_start: float, range_end: float) -> float | None:
    """PromQL `increase()` of a counter's in-range points (rate times the range)."""
    return _extrapolated_rate(points, range_start, range_end, is_counter=True, is_rate=False)


# -- selectors -------------------------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_SELECTOR = re.compile(rf"^\s*(?P<name>{_NAME})?\s*(?:\{{(?P<body>.*)\}})?\s*$", re.DOTALL)
_MATCHER = re.compile(rf'\s*(?P<label>{_LABEL})\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher. Regular expressions are anchored at both ends, as in PromQL."""

    label: str
    op: str  # "=", "!=", "=~", "!~"
    value: str

    def matches(self, value: str) -> bool:
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        hit = re.fullmatch(self.value, value, re.DOTALL) is not None
        return hit if self.op == "=~" else not hit

    def promql(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.label}{self.op}"{escaped}"'


@dataclass(frozen=True, slots=True)
class Selector:
    """A PromQL vector selector: a metric name (or `__name__` matchers) and label matchers."""

    name: str | None
    matchers: tuple[Matcher, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Selector:
        """`name`, `name{l="v"}`, `{__name__=~"a|b", l!="v"}`; ValueError with a reason otherwise."""
        m = _SELECTOR.match(text)
        if not m or (m["name"] is None and m["body"] is None):
            raise ValueError(f"not a metric selector: {text!r} (expected name or name{{label=\"value\"}})")
        matchers: list[Matcher] = []
        body = (m["body"] or "").strip()
        pos = 0
        while pos < len(body):
            mm = _MATCHER.match(body, pos)
            if not mm:
                raise ValueError(f"bad label matcher in {text!r} at {body[pos:]!r}")
            value = _UNESCAPE.sub(lambda e: "\n" if e[1] == "n" else e[1], mm["value"])
            if mm["op"] in ("=~", "!~"):
                try:
                    re.compile(value)
                except re.error as exc:
                    raise ValueError(f"bad regular expression {value!r} in {text!r}: {exc}") from None
            matchers.append(Matcher(mm["label"], mm["op"], value))
            pos = mm.end()
        name = m["name"]
        if name is None and not any(x.label == "__name__" for x in matchers):
            raise ValueError(f"selector {text!r} names no metric")
        return cls(name, tuple(matchers))

    @property
    def label_matchers(self) -> tuple[Matcher, ...]:
        return tuple(m for m in self.matchers if m.label != "__name__")

    def matches_name(self, name: str) -> bool:
        if self.name is not None and name != self.name:
            return False
        return all(m.matches(name) for m in self.matchers if m.label == "__name__")

    def matches_labels(self, labels: Mapping[str, str]) -> bool:
        # An absent label matches as the empty string, as in PromQL.
        return all(m.matches(labels.get(m.label, "")) for m in self.label_matchers)

    def renamed(self, name: str) -> Selector:
        """The same label matchers on another metric (a histogram's `_bucket` or `_sum` series)."""
        return Selector(name, self.label_matchers)

    def promql(self, extra: Sequence[Matcher] = ()) -> str:
        """PromQL text, with `extra` matchers (job, instance filters) appended."""
        inner = ",".join(m.promql() for m in (*self.matchers, *extra))
        return f"{self.name or ''}{{{inner}}}" if inner or not self.name else self.name

    def __str__(self) -> str:
        return self.promql()
