"""The leak detector's small judgements at their edges: a process's age and life, the alert rate,
a site's held-bytes trend, and when a running tracker has seen enough."""

import math

import pytest

from gpuscope.core.common.units import format_duration, format_size
from gpuscope.core.leak import HeldTrend, LeakThresholds, held_evidence, held_trend, tracking_settled
from gpuscope.core.leak._held import held_floors
from gpuscope.core.leak._life import ended_run, warming_up

MB = 1e6
TIMES = [i * 0.25 for i in range(49)]  # 12 s read 4 times a second

def settled_by(times, sites, totals):
    """`tracking_settled` with the totals named: ("heap", series), ("rss", series)."""
    named = dict(totals)
    return tracking_settled(times, sites, named.get("heap", []), named.get("rss", []))


# -- a process's age and life ---------------------------------------------------------------------------


def test_growth_in_the_first_seconds_is_a_warm_up_until_the_process_is_twice_that_old():
    assert warming_up(started=0.0, since=5.0, now=10.0, warmup_s=20.0)  # young
    assert warming_up(started=0.0, since=5.0, now=39.0, warmup_s=20.0)  # began young, not yet 40 s old
    assert not warming_up(started=0.0, since=5.0, now=40.0, warmup_s=20.0)
    assert not warming_up(started=0.0, since=20.0, now=30.0, warmup_s=20.0)  # began once grown up
    assert warming_up(started=0.0, since=19.0, now=30.0, warmup_s=20.0)
    assert warming_up(started=100.0, since=None, now=119.0, warmup_s=20.0)  # growing from now: the age decides
    assert not warming_up(started=100.0, since=None, now=120.0, warmup_s=20.0)
    assert not warming_up(started=100.0, since=110.0, now=140.0, warmup_s=20.0)


def test_the_default_warm_up_is_twenty_seconds():
    assert warming_up(0.0, None, 19.0) and not warming_up(0.0, None, 20.0)


def test_a_run_is_a_life_shorter_than_a_services():
    assert ended_run(599.0) and not ended_run(600.0)
    assert ended_run(9.0, service_life_s=10.0) and not ended_run(10.0, service_life_s=10.0)


# -- the alert rate ------------------------------------------------------------------------------------------


def test_the_alert_rate_runs_from_the_fast_rate_to_the_slow_one_as_a_power_law():
    th = LeakThresholds()
    assert th.alert_rate(9.0) == math.inf
    assert th.alert_rate(10.0) == pytest.approx(5e6)
    assert th.alert_rate(7200.0) == pytest.approx(1e9 / 7200)
    # halfway on a log scale, the geometric mean
    assert th.alert_rate(math.sqrt(10.0 * 7200.0)) == pytest.approx(math.sqrt(5e6 * 1e9 / 7200))
    # beyond the slow window it keeps falling, down to the least rate
    assert th.alert_rate(72000.0) < 1e9 / 7200
    assert th.alert_rate(1e12) == th.min_rate


def test_without_a_longer_slow_window_or_a_faster_fast_rate_the_alert_rate_is_the_lower_one():
    same = LeakThresholds(fast_rate=1e5, slow_bytes=1e9, slow_window_s=7200.0)  # fast under slow's 139 kB/s
    assert same.alert_rate(100.0) == pytest.approx(1e5)
    short = LeakThresholds(fast_duration_s=100.0, slow_window_s=50.0, slow_bytes=1e6)  # 20 kB/s
    assert short.alert_rate(100.0) == pytest.approx(2e4)
    assert short.alert_rate(99.0) == math.inf


# -- a site's held bytes ------------------------------------------------------------------------------------


def test_a_steady_rise_is_rising_at_its_rate():
    trend = held_trend(TIMES, [2 * MB * t for t in TIMES])
    assert trend.kind == "rising"
    assert trend.growth_bytes_per_s == pytest.approx(2 * MB)
    assert trend.confidence == pytest.approx(1.0)


def test_too_few_reads_or_too_short_a_span_is_insufficient():
    assert held_trend([0.0, 1.0, 2.0], [0.0, 5 * MB, 10 * MB]).kind == "insufficient-data"
    assert held_trend([0.0, 0.5, 1.0, 1.9], [0.0, 5 * MB, 10 * MB, 15 * MB]).kind == "insufficient-data"
    assert held_trend([0.0, 0.5, 1.0, 2.0], [0.0, 5 * MB, 10 * MB, 15 * MB]).kind == "rising"


