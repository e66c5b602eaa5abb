"""What the alerting rules ask of Prometheus, read from their PromQL: the floors' widths and offsets,
the ramp's conditions, the new-high test's lookback, how long a condition holds before it fires.
(Their behaviour on series is `promtool`'s, in tests/integration/test_rules.py.)"""

from __future__ import annotations

import re

from gpuscope.core.fleet.rules import duration, leak_rules, lookback_s, ramp_expr, slope_expr
from gpuscope.core.leak import LeakThresholds

TH = LeakThresholds()


def test_durations_take_the_largest_whole_unit():
    assert [duration(s) for s in (7200, 300, 50, 90, 3600 * 1.5, 59.6)] == ["2h", "5m", "50s", "90s", "90m", "1m"]


def test_the_new_high_test_looks_ten_minutes_back_or_one_horizon_if_longer():
    assert lookback_s(60) == 600 and lookback_s(600) == 600 and lookback_s(1800) == 1800


def test_the_slope_is_the_trend_of_the_floors_only_while_the_series_lives():
    assert slope_expr("m", 300, 6) == "deriv(min_over_time(m[50s])[5m:50s]) and m"


def floors(expr: str) -> list[tuple[str, str]]:
    """(width, offset) of each floor of a ramp, as they appear."""
    return re.findall(r"min_over_time\(m\[(\w+)\](?: offset (\w+))?\)", expr)


def test_the_ramp_compares_six_floors_oldest_first_each_a_sixth_of_the_horizon():
    expr = ramp_expr("m", 300, TH)
    rise = "(min_over_time(m[50s]) - min_over_time(m[50s] offset 4m10s))".replace("4m10s", "250s")
    assert f"({rise} > {TH.flat_bytes:g})" in expr
    # each step rises by at least 5 % of the rise and carries under max_jump_share of it
    for newer, older in [("200s", "250s"), ("150s", "200s"), ("100s", "150s"), ("50s", "100s")]:
        jump = f"(min_over_time(m[50s] offset {newer}) - min_over_time(m[50s] offset {older}))"
        assert f"({jump} > 0.05 * {rise})" in expr
        assert f"({jump} < {TH.max_jump_share:g} * {rise})" in expr
    last = "(min_over_time(m[50s]) - min_over_time(m[50s] offset 50s))"
    assert f"({last} > 0.05 * {rise})" in expr and f"({last} < 0.45 * {rise})" in expr
    assert expr.count(" > 0.05 * ") == 5 and expr.count(" < 0.45 * ") == 5 and expr.count("\n  and ") == 10


def test_the_ramp_must_reach_a_new_high_over_the_lookback_before_the_horizon():
    expr = ramp_expr("m", 300, TH)
    assert expr.endswith("unless\n(max_over_time(min_over_time(m[50s])[10m:50s] offset 5m) >= min_over_time(m[50s]))")
    assert "[2h:20m] offset 2h) >=" in ramp_expr("m", 7200, TH)


def test_the_rules_hold_a_sixth_of_their_horizon_and_at_least_thirty_seconds_before_firing():
    rules = "".join(leak_rules(TH))
    assert re.findall(r"for: (\w+)", rules)[:5] == ["30s", "50s", "5m", "20m", "1h"]
    assert rules.count("- alert:") == 3 * 5
    assert "DCGM_FI_DEV_FB_USED * 1048576" in rules
    assert "DCGM_FI_DEV_FB_USED" not in "".join(leak_rules(TH, dcgm=False))


def test_each_rule_says_the_leak_rate_it_fires_at():
    rules = leak_rules(TH, (300,), dcgm=False)
    rate = TH.rate_margin * TH.alert_rate(300) / 1e6
    assert f"({rate:.3g} MB/s)" in rules[1]
