import math
import random

import pytest

from gpuscope.core.growth import floor_growth, theil_sen


def test_steady_growth_is_measured_through_spikes():
    rng = random.Random(1)
    times = [i * 0.5 for i in range(60)]
    values = [100e6 + 2e6 * t + (rng.random() * 30e6 if rng.random() < 0.2 else 0) for t in times]
    assert floor_growth(times, values) == pytest.approx(2e6, rel=0.15)


def test_flat_memory_with_transient_spikes_reads_as_no_growth():
    rng = random.Random(2)
    times = [float(i) for i in range(30)]
    values = [500e6 + (rng.random() * 50e6 if i % 3 == 0 else rng.random() * 1e5) for i in range(30)]
    assert abs(floor_growth(times, values)) < 0.05e6


def test_sawtooth_that_returns_to_its_floor_is_not_growth():
    times = [float(i) for i in range(40)]
    values = [200e6 + (i % 8) * 25e6 for i in range(40)]  # fills a buffer, frees it, again
    assert abs(floor_growth(times, values)) < 0.5e6


def test_too_little_data_says_nothing():
    assert floor_growth([0.0, 1.0], [1.0, 2.0]) is None
    assert floor_growth([0.0, 0.5, 1.0, 1.5], [1.0, 2.0, 3.0, 4.0]) is None  # under 3 s of history
    assert floor_growth([float(i) for i in range(10)], [math.nan] * 10) is None


def test_theil_sen_ignores_one_outlier():
    pts = [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0), (3.0, 100.0), (4.0, 4.0)]
    assert theil_sen(pts) == pytest.approx(1.0)


def test_one_formatting_binary_sizes_decimal_rates_and_durations():
    from gpuscope.core.units import format_bytes, format_duration, format_size, format_speed

    assert format_bytes(1536) == "1.5K" and format_bytes(3 << 30) == "3.0G" and format_bytes(None) == "N/A"
    assert format_size(2 << 30, sign=True) == "+2.0 GiB" and format_size(340 << 20) == "340 MiB"
    assert format_size(-(3 << 10)) == "-3.0 KiB" and format_size(12) == "12 B"
    assert format_speed(2e6) == "2.0 MB/s" and format_speed(0.14e6) == "0.14 MB/s" and format_speed(120e6) == "120 MB/s"
    assert [format_duration(s) for s in (4.5, 42, 1020, 11520)] == ["4.5 s", "42 s", "17 min", "3.2 h"]
    assert format_duration(None) == "?" and format_duration(math.inf, na="never") == "never"
