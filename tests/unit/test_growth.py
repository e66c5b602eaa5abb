import math
import random

import pytest

from gpuscope.core.leak import FloorSketch, floor_growth
from gpuscope.core.leak.growth import theil_sen


def growth_of(times, values):
    """The floor growth of given samples, as the diagnosis reads a short stretch."""
    return floor_growth(FloorSketch.of(times, values))


def test_steady_growth_is_measured_through_spikes():
    rng = random.Random(1)
    times = [i * 0.5 for i in range(60)]
    values = [100e6 + 2e6 * t + (rng.random() * 30e6 if rng.random() < 0.2 else 0) for t in times]
    assert growth_of(times, values) == pytest.approx(2e6, rel=0.15)


def test_flat_memory_with_transient_spikes_reads_as_no_growth():
    rng = random.Random(2)
    times = [float(i) for i in range(30)]
    values = [500e6 + (rng.random() * 50e6 if i % 3 == 0 else rng.random() * 1e5) for i in range(30)]
    assert abs(growth_of(times, values)) < 0.05e6


def test_sawtooth_that_returns_to_its_floor_is_not_growth():
    times = [float(i) for i in range(40)]
    values = [200e6 + (i % 8) * 25e6 for i in range(40)]  # fills a buffer, frees it, again
    assert abs(growth_of(times, values)) < 0.5e6


def test_too_little_data_says_nothing():
    assert growth_of([0.0, 1.0], [1.0, 2.0]) is None
    assert growth_of([0.0, 0.5, 1.0, 1.5], [1.0, 2.0, 3.0, 4.0]) is None  # under 3 s of history
    assert growth_of([float(i) for i in range(10)], [math.nan] * 10) is None


def test_theil_sen_ignores_one_outlier():
    pts = [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0), (3.0, 100.0), (4.0, 4.0)]
    assert theil_sen(pts) == pytest.approx(1.0)


def test_one_formatting_binary_sizes_decimal_rates_and_durations():
    from gpuscope.core.common.units import format_bytes, format_duration, format_size, format_speed

    assert format_bytes(1536) == "1.5K" and format_bytes(3 << 30) == "3.0G" and format_bytes(None) == "N/A"
    assert format_size(2 << 30, sign=True) == "+2.0 GiB" and format_size(340 << 20) == "340 MiB"
    assert format_size(-(3 << 10)) == "-3.0 KiB" and format_size(12) == "12 B"
    assert format_speed(2e6) == "2.0 MB/s" and format_speed(0.14e6) == "0.14 MB/s" and format_speed(120e6) == "120 MB/s"
    assert [format_duration(s) for s in (4.5, 42, 1020, 11520)] == ["4.5 s", "42 s", "17 min", "3.2 h"]
    assert format_duration(None) == "?" and format_duration(math.inf, na="never") == "never"


def test_the_leak_watch_gives_the_grow_column_the_floor_growth_of_its_own_floors():
    """GROW and the alerts read one set of floors: a sawtooth riding 1 MB/s reads 1 MB/s over the
    last 30 s, a sawtooth on a flat floor reads ~0, and a series with too little data reads None."""
    from gpuscope.core.leak import LeakWatch

    mb = 1e6
    watch = LeakWatch()
    for i in range(240):  # 2 Hz for 120 s
        t = 1000.0 + i / 2
        saw = (i % 10) * 5 * mb  # a batch buffer filled and freed every 5 s
        watch.add("leaking", t, 500 * mb + 1 * mb * (t - 1000.0) + saw)
        watch.add("flat", t, 500 * mb + saw)
    watch.add("new", 1000.0, 1 * mb)
    assert watch.recent_growth("leaking", 30.0) == pytest.approx(1 * mb, rel=0.1)
    assert abs(watch.recent_growth("flat", 30.0)) < 0.05 * mb
    assert watch.recent_growth("new", 30.0) is None and watch.recent_growth("unknown", 30.0) is None


def test_the_grow_column_is_the_leak_watch_s_reading():
    """One estimator: the process table's GROW comes from the leak watch that raises the alerts."""
    from gpuscope.core.leak import LeakWatch
    from helpers import NoAllocator, NoNvml, OneProcessHost
    from gpuscope.core.node.live import NodeSource

    class Watch(LeakWatch):
        def recent_growth(self, key, window_s):
            return 123456.0 if key == ("rss", 1000, 1.0) and window_s == 30.0 else None

    node = NodeSource(nvml=NoNvml(), host=OneProcessHost("python svc.py"), allocator=NoAllocator(), watch=Watch())
    row = next(r for r in node.sample_once().processes if r.pid == 1000)
    assert row.rss_growth_bytes_per_s == 123456.0


def test_the_grow_column_and_the_detector_read_the_same_growth():
    """One definition of a floor's growth: for a series the detector judges over all its samples,
    the GROW column's figure over a window holding them all is the detector's growth, to the bit."""
    from gpuscope.core.leak import LeakWatch
    from gpuscope.core.node.live import GROWTH_WINDOW_S

    rng = random.Random(7)
    mb = 1e6
    watch = LeakWatch()
    for i in range(100):  # 4 Hz for 25 s: 2 MB/s under noise and batch spikes
        t = 1000.0 + i / 4
        watch.add("svc", t, 400 * mb + 2 * mb * (t - 1000.0) + rng.random() * 3 * mb
                  + (rng.random() * 20 * mb if rng.random() < 0.2 else 0.0))
    watch.update()
    detector = watch.assessment("svc")
    assert detector.pattern == "steady-growth" and detector.span_s < GROWTH_WINDOW_S, detector
    assert detector.growth_bytes_per_s == pytest.approx(2 * mb, rel=0.15)
    assert watch.recent_growth("svc", GROWTH_WINDOW_S) == detector.growth_bytes_per_s


def test_a_stretch_too_short_to_judge_keeps_the_floor_growth_as_its_growth():
    """A diagnosis whose untouched samples are too few to judge still gives their floor's growth,
    the same figure the GROW column would read of those samples."""
    from gpuscope.core.diagnosis.steps import Evidence, Series, diagnose

    times = (-4.0, -3.0, -2.0, -1.0, 0.0)  # five samples: fewer than a judgement needs
    rss = (300e6, 301e6, 306e6, 303e6, 304e6)  # 1 MB/s, one sample a burst
    d = diagnose(Evidence(pid=4242, command="python svc.py", duration_s=5.0, rss=Series(times, rss)))
    assert d.memory.pattern == "insufficient-data", d.memory
    assert d.memory.growth_bytes_per_s == growth_of(times, rss) == pytest.approx(1e6, rel=0.2)
