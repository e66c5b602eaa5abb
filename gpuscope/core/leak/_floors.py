"""The floors of a stretch of a series, and the growth through them: what the detector judges, the
GROW column shows and the diagnosis reads of a stretch too short to judge, defined once."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuscope.core.leak._assessment import LeakThresholds
from gpuscope.core.leak._sketch import FloorSketch, _Bucket, _median
from gpuscope.core.leak.growth import theil_sen

# Under these, a stretch has no growth figure: four samples over three seconds is the least a
# slope through floors means anything on (judging a leak asks more: `LeakThresholds`).
GROWTH_MIN_SAMPLES = 4
GROWTH_MIN_SPAN_S = 3.0


def _floors(buckets: Sequence[_Bucket], count: int) -> list[_Bucket]:
    """Merge buckets into `count` equal time slices (empty slices are skipped): the floors."""
    t0 = buckets[0].t_first
    width = (buckets[-1].t_last - t0) / count
    out: list[_Bucket] = []
    last_k = -1
    for b in buckets:
        k = min(int((b.t_first - t0) / width), count - 1) if width > 0 else 0
        if k == last_k:
            out[-1].merge(b)
        else:
            out.append(b.copy())
            last_k = k
    return out


def _floor_count(buckets: Sequence[_Bucket], count: int) -> int:
    """How many floors `_floors(buckets, count)` makes."""
    t0 = buckets[0].t_first
    width = (buckets[-1].t_last - t0) / count
    m = 0
    last_k = -1
    for b in buckets:
        k = min(int((b.t_first - t0) / width), count - 1) if width > 0 else 0
        if k != last_k:
            m += 1
            last_k = k
    return m


def _slices(samples: int, th: LeakThresholds) -> int:
    """How many floors a stretch of this many samples is cut into (a sawtooth's may be fewer)."""
    return max(th.min_floors, min(th.max_floors, samples // th.samples_per_floor))


def floors_of(buckets: Sequence[_Bucket], th: LeakThresholds, ref_value: float,
              noise: Callable[[], float]) -> tuple[list[_Bucket], float]:
    """The floors of a stretch of buckets (oldest first, not empty), and the typical fall of the
    sawtooth seen in it (0.0: none). `ref_value` is the sketch's reference (bucket sums are relative
    to it); `noise()` the series' sample noise (`FloorSketch.noise`), asked only where big falls are.

    A sawtooth (batch buffers filled and freed): memory falls back by a big step again and again
    - steps that noise does not make: 8 sample sigmas, and at least `sawtooth_min_swing` - and
    between two falls it sits well above where they landed: in the median cycle, on average by
    at least 0.3 of a typical fall (a filled-then-freed buffer: about half) and by more than noise
    puts a mean above a minimum (4 sigmas). A cycle is measured from the middle of the two
    landings that bracket it, so a floor that rises does not count as lift. Occasional bursts fall
    back too, but between them memory is rarely up. It takes three falls (two cycles), spread over
    a third of the stretch at least. Each floor of a sawtooth must hold a whole cycle, or floors
    catch fill phases: they are about span / falls long."""
    n = sum(b.n for b in buckets)
    span = buckets[-1].t_last - buckets[0].t_first
    count = _slices(n, th)
    swing = 0.0
    falls = [b for b in buckets if b.max_drop >= th.sawtooth_min_swing]
    if len(falls) >= 3:  # else no sawtooth, whatever the noise: its falls are bigger still
        sigma = noise()
        big = max(th.sawtooth_min_swing, 8 * sigma)
        falls = [b for b in falls if b.max_drop >= big]
        if len(falls) >= 3 and falls[-1].t_last - falls[0].t_first >= span / 3:
            lifts = []
            cycle_n = cycle_sum = 0.0
            landed = None
            for b in buckets:
                if landed is not None:
                    cycle_n += b.n
                    cycle_sum += b.s1
                if b.max_drop >= big:
                    if landed is not None:
                        lifts.append(ref_value + cycle_sum / cycle_n - (landed + b.v_min) / 2)
                    landed = b.v_min
                    cycle_n = cycle_sum = 0.0
            typical = _median([b.max_drop for b in falls])
            if _median(lifts) >= max(0.3 * typical, 4 * sigma):
                swing = typical
                # A coarse bucket holding several falls counts once, but floors are that wide anyway.
                count = max(4, min(count, int(len(falls) / 1.5)))
    return _floors(buckets, count), swing


def floor_growth(sketch: FloorSketch, since: float | None = None,
                 thresholds: LeakThresholds = LeakThresholds()) -> float | None:
    """Growth per second of the series' floor from `since` on (None: all of it): the Theil-Sen
    slope through the minima of its floors (`floors_of`), the slope the detector fits. None while
    there is too little data to say: under GROWTH_MIN_SAMPLES samples or GROWTH_MIN_SPAN_S seconds,
    or under two floors. Costs O(buckets), never O(samples)."""
    if sketch.last_time is None:
        return None
    buckets = list(sketch.buckets()) if since is None else sketch.recent(since)
    if not buckets or sum(b.n for b in buckets) < GROWTH_MIN_SAMPLES:
        return None
    if buckets[-1].t_last - buckets[0].t_first < GROWTH_MIN_SPAN_S:
        return None
    if sketch.flat_since <= buckets[0].t_first:
        # Every sample alike (most series, most of the time): what Theil-Sen finds, without the fit.
        return 0.0 if _floor_count(buckets, _slices(sum(b.n for b in buckets), thresholds)) >= 2 else None
    floors, _ = floors_of(buckets, thresholds, sketch.ref, sketch.noise)
    if len(floors) < 2:
        return None
    return theil_sen([(f.t_min, f.v_min) for f in floors])
