"""The leak detector: synthetic series of every kind, the default thresholds, series recorded from
real processes, and the live watch. Deterministic: seeded noise, no sleeps but the recording's."""

from __future__ import annotations

import gc
import math
import random
import subprocess
import sys

import psutil
import pytest

from gpuscope.core.leak import (
    PATTERNS,
    VERDICTS,
    FloorSketch,
    LeakAssessment,
    LeakThresholds,
    LeakWatch,
    assess,
)

MB = 1e6
GB = 1e9


def series(seconds, shape, *, seed=0, noise=5 * MB, bursts=0.0, base=20 * GB, every=1.0):
    """(times, values): base + shape(t) + gaussian noise + occasional bursts (1-5 s, 50 MB-1 GB)."""
    rng = random.Random(seed)
    times, values = [], []
    burst_left, height = 0, 0.0
    for i in range(int(seconds / every) + 1):
        t = i * every
        v = base + shape(t) + rng.gauss(0, noise)
        if bursts:
            if burst_left == 0 and rng.random() < bursts:
                burst_left, height = rng.randint(1, 5), rng.uniform(50 * MB, 1 * GB)
            if burst_left:
                v += height
                burst_left -= 1
        times.append(t)
        values.append(v)
    return times, values


def check(a: LeakAssessment) -> LeakAssessment:
    """Every assessment is well formed, whatever it says."""
    assert a.verdict in VERDICTS
    assert a.pattern in PATTERNS
    assert 0.0 <= a.confidence <= 1.0
    assert a.reason and "\n" not in a.reason
    return a


# --- synthetic series -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "seconds"),
    [(50 * MB, 60), (5 * MB, 120), (1 * MB, 600), (0.2 * MB, 7200)],
    ids=["50MB/s-1min", "5MB/s-2min", "1MB/s-10min", "0.2MB/s-2h"],
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_steady_leaks_with_noise_and_bursts_are_leaks(rate, seconds, seed):
    times, values = series(seconds, lambda t: rate * t, seed=seed, noise=5 * MB, bursts=0.01)
    a = check(assess(times, values))
    assert (a.verdict, a.pattern) == ("leak", "steady-growth"), a.reason
    assert a.growth_bytes_per_s == pytest.approx(rate, rel=0.1)
    assert a.since == pytest.approx(0.0, abs=0.1 * seconds)
    assert a.confidence >= 0.5
    assert "rose" in a.reason


def test_a_step_then_flat_is_not_a_leak():
    times, values = series(600, lambda t: 2 * GB if t >= 12 else 0.0, seed=4)
    a = check(assess(times, values))
    assert (a.verdict, a.pattern) == ("no-leak", "step-then-plateau"), a.reason
    assert a.since == pytest.approx(12.0, abs=2.0)
    assert "+1.9 GiB step at 12 s" in a.reason
    assert abs(a.growth_bytes_per_s) < 0.05 * MB  # flat since
    assert a.confidence >= 0.5


def test_a_step_two_hours_back_is_still_not_a_leak():
    times, values = series(7200, lambda t: 2 * GB if t >= 12 else 0.0, seed=5, bursts=0.005)
    a = check(assess(times, values))
    assert (a.verdict, a.pattern) == ("no-leak", "step-then-plateau"), a.reason
    assert a.since == pytest.approx(12.0, abs=20.0)  # placed to within the floor bucket's width


def test_a_step_seconds_ago_is_too_soon_to_call():
    times, values = series(3600, lambda t: 2 * GB if t > 3595 else 0.0, seed=6)
    a = check(assess(times, values))
    assert (a.verdict, a.pattern) == ("inconclusive", "step-then-plateau"), a.reason
    assert "too soon" in a.reason


def warm_up(ramp_s, size):
    return lambda t: size * min(t, ramp_s) / ramp_s


def test_warm_up_ramp_then_plateau_is_not_a_leak_once_the_plateau_is_long_enough():
    shape = warm_up(300, 1.5 * GB)  # KV cache / CUDA context warming for 5 minutes
    during = check(assess(*series(200, shape, seed=7)))
    assert during.pattern == "steady-growth"  # while it climbs it cannot be told from a leak
    short = check(assess(*series(400, shape, seed=7)))  # 100 s of plateau after 300 s of ramp
    assert short.verdict != "no-leak", short.reason
    long = check(assess(*series(1800, shape, seed=7)))
    assert (long.verdict, long.pattern) == ("no-leak", "step-then-plateau"), long.reason
    assert "warm-up" in long.reason and "1.4 GiB" in long.reason
    assert long.since == pytest.approx(0.0)


