import math

from gpuscope.core.store import Ring, SeriesStore


def test_ring_keeps_the_newest_samples_in_order():
    ring = Ring(4)
    for t in range(10):
        ring.append(float(t), t * 10)
    assert len(ring) == 4
    assert ring.since(0.0) == ([6.0, 7.0, 8.0, 9.0], [60.0, 70.0, 80.0, 90.0])
    assert ring.since(8.0) == ([8.0, 9.0], [80.0, 90.0])


def test_not_available_is_stored_as_nan_not_zero():
    ring = Ring(3)
    ring.append(1.0, None)
    assert math.isnan(ring.since(0.0)[1][0])


def test_memory_per_series_is_bounded_however_long_it_runs():
    ring = Ring(100)
    ring.append(0.0, 1)
    assert ring._times.buffer_info()[1] == 1  # a short-lived series costs what it holds
    for t in range(1, 100_000):
        ring.append(float(t), t)
    assert (ring._times.buffer_info()[1], ring._values.buffer_info()[1]) == (100, 100)
    assert ring.since(99_998.0) == ([99_998.0, 99_999.0], [99_998.0, 99_999.0])
    assert ring.last_time() == 99_999.0


def test_store_drops_idle_series_and_caps_their_number():
    store = SeriesStore(capacity=10, max_series=3, idle_ttl=5.0)
    for pid in range(5):
        store.add(("rss", pid), float(pid), 1.0)
    store.prune(now=4.0)
    assert sorted(store.keys()) == [("rss", 2), ("rss", 3), ("rss", 4)]  # the 3 most recent
    store.prune(now=8.5)  # pid 2 and 3 have been idle for more than 5 s
    assert store.keys() == [("rss", 4)]


def test_window_of_an_unknown_series_is_empty():
    assert SeriesStore().window("nope", 0.0) == ([], [])
