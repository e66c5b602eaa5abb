"""A small reader of Prometheus's promqltest scripts (`promql/promqltest/testdata/*.test`), enough
to replay their classic-histogram `histogram_quantile` cases against gpuscope.core.serving.promql.

Supported: `load` / `load_with_nhcb` blocks (series in expanding notation: `0+10x10`, `1+0x10`,
`0x10`, plain values, `_` for a missing sample), `clear`, and `eval instant at T <expr>` blocks
with their expected `{labels} value` lines. Expressions: `histogram_quantile(Q, V)` where V is
`sel_bucket`, `rate(sel_bucket[R])`, or `sum|avg(rate(sel_bucket[R])) by (le, ...)` /
`sum|avg by (le, ...) (rate(sel_bucket[R]))`, evaluated with Prometheus 2.x semantics: a range
`[R]` at T holds the samples with T-R <= t <= T, an instant selector the newest sample within
the 5-minute lookback.

A case the reader cannot replay with Prometheus 2.42 semantics carries a `skip` reason.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gpuscope.core.serving.promql import Selector, histogram_quantile, in_range, parse_le, rate

LOOKBACK_S = 300.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_EXPAND = re.compile(r"^(?P<start>[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)(?:(?P<op>[-+])(?P<step>\d+\.?\d*(?:e[-+]?\d+)?))?x(?P<n>\d+)$", re.I)
_SERIES = re.compile(r"^\s+(?P<sel>\S*\{[^}]*\}|[a-zA-Z_:][\w:]*)\s+(?P<values>.+)$")
_EXPECTED = re.compile(r"^\s+(?P<sel>[a-zA-Z_:][\w:]*)?(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)\s*$")

_BUCKET_SEL = r"(?P<sel>[a-zA-Z_:][\w:]*(?:\{[^}]*\})?)"
_RANGE = r"\[(?P<range>\w+)\]"
FORMS = (
    re.compile(rf"^histogram_quantile\((?P<q>[^,]+),\s*{_BUCKET_SEL}\)$"),
    re.compile(rf"^histogram_quantile\((?P<q>[^,]+),\s*rate\({_BUCKET_SEL}{_RANGE}\)\)$"),
    re.compile(
        rf"^histogram_quantile\((?P<q>[^,]+),\s*(?P<agg>sum|avg)\s*\(rate\({_BUCKET_SEL}{_RANGE}\)\)(?:\s*by\s*\((?P<by>[^)]*)\))?\)$"
    ),
    re.compile(
        rf"^histogram_quantile\((?P<q>[^,]+),\s*(?P<agg>sum|avg)\s+by\s*\((?P<by>[^)]*)\)\s*\(rate\({_BUCKET_SEL}{_RANGE}\)\)\)$"
    ),
)


def seconds(text: str) -> float:
    if text == "0":
        return 0.0
    total, pos = 0.0, 0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            raise ValueError(f"bad duration {text!r}")
        total += float(m[1]) * _UNIT_S[m[2]]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"bad duration {text!r}")
    return total


def expand(values: str) -> list[float | None]:
    """promqltest's value notation: `a+bxn` is n+1 values a, a+b, ...; `axn` is a+0xn."""
    out: list[float | None] = []
    for token in values.split():
        if token == "_":
            out.append(None)
            continue
        m = _EXPAND.match(token)
        if m:
            start, step = float(m["start"]), float(m["step"] or 0)
            if m["op"] == "-":
                step = -step
            out.extend(start + i * step for i in range(int(m["n"]) + 1))
        else:
            out.append(float(token))
    return out


def go_number(text: str) -> float:
    """A PromQL number literal, including the `1./6.` divisions the test files use."""
    text = text.strip()
    if "/" in text:
        a, b = text.split("/")
        return go_number(a) / go_number(b)
    return float(text)


@dataclass
class Series:
    name: str
    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass
class Case:
    line: int
    at: float
    expr: str
    expected: dict[tuple, float] = field(default_factory=dict)
    series: list[Series] = field(default_factory=list)  # the storage when the eval runs
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"line{self.line}"


