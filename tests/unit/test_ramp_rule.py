"""The ramp's stop rule and its conclusions, over given P99s and steps."""

from __future__ import annotations

import random

import pytest

from gpuscope.core.ramp.result import Interval, Step, find_knee, memory_slope
from gpuscope.core.ramp.rule import RAMPING, STOPPED, WATCHING, BreakWatch, StopRule

RULE = StopRule()  # the defaults: 12-point baseline, 3.2 sd, drift 0.5, 3 breaks, 30 s watch


def feed(watch: BreakWatch, values, start: int = 0) -> list[bool]:
    return [watch.add(start + k, v, RULE.interval_s).broke for k, v in enumerate(values)]


def steady(n: int, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    return [0.200 + rng.uniform(-0.01, 0.01) for _ in range(n)]


def test_the_first_eleven_points_are_the_baseline_and_are_not_judged():
    watch = BreakWatch(RULE)
    assert all(watch.add(k, 5.0 if k == 5 else 0.2, 5.0).score is None for k in range(11))
    assert watch.add(11, 0.2, 5.0).score is not None


def test_three_breaks_start_the_watch_and_one_more_ends_the_ramp():
    watch = BreakWatch(RULE)
    feed(watch, steady(12))
    assert feed(watch, [0.5, 0.6], 12) == [True, True] and watch.state == RAMPING
    feed(watch, [0.7], 14)
    assert watch.state == WATCHING and watch.first_break == 12
    feed(watch, [0.8], 15)
    assert watch.state == STOPPED


def test_a_spike_and_a_recovered_watch_do_not_end_the_ramp():
    watch = BreakWatch(RULE)
    feed(watch, steady(12))
    assert feed(watch, [0.9, 0.2, 0.2], 12) == [True, False, False]
    assert watch.state == RAMPING and watch.in_a_row == 0
    feed(watch, [0.9, 0.9, 0.9], 15)
    assert watch.state == WATCHING
    feed(watch, steady(6, seed=4), 18)  # 30 s of a P99 back to its level
    assert watch.state == RAMPING and watch.in_a_row == 0


def test_breaks_never_enter_the_reference_so_a_steady_climb_keeps_breaking():
    watch = BreakWatch(StopRule(breaks=3, watch_s=30))
    feed(watch, steady(12))
    climb = [0.2 + 0.05 * k for k in range(1, 8)]
    broke = feed(watch, climb, 12)
    assert broke[:4] == [True] * 4 and watch.state == STOPPED


def test_the_spread_floor_keeps_a_flat_p99_from_breaking_on_a_millisecond():
    watch = BreakWatch(RULE)
    feed(watch, [0.2485] * 11)
    assert watch.add(11, 0.2500, 5.0).score == 0.0  # the sd is floored at 5 % of 248.5 ms
    bare = BreakWatch(StopRule(min_spread=0.0))
    feed(bare, [0.2485] * 11)
    assert bare.add(11, 0.2500, 5.0).broke


def test_the_rule_refuses_parameters_it_cannot_use():
    for bad in ({"baseline_points": 2}, {"breaks": 0}, {"threshold": 0}, {"drift": -1}):
        with pytest.raises(ValueError):
            StopRule(**bad)


def interval(index: int, step: int, ok: int, broke: bool, sent: int | None = None) -> Interval:
    return Interval(index, step, 0.0, 0.0, 5.0, ok if sent is None else sent, ok, 0, None, None, None, 0, None,
                    None, None, 0, None, None, broke)


def step(number: int, rate: float, ok: int, sent: int, broke: bool) -> Step:
    return Step(number, rate, 10.0, sent, ok, 0, None, None, None, None, None, None, None, None, 0, broke)


def test_a_saturated_step_gives_what_it_served_without_its_first_interval():
    steps = [step(1, 18, 180, 180, False), step(2, 22, 190, 220, True)]
    intervals = [interval(0, 2, 90, True, 110), interval(1, 2, 100, True, 110), interval(2, 2, 100, True, 110)]
    knee = find_knee(steps, intervals, 2)
    assert knee.method == "saturated" and knee.critical_rps == pytest.approx(20.0)
    assert knee.uncertainty_rps == pytest.approx(0.1)  # one request over the 10 s measured


def test_a_step_that_kept_up_puts_the_knee_between_it_and_the_last_that_held():
    steps = [step(1, 18, 180, 180, False), step(2, 20, 200, 200, True)]
    knee = find_knee(steps, [interval(0, 2, 100, True), interval(1, 2, 100, True)], 2)
    assert knee.method == "between-steps"
    assert (knee.critical_rps, knee.uncertainty_rps) == pytest.approx((19.0, 1.0))


def test_memory_per_request_is_the_slope_over_requests_served_not_over_time():
    points = [Interval(k, 1, 0, 0, 1, 0, 0, 0, None, None, None, 0, None, 1000 + 500 * n + (7 if k % 2 else 0),
                       None, n, None, None, False)
              for k, n in enumerate([0, 10, 30, 35, 80, 81, 120])]
    assert memory_slope(points) == pytest.approx(500, rel=0.02)


def test_the_text_names_a_keeping_site_with_the_code_path_that_called_it():
    from gpuscope.core.ramp.report import memory_lines
    from gpuscope.core.ramp.result import MemoryFinding, RampResult, Site

    stack = (("remember_request", "/srv/app.py", 40), ("_serve", "/srv/app.py", 120), ("do_POST", "/srv/app.py", 150))
    site = Site("remember_request", "/srv/app.py", 40, 5 << 20, 10, 512 * 1024, stack)
    result = RampResult("http://x/", "http", {}, 0.0, 1.0, "client", (), (), "max-rate", "", None,
                        MemoryFinding(sites=(site,)))
    lines = memory_lines(result)
    assert lines[0] == "  kept by remember_request (/srv/app.py:40): 512.0K/request, 5.0M in 10 allocations"
    assert lines[1] == "    called from _serve (app.py:120) < do_POST (app.py:150)"
    assert site.to_json()["stack"][1] == {"function": "_serve", "file": "/srv/app.py", "line": 120}


def test_the_command_s_defaults_are_the_incident_s_rule():
    """A P99 every 5 s, a 12-point (1-minute) baseline, 3.2 sd with a 0.5 drift, three breaks in a
    row, a 30 s watch; 5 % error rate."""
    import argparse

    from gpuscope.commands import ramp

    parser = argparse.ArgumentParser()
    ramp.add_arguments(parser)
    plan = ramp._plan(parser.parse_args(["--target", "http://127.0.0.1:1/"]), [])[0]
    assert (plan.rule.interval_s, plan.rule.baseline_points, plan.rule.threshold, plan.rule.drift, plan.rule.breaks,
            plan.rule.watch_s) == (5.0, 12, 3.2, 0.5, 3, 30.0)
    assert plan.max_error_rate == 0.05
