"""Judging a series: each horizon's floors analysed (steady growth, step, sawtooth, flat, ...),
the horizons combined, and `assess()` over given samples."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpuscope.core.leak.growth import theil_sen, thinned
from gpuscope.core.common.units import format_duration, format_size, format_speed
from gpuscope.core.leak._assessment import GROWING, LeakAssessment, LeakThresholds
from gpuscope.core.leak._floors import _floor_count, _slices, floors_of
from gpuscope.core.leak._sketch import FloorSketch, _Bucket, _median


# --- one horizon ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _View:
    """The judgement of one horizon, with what the combination needs."""

    assessment: LeakAssessment
    horizon_s: float
    duration_s: float  # how long the growth (or the horizon) lasted
    swinging: bool  # big swings back to the floor seen in this horizon
    peak: float  # highest value in the horizon's last floor
    change: bool = False  # a real change of the floor (a step, or growth clear of the noise)


def _horizons(sketch: FloorSketch, th: LeakThresholds) -> list[float]:
    """The horizons to judge: 10 s, 40 s, 160 s, ... (x4) while shorter than the data, then all
    of it (the last one; empty without data)."""
    if not sketch.samples:
        return []
    span = sketch.span_s
    out = []
    h = th.fast_duration_s
    while h < 0.8 * span:
        out.append(h)
        h *= 4
    out.append(span)
    return out


def _judge(sketch: FloorSketch, th: LeakThresholds,
           cache: Callable[[int, float, Callable[[], _View | None]], _View | None] | None = None) -> _View | None:
    """Judge every horizon of the sketch and combine. With a `cache`, horizon i (-1: the whole
    series) of length h is `cache(i, h, compute)`: a kept judgement while still fresh, else
    `compute()`'s, kept. A judgement of None (a short horizon all alike) has no say."""
    horizons = _horizons(sketch, th)
    noise: list[float] = []  # computed once, and only if a horizon is judged afresh

    def compute(h: float, whole: bool) -> _View | None:
        if whole:
            buckets = list(sketch.buckets())
        else:
            t_end = sketch.last_time or 0.0  # horizons exist only for a sketch with samples
            t0 = t_end - h - 1e-6  # room for float error in times of up to ~8e9 s (wall clock), no more
            if sketch.flat_since <= t0:
                # Every sample of this horizon alike: its view would be "flat" (or too little data),
                # which never changes what `_combine` chooses (not a leak, no change, no swings).
                return None
            buckets = sketch.recent(t0)
        flat = _analyse_flat(buckets, h, th)
        if flat is not None:
            return flat
        if not noise:
            noise.append(sketch.noise())
        return _analyse(buckets, h, th, sketch.ref, noise[0], sketch.origin)

    views = []
    for i, h in enumerate(horizons):
        whole = i == len(horizons) - 1
        if cache is None:
            view = compute(h, whole)
        else:
            view = cache(-1 if whole else i, h, functools.partial(compute, h, whole))
        if view is not None:
            views.append(view)
    return _combine(views) if views else None


def kendall_tau(points: Sequence[tuple[float, float]]) -> float:
    """Kendall's tau of value against time (Mann-Kendall S / number of pairs), in [-1, 1], over
    at most MAX_PAIRWISE_POINTS points (see `growth.thinned`)."""
    points = thinned(points)
    s = pairs = 0
    for i, (_, v1) in enumerate(points):
        for _, v2 in points[i + 1:]:
            pairs += 1
            if v2 > v1:
                s += 1
            elif v2 < v1:
                s -= 1
    return s / pairs if pairs else 0.0


def _floor_noise(values: Sequence[float]) -> float:
    """Robust scale of the floor's jitter: MAD of successive differences, trend removed."""
    diffs = [b - a for a, b in zip(values, values[1:])]
    if len(diffs) < 2:
        return 0.0
    mid = _median(diffs)
    mad = _median([abs(d - mid) for d in diffs])
    return 1.4826 * mad / math.sqrt(2)