def read_cases(path: Path) -> list[Case]:
    """Every `eval instant` of `histogram_quantile` (and `histogram_quantiles`) in the file."""
    lines = path.read_text().splitlines()
    storage: list[Series] = []
    native: set[str] = set()  # names holding native histograms ({{...}}, or load_with_nhcb's)
    cases: list[Case] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("load"):
            with_nhcb = line.startswith("load_with_nhcb")
            step = seconds(line.split()[1])
            i += 1
            while i < len(lines) and lines[i][:1].isspace() and lines[i].strip():
                m = _SERIES.match(lines[i])
                if m and "{{" not in m["values"]:
                    sel = Selector.parse(m["sel"])
                    labels = {x.label: x.value for x in sel.matchers}
                    values = expand(m["values"])
                    points = [(n * step, v) for n, v in enumerate(values) if v is not None]
                    name = sel.name or labels.pop("__name__", "")
                    storage.append(Series(name, labels, points))
                    if with_nhcb and name.endswith("_bucket"):
                        native.add(name.removesuffix("_bucket"))  # also stored as a native histogram
                elif m:
                    native.add(m["sel"].split("{")[0])
                i += 1
            continue
        if line.strip() == "clear":
            storage = []
            native = set()
        elif line.startswith("eval instant at ") and "histogram_quantile" in line:
            at_text, expr = line[len("eval instant at ") :].split(" ", 1)
            case = Case(i + 1, seconds(at_text), expr.strip(), series=list(storage))
            i += 1
            while i < len(lines) and lines[i][:1].isspace() and lines[i].strip():
                body = lines[i].strip()
                if body.startswith("expect fail"):
                    case.skip = "expects a PromQL error (duplicate label sets from a regex name selector): engine behaviour, not the quantile"
                elif body.startswith(("expect", "#")):
                    pass  # warn/info annotations: 2.42 has none, and gpuscope reports none
                else:
                    m = _EXPECTED.match(lines[i])
                    assert m, f"line {i + 1}: cannot read expected result {body!r}"
                    labels = Selector.parse("result" + m["labels"]).matchers if m["labels"] else ()
                    case.expected[tuple(sorted((x.label, x.value) for x in labels))] = go_number(m["value"])
                i += 1
            case.skip = _why_skip(case, native)
            cases.append(case)
            continue
        i += 1
    return cases


def _why_skip(case: Case, native: set[str]) -> str | None:
    if case.expr.startswith("histogram_quantiles("):
        return "histogram_quantiles() is a Prometheus 3.x function (not in 2.42)"
    if case.skip:
        return case.skip
    form = next((f.match(case.expr) for f in FORMS if f.match(case.expr)), None)
    if form is None:
        return "not one of the classic-bucket forms this reader evaluates"
    name = form["sel"].split("{")[0]
    if name in native:
        return "native histogram: Prometheus 2.42 has no native histograms with custom buckets"
    return None


def evaluate(case: Case) -> dict[tuple, float]:
    """The case's result: output label set (sorted pairs) -> value."""
    form = next(f.match(case.expr) for f in FORMS if f.match(case.expr))
    q = go_number(form["q"])
    sel = Selector.parse(form["sel"])
    selected = [s for s in case.series if sel.matches_name(s.name) and sel.matches_labels(s.labels)]
    values: list[tuple[dict[str, str], float]] = []
    if "range" in form.groupdict() and form["range"]:
        window = seconds(form["range"])
        for s in selected:
            r = rate(in_range(s.points, case.at - window, case.at), case.at - window, case.at)
            if r is not None:
                values.append((s.labels, r))
    else:
        for s in selected:
            recent = [v for t, v in s.points if case.at - LOOKBACK_S <= t <= case.at]
            if recent:
                values.append((s.labels, recent[-1]))

    groups: dict[tuple, list[tuple[str, float]]] = defaultdict(list)
    agg = form.groupdict().get("agg")
    by = [x.strip() for x in (form["by"] or "").split(",") if x.strip()] if agg else None
    for labels, value in values:
        keep = {k: v for k, v in labels.items() if k != "le" and (by is None or k in by)}
        groups[tuple(sorted(keep.items()))].append((labels.get("le", ""), value))

    result: dict[tuple, float] = {}
    for group, buckets in groups.items():
        by_le: dict[str, list[float]] = defaultdict(list)
        for le, value in buckets:
            by_le[le].append(value)
        if agg == "avg":
            summed = {le: sum(v) / len(v) for le, v in by_le.items()}
        elif by is None:  # no aggregation: one series per le in the group
            summed = {le: v[0] for le, v in by_le.items()}
        else:
            summed = {le: sum(v) for le, v in by_le.items()}
        parsed = [(bound, count) for le, count in summed.items() if (bound := parse_le(le)) is not None]
        if parsed:
            result[group] = histogram_quantile(q, parsed)
    return result


def same(expected: float, actual: float) -> bool:
    """promqltest's comparison: NaN equals NaN, otherwise equal within 1e-6 relative."""
    if math.isnan(expected) or math.isnan(actual):
        return math.isnan(expected) and math.isnan(actual)
    if math.isinf(expected) or math.isinf(actual):
        return expected == actual
    return math.isclose(expected, actual, rel_tol=1e-6, abs_tol=1e-12)