def test_a_rise_under_a_megabyte_or_the_least_rate_is_not_rising():
    assert held_trend(TIMES, [0.08 * MB * t for t in TIMES]).kind != "rising"  # 0.96 MB in all
    assert held_trend(TIMES, [0.09 * MB * t for t in TIMES]).kind == "rising"  # 1.08 MB
    slow = LeakThresholds(min_rate=3 * MB)
    assert held_trend(TIMES, [2 * MB * t for t in TIMES], slow).kind != "rising"


def test_a_rise_that_falls_back_as_far_between_two_reads_is_churn():
    held = [2 * MB * t for t in TIMES]
    held[30] = -30 * MB  # one read far under: the floors before it fall, its fall is larger than the rise
    assert held_trend(TIMES, held).kind != "rising"


def test_a_rise_that_levels_off_is_a_cache_filling_to_its_bound():
    held = [min(2 * MB * t, 8 * MB) for t in TIMES]  # fills in 4 s, then flat for 8
    trend = held_trend(TIMES, held)
    assert trend.kind == "levelled"
    assert trend.growth_bytes_per_s == pytest.approx(0.0)


def test_level_held_bytes_are_balanced():
    trend = held_trend(TIMES, [5 * MB] * len(TIMES))
    assert trend.kind == "balanced" and trend.growth_bytes_per_s == 0.0


def test_a_long_tracking_is_thinned_to_its_trend_points_and_keeps_its_last():
    times = [i * 0.1 for i in range(601)]  # 60 s, 601 reads
    held = [2 * MB * t for t in times]
    assert held_trend(times, held).growth_bytes_per_s == pytest.approx(2 * MB)
    # a rise only in the last read: kept, so it shows (not rising: it is not steady)
    late = [0.0] * 600 + [50 * MB]
    assert held_trend(times, late).kind != "rising"


def test_floors_are_what_stays_held_from_each_read_to_the_end():
    assert held_floors([0, 1, 2, 3], [5, 1, 4, 3]) == [(0.0, 1.0), (1.0, 1.0), (2.0, 3.0), (3.0, 3.0)]


# -- when a running tracker has seen enough ---------------------------------------------------------------


def settle_times(seconds: float, step: float = 0.5) -> list[float]:
    return [i * step for i in range(int(seconds / step) + 1)]


def test_a_tracker_is_not_stopped_before_six_seconds_and_six_points():
    times = settle_times(5.5)
    rising = [("site", [4 * MB * t for t in times])]
    assert settled_by(times, rising, []) is None
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0]  # six seconds, five points after the first second
    assert settled_by(times, [("site", [4 * MB * t for t in times])], []) is None


def test_a_site_rising_steadily_settles_as_rising():
    times = settle_times(8.0)
    settled = settled_by(times, [("flat", [MB] * len(times)), ("grow", [4 * MB * t for t in times])], [])
    assert settled is not None and settled.kind == "rising" and settled.reason.startswith("grow rose")


def test_the_heap_rising_settles_but_the_rss_alone_does_not():
    times = settle_times(8.0)
    rising = [4 * MB * t for t in times]
    flat = [100 * MB] * len(times)
    heap = settled_by(times, [], [("heap", rising), ("rss", flat)])
    assert heap is not None and heap.kind == "rising"
    rss = settled_by(times, [], [("heap", flat), ("rss", rising)])
    assert rss is None  # the RSS still moving: keep tracking


def test_flat_totals_settle_as_flat_and_one_that_rose_then_levelled_as_levelled():
    times = settle_times(9.0)
    flat = [100 * MB] * len(times)
    settled = settled_by(times, [], [("heap", flat), ("rss", flat)])
    assert settled is not None and settled.kind == "flat" and settled.reason.startswith("the heap in use and the RSS flat")
    # the floors of the thirds: 100, 108, 108 MB
    levelled = [100 * MB if t < 3.5 else 108 * MB for t in times]
    settled = settled_by(times, [], [("heap", flat), ("rss", levelled)])
    assert settled is not None and settled.kind == "levelled" and settled.reason.startswith("the RSS rose")