def sawtooth(period, swing, floor_rate=0.0):
    return lambda t: floor_rate * t + swing * ((t % period) / period)


def test_sawtooth_over_a_flat_floor_is_not_a_leak():
    a = check(assess(*series(1800, sawtooth(20, 300 * MB), seed=8, noise=2 * MB)))
    assert (a.verdict, a.pattern) == ("no-leak", "sawtooth"), a.reason
    assert abs(a.growth_bytes_per_s) < 0.05 * MB


def test_square_wave_buffers_over_a_flat_floor_are_a_sawtooth():
    shape = lambda t: 500 * MB if (t % 30) < 12 else 0.0  # noqa: E731 - filled 12 s of every 30
    a = check(assess(*series(3600, shape, seed=9)))
    assert (a.verdict, a.pattern) == ("no-leak", "sawtooth"), a.reason


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_leak_watched_around_a_gap_is_a_leak_not_a_few_jumps(seed):
    # A diagnosis leaves out the samples taken while a tracker runs: 10 s with no samples in the
    # middle of 30 s. The floor's rise across the gap is the trend's, not a jump.
    times, values = series(30, sawtooth(3, 30 * MB, floor_rate=7.5 * MB), seed=seed, noise=1 * MB, every=0.5)
    kept = [(t, v) for t, v in zip(times, values) if not 10 <= t < 20]
    a = check(assess([t for t, _ in kept], [v for _, v in kept]))
    assert (a.verdict, a.pattern) == ("leak", "steady-growth"), a.reason
    assert a.growth_bytes_per_s == pytest.approx(7.5 * MB, rel=0.2)


def test_a_staircase_of_two_jumps_is_not_a_steady_rise():
    times, values = series(60, lambda t: 100 * MB * ((t >= 20) + (t >= 40)), seed=4, noise=1 * MB)
    a = check(assess(times, values))
    assert a.verdict != "leak", a.reason


def test_sawtooth_whose_floor_rises_is_a_leak():
    a = check(assess(*series(1800, sawtooth(20, 300 * MB, floor_rate=0.5 * MB), seed=10, noise=2 * MB)))
    assert (a.verdict, a.pattern) == ("leak", "steady-growth"), a.reason
    assert a.growth_bytes_per_s == pytest.approx(0.5 * MB, rel=0.1)
    assert "sawtooth" in a.reason


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("seconds", [60, 600, 7200])
def test_flat_with_noise_is_flat(seconds, seed):
    a = check(assess(*series(seconds, lambda t: 0.0, seed=seed, noise=10 * MB)))
    assert (a.verdict, a.pattern) == ("no-leak", "flat"), a.reason


@pytest.mark.parametrize("seed", [14, 15, 16])
def test_noise_with_occasional_bursts_is_not_a_leak(seed):
    a = check(assess(*series(3600, lambda t: 0.0, seed=seed, noise=10 * MB, bursts=0.003)))
    # "no-leak" (flat), or "inconclusive" when the series ends inside a burst: a jump seconds ago
    # cannot be told from a step yet.
    assert a.verdict != "leak", a.reason


def test_a_falling_floor_is_not_a_leak():
    a = check(assess(*series(1800, lambda t: -0.5 * MB * t, seed=17)))
    assert (a.verdict, a.pattern) == ("no-leak", "falling"), a.reason


def test_growth_that_starts_late_is_dated_from_its_start():
    a = check(assess(*series(3600, lambda t: 1 * MB * max(0.0, t - 2400), seed=18)))
    assert (a.verdict, a.pattern) == ("leak", "steady-growth"), a.reason
    assert a.since == pytest.approx(2400, abs=60)
    assert a.growth_bytes_per_s == pytest.approx(1 * MB, rel=0.05)


