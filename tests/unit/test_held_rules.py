"""The rules that decide whether a tracked site's rise is leak evidence, how held bytes are
trended, what a short window asks of its samples, and how stack samples are weighed."""

from __future__ import annotations

from gpuscope.core.diagnosis.attribution import suspects_from_stacks
from gpuscope.core.diagnosis.steps import settle_seconds, window_thresholds
from gpuscope.core.leak import LeakThresholds, held_evidence, held_trend
from gpuscope.core.target.stacks import OWN, StackFrame

TIMES = [i * 0.25 for i in range(49)]  # 12 s read 4 times a second
MB = 1e6


def test_a_rise_the_memory_in_use_does_not_follow_is_turnover_not_a_leak():
    held = [1 * MB * t for t in TIMES]  # 1 MB/s of new cache entries ...
    trend = held_trend(TIMES, held)
    assert trend.kind == "rising"
    level = held_evidence(trend, TIMES, held, TIMES, [100 * MB] * len(TIMES))  # ... replacing older ones
    assert not level.counts and level.rule == "memory in use level", level
    rising = held_evidence(trend, TIMES, held, TIMES, [100 * MB + 0.9 * MB * t for t in TIMES])
    assert rising.counts and rising.rule == "memory in use rising", rising


def test_small_python_objects_count_through_the_blocks_malloc_does_not_hand_out():
    held = [1 * MB * t for t in TIMES]
    trend = held_trend(TIMES, held)
    blocks = [1000 + 4000 * t for t in TIMES]  # 4000 blocks/s: up to 2 MB/s
    judged = held_evidence(trend, TIMES, held, TIMES, [50 * MB] * len(TIMES), blocks)
    assert judged.counts and judged.rule == "memory in use rising", judged


def test_a_rise_larger_than_all_the_memory_in_use_at_the_start_outlasts_any_turnover():
    held = [3 * MB * t for t in TIMES]  # 36 MB gained
    judged = held_evidence(held_trend(TIMES, held), TIMES, held, TIMES, [20 * MB] * len(TIMES))
    assert judged.counts and judged.rule == "outlasts turnover", judged


def test_without_a_measure_of_the_memory_in_use_the_site_decides():
    held = [1 * MB * t for t in TIMES]
    judged = held_evidence(held_trend(TIMES, held), TIMES, held, (), ())
    assert judged.counts and judged.rule == "no measure of memory in use", judged


def test_what_is_built_and_dropped_leaves_no_floor_however_the_reads_line_up():
    # 40 MB built over each 0.96 s and dropped, read 4 times a second: raw reads drift upward for
    # a few seconds at a time; what stays held does not rise
    for period in (0.7, 0.75, 0.8, 0.83, 0.85, 0.9, 0.96, 1.1):
        held = [40 * MB * ((t % period) / period) for t in TIMES]
        assert held_trend(TIMES, held).kind != "rising", period
    # a leak with its own small temporaries at the same site still rises
    leak = [0.5 * MB * t + 2 * MB * ((t % 0.96) / 0.96) for t in TIMES]
    assert held_trend(TIMES, leak).kind == "rising"


def test_a_short_window_asks_less_of_its_samples_and_a_long_one_the_defaults():
    th = LeakThresholds()
    assert window_thresholds(th, 30.0) == th
    short = window_thresholds(th, 10.0)
    assert short.min_span_s == 4.0 and short.fast_duration_s == 4.0
    # 5 MB/s over 4 s counts
    assert short.rate_margin * short.alert_rate(4.0) <= 5e6


def test_how_long_would_settle_a_slow_growth_grows_as_the_rate_falls():
    th = LeakThresholds()
    fast, slow = settle_seconds(th, 2e6, 30.0), settle_seconds(th, 0.2e6, 30.0)
    assert fast is not None and slow is not None and 60 <= fast < slow
    assert settle_seconds(th, 1e3, 30.0) is None  # under min_rate: never a leak


def frame(function: str, line: int) -> StackFrame:
    return StackFrame(function, "/srv/app.py", line, OWN)


def test_stack_samples_net_growth_by_function():
    keeps = [((frame("ingest", 10),), 1e6, 1), ((frame("ingest", 11),), 1e6, 1), ((frame("ingest", 12),), 1e6, 1)]
    # a neighbour credited 10 MB on its builds and debited 9.5 MB on its drops
    churns = [((frame("rebuild", 40),), 5e6, 1), ((frame("rebuild", 40),), 5e6, 1), ((frame("rebuild", 41),), -9.5e6, 1)]
    found = suspects_from_stacks(keeps + churns, "stack-sampling", known_bytes=False, by_function=True)
    assert [s.function for s in found] == ["ingest", "rebuild"], found
    assert abs(found[0].share - 3 / 3.5) < 1e-9
    per_line = suspects_from_stacks(keeps + churns, "stack-sampling", known_bytes=False)
    assert per_line[0].function == "rebuild"  # per line, ingest's share is split in three
