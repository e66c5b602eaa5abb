import random

from gpuscope.core.changepoint import latency_jump


def noisy(n, level, rng, t0=0.0):
    return [(t0 + i, level * (1 + rng.uniform(-0.1, 0.1))) for i in range(n)]


def test_a_p99_jump_is_found_with_when_it_started():
    rng = random.Random(3)
    points = noisy(60, 0.5, rng) + noisy(30, 1.4, rng, t0=60)
    jump = latency_jump(points)
    assert jump is not None and 58 <= jump.started <= 62
    assert 0.45 < jump.before < 0.55 and 1.3 < jump.after < 1.5


def test_noise_and_a_lone_spike_are_not_jumps():
    rng = random.Random(4)
    points = noisy(90, 0.5, rng)
    assert latency_jump(points) is None
    points[70] = (70, 5.0)  # one slow request
    assert latency_jump(points) is None


def test_too_little_history_or_gaps():
    assert latency_jump([(0, 1.0), (1, 2.0)]) is None
    rng = random.Random(5)
    points = noisy(40, 0.5, rng) + [(40 + i, None) for i in range(10)] + noisy(20, 2.0, rng, t0=50)
    jump = latency_jump(points)
    assert jump is not None and jump.started >= 50
