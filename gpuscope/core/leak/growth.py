"""The robust slope: Theil-Sen (the median of pairwise slopes), which one odd point cannot move.

The leak detector fits it through a series' floors (`gpuscope.core.leak.floor_growth`); the gate,
the ramp and the allocation sites' trends through points of their own.
"""

from __future__ import annotations

from collections.abc import Sequence


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