def test_a_fast_leak_that_started_seconds_ago_is_seen_in_a_long_quiet_history():
    a = check(assess(*series(3600, lambda t: 50 * MB * max(0.0, t - 3580), seed=19)))
    assert a.verdict == "leak", a.reason
    assert a.since >= 3570


def test_a_step_then_a_leak_is_a_leak_since_the_step():
    shape = lambda t: (2 * GB + 0.5 * MB * (t - 600)) if t >= 600 else 0.0  # noqa: E731
    a = check(assess(*series(3600, shape, seed=20)))
    assert (a.verdict, a.pattern) == ("leak", "steady-growth"), a.reason
    assert a.since == pytest.approx(600, abs=30)
    assert "step" in a.reason


def test_cache_growth_reserved_grows_while_allocated_is_flat():
    rng = random.Random(21)
    times = [float(i) for i in range(1201)]
    allocated = [4 * GB + rng.gauss(0, 1 * MB) for _ in times]
    reserved = [5 * GB + 1 * MB * t + rng.gauss(0, 1 * MB) for t in times]
    used = [r + 600 * MB for r in reserved]  # NVML: reserved + CUDA context
    plain = check(assess(times, used))
    assert plain.verdict == "leak"  # without torch's figures it looks like a leak ...
    a = check(assess(times, used, allocated=allocated, reserved=reserved))
    assert (a.verdict, a.pattern) == ("no-leak", "cache-growth"), a.reason  # ... with them it is not
    assert "allocated" in a.reason and "reserved" in a.reason
    assert a.growth_bytes_per_s == pytest.approx(1 * MB, rel=0.05)


def test_allocated_growing_is_a_leak_even_with_the_torch_series():
    rng = random.Random(22)
    times = [float(i) for i in range(1201)]
    allocated = [4 * GB + 1 * MB * t + rng.gauss(0, 1 * MB) for t in times]
    reserved = [a + 1 * GB for a in allocated]
    a = check(assess(times, reserved, allocated=allocated, reserved=reserved))
    assert (a.verdict, a.pattern) == ("leak", "steady-growth"), a.reason


def test_growth_outside_torchs_allocator_stays_a_leak():
    rng = random.Random(23)
    times = [float(i) for i in range(1201)]
    allocated = [4 * GB + rng.gauss(0, 1 * MB) for _ in times]
    reserved = [5 * GB + rng.gauss(0, 1 * MB) for _ in times]
    used = [6 * GB + 1 * MB * t + rng.gauss(0, 1 * MB) for t in times]  # NCCL, cuBLAS workspaces, ...
    a = check(assess(times, used, allocated=allocated, reserved=reserved))
    assert a.verdict == "leak" and "outside PyTorch's allocator" in a.reason


@pytest.mark.parametrize(
    ("times", "values"),
    [([], []), ([0.0, 1.0, 2.0, 3.0], [1e9, 2e9, 3e9, 4e9]), ([float(i) for i in range(30)], [math.nan] * 30),
     ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [1e9] * 8)],
    ids=["empty", "4-samples", "all-nan", "7-seconds"],
)
def test_too_little_data_is_insufficient_and_inconclusive(times, values):
    a = check(assess(times, values))
    assert (a.verdict, a.pattern) == ("inconclusive", "insufficient-data")
    assert a.confidence == 0.0 and a.growth_bytes_per_s is None and a.time_to_full_s is None


def test_nan_gaps_are_tolerated():
    times, values = series(1200, lambda t: 1 * MB * t, seed=24)
    values = [math.nan if (i % 3 == 0 or 500 <= i < 560) else v for i, v in enumerate(values)]
    values[700] = None  # None reads as "not available" too
    a = check(assess(times, values))
    assert (a.verdict, a.pattern) == ("leak", "steady-growth"), a.reason
    assert a.growth_bytes_per_s == pytest.approx(1 * MB, rel=0.05)
    assert a.samples == sum(1 for v in values if v is not None and not math.isnan(v))
    valid = [v for v in values if v is not None and not math.isnan(v)]
    assert a.start_bytes == valid[0] and a.end_bytes == valid[-1]


