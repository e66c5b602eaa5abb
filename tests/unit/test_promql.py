"""histogram_quantile and rate as Prometheus 2.42 computes them (gpuscope.core.serving.promql).

The oracle is Prometheus's own promqltest file (tests/support/fixtures/metrics/prometheus_histograms.test,
from a newer Prometheus): every classic-bucket `histogram_quantile` case it holds is replayed. The
cases that cannot apply to 2.42 are listed in SKIPPED with the reason, and counted, so a changed
fixture or reader cannot silently skip more.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuscope.core.serving.promql import Selector, histogram_quantile, in_range, increase, parse_le, rate
from helpers import FIXTURES
from promqltest import evaluate, read_cases, same

FIXTURE = FIXTURES / "prometheus_histograms.test"
CASES = read_cases(FIXTURE)
REPLAYED = [c for c in CASES if c.skip is None]

# Cases of the fixture that Prometheus 2.42 would not run the same way, and why.
SKIPPED = {
    "native histogram: Prometheus 2.42 has no native histograms with custom buckets": 38,
    "histogram_quantiles() is a Prometheus 3.x function (not in 2.42)": 18,
    "expects a PromQL error (duplicate label sets from a regex name selector): engine behaviour, not the quantile": 2,
}


def test_the_fixture_keeps_its_source_line():
    assert FIXTURE.read_text().splitlines()[0].startswith("# source: prometheus/prometheus")


def test_every_case_is_replayed_or_skipped_for_a_known_reason():
    assert Counter(c.skip for c in CASES if c.skip) == SKIPPED
    assert len(REPLAYED) == 45


@pytest.mark.parametrize("case", REPLAYED, ids=[f"{c.id}:{c.expr}" for c in REPLAYED])
def test_fixture_case(case):
    got = evaluate(case)
    assert set(got) == set(case.expected), f"label sets differ: {got} vs {case.expected}"
    for labels, value in got.items():
        assert same(case.expected[labels], value), f"{dict(labels)}: {value} != {case.expected[labels]}"


# -- each rule, by hand ------------------------------------------------------------------------------

INF = math.inf
H = [(0.1, 50.0), (0.2, 70.0), (1.0, 110.0), (INF, 120.0)]


def test_quantile_out_of_range_and_nan():
    assert histogram_quantile(-0.1, H) == -INF
    assert histogram_quantile(1.01, H) == INF
    assert math.isnan(histogram_quantile(math.nan, H))


def test_no_inf_bucket_is_nan():
    assert math.isnan(histogram_quantile(0.5, [(0.1, 1.0), (1.0, 2.0)]))


def test_fewer_than_two_buckets_is_nan():
    assert math.isnan(histogram_quantile(0.5, [(INF, 10.0)]))
    # two spellings of +Inf coalesce into one bucket: still one
    assert math.isnan(histogram_quantile(0.5, [(INF, 0.0), (INF, 0.0)]))


def test_zero_observations_is_nan():
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]))
    assert math.isnan(histogram_quantile(0.5, [(-1.0, 0.0), (INF, 0.0)]))  # even with a bound <= 0


def test_rank_in_the_inf_bucket_gives_the_highest_finite_bound():
    assert histogram_quantile(0.99, [(0.1, 1.0), (0.5, 2.0), (INF, 100.0)]) == 0.5


def test_lowest_bucket_rule():
    # upper bound <= 0: the bound itself
    assert histogram_quantile(0.1, [(-0.2, 10.0), (1.0, 20.0), (INF, 20.0)]) == -0.2
    # upper bound > 0: interpolate from 0
    assert histogram_quantile(0.25, [(0.4, 10.0), (1.0, 20.0), (INF, 20.0)]) == pytest.approx(0.2)


def test_linear_interpolation_inside_a_bucket():
    # 10 below 1, 10 between 1 and 3: the median is the top of the first, p75 halfway in the second
    buckets = [(1.0, 10.0), (3.0, 20.0), (INF, 20.0)]
    assert histogram_quantile(0.5, buckets) == 1.0
    assert histogram_quantile(0.75, buckets) == 2.0


def test_equal_bounds_coalesce_and_order_does_not_matter():
    spelled = [(parse_le(le), c) for le, c in (("1", 3.0), ("1.0", 2.0), ("+Inf", 10.0), ("0.5", 1.0), ("5e-1", 1.0))]
    assert histogram_quantile(0.5, spelled) == histogram_quantile(0.5, [(0.5, 2.0), (1.0, 5.0), (INF, 10.0)])


def test_monotonicity_is_forced():
    # the nonmonotonic example of the fixture, by hand
    buckets = [(0.1, 20.0), (1.0, 10.0), (10.0, 50.0), (100.0, 40.0), (1000.0, 90.0), (INF, 80.0)]
    assert histogram_quantile(0.01, buckets) == pytest.approx(0.0045)
    assert histogram_quantile(0.5, buckets) == pytest.approx(8.5)
    assert histogram_quantile(0.99, buckets) == pytest.approx(979.75)


@pytest.mark.parametrize(
    "text, value",
    [("1", 1.0), ("1.0", 1.0), ("1e0", 1.0), (".2", 0.2), ("+Inf", INF), ("+inf", INF), ("-0.1", -0.1)],
)
def test_le_parses_as_go_does(text, value):
    assert parse_le(text) == value


@pytest.mark.parametrize("text", ["", "abc", " 1", "1_000", "NaN", None, "0x10"])
def test_unusable_le_is_skipped(text):
    assert parse_le(text) is None


# -- property-based: random histograms against the rules ----------------------------------------------

bounds = st.lists(st.floats(-100, 1000, allow_nan=False, allow_infinity=False), min_size=1, max_size=12, unique=True)


@st.composite
def histograms(draw):
    finite = sorted(draw(bounds))
    increments = draw(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=len(finite) + 1, max_size=len(finite) + 1))
    counts, total = [], 0.0
    for inc in increments:
        total += inc
        counts.append(total)
    return list(zip([*finite, INF], counts))


@given(histograms(), st.lists(st.floats(0, 1), min_size=2, max_size=10))
@settings(max_examples=150, deadline=None)
def test_quantile_is_monotone_in_q(buckets, qs):
    results = [histogram_quantile(q, buckets) for q in sorted(qs)]
    defined = [r for r in results if not math.isnan(r)]
    assert defined == sorted(defined)


@given(histograms(), st.floats(0, 1))
@settings(max_examples=150, deadline=None)
def test_quantile_stays_within_the_bucket_bounds(buckets, q):
    result = histogram_quantile(q, buckets)
    observations = buckets[-1][1]
    if observations == 0:
        assert math.isnan(result)
        return
    lowest, highest_finite = buckets[0][0], buckets[-2][0]
    if math.isnan(result):
        # the only NaN left: rank 0 in an empty lowest bucket with a positive bound (0/0)
        assert q * observations == 0 and buckets[0][1] == 0 and lowest > 0
        return
    assert min(0.0, lowest) <= result <= highest_finite


@given(histograms(), st.floats(0, 1), st.randoms())
@settings(max_examples=100, deadline=None)
def test_bucket_order_does_not_matter(buckets, q, rnd):
    shuffled = list(buckets)
    rnd.shuffle(shuffled)
    a, b = histogram_quantile(q, buckets), histogram_quantile(q, shuffled)
    assert (math.isnan(a) and math.isnan(b)) or a == b


@given(histograms(), st.floats(0, 1))
@settings(max_examples=100, deadline=None)
def test_without_the_inf_bucket_it_is_nan(buckets, q):
    assert math.isnan(histogram_quantile(q, buckets[:-1]))


@given(histograms(), st.one_of(st.floats(-10, -1e-9), st.floats(1 + 1e-9, 10)))
def test_q_outside_0_1_is_infinite(buckets, q):
    assert histogram_quantile(q, buckets) == (-INF if q < 0 else INF)


@given(histograms(), st.floats(0, 1), st.data())
@settings(max_examples=100, deadline=None)
def test_a_dip_between_buckets_reads_as_the_envelope(buckets, q, data):
    # Lowering a bucket below its lower neighbour changes nothing: the monotonicity fix.
    assume(len(buckets) >= 3)
    i = data.draw(st.integers(1, len(buckets) - 2))
    dipped = list(buckets)
    dipped[i] = (buckets[i][0], buckets[i - 1][1] * data.draw(st.floats(0, 1)))
    envelope = list(buckets)
    envelope[i] = (buckets[i][0], buckets[i - 1][1])
    a, b = histogram_quantile(q, dipped), histogram_quantile(q, envelope)
    assert (math.isnan(a) and math.isnan(b)) or a == b


# -- rate() and increase() -----------------------------------------------------------------------------


def test_rate_extrapolates_to_the_range_edges():
    # samples at 5, 10, 15 s in a [0, 20] range: 2 per second throughout
    points = [(5.0, 10.0), (10.0, 20.0), (15.0, 30.0)]
    assert rate(points, 0.0, 20.0) == pytest.approx(2.0)
    assert increase(points, 0.0, 20.0) == pytest.approx(40.0)


def test_rate_never_extrapolates_a_counter_below_zero():
    # it started at 0 just before the first sample: extrapolate back only to that zero point
    points = [(10.0, 1.0), (11.0, 2.0), (12.0, 3.0)]
    # 5 s before the first sample, but the counter was 0 only 1 s before it (2 s * 1/2): the
    # extrapolation stops there. Interval 2 + 1 s for an increase of 2 over 2 s: 3.
    assert increase(points, 5.0, 12.0) == pytest.approx(3.0)


def test_rate_extrapolates_half_a_step_when_the_series_starts_late():
    # first sample 10 s after the start, with 1 s steps: extrapolate half a step, not 10 s
    points = [(10.0, 100.0), (11.0, 101.0), (12.0, 102.0)]
    assert increase(points, 0.0, 12.0) == pytest.approx(2.0 * (2.0 + 0.5) / 2.0)


def test_rate_handles_counter_resets():
    points = [(0.0, 10.0), (1.0, 20.0), (2.0, 5.0), (3.0, 15.0)]
    # 10 up, a restart (20 lost then counted), 5 from zero, 10 up: 25 in 3 s, no extrapolation
    assert increase(points, 0.0, 3.0) == pytest.approx(25.0)


def test_rate_needs_two_samples():
    assert rate([(1.0, 5.0)], 0.0, 2.0) is None
    assert rate([], 0.0, 2.0) is None


def test_range_is_closed_at_both_ends():
    points = [(0.0, 1.0), (5.0, 2.0), (10.0, 3.0), (10.5, 4.0)]
    assert in_range(points, 0.0, 10.0) == [(0.0, 1.0), (5.0, 2.0), (10.0, 3.0)]


@given(
    st.floats(0.1, 100),
    st.floats(0, 1e6),
    st.lists(st.floats(0.5, 1.5), min_size=2, max_size=40),
    st.floats(0, 0.5),
)
@settings(max_examples=100, deadline=None)
def test_rate_of_a_steady_counter_is_its_slope(slope, start, steps, offset):
    # Regular scrapes (jitter within the 1.1 threshold) of a counter far from zero: exact slope.
    t, points = offset, []
    for step in steps:
        points.append((t, start + 1e6 + slope * t))
        t += step
    end = points[-1][0] + offset
    assume(max(steps) * 1.1 > offset and offset < min(steps[:-1]) * 1.1)
    assert rate(points, 0.0, end) == pytest.approx(slope, rel=1e-6)


# -- selectors ----------------------------------------------------------------------------------------


def test_selector_parses_and_matches():
    s = Selector.parse('vllm:request_success_total{finished_reason=~"abort|error", model_name!="x"}')
    assert s.name == "vllm:request_success_total"
    assert s.matches_labels({"finished_reason": "abort", "model_name": "m"})
    assert not s.matches_labels({"finished_reason": "aborted", "model_name": "m"})  # anchored
    assert not s.matches_labels({"finished_reason": "error", "model_name": "x"})
    assert s.promql() == 'vllm:request_success_total{finished_reason=~"abort|error",model_name!="x"}'


def test_selector_by_name_regex():
    s = Selector.parse('{__name__=~"nv_inference_request_(success|failure)"}')
    assert s.name is None and s.matches_name("nv_inference_request_failure") and not s.matches_name("nv_x")


@pytest.mark.parametrize("text", ["", "{}", "9abc", 'x{a="1"', 'x{a=~"("}', "x{a=1}"])
def test_bad_selectors_say_why(text):
    with pytest.raises(ValueError):
        Selector.parse(text)


def test_quantile_matches_a_brute_force_reference():
    # An independent reading of the rules on integer-valued data: the observation of rank q*n,
    # placed linearly within its bucket, is what the interpolation computes.
    rnd = random.Random(5)
    for _ in range(200):
        finite = sorted(rnd.sample(range(1, 50), rnd.randint(1, 6)))
        per_bucket = [rnd.randint(1, 20) for _ in range(len(finite))] + [0]
        cumulative = [sum(per_bucket[: i + 1]) for i in range(len(per_bucket))]
        buckets = list(zip([*map(float, finite), INF], map(float, cumulative)))
        q = rnd.random()
        rank = q * cumulative[-1]
        b = next(i for i, c in enumerate(cumulative) if c >= rank)
        lower = 0.0 if b == 0 else float(finite[b - 1])
        below = 0 if b == 0 else cumulative[b - 1]
        expected = lower + (finite[b] - lower) * (rank - below) / per_bucket[b]
        assert histogram_quantile(q, buckets) == pytest.approx(expected)
