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