def test_wall_clock_times_work_as_well_as_small_ones():
    times, values = series(1800, lambda t: 1 * MB * max(0.0, t - 600), seed=40)
    here = assess(times, values)
    epoch = 1.7e9
    there = assess([t + epoch for t in times], values)
    assert (there.verdict, there.pattern, there.reason) == (here.verdict, here.pattern, here.reason)
    assert there.since == pytest.approx(here.since + epoch)
    assert there.growth_bytes_per_s == pytest.approx(here.growth_bytes_per_s, rel=1e-6)


def test_time_to_full_from_a_device_total():
    times, values = series(600, lambda t: 10 * MB * t, seed=25, base=40 * GB, noise=2 * MB)
    a = check(assess(times, values, total_bytes=80 * GB))
    assert a.verdict == "leak"
    expected = (80 * GB - values[-1]) / (10 * MB)
    assert a.time_to_full_s == pytest.approx(expected, rel=0.05)
    assert "full in" in a.reason
    assert assess(times, values).time_to_full_s is None  # no total, no projection
    flat = assess(*series(600, lambda t: 0.0, seed=25), total_bytes=80 * GB)
    assert flat.time_to_full_s is None
    already = assess(times, values, total_bytes=40 * GB)
    assert already.time_to_full_s == 0.0


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError):
        assess([0.0, 1.0], [1.0])
    with pytest.raises(ValueError):
        assess([0.0, 1.0], [1.0, 2.0], allocated=[1.0])


def test_assessment_json_is_plain():
    a = assess(*series(120, lambda t: 5 * MB * t, seed=26), total_bytes=80 * GB)
    j = a.to_json()
    assert set(j) == {"verdict", "pattern", "growth_bytes_per_s", "confidence", "since", "time_to_full_s",
                      "start_bytes", "end_bytes", "samples", "span_s", "reason"}
    assert all(not (isinstance(v, float) and not math.isfinite(v)) for v in j.values())


# --- the default thresholds -------------------------------------------------------------------


def test_alert_rate_runs_from_the_fast_rule_to_the_slow_one():
    th = LeakThresholds()
    assert th.alert_rate(9.0) == math.inf  # nothing is a leak before 10 s
    assert th.alert_rate(10.0) == pytest.approx(5 * MB)
    assert th.alert_rate(7200.0) == pytest.approx(1 * GB / 7200)
    rates = [th.alert_rate(d) for d in (10, 60, 600, 3600, 7200, 86400)]
    assert rates == sorted(rates, reverse=True)  # the longer it lasts, the lower the rate that counts
    assert th.alert_rate(1e9) == th.min_rate


def test_five_mb_per_s_for_ten_seconds_alerts_four_does_not():
    for seed in range(5):
        five = check(assess(*series(10, lambda t: 5 * MB * t, seed=seed, noise=1 * MB)))
        assert five.verdict == "leak", five.reason
        assert five.span_s == 10.0
        four = check(assess(*series(10, lambda t: 4 * MB * t, seed=seed, noise=1 * MB)))
        assert (four.verdict, four.pattern) == ("inconclusive", "steady-growth"), four.reason
        assert "below" in four.reason


def test_fast_leak_needs_ten_seconds():
    a = check(assess(*series(9, lambda t: 50 * MB * t, seed=27, noise=1 * MB)))
    assert (a.verdict, a.pattern) == ("inconclusive", "insufficient-data")


def test_one_gb_over_two_hours_alerts_but_not_early():
    rate = 1 * GB / 7200
    times, values = series(7200, lambda t: rate * t, seed=28, noise=10 * MB, bursts=0.005)
    a = check(assess(times, values))
    assert (a.verdict, a.pattern) == ("leak", "steady-growth"), a.reason
    assert a.growth_bytes_per_s == pytest.approx(rate, rel=0.05)
    early = check(assess(times[:1800], values[:1800]))  # 250 MB in 30 min: growing, not yet a leak
    assert (early.verdict, early.pattern) == ("inconclusive", "steady-growth"), early.reason


def test_slow_slope_in_big_noise_is_not_a_confident_leak():
    """0.05 MB/s for 20 minutes (60 MB) in 30 MB noise: the detector reads the floor as flat within
    the noise or as growth below the alert rate for 20 minutes (0.37 MB/s); never a confident leak."""
    for seed in range(5):
        a = check(assess(*series(1200, lambda t: 0.05 * MB * t, seed=seed, noise=30 * MB)))
        assert not (a.verdict == "leak" and a.confidence >= 0.5), a.reason
        assert a.verdict in ("inconclusive", "no-leak")


