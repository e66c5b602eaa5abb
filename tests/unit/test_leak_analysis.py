"""The leak detector's judgement of a series at the edges of its thresholds: too little data, a
step just over the flat band, a plateau just long enough, growth just fast enough, a sawtooth.
Made-up series without noise (or with noise made to measure), so each edge is exact."""

from __future__ import annotations

import pytest

from gpuscope.core.leak import LeakThresholds, assess

MB = 1e6
TH = LeakThresholds()
SECONDS = [float(i) for i in range(241)]  # 4 minutes read once a second: 24 floors of 10 s


def judged(times, values, th=TH):
    a = assess(times, values, thresholds=th)
    return a.verdict, a.pattern


def stepped(at: float, jump: float, times=SECONDS, base: float = 100 * MB) -> list[float]:
    return [base + (jump if t >= at else 0.0) for t in times]


# -- too little data ----------------------------------------------------------------------------------------


def test_six_samples_over_ten_seconds_are_enough_and_fewer_or_shorter_are_not():
    rising = lambda times: [20 * MB * i for i in range(len(times))]  # noqa: E731
    enough = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert judged(enough, rising(enough)) == ("leak", "steady-growth")
    five = [0.0, 2.5, 5.0, 7.5, 10.0]
    a = assess(five, rising(five))
    assert (a.verdict, a.pattern, a.confidence) == ("inconclusive", "insufficient-data", 0.0)
    short = [0.0, 2.0, 4.0, 6.0, 8.0, 9.99]
    assert judged(short, rising(short)) == ("inconclusive", "insufficient-data")


def test_samples_in_only_three_stretches_are_too_few_floors_and_four_are_enough():
    three = [0.0, 0.1, 0.2, 17.0, 17.1, 17.2, 39.8, 39.9, 40.0]
    a = assess(three, [3 * MB * t for t in three])
    assert (a.verdict, a.pattern, a.confidence) == ("inconclusive", "insufficient-data", 0.0)
    assert "only 3 stretches" in a.reason
    four = [0.0, 0.1, 0.2, 17.0, 17.1, 17.2, 28.0, 28.1, 28.2, 39.8, 39.9, 40.0]
    assert judged(four, [3 * MB * t for t in four]) == ("leak", "steady-growth")


# -- a step ---------------------------------------------------------------------------------------------------


def test_a_step_of_the_flat_band_is_flat_and_a_hair_more_is_a_step():
    late = [float(i) for i in range(121)]
    assert judged(late, stepped(90, 16 * MB, late)) == ("no-leak", "flat")
    up = assess(late, stepped(90, 16.001 * MB, late))
    assert (up.verdict, up.pattern, up.since) == ("no-leak", "step-then-plateau", 90.0)
    assert up.growth_bytes_per_s == 0.0
    assert judged(late, stepped(90, -16 * MB, late)) == ("no-leak", "flat")
    assert judged(late, stepped(90, -16.001 * MB, late)) == ("no-leak", "falling")


def test_a_step_is_settled_once_flat_for_the_least_plateau():
    values = stepped(220, 50 * MB)  # flat for 20 s, two floors, after the step
    settled = assess(SECONDS, values, thresholds=LeakThresholds(min_plateau_s=20.0))
    assert (settled.verdict, settled.pattern, settled.since) == ("no-leak", "step-then-plateau", 220.0)
    assert settled.reason.endswith("flat since")
    soon = assess(SECONDS, values, thresholds=LeakThresholds(min_plateau_s=20.5))
    assert (soon.verdict, soon.pattern) == ("inconclusive", "step-then-plateau")
    assert "too soon to say" in soon.reason
    assert soon.confidence == pytest.approx(settled.confidence / 2)


def test_one_floor_after_a_step_is_not_yet_a_plateau_however_long_it_lasts():
    two_minutes = [float(i) for i in range(121)]  # 15 floors of 8 s: the step at 110 s leaves one after it
    a = assess(two_minutes, stepped(110, 50 * MB, two_minutes))
    assert (a.verdict, a.pattern, a.since, a.growth_bytes_per_s) == ("inconclusive", "step-then-plateau", 110.0, 0.0)
    assert "flat for 10 s so far: too soon to say" in a.reason


