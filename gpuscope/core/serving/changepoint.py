"""When did latency jump? A one-sided CUSUM on the per-interval P99.

The P99 of a service wanders; a jump is a sustained shift up from its earlier level. CUSUM
accumulates how far each new value sits above the baseline (its median) beyond a slack of k
robust standard deviations, and calls a jump when the sum passes h of them; the jump started
where the sum last left zero.

The serving source runs this over its history as it makes each snapshot, and the snapshot
carries the finding: whatever shows a snapshot (console, report, wizard, `metrics --json`, the
journal) shows the same jump.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

BASELINE_MIN = 10  # points of history before a baseline means anything
SLACK_K = 1.0  # deviations ignored per point (noise)
LIMIT_H = 6.0  # accumulated deviations that make a jump
MIN_RELATIVE_JUMP = 0.2  # and the shift must be at least 20 % of the baseline


@dataclass(frozen=True, slots=True)
class Jump:
    """An upward shift of a latency: when it started, the level before and the level since."""

    started: float  # time of the first point of the shift (seconds since the epoch)
    before_s: float  # baseline level
    after_s: float  # level since the jump (median of the points after it)

    def describe(self) -> str:
        """One line, the same wherever it is shown."""
        at = time.strftime("%H:%M:%S", time.localtime(self.started))
        return f"P99 jumped from {_seconds(self.before_s)} to {_seconds(self.after_s)} at {at}"

    def to_json(self) -> dict[str, float]:
        return {"started": self.started, "before_s": self.before_s, "after_s": self.after_s}


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def cusum_increment(value: float, mean: float, sigma: float, drift: float) -> float:
    """One step of a one-sided CUSUM: how far `value` sits above `mean`, in `sigma`s, beyond the
    `drift` allowance (negative when below it)."""
    return (value - mean) / sigma - drift


def latency_jump(points: Sequence[tuple[float, float | None]]) -> Jump | None:
    """The most recent upward shift in (time, value) points, oldest first, or None."""
    data = [(t, v) for t, v in points if v is not None]
    if len(data) < BASELINE_MIN + 3:
        return None
    baseline_values = [v for _, v in data[: max(BASELINE_MIN, len(data) // 2)]]
    base = statistics.median(baseline_values)
    mad = statistics.median(abs(v - base) for v in baseline_values)
    sigma = max(1.4826 * mad, 0.05 * abs(base), 1e-9)  # robust spread, never zero
    total, start = 0.0, None
    jump_at = None
    for i, (_, v) in enumerate(data):
        step = cusum_increment(v, base, sigma, SLACK_K)
        if total == 0.0 and step > 0:
            start = i
        total = max(0.0, total + step)
        if total == 0.0:
            start = None
        if total > LIMIT_H and start is not None:
            jump_at = start
    if jump_at is None:
        return None
    after = statistics.median(v for _, v in data[jump_at:])
    if after - base < MIN_RELATIVE_JUMP * abs(base):
        return None
    return Jump(started=data[jump_at][0], before_s=base, after_s=after)
