import math

from gpuscope.core.node.store import Ring, SeriesStore


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


def _held(ring: Ring) -> int:
    """Numbers held in the ring's arrays and its clock's (allocated, not only used)."""
    return sum(a.buffer_info()[1] for a in (ring._seqs, ring._counts, ring._values, ring.clock._times))


def test_memory_per_series_is_bounded_however_long_it_runs():
    ring = Ring(100)
    ring.append(0.0, 1)
    assert _held(ring) == 4  # a short-lived series costs what it holds
    for t in range(1, 100_000):
        ring.append(float(t), t)
    assert _held(ring) < 4 * 2 * (100 + 256)  # the capacity, and what waits to be trimmed in one go
    assert ring.since(99_998.0) == ([99_998.0, 99_999.0], [99_998.0, 99_999.0])
    assert ring.last_time() == 99_999.0
    assert len(ring) == 100 and ring.since(0.0)[0] == [float(t) for t in range(99_900, 100_000)]


def test_a_series_whose_value_does_not_change_holds_one_run():
    ring = Ring(1000)
    for t in range(5000):
        ring.append(float(t), 7 if t % 1000 else None)  # NaN runs too
    assert ring.runs() <= 10
    times, values = ring.since(0.0)
    assert times == [float(t) for t in range(4000, 5000)]
    assert math.isnan(values[0]) and values[1:] == [7.0] * 999


def test_series_fed_together_share_their_times_exactly():
    store = SeriesStore(capacity=50)
    for tick in range(200):
        t = 1.7e9 + tick * 0.5013
        for pid in range(20):
            if pid == 3 and tick % 10 == 0:
                continue  # a series missing a tick keeps the others' times
            store.add(("rss", pid), t, pid * 1000 + (tick if pid == 0 else 0))
        if tick % 3 == 0:
            store.add(("dev", 0), t + 0.1, tick)  # read at other times: a clock of its own
        store.prune(t)
    clocks = {id(store._rings[k].clock) for k in store.keys()}
    assert len(clocks) == 2
    times, values = store.window(("rss", 0), 0.0)
    assert times == [1.7e9 + tick * 0.5013 for tick in range(150, 200)] and values == [float(t) for t in range(150, 200)]
    times, values = store.window(("rss", 3), 0.0)
    assert len(times) == 50 and times[-1] == 1.7e9 + 199 * 0.5013 and set(values) == {3000.0}
    assert store.window(("dev", 0), 0.0)[0][-1] == 1.7e9 + 198 * 0.5013 + 0.1
    assert store._rings[("rss", 5)].runs() == 1


def test_a_series_fed_at_times_its_clock_lacks_keeps_them_all():
    store = SeriesStore(capacity=100)
    store.add("a", 1.0, 1)
    store.add("b", 1.0, 1)  # joins a's clock
    store.add("a", 3.0, 2)
    store.add("b", 2.0, 2)  # between a's times: b takes a clock of its own
    store.add("b", 3.0, 3)
    assert store.window("b", 0.0) == ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert store.window("a", 0.0) == ([1.0, 3.0], [1.0, 2.0])


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