def test_a_step_s_growth_is_the_slope_of_what_followed_it():
    values = [v + (0.2 * MB * (t - 220) if t >= 220 else 0.0) for t, v in zip(SECONDS, stepped(220, 50 * MB))]
    a = assess(SECONDS, values)  # 4 MB more over the two floors after the step: within the band
    assert (a.verdict, a.pattern, a.since) == ("no-leak", "step-then-plateau", 220.0)
    assert a.growth_bytes_per_s == pytest.approx(0.2 * MB)


def test_a_step_right_after_the_first_floor_is_a_step():
    a = assess(SECONDS, stepped(10, 50 * MB))
    assert (a.verdict, a.pattern, a.since) == ("no-leak", "step-then-plateau", 10.0)


def test_a_step_spread_over_seconds_is_dated_when_it_crossed_its_middle():
    # from 185 s to 195 s, in the last minute (read to the second: older samples are summed coarser)
    values = [100 * MB + 50 * MB * min(1.0, max(0.0, (t - 185) / 10)) for t in SECONDS]
    a = assess(SECONDS, values)
    assert (a.verdict, a.pattern, a.since) == ("no-leak", "step-then-plateau", 190.0)


def test_a_plateau_drifting_within_the_band_is_half_as_sure_as_a_still_one():
    still = assess(SECONDS, stepped(95, 50 * MB))
    drifting = assess(SECONDS, [v + (10 * MB * (t - 95) / 145 if t >= 95 else 0.0)
                                for t, v in zip(SECONDS, stepped(95, 50 * MB))])
    assert (drifting.verdict, drifting.pattern, drifting.since) == ("no-leak", "step-then-plateau", 95.0)
    assert drifting.confidence == pytest.approx(still.confidence / 2, rel=0.01)


# -- a ramp that stopped (warm-up) ---------------------------------------------------------------------------


def test_a_warm_up_is_settled_once_flat_for_a_third_of_the_horizon():
    def ramp(stop):
        return [100 * MB + 1 * MB * min(t, stop) for t in SECONDS]

    settled = assess(SECONDS, ramp(160.0))  # flat for 80 s of 240
    assert (settled.verdict, settled.pattern, settled.since) == ("no-leak", "step-then-plateau", 0.0)
    assert "(warm-up), flat since" in settled.reason
    assert judged(SECONDS, ramp(170.0)) == ("inconclusive", "step-then-plateau")


def test_a_warm_up_a_little_over_the_flat_band_is_a_warm_up():
    a = assess(SECONDS, [100 * MB + 20 * MB * min(t, 100.0) / 100 for t in SECONDS])  # 18 MB through its floors
    assert (a.verdict, a.pattern, a.since) == ("no-leak", "step-then-plateau", 0.0)
    assert a.reason == "rose 19.1 MiB in 100 s (warm-up), flat since"


def test_a_ramp_that_stopped_two_floors_ago_is_a_warm_up_too_soon_to_call():
    a = assess(SECONDS, [100 * MB + 1 * MB * min(t, 220.0) for t in SECONDS])
    assert (a.verdict, a.pattern, a.since) == ("inconclusive", "step-then-plateau", 0.0)
    assert a.reason.endswith("flat for 20 s so far: too soon to say")


def test_eight_floors_are_enough_to_see_a_warm_up():
    minute = [float(i) for i in range(64)]  # 64 samples: 8 floors
    a = assess(minute, [100 * MB + 5 * MB * min(t, 40.0) for t in minute])
    assert (a.verdict, a.pattern, a.since) == ("no-leak", "step-then-plateau", 0.0)


def test_a_warm_up_may_creep_on_at_a_quarter_of_its_rate():
    wide = LeakThresholds(flat_bytes=100 * MB)  # a creep of 40 MB after it is within the band

    def ramp(creep):
        return [100 * MB + 2 * MB * min(t, 155.0) + creep * max(0.0, t - 155) for t in SECONDS]

    assert assess(SECONDS, ramp(0.5 * MB), thresholds=wide).pattern == "step-then-plateau"
    assert assess(SECONDS, ramp(0.55 * MB), thresholds=wide).pattern == "steady-growth"


def test_a_warm_up_under_a_sawtooth_must_rise_more_than_half_its_swings():
    def ramp(size):  # the sawtooth's swings are 57 MB
        return [sawtooth(t) + size * min(t, 100.0) / 100 for t in SECONDS]

    assert assess(SECONDS, ramp(100 * MB)).pattern == "step-then-plateau"
    assert assess(SECONDS, ramp(40 * MB)).pattern != "step-then-plateau"