def test_thresholds_are_configurable():
    times, values = series(10, lambda t: 5 * MB * t, seed=29, noise=1 * MB)
    assert assess(times, values).verdict == "leak"
    assert assess(times, values, thresholds=LeakThresholds(fast_rate=10 * MB)).verdict == "inconclusive"
    with pytest.raises(ValueError):
        LeakThresholds(rate_margin=0.0)
    with pytest.raises(Exception):  # frozen
        LeakThresholds().fast_rate = 1.0  # type: ignore[misc]


# --- series recorded from real processes --------------------------------------------------------

# Each child takes one step of its pattern per line on stdin and answers "ok": the test reads its
# RSS after each step and stamps it at 10 samples a second. The series is the real process's
# memory, its shape fixed by the steps, not by how much CPU this machine leaves the children.
STEPPER = """
import sys
{setup}
print("ready", flush=True)
for i, _ in enumerate(sys.stdin):
{step}
    print("ok", flush=True)
"""
STEPS = {
    "leaking": ("keep = []", "    keep.append(b'x' * 2_000_000)"),                  # 20 MB a sample, never freed
    "plateauing": ("block = None", "    if i == 5:\n        block = b'x' * 200_000_000"),  # 200 MB once (a model load)
    # a 150 MB batch buffer, filled for 3 samples and freed for 3 (large blocks go back to the OS at once)
    "sawtoothing": ("buf = None", "    buf = b'x' * 150_000_000 if (i // 3) % 2 == 0 else None"),
}
SAMPLE_S = 0.1
# Thresholds scaled to a recording of a few seconds: the fast rule over 1 s instead of 10 s,
# floors of about 12 samples (1.2 s: two sawtooth periods).
RECORDED = LeakThresholds(fast_duration_s=1.0, min_span_s=2.0, min_plateau_s=1.0, samples_per_floor=12, min_floors=4)


