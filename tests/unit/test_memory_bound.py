"""A long run's memory stays bounded: the series store and the leak watch fed as the console
feeds them (one sample per series per tick, most series idle), measured with tracemalloc."""

import random
import tracemalloc

from gpuscope.core.leak import FloorSketch, LeakWatch
from gpuscope.core.node.store import SeriesStore

TICK_S = 0.5  # the console at --refresh 0.5


def _feed(target, ticks: range, series: int, rng: random.Random) -> None:
    """Idle series (a constant), a few noisy ones (page-sized jitter) and one leaking one."""
    for tick in ticks:
        t = 1.7e9 + tick * TICK_S
        for n in range(series):
            if n == 0:
                value = 1e8 + tick * 1e6
            elif n % 10 == 0:
                value = 5e7 + rng.randrange(16) * 4096
            else:
                value = n * 2**22
            target(n, t, value)


def _traced_growth(feed_first, feed_more) -> int:
    """Bytes allocated and still held by feed_more, after feed_first (traced too: what it held and
    feed_more replaces is not counted as growth)."""
    tracemalloc.start()
    try:
        feed_first()
        before = tracemalloc.get_traced_memory()[0]
        feed_more()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_the_store_grows_by_the_changes_not_by_the_samples():
    store = SeriesStore(capacity=3600)
    rng = random.Random(7)

    def add(n, t, v):
        store.add(("rss", n), t, v)

    def feed(ticks):
        def run():
            _feed(add, ticks, 100, rng)
            store.prune(1.7e9 + ticks[-1] * TICK_S)
        return run

    # 1 to 10 minutes of samples: 100 series x 1080 samples, 1.7 MB as (time, value) pairs.
    grown = _traced_growth(feed(range(120)), feed(range(120, 1200)))
    changing = 11  # the leaking series and the noisy ones hold a run per sample
    assert grown < changing * 1080 * 20 + 100 * 1080 * 0.5, grown


def test_older_buckets_of_the_leak_watch_are_compact():
    watch = LeakWatch()
    rng = random.Random(7)

    def feed(ticks):
        def run():
            for tick in ticks:
                _feed(lambda n, t, v: watch.add(("rss", n), t, v), range(tick, tick + 1), 40, rng)
                watch.update()
        return run

    footprint = []
    grown = _traced_growth(lambda: (feed(range(120))(), footprint.append(watch.footprint())),
                           feed(range(120, 1200)))
    added = watch.footprint() - footprint[0]
    assert added > 40 * 60  # from one minute to ten the older levels fill, as designed ...
    # ... at this many bytes per bucket, all else included (132 when each of the newest buckets kept
    # its key as an int object of its own)
    assert grown / added < 120, grown / added


def test_an_idle_series_keeps_one_run_of_steps():
    sketch = FloorSketch()
    for k in range(2000):
        sketch.add(float(k), 5e8)
    assert sketch.noise() == 0.0 and len(sketch._steps) == 256
    assert len(sketch._steps._values) == 1
    rng = random.Random(7)
    jitter = [rng.randrange(-16, 16) * 4096 for _ in range(300)]
    for k, dv in enumerate(jitter, 2000):
        sketch.add(float(k), 5e8 + dv)
    steps = [b - a for a, b in zip(jitter, jitter[1:])][-256:]
    assert list(sketch._steps) == steps  # the latest 256, in order
    assert sketch.noise() > 0