# -- growth ---------------------------------------------------------------------------------------------------


def test_a_rise_that_falls_back_a_little_every_other_floor_rose_mostly():
    # 3 MB a floor, every other floor 15.5 MB higher: a fall of 12.5 MB after each (too small for a sawtooth)
    a = assess(SECONDS, [100 * MB + (t // 10) * 3 * MB + (15.5 * MB if (t // 10) % 2 else 0.0) for t in SECONDS])
    assert a.pattern == "steady-growth"
    assert a.reason.startswith("floor rose 0.30 MB/s for 4 min, mostly;")


def test_the_time_to_full_counts_from_the_recent_peak():
    values = [100 * MB + 1 * MB * t for t in SECONDS]
    values[235] += 50 * MB  # a burst in the last floor, gone by the last sample
    a = assess(SECONDS, values, total_bytes=1000 * MB)
    assert a.verdict == "leak"
    assert a.time_to_full_s == pytest.approx((1000 * MB - values[235]) / (1 * MB))


def test_a_line_at_the_margin_of_the_alert_rate_is_a_leak_and_just_under_it_is_not():
    minute = [float(i) for i in range(61)]
    needed = TH.rate_margin * TH.alert_rate(60.0)
    at = assess(minute, [100 * MB + needed * t for t in minute])
    assert (at.verdict, at.pattern, at.since) == ("leak", "steady-growth", 0.0)
    assert at.growth_bytes_per_s == pytest.approx(needed)
    under = assess(minute, [100 * MB + 0.999 * needed * t for t in minute])
    assert (under.verdict, under.pattern) == ("inconclusive", "steady-growth")
    assert "below the" in under.reason


def test_a_line_rising_by_the_flat_band_is_flat_and_a_hair_more_is_growth():
    per_s = 16 * MB / 230.0  # the floors' minima span 230 s: the line rises by the band through them
    assert judged(SECONDS, [100 * MB + per_s * t for t in SECONDS]) == ("no-leak", "flat")
    grows = assess(SECONDS, [100 * MB + 1.001 * per_s * t for t in SECONDS])
    assert (grows.verdict, grows.pattern, grows.since) == ("inconclusive", "steady-growth", 0.0)
    assert grows.growth_bytes_per_s == pytest.approx(1.001 * per_s)
    per_s = 16 * MB / 231.0  # falling, each floor's minimum is its last sample: 9 s to 240 s
    assert judged(SECONDS, [100 * MB - 0.999 * per_s * t for t in SECONDS]) == ("no-leak", "flat")
    falls = assess(SECONDS, [100 * MB - 1.001 * per_s * t for t in SECONDS])
    assert (falls.verdict, falls.pattern) == ("no-leak", "falling")
    assert falls.growth_bytes_per_s == pytest.approx(-1.001 * per_s)


def test_a_rise_or_fall_of_exactly_the_flat_band_is_flat():
    up = assess(SECONDS, [100 * MB + 1e5 * t for t in SECONDS], thresholds=LeakThresholds(flat_bytes=23e6))
    assert (up.pattern, up.growth_bytes_per_s) == ("flat", 1e5)  # 23 MB through floors 230 s apart
    down = assess(SECONDS, [100 * MB - 1e5 * t for t in SECONDS], thresholds=LeakThresholds(flat_bytes=23.1e6))
    assert (down.pattern, down.growth_bytes_per_s) == ("flat", -1e5)  # 23.1 MB through floors 231 s apart


def test_growth_at_exactly_the_alert_rate_is_a_leak():
    minute = [float(i) for i in range(61)]
    exact = LeakThresholds(fast_rate=1e6, fast_duration_s=60.0, rate_margin=1.0)  # 1 MB/s over 60 s
    a = assess(minute, [100 * MB + 1e6 * t for t in minute], thresholds=exact)
    assert (a.verdict, a.growth_bytes_per_s) == ("leak", 1e6)


def test_the_least_confidence_is_enough():
    values = [100 * MB + 2 * MB * t for t in SECONDS]
    confidence = assess(SECONDS, values).confidence
    assert assess(SECONDS, values, thresholds=LeakThresholds(min_confidence=confidence)).verdict == "leak"
    above = LeakThresholds(min_confidence=min(1.0, confidence + 1e-6))
    unsure = assess(SECONDS, values, thresholds=above)
    assert unsure.verdict == "inconclusive"
    assert unsure.reason.endswith(f"; not yet sure enough to call it a leak (confidence {confidence:.2f})")


def test_a_floor_drifting_within_the_band_is_flat_but_half_as_sure_as_a_still_one():
    drifting = assess(SECONDS, [100 * MB + 10 * MB * t / 240 for t in SECONDS])  # every floor higher
    still = assess(SECONDS, [100 * MB + (5 * MB if (t // 10) % 2 else 0.0) for t in SECONDS])  # no trend
    assert (drifting.pattern, still.pattern) == ("flat", "flat")
    assert drifting.confidence == pytest.approx(still.confidence / 2, rel=0.05)


def test_a_still_series_is_flat():
    still = assess(SECONDS, [100 * MB] * len(SECONDS))
    assert (still.verdict, still.pattern, still.since, still.growth_bytes_per_s) == ("no-leak", "flat", 0.0, 0.0)
    assert still.confidence > 0.9
    exact = assess(SECONDS, [100 * MB] * len(SECONDS), thresholds=LeakThresholds(flat_bytes=0.0))
    assert exact.reason == "floor flat (within 0 B) for 4 min"  # no noise, no band: exactly flat


@pytest.mark.parametrize("start", [0.0, -240.0], ids=["from-0", "ending-at-0"])
def test_a_fast_leak_of_the_last_seconds_is_seen_in_a_quiet_history(start):
    times = [start + t for t in SECONDS]
    a = assess(times, [100 * MB + 20 * MB * max(0.0, t - 220) for t in SECONDS])
    assert (a.verdict, a.pattern) == ("leak", "steady-growth")
    assert a.growth_bytes_per_s == pytest.approx(20 * MB)
    assert a.since == start + 230.0  # the start of the ten-second horizon that saw it


# -- a sawtooth ---------------------------------------------------------------------------------------------


def sawtooth(t: float) -> float:
    return 100 * MB + 60 * MB * ((t % 20) / 20)  # filled over 20 s, freed: swings of 57 MB


def test_swings_over_a_flat_floor_are_a_sawtooth():
    a = assess(SECONDS, [sawtooth(t) for t in SECONDS])
    assert (a.verdict, a.pattern, a.growth_bytes_per_s) == ("no-leak", "sawtooth", 0.0)
    assert "swings of" in a.reason


def test_a_step_under_half_the_swings_of_a_sawtooth_is_not_a_step():
    under = assess(SECONDS, [sawtooth(t) + (25 * MB if t >= 120 else 0.0) for t in SECONDS])
    assert under.pattern != "step-then-plateau"
    over = assess(SECONDS, [sawtooth(t) + (35 * MB if t >= 120 else 0.0) for t in SECONDS])
    assert (over.verdict, over.pattern) == ("no-leak", "step-then-plateau")


def test_a_sawtooth_whose_floor_falls_by_less_than_half_its_swings_is_a_sawtooth():
    assert judged(SECONDS, [sawtooth(t) - 25 * MB * t / 240 for t in SECONDS]) == ("no-leak", "sawtooth")
    assert judged(SECONDS, [sawtooth(t) - 50 * MB * t / 240 for t in SECONDS]) == ("no-leak", "falling")


def test_a_sawtooth_whose_floor_rises_is_growth_of_its_floor():
    a = assess(SECONDS, [sawtooth(t) + 0.1 * MB * t for t in SECONDS])
    assert (a.pattern, a.since) == ("steady-growth", 0.0)
    assert a.growth_bytes_per_s == pytest.approx(0.1 * MB)
    assert a.reason.startswith("floor of a sawtooth")


def test_a_fill_seen_by_a_short_horizon_is_not_heard_when_a_longer_one_sees_the_sawtooth():
    # Flat for 200 s, then buffers filled and freed every 10 s: the last 10 s are a fill phase.
    values = [100 * MB + (60 * MB * ((t % 10) / 10) if t >= 200 else 0.0) for t in SECONDS]
    assert assess(SECONDS, values).verdict == "no-leak"


def test_a_step_seconds_ago_in_a_flat_history_is_too_soon_to_call():
    minute = [float(i) for i in range(61)]
    a = assess(minute, stepped(56, 200 * MB, minute))  # the whole minute's floors do not see it yet
    assert (a.verdict, a.pattern, a.since, a.growth_bytes_per_s) == ("inconclusive", "step-then-plateau", 56.0, 0.0)
    assert "too soon to say" in a.reason


# -- torch's allocated and reserved memory ------------------------------------------------------------------

RISING = [100 * MB + 2 * MB * t for t in SECONDS]  # a leak at 2 MB/s
LEVEL = [50 * MB] * len(SECONDS)
MISSING = [None] * len(SECONDS)


def torch_judged(primary, allocated, reserved):
    return assess(SECONDS, primary, allocated=allocated, reserved=reserved)


def test_growth_while_reserved_grows_and_allocated_does_not_is_the_caching_allocator():
    reserved = [10 * MB + 2 * MB * max(0.0, t - 120) for t in SECONDS]  # grew for the last two minutes
    a = torch_judged(RISING, LEVEL, reserved)
    assert (a.verdict, a.pattern) == ("no-leak", "cache-growth")
    assert "allocated stayed flat" in a.reason
    # no surer than either judgement it rests on
    assert a.confidence == assess(SECONDS, reserved).confidence < assess(SECONDS, RISING).confidence


def test_allocated_growing_at_a_tenth_of_the_rate_is_not_flat():
    reserved = [10 * MB + 2 * MB * t for t in SECONDS]
    tenth = torch_judged(RISING, [50 * MB + 0.2 * MB * t for t in SECONDS], reserved)
    assert (tenth.verdict, tenth.pattern) == ("leak", "steady-growth")
    under = torch_judged(RISING, [50 * MB + 0.19 * MB * t for t in SECONDS], reserved)
    assert (under.verdict, under.pattern) == ("no-leak", "cache-growth")
    assert "allocated stayed nearly flat" in under.reason


def test_allocated_drifting_within_the_flat_band_is_flat_however_slow_the_growth():
    slow = [100 * MB + 0.3 * MB * t for t in SECONDS]  # growth, under the alert rate
    drifting = [50 * MB + 10 * MB * t / 240 for t in SECONDS]  # flat, at 42 kB/s: more than a tenth of 0.3 MB/s
    assert assess(SECONDS, drifting).pattern == "flat"
    a = torch_judged(slow, drifting, [10 * MB + 2 * MB * t for t in SECONDS])
    assert a.pattern == "cache-growth"


def test_growth_with_allocated_and_reserved_flat_is_outside_the_allocator():
    a = torch_judged(RISING, LEVEL, LEVEL)
    assert (a.verdict, a.pattern) == ("leak", "steady-growth")
    assert a.reason.endswith("; outside PyTorch's allocator (reserved flat)")
    plain = assess(SECONDS, RISING)
    for reserved in (None, MISSING):  # nothing to say of reserved: the primary's judgement as it is
        assert torch_judged(RISING, LEVEL, reserved) == plain


def test_allocated_leaking_is_the_leak_when_the_primary_is_not_and_missing_allocated_changes_nothing():
    a = torch_judged(LEVEL, RISING, None)
    assert (a.verdict, a.pattern) == ("leak", "steady-growth")
    assert a.reason.startswith("torch allocated: floor rose")
    plain = assess(SECONDS, RISING)
    assert torch_judged(RISING, RISING, None) == plain  # both leaking: the primary's
    assert torch_judged(RISING, MISSING, [10 * MB + 2 * MB * t for t in SECONDS]) == plain
    assert torch_judged(LEVEL, LEVEL, RISING) == assess(SECONDS, LEVEL)


# -- each shape, whatever the clock ------------------------------------------------------------------------

# name: (the series over 4 minutes, then what the detector says of it: verdict, pattern, since, growth, reason)
SHAPES = {
    "step": (lambda t: 100 * MB + (50 * MB if t >= 95 else 0.0),
             "no-leak", "step-then-plateau", 95.0, 0.0, "a +47.7 MiB step at 95 s, flat since"),
    "drop": (lambda t: 100 * MB - (50 * MB if t >= 95 else 0.0),
             "no-leak", "falling", 0.0, 0.0, "floor fell 47.7 MiB over 4 min"),
    "onset": (lambda t: 100 * MB + (1 * MB * (t - 125) if t >= 125 else 0.0),
              "inconclusive", "steady-growth", 130.0, 1 * MB,
              "floor rose 1.0 MB/s for 110 s, steadily; below the 1.4 MB/s that makes a leak over 110 s"),
    "step, then growth": (lambda t: 100 * MB + (40 * MB + 1 * MB * (t - 125) if t >= 125 else 0.0),
                          "inconclusive", "steady-growth", 125.0, 1 * MB,
                          "after a +42.9 MiB step, floor rose 1.0 MB/s for 115 s, steadily; "
                          "below the 1.3 MB/s that makes a leak over 115 s"),
    "step, then a leak": (lambda t: 100 * MB + (50 * MB + 2 * MB * (t - 95) if t >= 95 else 0.0),
                          "leak", "steady-growth", 95.0, 2 * MB,
                          "after a +49.6 MiB step, floor rose 2.0 MB/s for 2 min, steadily"),
    "step spread over seconds, then growth": (
        lambda t: 100 * MB + (40 * MB * min(1.0, (t - 125) / 10) + 1 * MB * max(0.0, t - 135) if t >= 125 else 0.0),
        "inconclusive", "steady-growth", 129.0, 1 * MB,
        "after a +28.8 MiB step, floor rose 1.0 MB/s for 111 s, steadily; below the 1.3 MB/s that makes a leak over 111 s"),
    "warm-up": (lambda t: 100 * MB + 1 * MB * min(t, 155.0),
                "no-leak", "step-then-plateau", 0.0, 0.0, "rose 148 MiB in 3 min (warm-up), flat since"),
    "leak": (lambda t: 100 * MB + 1 * MB * t, "leak", "steady-growth", 0.0, 1 * MB, "floor rose 1.0 MB/s for 4 min, steadily"),
}


@pytest.mark.parametrize("start", [0.0, 1.7e9], ids=["from-0", "wall-clock"])
@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_is_told_with_its_start_and_rate_on_any_clock(shape, start):
    values, verdict, pattern, since, growth, reason = SHAPES[shape]
    a = assess([start + t for t in SECONDS], [values(t) for t in SECONDS])
    assert (a.verdict, a.pattern, a.since - start, a.reason) == (verdict, pattern, since, reason)
    assert a.growth_bytes_per_s == pytest.approx(growth, abs=1.0)


@pytest.mark.parametrize("at", [200.0, 210.0, 225.0])
def test_a_late_leak_is_dated_and_measured_alike_on_the_wall_clock(at):
    """A short horizon covers its own length on any clock: room for float error relative to the
    time (1e-9 of 1.7e9 s) once widened it by 1.7 s, and a leak that began late was dated a
    second early and its rate read lower on the wall clock."""
    values = [100 * MB + (8 * MB * (t - at) if t >= at else 0.0) for t in SECONDS]
    judged = [assess([start + t for t in SECONDS], values) for start in (0.0, 1.7e9)]
    (a, b) = judged
    assert (a.verdict, a.pattern, a.since, a.growth_bytes_per_s) == \
        (b.verdict, b.pattern, b.since - 1.7e9, b.growth_bytes_per_s)


# -- sample noise ---------------------------------------------------------------------------------------------


def jittered(values: list[float], by: float) -> list[float]:
    """Every other sample `by` higher, every other `by` lower: noise of the samples, not of the floors."""
    return [v + (by if i % 2 else -by) for i, v in enumerate(values)]


def test_a_slope_must_stand_six_standard_errors_clear_of_the_sample_noise():
    # +-25 MB from sample to sample: the slope through 24 floors is clear of it from 2.09 MB/s
    unclear = assess(SECONDS, jittered([100 * MB + 2.0 * MB * t for t in SECONDS], 25 * MB))
    assert (unclear.verdict, unclear.pattern) == ("inconclusive", "steady-growth")
    assert unclear.reason.endswith("; not yet clear of the noise (samples scatter by 106 MiB)")
    clear = assess(SECONDS, jittered([100 * MB + 2.2 * MB * t for t in SECONDS], 25 * MB))
    assert (clear.verdict, clear.pattern) == ("leak", "steady-growth")


def test_a_step_must_stand_six_standard_errors_clear_of_the_sample_noise():
    # +-5 MB from sample to sample: a step after 10 of 24 floors is clear of it from 55.1 MB
    within = assess(SECONDS, jittered(stepped(95, 52 * MB), 5 * MB))
    assert within.pattern != "step-then-plateau"
    clear = assess(SECONDS, jittered(stepped(95, 58 * MB), 5 * MB))
    assert (clear.verdict, clear.pattern, clear.since) == ("no-leak", "step-then-plateau", 95.0)