def test_recorded_rss_of_real_processes_is_classified(tmp_path):
    children = {}
    try:
        for name, (setup, step) in STEPS.items():
            script = tmp_path / f"{name}.py"
            script.write_text(STEPPER.format(setup=setup, step=step))
            children[name] = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, text=True)
            assert children[name].stdout.readline().strip() == "ready"
        recorded = {name: ([], []) for name in children}
        for i in range(50):  # 5 s of samples
            for name, child in children.items():
                child.stdin.write("step\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "ok"
                recorded[name][0].append(i * SAMPLE_S)
                recorded[name][1].append(float(psutil.Process(child.pid).memory_info().rss))
    finally:
        for child in children.values():
            child.kill()
            child.wait()
    found = {name: check(assess(t, v, thresholds=RECORDED)) for name, (t, v) in recorded.items()}
    summary = {name: (a.verdict, a.pattern, a.reason) for name, a in found.items()}
    assert (found["leaking"].verdict, found["leaking"].pattern) == ("leak", "steady-growth"), summary
    assert found["leaking"].growth_bytes_per_s > 5 * MB, summary
    assert (found["plateauing"].verdict, found["plateauing"].pattern) == ("no-leak", "step-then-plateau"), summary
    assert found["plateauing"].end_bytes - found["plateauing"].start_bytes > 150 * MB, summary
    assert (found["sawtoothing"].verdict, found["sawtoothing"].pattern) == ("no-leak", "sawtooth"), summary


# --- the live watch -----------------------------------------------------------------------------


def test_watch_alerts_for_the_leaking_series_only():
    watch = LeakWatch()
    feeds = {
        ("gpu", 0): series(900, lambda t: 2 * MB * max(0.0, t - 300), seed=30, base=30 * GB),  # leaks from 5 min
        ("pid", 101): series(900, lambda t: 0.0, seed=31, noise=10 * MB, bursts=0.005),
        ("pid", 102): series(900, lambda t: 2 * GB if t >= 120 else 0.0, seed=32),
        ("pid", 103): series(900, sawtooth(8, 400 * MB), seed=33, noise=2 * MB),  # fills last < 10 s
    }
    first_alert = {}
    for i in range(901):
        for key, (times, values) in feeds.items():
            watch.add(key, times[i], values[i], total_bytes=80 * GB if key[0] == "gpu" else None)
        for alert in watch.update():
            first_alert.setdefault(alert.key, times[i])
    assert set(first_alert) == {("gpu", 0)}
    assert 300 < first_alert[("gpu", 0)] < 500  # 2 MB/s counts after ~50 s (alert rate 2.2 MB/s at 40 s)
    (alert,) = watch.alerts()
    assert alert.key == ("gpu", 0)
    assert alert.growth_bytes_per_s == pytest.approx(2 * MB, rel=0.1)
    assert alert.since == pytest.approx(300, abs=30)
    assert alert.time_to_full_s == pytest.approx((80 * GB - feeds[("gpu", 0)][1][-1]) / (2 * MB), rel=0.1)
    assert alert.raised_at == first_alert[("gpu", 0)]
    assert watch.assessment(("pid", 102)).pattern == "step-then-plateau"
    assert watch.assessment(("pid", 103)).pattern == "sawtooth"
    assert watch.assessment(("pid", 101)).verdict == "no-leak"


def test_watch_confirms_a_young_leak_before_raising_it():
    """A burst on top of a rise of the noise looks like a fast ramp for a second or two (assess()
    at that instant calls it a leak); the watch raises a young leak only once it keeps being one."""
    rng = random.Random(38)
    times, values = [], []
    for i in range(300):
        v = 10 * GB + rng.gauss(0, 3 * MB)
        if 200 <= i < 206:
            v += (i - 200) * 12 * MB  # the noise happens to rise 60 MB over 6 s ...
        if 206 <= i < 211:
            v += 112 * MB  # ... then a 5 s burst on top
        times.append(float(i))
        values.append(v)
    assert any(assess(times[:i], values[:i]).verdict == "leak" for i in range(205, 212))
    watch = LeakWatch()
    for t, v in zip(times, values):
        watch.add("s", t, v)
        assert watch.update() == [], watch.assessment("s").reason

    watch = LeakWatch()
    raised = None
    for t, v in zip(*series(300, lambda t: 50 * MB * max(0.0, t - 120), seed=39)):
        watch.add("s", t, v)
        if watch.update() and raised is None:
            raised = t
    assert raised is not None and 120 + 10 <= raised <= 120 + 15  # 10 s of growth, then 3 s to confirm


def test_watch_slow_sawtooth_alerts_only_until_it_has_fallen_back_three_times():
    """A buffer filled over 30 s is, while it fills, a fast leak by the rule (5 MB/s for 10 s);
    once the series has fallen back to its floor three times (two whole cycles), fill phases are
    known for what they are."""
    watch = LeakWatch()
    times, values = series(1800, sawtooth(30, 400 * MB), seed=37, noise=2 * MB)
    alerted = []
    for t, v in zip(times, values):
        watch.add("s", t, v)
        if watch.update():
            alerted.append(t)
    assert alerted and max(alerted) < 3 * 30 + 10  # the third fall is at 90 s
    assert watch.assessment("s").pattern == "sawtooth"


def test_watch_assesses_at_most_once_per_interval_and_only_on_new_data():
    watch = LeakWatch(min_interval_s=5.0)
    times, values = series(60, lambda t: 0.0, seed=34)
    seen = []
    for t, v in zip(times, values):
        watch.add("s", t, v)
        watch.update()
        if not any(a is watch.assessment("s") for a in seen):
            seen.append(watch.assessment("s"))
    assert [a.span_s for a in seen] == [float(t) for t in range(0, 61, 5)]
    before = watch.assessment("s")
    watch.update()  # nothing new
    assert watch.assessment("s") is before


def test_watch_memory_stays_bounded():
    watch = LeakWatch(window_s=6 * 3600)
    rng = random.Random(35)
    footprints, objects = [], []
    for i in range(100_000):
        t = float(i)
        watch.add("leak", t, 10 * GB + 0.1 * MB * (i % 40_000) + rng.gauss(0, 5 * MB))
        watch.add("flat", t, 10 * GB + rng.gauss(0, 5 * MB))
        watch.add("gaps", t, math.nan if i % 5 else 10 * GB)
        if i % 50 == 0:
            watch.update()
        if i in (30_000, 60_000, 99_950):
            footprints.append(watch.footprint())
            gc.collect()
            objects.append(len(gc.get_objects()))
    assert footprints[-1] <= 3 * 6 * 64  # three series, at most 6 levels of 64 buckets over 6 h
    assert max(footprints) - min(footprints) <= 10
    assert max(objects) - min(objects) < 500  # nothing else accumulates either
    flat = watch.assessment("flat")
    assert flat.samples <= 6 * 3600 + 1024 and flat.span_s <= 6 * 3600 + 1024  # within a coarse bucket
    assert flat.verdict == "no-leak"


def test_watch_bounds_the_number_of_series_and_forgets():
    watch = LeakWatch(max_series=3)
    for k in range(5):
        watch.add(k, 0.0, 1e9)
    assert watch.keys() == [2, 3, 4]
    watch.forget(3)
    assert watch.keys() == [2, 4] and watch.assessment(3) is None


def test_watch_cache_growth_from_torch_figures():
    watch = LeakWatch()
    rng = random.Random(36)
    for i in range(1200):
        t = float(i)
        reserved = 5 * GB + 1 * MB * t + rng.gauss(0, 1 * MB)
        watch.add("pid", t, reserved + 600 * MB, allocated=4 * GB + rng.gauss(0, 1 * MB), reserved=reserved)
        watch.update()
    assert watch.alerts() == []
    assert watch.assessment("pid").pattern == "cache-growth"


def test_sketch_skips_missing_and_out_of_order_samples():
    sketch = FloorSketch()
    assert sketch.add(0.0, 1.0) and sketch.add(1.0, 2.0)
    assert not sketch.add(0.5, 3.0)  # older than the latest
    assert not sketch.add(2.0, None) and not sketch.add(2.0, math.nan)
    assert sketch.samples == 2 and sketch.last_value == 2.0 and sketch.span_s == 1.0


# -- held bytes of one allocation site over a tracking window ---------------------------------------

from gpuscope.core.leak import held_trend  # noqa: E402


def test_held_bytes_rising_steadily_to_the_end_are_a_leak_even_when_slow():
    times = [float(t) for t in range(16)]
    trend = held_trend(times, [300_000 * t for t in times])  # 0.3 MB/s, exact as a tracker counts
    assert trend.kind == "rising" and abs(trend.growth_bytes_per_s - 3e5) < 1 and trend.confidence > 0.9


def test_held_bytes_that_rise_then_level_off_are_a_cache_filling_to_its_bound():
    times = [float(t) for t in range(16)]
    trend = held_trend(times, [min(t, 4) * 10_000_000 for t in times])
    assert trend.kind == "levelled" and "levelled off" in trend.reason


def test_held_bytes_that_come_and_go_are_balanced_and_too_few_readings_say_nothing():
    times = [float(t) for t in range(16)]
    assert held_trend(times, [20_000_000 * (t % 2) for t in times]).kind == "balanced"
    assert held_trend(times[:3], [0, 5e6, 1e7]).kind == "insufficient-data"
    assert held_trend(times, [1000 * t for t in times]).kind == "balanced"  # 15 kB in all: too little to count


def test_watch_lists_a_live_leak_before_an_exited_one_and_forgets_the_exited_one_after_a_minute():
    """The faster leaker exits at 200 s: its alert stays a minute, marked ended and after the live
    leak (slower, but live), then goes with its series. Data time is the watch's only clock."""
    watch = LeakWatch()
    fast = series(400, lambda t: 8 * MB * t, seed=40)
    slow = series(400, lambda t: 3 * MB * t, seed=41)
    for i in range(401):
        if i <= 200:
            watch.add("fast", fast[0][i], fast[1][i])
        watch.add("slow", slow[0][i], slow[1][i])
        alerts = watch.update()
        if i == 200:
            assert [a.key for a in alerts] == ["fast", "slow"] and not any(a.ended for a in alerts)
        if i == 230:
            assert [(a.key, a.ended) for a in alerts] == [("slow", False), ("fast", True)]
        if i == 259:
            assert "fast" in watch.keys()
        if i == 261:
            assert [a.key for a in alerts] == ["slow"] and "fast" not in watch.keys()
