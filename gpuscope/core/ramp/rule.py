"""When a ramp stops: the P99 break rule, over one P99 a measuring interval.

Each interval's P99 is scored against the `baseline_points - 1` points before it that did not
break (a break never raises its own reference): the one-sided CUSUM increment
`(x - mean) / sd - drift` (gpuscope.core.serving.changepoint), floored at 0. A score above
`threshold` is a break. `breaks` breaks in a row pause the ramp (the load stays where it is) for a
`watch_s` watch; one more break in the watch ends the ramp, and the load where it broke is the
critical throughput. A watch without a break resumes the ramp (the P99 had recovered).

The sd is floored at `min_spread` of the mean: a service whose P99 barely moves (a fixed service
time, a histogram whose buckets hold it at one value) would otherwise call a break on noise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuscope.core.serving.changepoint import cusum_increment

RAMPING, WATCHING, STOPPED = "ramping", "watching", "stopped"


@dataclass(frozen=True)
class StopRule:
    """The stop rule's parameters (the defaults: a 1-minute baseline of 5 s P99s)."""

    interval_s: float = 5.0
    baseline_points: int = 12
    threshold: float = 3.2
    drift: float = 0.5
    breaks: int = 3
    watch_s: float = 30.0
    min_spread: float = 0.05

    def __post_init__(self) -> None:
        if self.baseline_points < 3:
            raise ValueError(f"the baseline needs 3 points or more, not {self.baseline_points}")
        if self.breaks < 1:
            raise ValueError(f"breaks in a row must be 1 or more, not {self.breaks}")
        for name in ("interval_s", "threshold", "watch_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        if not (self.drift >= 0 and self.min_spread >= 0):
            raise ValueError("the drift and the spread floor must be 0 or more")

    def to_json(self) -> dict:
        return {"interval_s": self.interval_s, "baseline_points": self.baseline_points, "threshold": self.threshold,
                "drift": self.drift, "breaks": self.breaks, "watch_s": self.watch_s, "min_spread": self.min_spread}


@dataclass(frozen=True)
class Score:
    """One P99 judged: its score (None: no reference yet, or no P99) and whether it broke."""

    score: float | None
    broke: bool


class BreakWatch:
    """The rule over P99s as they come, one interval at a time."""

    def __init__(self, rule: StopRule) -> None:
        self.rule = rule
        self.state = RAMPING
        self.in_a_row = 0
        self.first_break: int | None = None  # index of the first break of the current run of breaks
        self._reference: list[float] = []
        self._watch_left = 0.0

    def add(self, index: int, p99: float | None, elapsed_s: float) -> Score:
        """Judge interval `index`'s P99 (`elapsed_s` long); the state moves as the rule says."""
        if self.state == STOPPED:
            return Score(None, False)
        if self.state == WATCHING:
            self._watch_left -= elapsed_s
        score = self._score(p99)
        broke = score is not None and score > self.rule.threshold
        if broke:
            if self.in_a_row == 0:
                self.first_break = index
            self.in_a_row += 1
            if self.state == WATCHING:
                self.state = STOPPED
            elif self.in_a_row >= self.rule.breaks:
                self.state = WATCHING
                self._watch_left = self.rule.watch_s
        else:
            if p99 is not None:
                self._reference = (self._reference + [p99])[-(self.rule.baseline_points - 1):]
            if self.state != WATCHING:
                self.in_a_row = 0
                self.first_break = None
        if self.state == WATCHING and self._watch_left <= 1e-9 and not broke:
            # the watch ran out without a break: the P99 recovered, the ramp goes on
            self.state = RAMPING
            self.in_a_row = 0
            self.first_break = None
        return Score(score, broke)

    def _score(self, p99: float | None) -> float | None:
        if p99 is None or len(self._reference) < self.rule.baseline_points - 1:
            return None
        mean = statistics.fmean(self._reference)
        sd = max(statistics.pstdev(self._reference), self.rule.min_spread * abs(mean), 1e-9)
        return max(0.0, cusum_increment(p99, mean, sd, self.rule.drift))
