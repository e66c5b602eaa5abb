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
    assert judged(five, rising(five)) == ("inconclusive", "insufficient-data")
    short = [0.0, 2.0, 4.0, 6.0, 8.0, 9.99]
    assert judged(short, rising(short)) == ("inconclusive", "insufficient-data")


def test_samples_in_only_three_stretches_are_too_few_floors_and_four_are_enough():
    three = [0.0, 0.1, 0.2, 17.0, 17.1, 17.2, 39.8, 39.9, 40.0]
    a = assess(three, [3 * MB * t for t in three])
    assert (a.verdict, a.pattern) == ("inconclusive", "insufficient-data")
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


# -- a ramp that stopped (warm-up) ---------------------------------------------------------------------------


def test_a_warm_up_is_settled_once_flat_for_a_third_of_the_horizon():
    def ramp(stop):
        return [100 * MB + 1 * MB * min(t, stop) for t in SECONDS]

    settled = assess(SECONDS, ramp(160.0))  # flat for 80 s of 240
    assert (settled.verdict, settled.pattern, settled.since) == ("no-leak", "step-then-plateau", 0.0)
    assert "(warm-up), flat since" in settled.reason
    assert judged(SECONDS, ramp(170.0)) == ("inconclusive", "step-then-plateau")


# -- growth ---------------------------------------------------------------------------------------------------


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


def test_a_floor_drifting_within_the_band_is_flat_but_half_as_sure_as_a_still_one():
    drifting = assess(SECONDS, [100 * MB + 10 * MB * t / 240 for t in SECONDS])  # every floor higher
    still = assess(SECONDS, [100 * MB + (5 * MB if (t // 10) % 2 else 0.0) for t in SECONDS])  # no trend
    assert (drifting.pattern, still.pattern) == ("flat", "flat")
    assert drifting.confidence == pytest.approx(still.confidence / 2, rel=0.05)


def test_a_still_series_is_flat():
    still = assess(SECONDS, [100 * MB] * len(SECONDS))
    assert (still.verdict, still.pattern, still.since, still.growth_bytes_per_s) == ("no-leak", "flat", 0.0, 0.0)
    assert still.confidence > 0.9


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
    assert (a.verdict, a.pattern, a.since) == ("inconclusive", "step-then-plateau", 56.0)
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