def test_totals_still_moving_keep_the_tracker_going():
    times = settle_times(9.0)
    # a rise too ragged to be steady, too large to be flat
    ragged = [100 * MB + (3 * MB if i % 2 else 0) + 0.6 * MB * t for i, t in enumerate(times)]
    assert settled_by(times, [], [("heap", ragged)]) is None
    assert settled_by(times, [], []) is None  # nothing to judge


def test_reads_of_the_first_second_and_missing_reads_are_left_out():
    times = settle_times(8.0)
    # the tracker's own start: 50 MB in its first second, flat after
    start = [50 * MB * (1 - t) if t < 1.0 else 0.0 for t in times]
    settled = settled_by(times, [], [("heap", start)])
    assert settled is not None and settled.kind == "flat"
    gaps = [None if i % 2 else 100 * MB for i in range(len(times))]
    settled = settled_by(times, [], [("heap", gaps)])
    assert settled is not None and settled.kind == "flat"


# -- a site's trend does not depend on when tracking began or what was held before ------------------------

SHAPES = {
    "rising": [2 * MB * t for t in TIMES],
    "levelled": [min(2 * MB * t, 8 * MB) for t in TIMES],
    "balanced": [5 * MB + (MB if i % 2 else 0) for i in range(len(TIMES))],
    "churn": [2 * MB * t if i != 30 else -30 * MB for i, t in enumerate(TIMES)],
    "small": [0.08 * MB * t for t in TIMES],
    "late batch": [0.0] * 30 + [2 * MB * (i + 1) for i in range(19)],
    "small cache": [min(0.25 * MB * t, 0.5 * MB) for t in TIMES],
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_trend_is_the_same_whenever_tracking_began_and_whatever_was_held_before(shape):
    held = SHAPES[shape]
    base = held_trend(TIMES, held)
    moved = held_trend([t + 1000.0 for t in TIMES], [v + 500 * MB for v in held])
    assert (moved.kind, moved.growth_bytes_per_s, moved.confidence) == pytest.approx(
        (base.kind, base.growth_bytes_per_s, base.confidence))


def test_each_kind_at_its_rate_and_confidence():
    rising = held_trend(TIMES, SHAPES["rising"])
    assert (rising.kind, rising.growth_bytes_per_s, rising.confidence) == ("rising", pytest.approx(2 * MB), 1.0)
    assert held_trend(TIMES, SHAPES["late batch"]).kind == "balanced"
    assert held_trend(TIMES, SHAPES["churn"]).kind == "balanced"
    levelled = held_trend(TIMES, SHAPES["levelled"])
    assert levelled.kind == "levelled" and levelled.confidence == pytest.approx(0.55, abs=0.01)  # its tau
    balanced = held_trend(TIMES, [5 * MB] * len(TIMES))
    assert balanced.confidence == 1.0  # no rank correlation at all: surely balanced
    small = held_trend(TIMES, SHAPES["small"])  # steady, but under a megabyte in all
    assert small.kind == "balanced" and small.confidence == pytest.approx(0.5)


def test_few_points_lower_the_confidence_of_a_rise():
    times = [0.0, 1.0, 2.0, 3.0, 4.0]
    trend = held_trend(times, [2 * MB * t for t in times])
    assert trend.kind == "rising" and trend.confidence == pytest.approx(0.5)


def test_insufficient_data_says_no_growth_and_no_confidence():
    trend = held_trend([0.0, 1.0, 2.0], [0.0, 5 * MB, 10 * MB])
    assert (trend.growth_bytes_per_s, trend.confidence) == (0.0, 0.0)
    assert held_trend([100.0, 100.5, 101.0, 101.9], [0.0, 5 * MB, 10 * MB, 15 * MB]).kind == "insufficient-data"


def test_a_thinned_tracking_reads_its_end_value_last():
    times = [i * 0.1 for i in range(601)]  # thinned every 11th read: the last is added
    trend = held_trend(times, [2 * MB * t for t in times])
    assert trend.reason.endswith(f"(to {format_size(2 * MB * 60.0)})")
    times = [i * 0.1 for i in range(595)]  # 594 = 54 x 11: the last read is on the grid
    trend = held_trend(times, [2 * MB * t for t in times])
    assert trend.reason.endswith(f"(to {format_size(2 * MB * 59.4)})")


def test_a_fall_between_two_reads_as_large_as_the_rise_is_churn_even_when_the_next_read_recovers():
    held = [2 * MB * t for t in TIMES]
    held[40] = held[40] - 25 * MB  # 24.5 MB freed, and allocated again by the next read: the rise is 24 MB
    assert held_trend(TIMES, held).kind == "balanced"
    held[40] = 2 * MB * TIMES[40] - 5 * MB  # a fall of 5.5 MB: under the rise
    assert held_trend(TIMES, held).kind == "rising"


# -- a rising site against the memory in use ----------------------------------------------------------------

RISING = HeldTrend("rising", 4 * MB, 1.0, "")
FLAT_HELD = [0.0] * len(TIMES)


def test_the_memory_in_use_must_rise_at_least_a_quarter_of_the_sites_rate():
    quarter = [100 * MB + 1 * MB * t for t in TIMES]  # exactly 1 MB/s against 4 MB/s
    assert held_evidence(RISING, TIMES, FLAT_HELD, TIMES, quarter).counts
    under = [100 * MB + 0.9 * MB * t for t in TIMES]
    assert not held_evidence(RISING, TIMES, FLAT_HELD, TIMES, under).counts


def test_small_object_blocks_count_their_bytes_even_when_few():
    slow = HeldTrend("rising", 1000.0, 1.0, "")  # 1 kB/s: a quarter is 250 B/s
    level = [100 * MB] * len(TIMES)
    assert not held_evidence(slow, TIMES, FLAT_HELD, TIMES, level, [1000.0] * len(TIMES)).counts
    one_block_a_second = [1000.0 + t for t in TIMES]  # 512 B/s
    assert held_evidence(slow, TIMES, FLAT_HELD, TIMES, level, one_block_a_second).counts
    tiny = HeldTrend("rising", 2.0, 1.0, "")
    assert not held_evidence(tiny, TIMES, FLAT_HELD, TIMES, level).counts


def test_a_site_with_no_growth_against_level_memory_is_matched_by_it():
    still = HeldTrend("rising", 0.0, 1.0, "")
    judged = held_evidence(still, TIMES, FLAT_HELD, TIMES, [100 * MB] * len(TIMES))
    assert judged.counts and judged.rule == "memory in use rising"


def test_the_tracker_s_first_second_of_heap_is_left_out():
    # the tracker's own buffers: 80 MB more in use from its first reads, then level
    heap = [20 * MB if t < 0.75 else 100 * MB for t in TIMES]
    judged = held_evidence(RISING, TIMES, FLAT_HELD, TIMES, heap)
    assert not judged.counts and judged.rule == "memory in use level"


def test_the_memory_in_use_is_measured_from_four_reads_over_two_seconds():
    level = [100 * MB] * 4
    assert held_evidence(RISING, TIMES, FLAT_HELD, [1.0, 1.5, 2.5, 3.0], level).rule == "memory in use level"
    assert held_evidence(RISING, TIMES, FLAT_HELD, [1.0, 1.5, 2.5, 2.9], level).rule == "no measure of memory in use"
    assert held_evidence(RISING, TIMES, FLAT_HELD, [1.0, 1.3, 1.6, 1.9], level).rule == "no measure of memory in use"
    assert held_evidence(RISING, TIMES, FLAT_HELD, [1.0, 2.0, 3.0], level[:3]).rule == "no measure of memory in use"
    # all in the first second: read as they are
    early = [0.0, 0.3, 0.6, 0.9]
    assert held_evidence(RISING, TIMES, FLAT_HELD, early, level).rule == "no measure of memory in use"


def test_a_site_outlasts_turnover_when_it_gains_more_than_the_process_held_at_its_first_read():
    heap = [40 * MB] + [20 * MB] * (len(TIMES) - 1)  # 40 MB at the first read, 20 MB after
    level = [20 * MB] * len(TIMES)
    gained_36 = [36 * MB * t / TIMES[-1] for t in TIMES]
    assert held_evidence(RISING, TIMES, gained_36, TIMES, heap).rule == "memory in use level"
    assert held_evidence(RISING, TIMES, gained_36, TIMES, level).rule == "outlasts turnover"
    # what it gained is from its least to its last, not from its first
    dipped = [50 * MB, 10 * MB, *[10 * MB + 30 * MB * t / TIMES[-1] for t in TIMES[2:]]]
    assert held_evidence(RISING, TIMES, dipped, TIMES, [35 * MB] * len(TIMES)).rule == "memory in use level"
    assert held_evidence(RISING, TIMES, dipped, TIMES, [29 * MB] * len(TIMES)).rule == "outlasts turnover"


def test_a_gain_must_exceed_what_the_process_held_and_its_first_blocks_count():
    level = [20 * MB] * len(TIMES)
    exactly = [20 * MB * t / TIMES[-1] for t in TIMES]
    assert not held_evidence(RISING, TIMES, exactly, TIMES, level).counts
    more = [(20 * MB + 100) * t / TIMES[-1] for t in TIMES]
    assert held_evidence(RISING, TIMES, more, TIMES, level).counts
    blocks = [40000.0] * len(TIMES)  # 20.48 MB of small objects at the first read
    assert not held_evidence(RISING, TIMES, [36 * MB * t / TIMES[-1] for t in TIMES], TIMES, level, blocks).counts


def test_growth_that_began_in_the_first_seconds_counts_from_the_process_start():
    assert warming_up(started=100.0, since=105.0, now=130.0, warmup_s=20.0)
    assert not warming_up(started=100.0, since=125.0, now=130.0, warmup_s=20.0)


def test_a_slow_window_as_long_as_the_fast_one_takes_the_lower_rate():
    same = LeakThresholds(fast_duration_s=100.0, slow_window_s=100.0, slow_bytes=1e8)  # 1 MB/s
    assert same.alert_rate(100.0) == pytest.approx(1e6)


def test_a_tracker_may_stop_with_six_points_after_its_first_second_and_six_seconds():
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    settled = settled_by(times, [("site", [4 * MB * t for t in times])], [])
    assert settled is not None and settled.kind == "rising"
    flat = settled_by(times, [], [("heap", [100 * MB] * len(times))])
    assert flat is not None and flat.kind == "flat"
    assert flat.reason == f"the heap in use flat for {format_duration(5.0)}"


def test_a_site_read_fewer_times_is_judged_on_its_reads():
    times = settle_times(8.0)
    short = [4 * MB * t for t in times[:-3]]
    settled = settled_by(times, [("site", short)], [])
    assert settled is not None and settled.kind == "rising"


def test_a_slow_creep_within_a_megabyte_is_not_flat():
    times = settle_times(9.0)
    creep = [100 * MB + 0.1 * MB * t for t in times]  # 0.9 MB in all, 1.2 MB over the horizon
    assert settled_by(times, [], [("heap", creep)]) is None


def test_levelled_needs_a_megabyte_of_rise_then_a_quarter_of_one_at_most():
    times = settle_times(9.0)  # the thirds of the reads after the first second: 1-3 s, 3.5-5.5 s, 6-9 s

    def stepped(rise: float, after: float) -> list[float]:
        return [100 * MB if t < 3.5 else (100 * MB + rise if t < 6.0 else 100 * MB + rise + after) for t in times]

    assert settled_by(times, [], [("heap", stepped(1 * MB, 0.0))]).kind == "levelled"
    assert settled_by(times, [], [("heap", stepped(0.99 * MB, 0.0))]) is None
    assert settled_by(times, [], [("heap", stepped(2 * MB, 0.25 * MB))]).kind == "levelled"
    assert settled_by(times, [], [("heap", stepped(2 * MB, 0.22 * MB))]).kind == "levelled"
    assert settled_by(times, [], [("heap", stepped(2 * MB, 0.26 * MB))]) is None
    assert settled_by(times, [], [("heap", stepped(0.5 * MB, 0.1 * MB))]) is None


def test_a_rise_says_how_long_it_lasted_whenever_tracking_began():
    moved = held_trend([t + 1000.0 for t in TIMES], [v + 500 * MB for v in SHAPES["rising"]])
    assert f"steadily for {format_duration(12.0)} " in moved.reason
