"""Memory growth over a recent window, robust to noise.

A slope fitted to raw samples chases every transient (a batch buffer filled and freed, a GC
pause). Memory that stays shows in the *floor*: the minimum of each slice of the window. The
growth is the Theil-Sen slope (median of pairwise slopes) through those floors, so one odd slice
cannot move it either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def floor_points(times: Sequence[float], values: Sequence[float], chunks: int) -> list[tuple[float, float]]:
    """The minimum of each of `chunks` equal time slices, as (time of that minimum, value)."""
    pts = [(t, v) for t, v in zip(times, values) if not math.isnan(v)]
    if len(pts) < 2:
        return []
    t0, t1 = pts[0][0], pts[-1][0]
    span = t1 - t0
    if span <= 0:
        return []
    best: dict[int, tuple[float, float]] = {}
    for t, v in pts:
        k = min(int((t - t0) / span * chunks), chunks - 1)
        cur = best.get(k)
        if cur is None or v < cur[1]:
            best[k] = (t, v)
    return [best[k] for k in sorted(best)]


# Points a pairwise estimator (Theil-Sen, Kendall's tau) looks at: its pairs grow as the square of
# its points. A probe or a baseline may send a million points; more than these are thinned evenly
# (the first and the last kept), which moves neither estimator much on a series this dense.
MAX_PAIRWISE_POINTS = 512


def thinned(points: Sequence[tuple[float, float]], limit: int = MAX_PAIRWISE_POINTS) -> Sequence[tuple[float, float]]:
    """`points` itself when there are at most `limit`, else `limit` of them evenly spaced by index."""
    n = len(points)
    if n <= limit:
        return points
    step = (n - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


def theil_sen(points: Sequence[tuple[float, float]]) -> float | None:
    """Median of the slopes between every pair of points with distinct times (of at most
    MAX_PAIRWISE_POINTS points: see `thinned`)."""
    points = thinned(points)
    slopes = sorted(
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(points)
        for (t2, v2) in points[i + 1 :]
        if t2 != t1
    )
    if not slopes:
        return None
    mid = len(slopes) // 2
    return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2


def floor_growth(
    times: Sequence[float], values: Sequence[float], *, chunks: int = 6, min_points: int = 4, min_span: float = 3.0
) -> float | None:
    """Growth per second of the memory floor, or None while there is too little data to say."""
    valid = sum(1 for v in values if not math.isnan(v))
    if valid < min_points or not times or times[-1] - times[0] < min_span:
        return None
    first = values[0]
    if times[-1] > times[0] and all(v == first for v in values):
        return 0.0  # a flat floor (most series, most of the time): what Theil-Sen finds, without the fit
    pts = floor_points(times, values, max(2, min(chunks, valid // 2)))
    if len(pts) < 2:
        return None
    return theil_sen(pts)
