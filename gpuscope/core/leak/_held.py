"""Held bytes of one allocation site over a tracking window, and when a running tracker has seen
enough."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuscope.core.leak.growth import theil_sen
from gpuscope.core.common.units import format_duration, format_size, format_speed
from gpuscope.core.leak._assessment import LeakThresholds
from gpuscope.core.leak._analysis import kendall_tau


# --- held bytes of one allocation site --------------------------------------------------------------

HELD_MIN_RISE = 1e6  # bytes: a site must gain at least this much over the tracking window to count
TREND_POINTS = 60
EARLY_SHARE = 0.2  # of a rising site's rise, at least this much in the first half of the window


@dataclass(frozen=True)
class HeldTrend:
    """What the bytes one allocation site held over a tracking window look like.

    - `kind`: "rising" (held bytes rise steadily to the end: a leak, whatever RSS shows, since
      the tracker sees what the allocator's reuse of freed heap hides), "levelled" (they rose,
      then stopped: a cache filling up to its bound), "balanced" (what is allocated is freed),
      or "insufficient-data".
    - `growth_bytes_per_s`: the Theil-Sen slope of the held bytes; `confidence` in [0, 1].
    """

    kind: str
    growth_bytes_per_s: float
    confidence: float
    reason: str


def held_trend(times: Sequence[float], held: Sequence[float], thresholds: LeakThresholds = LeakThresholds()) -> HeldTrend:
    """Judge one site's held bytes over time (memory allocated since tracking began, still held).

    There is no sample noise to beat here (the tracker counts bytes exactly): what matters is
    that the rise is steady (Kendall's tau), lasts to the end (the last half of the window rises
    at least 40 % as fast as the whole), began with the window (its first half carries at least
    `EARLY_SHARE` of it: a batch that the tracker saw freed once and filling again at the end
    is not a rise), adds up (`HELD_MIN_RISE`, `min_rate`), and is not undone
    between two reads (a fall as large as the rise is churn, not a leak). The trend is
    of the floors (`held_floors`: what stays held), so that temporaries built and dropped at a
    period near the reads' do not alias into a rise; at most `TREND_POINTS` of them (the pairwise
    slopes are quadratic in the points)."""
    points = held_floors(times, held)
    if len(points) > TREND_POINTS:
        step = -(-len(points) // TREND_POINTS)
        points = points[::step] if (len(points) - 1) % step == 0 else [*points[::step], points[-1]]
    if len(points) < 4 or points[-1][0] - points[0][0] < 2.0:
        return HeldTrend("insufficient-data", 0.0, 0.0, f"held bytes read at only {len(points)} times")
    slope = theil_sen(points) or 0.0
    tau = kendall_tau(points)
    half = len(points) // 2
    late = theil_sen(points[half:]) or 0.0
    early = theil_sen(points[: half + 1]) or 0.0
    rise = points[-1][1] - points[0][1]
    early_rise = points[half][1] - points[0][1]
    # What a site builds and drops falls as far as it rose; reads that happen to line up with its
    # period can still make its floors climb for a while. A leak's held bytes do not fall that far.
    raw = [float(v) for v in held]
    fall = max((a - b for a, b in zip(raw, raw[1:])), default=0.0)
    peak = max(v for _, v in points)
    span = points[-1][0] - points[0][0]
    confidence = max(tau, 0.0) * min(1.0, len(points) / 10)
    if (rise >= HELD_MIN_RISE and slope >= thresholds.min_rate and tau >= 0.6 and late >= 0.4 * slope
            and early_rise >= EARLY_SHARE * rise and fall <= rise):
        return HeldTrend("rising", slope, confidence,
                         f"held bytes rose {format_speed(slope)} steadily for {format_duration(span)} (to {format_size(points[-1][1])})")
    if peak - points[0][1] >= HELD_MIN_RISE and early > 0 and late < 0.25 * early:
        return HeldTrend("levelled", late, confidence or 0.5,
                         f"held bytes rose to {format_size(peak)}, then levelled off (a cache filling to its bound)")
    return HeldTrend("balanced", slope, 1 - abs(tau) / 2,
                     f"held bytes at {format_size(points[-1][1])}, not rising steadily")


def held_floors(times: Sequence[float], held: Sequence[float]) -> list[tuple[float, float]]:
    """(time, the least held from then to the end of tracking): the bytes held at each time that
    stay held. What a site builds and drops (a temporary, a batch, a neighbour's buffers) falls
    again later and leaves no floor, however its period and the reads line up; a leak only adds,
    so its floors are its held bytes."""
    floors: list[tuple[float, float]] = []
    least = float("inf")
    for t, v in reversed(list(zip(times, held))):
        least = min(least, float(v))
        floors.append((float(t), least))
    floors.reverse()
    return floors


# --- a site's rise against the memory in use --------------------------------------------------------

HEAP_SHARE = 0.25  # the memory in use must rise at least this share of a site's rate for its rise to count
PYMALLOC_BLOCK_BYTES = 512  # the most one block of Python's small-object allocator holds
HEAP_SKIP_S = 1.0  # the tracker's own start (its buffers) is in its first second


@dataclass(frozen=True)
class HeldEvidence:
    """Whether a site's rise is leak evidence, by which rule, and why.

    A tracker started now sees the allocations made from now on, not the frees of what was
    allocated before: a full cache whose entries are replaced, or any memory that turns over,
    shows as a site that rises while the process's memory in use stays level. So a rise counts
    only where the memory in use (malloc's bytes in use, and Python's small-object blocks, which
    malloc does not hand out) rises with it ("memory in use rising"), or where the site gained
    more than the process had in use when tracking began, which no turnover of older memory could
    free ("outlasts turnover": more than the larger of that and its RSS then, which counts what
    the program mapped itself). Where the memory in use was not measured, the site decides
    alone ("no measure of memory in use")."""

    counts: bool
    rule: str
    reason: str

    def to_json(self) -> dict:
        return {"counts": self.counts, "rule": self.rule, "reason": self.reason}


def held_evidence(trend: HeldTrend, times: Sequence[float], held: Sequence[float],
                  heap_times: Sequence[float], heap: Sequence[float], blocks: Sequence[float] = (),
                  resident_before: float | None = None, claimed: float = 0.0) -> HeldEvidence:
    """Judge a rising site's held bytes (`trend`, over `times`) against the memory in use at
    `heap_times` (`heap`: malloc's bytes in use; `blocks`: Python's small-object blocks) and the
    process's RSS when tracking began (`resident_before`). `claimed`: bytes/s of the memory in
    use's rise already held by larger rising sites (`rising_evidence`), not this one's."""
    rate = max(trend.growth_bytes_per_s, 0.0)
    pairs = [(t, v, blocks[i] if i < len(blocks) else 0.0) for i, (t, v) in enumerate(zip(heap_times, heap))]
    kept = [p for p in pairs if p[0] >= HEAP_SKIP_S] or pairs
    if len(kept) < 4 or kept[-1][0] - kept[0][0] < 2.0:
        return HeldEvidence(True, "no measure of memory in use",
                            "the process's memory in use was not measured while tracking: the site's rise decides")
    heap_floors = held_floors([p[0] for p in kept], [p[1] for p in kept])
    block_floors = held_floors([p[0] for p in kept], [p[2] for p in kept])
    in_use = max(0.0, theil_sen(heap_floors) or 0.0) + PYMALLOC_BLOCK_BYTES * max(0.0, theil_sen(block_floors) or 0.0)
    left = in_use - claimed
    others = f", {format_speed(claimed)} of it held by faster rising sites" if claimed > 0 else ""
    if left >= HEAP_SHARE * rate:
        return HeldEvidence(True, "memory in use rising",
                            f"the process's memory in use rose {format_speed(in_use)} meanwhile{others} (the site "
                            f"{format_speed(rate)}): what the site holds is added, not replaced")
    gained = float(held[-1]) - min(float(v) for v in held) if held else 0.0
    # What older memory could be freed is at most what the process held then: its resident memory
    # bounds what the allocators' counts miss (what it mapped itself).
    before = max(float(pairs[0][1]) + PYMALLOC_BLOCK_BYTES * float(pairs[0][2]), resident_before or 0.0)
    if gained > before:
        return HeldEvidence(True, "outlasts turnover",
                            f"the site gained {format_size(gained)}, more than the {format_size(before)} the process "
                            "held when tracking began: no turnover of older memory explains it")
    return HeldEvidence(False, "memory in use level",
                        f"the process's memory in use stayed level ({format_speed(in_use)}{others}) while the site "
                        f"rose {format_speed(rate)}: it replaces memory allocated before tracking (a full cache "
                        "turning over, temporaries dropped), whose frees the tracker cannot see")


def rising_evidence(rising: Sequence[tuple[HeldTrend, Sequence[float], Sequence[float]]],
                    heap_times: Sequence[float], heap: Sequence[float], blocks: Sequence[float] = (),
                    resident_before: float | None = None) -> list[HeldEvidence]:
    """`held_evidence` of each rising site (trend, times, held), in the order given, with the
    memory in use's rise apportioned among them fastest first: a site counts by it only while the
    rise left over by the faster sites that count covers it. Beside a real leak, whose rise the
    memory in use follows, a cache turning over or a neighbour's batch must not count too."""
    order = sorted(range(len(rising)), key=lambda i: -rising[i][0].growth_bytes_per_s)
    judged: dict[int, HeldEvidence] = {}
    claimed = 0.0
    for i in order:
        trend, times, held = rising[i]
        judged[i] = held_evidence(trend, times, held, heap_times, heap, blocks, resident_before, claimed)
        if judged[i].counts:
            claimed += max(trend.growth_bytes_per_s, 0.0)
    return [judged[i] for i in range(len(rising))]


# --- when a running tracker has seen enough ---------------------------------------------------------

SETTLE_SKIP_S = 1.0  # the tracker's own start (its buffers, its module) is in its first second
SETTLE_MIN_S = 6.0  # a tracker is never stopped sooner: fewer points make no trend
SETTLE_MIN_POINTS = 6
SETTLE_TAU = 0.8  # a rise this steady (Kendall's tau) over the points so far is clear
SETTLE_HORIZON_S = 12.0  # what a default diagnosis (30 s) tracks: "flat" means no site could rise
# HELD_MIN_RISE over it, so the floors of each third of the points must stay within it and their
# slope, carried over this horizon, too.


@dataclass(frozen=True)
class Settled:
    """Why a tracker may stop before its time: "rising" (a site's held bytes rise steadily),
    "levelled" (the memory in use rose, then levelled off) or "flat"."""

    kind: str
    reason: str


def tracking_settled(times: Sequence[float], sites: Sequence[tuple[str, Sequence[float | None]]],
                     heap: Sequence[float | None], rss: Sequence[float | None],
                     thresholds: LeakThresholds = LeakThresholds(), *, blocks: Sequence[float | None] = (),
                     resident_before: float | None = None) -> Settled | None:
    """Whether what a running tracker has seen so far is clear enough to stop it (None: not yet).

    `sites`: (name, held bytes) of allocation sites; `heap`: the bytes malloc had in use; `rss`:
    the RSS; `blocks`: Python's small-object blocks handed out; each at `times` (seconds since
    tracking began); `resident_before`: the RSS before the tracker started. The heap rising
    steadily is a clear leak; so is a site rising steadily whose rise counts by the verdict's rule
    (`rising_evidence`); a site rising steadily whose rise does not count yet (a full cache turning
    over) keeps the tracker going, since only time tells whether it outlasts the turnover. Every
    total flat, or risen and then levelled off, is clearly no leak (a cache filling to its
    bound). Anything else: keep tracking."""
    kept = [i for i, t in enumerate(times) if t >= SETTLE_SKIP_S]
    if len(kept) < SETTLE_MIN_POINTS or times[kept[-1]] < SETTLE_MIN_S:
        return None

    def points(held: Sequence[float | None]) -> list[tuple[float, float]]:
        return [(times[i], float(v)) for i in kept if i < len(held) and (v := held[i]) is not None]

    def steady(pts: list[tuple[float, float]]) -> HeldTrend | None:
        if len(pts) < SETTLE_MIN_POINTS:
            return None
        trend = held_trend([t for t, _ in pts], [v for _, v in pts], thresholds)
        return trend if trend.kind == "rising" and kendall_tau(pts) >= SETTLE_TAU else None

    # The memory in use over every point (the rule skips the tracker's own start itself).
    in_use = [(t, float(v), float(b) if i < len(blocks) and (b := blocks[i]) is not None else 0.0)
              for i, t in enumerate(times) if i < len(heap) and (v := heap[i]) is not None]
    rising = []  # (name, steady, trend, times, held) of every rising site: the memory in use is apportioned among all
    for name, held in sites:
        pts = points(held)
        if len(pts) < SETTLE_MIN_POINTS:
            continue
        trend = held_trend([t for t, _ in pts], [v for _, v in pts], thresholds)
        if trend.kind == "rising":
            rising.append((name, kendall_tau(pts) >= SETTLE_TAU, trend, [t for t, _ in pts], [v for _, v in pts]))
    judged = rising_evidence([(trend, ts, vs) for _, _, trend, ts, vs in rising], [p[0] for p in in_use],
                             [p[1] for p in in_use], [p[2] for p in in_use], resident_before)
    turning_over = False
    for (name, steadily, trend, ts, _), evidence in zip(rising, judged):
        if steadily and evidence.counts:
            return Settled("rising", f"{name} rose {format_speed(trend.growth_bytes_per_s)} steadily for "
                                     f"{format_duration(ts[-1] - ts[0])} ({evidence.rule})")
        turning_over = turning_over or steadily
    heap_points = points(heap)
    # The RSS rises with a tracker's own buffers: not a leak's sign, so only the heap's rise stops it.
    if (heap_trend := steady(heap_points)) is not None:
        return Settled("rising", f"the heap in use rose {format_speed(heap_trend.growth_bytes_per_s)} steadily for "
                                 f"{format_duration(heap_points[-1][0] - heap_points[0][0])}")
    if turning_over:
        return None
    shapes = []
    for name, total in (("the heap in use", heap), ("the RSS", rss)):
        pts = points(total)
        if len(pts) < SETTLE_MIN_POINTS:
            continue
        third = len(pts) // 3
        parts = (pts[:third], pts[third:2 * third], pts[2 * third:])
        floors = [min(parts[k], key=lambda p: p[1]) for k in range(3)]
        drift = abs(theil_sen(floors) or 0.0) * SETTLE_HORIZON_S
        if max(v for _, v in floors) - min(v for _, v in floors) <= HELD_MIN_RISE and drift <= HELD_MIN_RISE:
            shapes.append((name, "flat"))
        elif floors[1][1] - floors[0][1] >= HELD_MIN_RISE and abs(floors[2][1] - floors[1][1]) <= HELD_MIN_RISE / 4:
            shapes.append((name, "levelled"))
        else:
            return None  # still moving: keep tracking
    if not shapes:
        return None
    span = format_duration(times[kept[-1]] - times[kept[0]])
    levelled = [name for name, shape in shapes if shape == "levelled"]
    if levelled:
        return Settled("levelled", f"{levelled[0]} rose, then stayed level for {span} (a cache filling to its bound)")
    return Settled("flat", f"{' and '.join(name for name, _ in shapes)} flat for {span}")