class _Sums:
    """Prefix sums over points (x, y) for O(1) least-squares residuals of any run [i, j)."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.n = [0.0]
        self.x = [0.0]
        self.y = [0.0]
        self.xx = [0.0]
        self.xy = [0.0]
        self.yy = [0.0]
        for x, y in zip(xs, ys):
            self.n.append(self.n[-1] + 1)
            self.x.append(self.x[-1] + x)
            self.y.append(self.y[-1] + y)
            self.xx.append(self.xx[-1] + x * x)
            self.xy.append(self.xy[-1] + x * y)
            self.yy.append(self.yy[-1] + y * y)

    def constant(self, i: int, j: int) -> float:
        n = self.n[j] - self.n[i]
        sy = self.y[j] - self.y[i]
        return max(self.yy[j] - self.yy[i] - sy * sy / n, 0.0)

    def line(self, i: int, j: int) -> float:
        n = self.n[j] - self.n[i]
        sx = self.x[j] - self.x[i]
        sy = self.y[j] - self.y[i]
        cxx = self.xx[j] - self.xx[i] - sx * sx / n
        cxy = self.xy[j] - self.xy[i] - sx * sy / n
        cyy = self.yy[j] - self.yy[i] - sy * sy / n
        if cxx <= 0:
            return max(cyy, 0.0)
        return max(cyy - cxy * cxy / cxx, 0.0)

    def mean(self, i: int, j: int) -> float:
        return (self.y[j] - self.y[i]) / (self.n[j] - self.n[i])

    def at(self, i: int, j: int, x: float) -> float:
        """The least-squares line through run [i, j), evaluated at x."""
        n = self.n[j] - self.n[i]
        sx = self.x[j] - self.x[i]
        sy = self.y[j] - self.y[i]
        cxx = self.xx[j] - self.xx[i] - sx * sx / n
        slope = (self.xy[j] - self.xy[i] - sx * sy / n) / cxx if cxx > 0 else 0.0
        return sy / n + slope * (x - sx / n)


def _best_break(m: int, cost, left_min: int, right_min: int) -> tuple[float, int]:
    best = (math.inf, -1)
    for k in range(left_min, m - right_min + 1):
        c = cost(k)
        if c < best[0]:
            best = (c, k)
    return best


def _evidence(floors: int, duration: float, th: LeakThresholds) -> float:
    """How much data backs a judgement, in (0, 1): more floors and a longer time, more."""
    return math.sqrt(floors / (floors + 3) * duration / (duration + th.fast_duration_s / 2))


def _analyse_flat(buckets: list[_Bucket], horizon: float, th: LeakThresholds) -> _View | None:
    """`_analyse`'s judgement of a horizon whose samples are all the same value, without its fits
    (None for any other horizon). Most series of a node are such (an idle process's GPU memory):
    judging them is most of the watch's work. For such a horizon `_analyse` finds no fall, floors
    all alike, no candidate shape better than the line, a line with no rise: "flat", the same
    view this returns (a test holds the two equal)."""
    v = buckets[0].v_first
    for b in buckets:
        if b.v_min != v or b.v_max != v:
            return None
    n = sum(b.n for b in buckets)
    t_start, t_end = buckets[0].t_first, buckets[-1].t_last
    span = t_end - t_start
    if n < th.min_samples or span < th.min_span_s - 1e-9:
        return None  # too little data: `_analyse` says so
    m = _floor_count(buckets, _slices(n, th))
    if m < 4:
        return None
    tol = max(th.flat_bytes, th.noise_factor * 0.0)
    a = LeakAssessment("no-leak", "flat", 0.0, min(max(_evidence(m, span, th), 0.0), 1.0), t_start, None, v, v, n,
                       span, f"floor flat (within {format_size(tol)}) for {format_duration(span)}")
    return _View(a, horizon, span, False, v, False)


def _analyse(buckets: list[_Bucket], horizon: float, th: LeakThresholds, ref_value: float, noise: float,
             origin: float) -> _View:
    """Judge one horizon. `ref_value` is the sketch's reference (bucket sums are relative to it);
    `noise` the sample-to-sample noise of the series (`FloorSketch.noise`); `origin` the time of
    its first sample (events are told as "at <time since origin>")."""
    n = sum(b.n for b in buckets)
    t_start, t_end = buckets[0].t_first, buckets[-1].t_last
    span = t_end - t_start
    first, last = buckets[0].v_first, buckets[-1].v_last
    peak = buckets[-1].v_max

    def view(verdict: str, pattern: str, growth: float | None, confidence: float, since: float | None,
             reason: str, duration: float = span, swinging: bool = False, change: bool = False) -> _View:
        a = LeakAssessment(verdict, pattern, growth, min(max(confidence, 0.0), 1.0), since, None, first, last,
                           n, span, reason)
        return _View(a, horizon, duration, swinging, peak, change)

    if n < th.min_samples or span < th.min_span_s - 1e-9:
        return view("inconclusive", "insufficient-data", None, 0.0, None,
                    f"only {n} sample{'s' if n != 1 else ''} over {format_duration(span)}; "
                    f"need {th.min_samples} over {format_duration(th.min_span_s)}")
    floors, swing = floors_of(buckets, th, ref_value, lambda: noise)
    swinging = swing > 0
    m = len(floors)
    if m < 4:
        return view("inconclusive", "insufficient-data", None, 0.0, None,
                    f"samples in only {m} stretches of {format_duration(span)} (gaps); need 4")
    peak = floors[-1].v_max
    points = [(f.t_min, f.v_min) for f in floors]
    xs = [t - t_start for t, _ in points]
    base = points[0][1]  # fits work on values relative to the first floor
    ys = [v - base for _, v in points]
    tol = max(th.flat_bytes, th.noise_factor * _floor_noise(ys))

    # Candidate shapes of the floor: a line, a step, flat-then-line (onset), line-then-flat (plateau).
    slope = theil_sen(points) or 0.0
    intercept = _median([y - slope * x for x, y in zip(xs, ys)])
    rss_line = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    sums = _Sums(xs, ys)
    rss_step, k_step = _best_break(m, lambda k: sums.constant(0, k) + sums.constant(k, m), 1, 1)
    shapes = [("line", rss_line, 0)]
    if rss_step < th.step_ratio * rss_line:
        shapes.insert(0, ("step", rss_step, k_step))
    if m >= 8:
        onset = _best_break(m, lambda k: sums.constant(0, k) + sums.line(k, m), 2, 3)
        plateau = _best_break(m, lambda k: sums.line(0, k) + sums.constant(k, m), 3, 2)
        name, (rss, k) = min((("onset", onset), ("plateau", plateau)), key=lambda s: s[1][0])
        if rss < th.bend_ratio * shapes[0][1]:
            shapes.insert(0, (name, rss, k))

    def trend(i: int, j: int) -> tuple[float, float]:
        """Theil-Sen slope and rise over floors [i, j)."""
        seg = points[i:j]
        if len(seg) < 2:
            return 0.0, 0.0
        b = theil_sen(seg) or 0.0
        return b, b * (seg[-1][0] - seg[0][0])

    def z_score(seg: Sequence[tuple[float, float]], b: float) -> float:
        """The slope in standard errors of a slope through these floor times with the series'
        sample noise (an upper bound for floors of many samples, right for short horizons)."""
        mean_x = sum(t for t, _ in seg) / len(seg)
        sxx = sum((t - mean_x) ** 2 for t, _ in seg)
        return b * math.sqrt(sxx) / noise if noise > 0 else math.inf

    def growth(i: int, since: float, prefix: str = "") -> _View:
        seg = points[i:]
        b, _ = trend(i, m)
        duration = t_end - since
        tau = kendall_tau(seg)
        confidence = max(tau, 0.0) * _evidence(len(seg), duration, th)
        needed = th.alert_rate(duration)
        z = z_score(seg, b)
        fast_enough = b >= th.rate_margin * needed
        if len(seg) >= 4:
            # Sustained: the growth must hold without the newest floor too (a burst that has just
            # begun, on top of noise that happened to rise, is not a leak).
            b_before = theil_sen(seg[:-1]) or 0.0
            z = min(z, z_score(seg[:-1], b_before))
            fast_enough = fast_enough and b_before >= th.rate_margin * needed
        # Growth made of one or two big jumps (bursts back to back, a staircase) is not a ramp yet.
        # Floors further apart than usual (samples left out between them, while a tracker ran)
        # rise further without jumping: the trend over the extra time is not counted as a jump.
        rise = seg[-1][1] - seg[0][1]
        spacing = _median([t2 - t1 for (t1, _), (t2, _) in zip(seg, seg[1:])])
        jumpy = max(v2 - v1 - max(b, 0.0) * max(0.0, t2 - t1 - spacing)
                    for (t1, v1), (t2, v2) in zip(seg, seg[1:])) > th.max_jump_share * rise
        how = "steadily" if tau >= 0.8 else "mostly" if tau >= 0.5 else "unevenly"
        if jumpy:
            how = "in a few jumps"
        what = f"floor of a sawtooth (swings of {format_size(swing)})" if swinging else "floor"
        text = f"{prefix}{what} rose {format_speed(b)} for {format_duration(duration)}, {how}"
        clear = len(seg) >= 3 and confidence >= th.min_confidence and z >= th.min_z and not jumpy
        if clear and fast_enough:
            return view("leak", GROWING, b, confidence, since, text, duration, swinging, True)
        if math.isinf(needed):
            text += f"; too short to call a leak (needs {format_duration(th.fast_duration_s)})"
        elif not fast_enough:
            text += f"; below the {format_speed(needed)} that makes a leak over {format_duration(duration)}"
        elif z < th.min_z:
            text += f"; not yet clear of the noise (samples scatter by {format_size(noise)})"
        elif jumpy:
            text += "; not a steady rise yet"
        else:
            text += f"; not yet sure enough to call it a leak (confidence {confidence:.2f})"
        return view("inconclusive", GROWING, b, confidence, since, text, duration, swinging, clear)

    def level(b: float) -> _View:
        """No real change of the floor over the horizon: flat, or a sawtooth."""
        confidence = _evidence(m, span, th) * (1 - abs(kendall_tau(points)) / 2)
        if swinging:
            return view("no-leak", "sawtooth", b, confidence, t_start,
                        f"swings of {format_size(swing)} over a flat floor for {format_duration(span)} "
                        "(buffers filled and freed)", swinging=True)
        return view("no-leak", "flat", b, confidence, t_start,
                    f"floor flat (within {format_size(tol)}) for {format_duration(span)}")

    def falling(b: float, drop: float) -> _View:
        return view("no-leak", "falling", b, _evidence(m, span, th), t_start,
                    f"floor fell {format_size(-drop)} over {format_duration(span)}", swinging=swinging)

    def settled(i: int, since: float, stopped: float, rise: float, step: bool) -> _View:
        """A rise, then a flat floor from floor i (at time `stopped`) on."""
        b, _ = trend(i, m)
        flat_for = t_end - stopped
        confidence = _evidence(m - i, flat_for, th) * (1 - abs(kendall_tau(points[i:])) / 2)
        head = (f"a {format_size(rise, sign=True)} step at {format_duration(since - origin)}" if step
                else f"rose {format_size(rise)} in {format_duration(stopped - since)} (warm-up)")
        long_enough = flat_for >= th.min_plateau_s and m - i >= 2
        if not step:
            long_enough = long_enough and flat_for >= th.plateau_fraction * span
        if long_enough:
            return view("no-leak", "step-then-plateau", b, confidence, since, f"{head}, flat since",
                        flat_for, swinging, True)
        return view("inconclusive", "step-then-plateau", b, confidence * 0.5, since,
                    f"{head}, flat for {format_duration(flat_for)} so far: too soon to say", flat_for, swinging, True)

    for name, _, k in shapes:
        if name == "step":
            jump = sums.mean(k, m) - sums.mean(0, k)
            if abs(jump) <= tol or abs(jump) < th.min_z * noise * math.sqrt(1 / k + 1 / (m - k)):
                continue  # within the noise
            if abs(jump) < swing / 2:
                continue  # within the swings of a sawtooth
            stepped = _step_time(buckets, points[k - 1][0], base + sums.mean(0, k) + jump / 2, jump > 0)
            rate, rise = trend(k, m)
            if m - k >= 3 and rise > tol:
                return growth(k, stepped, f"after a {format_size(jump, sign=True)} step, ")
            if jump > 0:
                return settled(k, stepped, stepped, jump, step=True)
            return falling(rate, jump)
        if name == "onset":
            rate, rise = trend(k, m)
            if rise > tol and rate > 0:
                flat_level = sums.mean(0, k)
                jump = sums.at(k, m, xs[k]) - flat_level
                began = _step_time(buckets, points[k - 1][0], base + flat_level + max(tol, jump / 2), True)
                return growth(k, min(began, points[k][0]),
                              f"after a {format_size(jump, sign=True)} step, " if jump > tol else "")
        if name == "plateau":
            b_up, rise_up = trend(0, k)
            b_flat, rise_flat = trend(k, m)
            if rise_up > max(tol, swing / 2) and abs(rise_flat) <= tol and b_flat <= 0.25 * b_up:
                return settled(k, t_start, points[k][0], sums.mean(k, m) - ys[0], step=False)
        if name == "line":
            rise = slope * (xs[-1] - xs[0])
            if rise > tol:
                return growth(0, t_start)
            if rise < -max(tol, swing / 2):
                return falling(slope, rise)
            return level(slope)
    raise AssertionError("the line always decides")  # pragma: no cover


def _step_time(buckets: Sequence[_Bucket], after: float, mid: float, up: bool) -> float:
    """When a step happened: the first bucket after `after` wholly on the new side of `mid`."""
    for b in buckets:
        if b.t_first <= after:
            continue
        if (b.v_min >= mid) if up else (b.v_max <= mid):
            return b.t_first
    return after


def _combine(views: Sequence[_View]) -> _View:
    """One judgement from the horizons (shortest first, the whole series last).

    A short horizon is not heard when a longer one sees a sawtooth (it saw a fill phase, or a
    burst on one; a leak in a sawtoothing process shows in the longer horizon's floors). Then:
    the leak that has lasted longest (its start and rate are the best measured); with no leak,
    the whole series' view - unless that saw no change and a shorter horizon did (a step or
    growth too recent to show in the long view's floors), then the longest such horizon.
    """
    heard = [v for i, v in enumerate(views) if not any(w.swinging for w in views[i + 1:])]
    leaks = [v for v in heard if v.assessment.verdict == "leak"]
    if leaks:
        return max(leaks, key=lambda v: (v.duration_s, v.assessment.confidence))
    whole = views[-1]
    if whole.change or whole.assessment.pattern == "insufficient-data":
        return whole
    recent = [v for v in heard[:-1] if v.change]
    return recent[-1] if recent else whole


def _finish(chosen: _View | None, sketch: FloorSketch, total_bytes: float | None) -> LeakAssessment:
    """The chosen horizon's judgement, with the whole series' extent and the time to full."""
    if chosen is None or not sketch.samples:
        return LeakAssessment("inconclusive", "insufficient-data", None, 0.0, None, None, None, None, 0, 0.0,
                              "no samples with a value")
    a = chosen.assessment
    ttf = None
    if total_bytes is not None and a.pattern == GROWING and a.growth_bytes_per_s and a.growth_bytes_per_s > 0:
        high = max(chosen.peak, sketch.last_value if sketch.last_value is not None else chosen.peak)
        ttf = max(total_bytes - high, 0.0) / a.growth_bytes_per_s
        if a.verdict == "leak":
            a = replace(a, reason=f"{a.reason}; full in {format_duration(ttf)} at this rate")
    # Every series, every tick: built directly (dataclasses.replace costs several times more).
    return LeakAssessment(a.verdict, a.pattern, a.growth_bytes_per_s, a.confidence, a.since, ttf, sketch.first_value,
                          sketch.last_value, sketch.samples, sketch.span_s, a.reason)


def _with_torch(primary: LeakAssessment, allocated: LeakAssessment | None,
                reserved: LeakAssessment | None) -> LeakAssessment:
    """Read the primary series in the light of torch's allocated and reserved memory."""
    if allocated is None or allocated.pattern == "insufficient-data":
        return primary

    def growing(a: LeakAssessment) -> bool:
        return a.pattern == GROWING and (a.growth_bytes_per_s or 0.0) > 0

    primary_rate = primary.growth_bytes_per_s or 0.0
    allocated_flat = not growing(allocated) or (allocated.growth_bytes_per_s or 0.0) < 0.1 * primary_rate
    if growing(primary) and allocated_flat:
        if reserved is not None and growing(reserved):
            return replace(
                primary, verdict="no-leak", pattern="cache-growth",
                confidence=min(primary.confidence, reserved.confidence),
                reason=(f"torch reserved grew {format_speed(reserved.growth_bytes_per_s)} while allocated stayed "
                        f"{'flat' if allocated.pattern != GROWING else 'nearly flat'}: the caching allocator "
                        "keeping freed blocks, not a leak"))
        if reserved is not None and reserved.pattern != "insufficient-data":
            return replace(primary, reason=f"{primary.reason}; outside PyTorch's allocator (reserved flat)")
        return primary
    if allocated.verdict == "leak" and primary.verdict != "leak":
        return replace(allocated, reason=f"torch allocated: {allocated.reason}")
    return primary


# --- one-shot -------------------------------------------------------------------------------------


def assess(
    times: Sequence[float],
    values: Sequence[float | None],
    *,
    thresholds: LeakThresholds = LeakThresholds(),
    total_bytes: float | None = None,
    allocated: Sequence[float | None] | None = None,
    reserved: Sequence[float | None] | None = None,
) -> LeakAssessment:
    """Judge one memory series: is it leaking, and what does it look like?

    `times` are seconds (any clock, ascending), `values` bytes at those times; NaN or None where
    the value was not available. `total_bytes` (a device's total memory) gives `time_to_full_s`.
    `allocated` and `reserved` are torch's `memory_allocated()` / `memory_reserved()` at the same
    `times` (same length, NaN where missing): with them, growth of the series while reserved grows
    and allocated does not is "cache-growth", not a leak.
    """
    if len(times) != len(values):
        raise ValueError("times and values must have the same length")
    for name, extra in (("allocated", allocated), ("reserved", reserved)):
        if extra is not None and len(extra) != len(times):
            raise ValueError(f"{name} must have one value per time")
    sketch = FloorSketch.of(times, values)
    primary = _finish(_judge(sketch, thresholds), sketch, total_bytes)
    if allocated is None:
        return primary

    def side(series: Sequence[float | None] | None) -> LeakAssessment | None:
        if series is None:
            return None
        s = FloorSketch.of(times, series)
        return _finish(_judge(s, thresholds), s, None)

    return _with_torch(primary, side(allocated), side(reserved))
