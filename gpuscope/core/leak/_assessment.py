"""What the leak detector says of a series (`LeakAssessment`), and the thresholds it judges by."""

from __future__ import annotations

import math
from dataclasses import dataclass



VERDICTS = ("leak", "no-leak", "inconclusive")
PATTERNS = (
    "steady-growth",
    "step-then-plateau",
    "sawtooth",
    "flat",
    "falling",
    "cache-growth",
    "insufficient-data",
)
GROWING = "steady-growth"


@dataclass(frozen=True)
class LeakThresholds:
    """What counts as a leak. Defaults from practice; every one can be changed.

    The alert rate for growth that has lasted `d` seconds is `alert_rate(d)`: `fast_rate` at
    `fast_duration_s`, `slow_bytes / slow_window_s` at `slow_window_s`, a power law between them
    and beyond (never under `min_rate`); none under `fast_duration_s`. A floor slope counts when
    it reaches `rate_margin` x that rate (the slope of a noisy floor, measured over the rule's own
    duration, scatters by a few percent around the truth: a leak exactly at the documented rate
    must still alert).
    """

    fast_rate: float = 5e6  # bytes/s ...
    fast_duration_s: float = 10.0  # ... sustained this long: a fast leak
    slow_bytes: float = 1e9  # this much ...
    slow_window_s: float = 7200.0  # ... over this long: a slow leak (~0.14 MB/s)
    min_rate: float = 1e4  # bytes/s: slower growth is never a leak, however long (~0.9 GB/day)
    rate_margin: float = 0.9
    min_confidence: float = 0.5  # a leak needs at least this confidence ...
    min_z: float = 6.0  # ... and a slope this many standard errors above zero (sample noise) ...
    max_jump_share: float = 0.45  # ... and no single floor-to-floor jump above this share of the rise
    min_samples: int = 6  # fewer valid samples: insufficient data
    min_span_s: float = 10.0  # a shorter span: insufficient data
    samples_per_floor: int = 8  # a floor is the minimum of this many samples, give or take, ...
    min_floors: int = 6  # ... but a horizon has at least this many floors ...
    max_floors: int = 24  # ... and at most this many (2 h: 5-minute floors)
    step_ratio: float = 0.7  # a step wins when its residuals are < step_ratio x the line's ...
    bend_ratio: float = 0.5  # ... a bend (flat then rising, rising then flat: 4 parameters), < this
    flat_bytes: float = 16e6  # a floor change under this is flat, whatever the noise ...
    noise_factor: float = 3.0  # ... and so is one under noise_factor x the floor's own noise
    plateau_fraction: float = 1 / 3  # a ramp that stopped: flat for this part of the horizon ...
    min_plateau_s: float = 10.0  # ... and at least this long, before it is "no-leak"
    sawtooth_min_swing: float = 16e6  # swings smaller than this are noise, not a sawtooth

    def __post_init__(self) -> None:
        for name in ("fast_rate", "fast_duration_s", "slow_bytes", "slow_window_s", "min_span_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.rate_margin <= 1 or not 0 <= self.min_confidence <= 1:
            raise ValueError("rate_margin must be in (0, 1] and min_confidence in [0, 1]")
        if self.min_samples < 3 or self.samples_per_floor < 1 or not 4 <= self.min_floors <= self.max_floors:
            raise ValueError("need min_samples >= 3, samples_per_floor >= 1, 4 <= min_floors <= max_floors")

    @property
    def slow_rate(self) -> float:
        return self.slow_bytes / self.slow_window_s

    def alert_rate(self, duration_s: float) -> float:
        """The floor growth (bytes/s) that is a leak when it has lasted `duration_s` seconds."""
        if duration_s < self.fast_duration_s - 1e-9:
            return math.inf
        if self.slow_window_s > self.fast_duration_s and self.fast_rate > self.slow_rate:
            exponent = math.log(self.fast_rate / self.slow_rate) / math.log(self.slow_window_s / self.fast_duration_s)
            rate = self.fast_rate * (duration_s / self.fast_duration_s) ** -exponent
        else:
            rate = min(self.fast_rate, self.slow_rate)
        return max(rate, self.min_rate)


@dataclass(frozen=True)
class LeakAssessment:
    """What the detector concluded about one memory series.

    - `verdict`: "leak" | "no-leak" | "inconclusive" (see `VERDICTS`).
    - `pattern`: one of `PATTERNS` (the diagnosis JSON's "pattern").
    - `growth_bytes_per_s`: the floor's current slope: over the growth for "steady-growth", over
      the flat part for "step-then-plateau", over the horizon otherwise (None: too little data).
    - `confidence`: in [0, 1], how sure the detector is of `pattern` (hence of the verdict);
      0 for insufficient data.
    - `since`: when the change began (the growth's start, the step's time), on the clock of the
      input times; for a flat or sawtooth series, the start of the horizon judged. Its resolution
      is the floor bucket's width (seconds for recent events, minutes for hours-old ones).
    - `time_to_full_s`: for growth, seconds until `total_bytes` is reached from the recent peak
      at the growth rate (None without a total, or without growth; 0 when already there).
    - `start_bytes`, `end_bytes`: the first and the latest valid sample assessed.
    - `samples`: valid (non-NaN) samples assessed; `span_s`: seconds from first to latest.
    - `reason`: one plain sentence saying why.
    """

    verdict: str
    pattern: str
    growth_bytes_per_s: float | None
    confidence: float
    since: float | None
    time_to_full_s: float | None
    start_bytes: float | None
    end_bytes: float | None
    samples: int
    span_s: float
    reason: str

    @property
    def is_leak(self) -> bool:
        return self.verdict == "leak"

    def to_json(self) -> dict:
        """Plain JSON types; NaN/inf never appear (None instead)."""
        return {
            "verdict": self.verdict,
            "pattern": self.pattern,
            "growth_bytes_per_s": _finite(self.growth_bytes_per_s),
            "confidence": round(self.confidence, 3),
            "since": _finite(self.since),
            "time_to_full_s": _finite(self.time_to_full_s),
            "start_bytes": _finite(self.start_bytes),
            "end_bytes": _finite(self.end_bytes),
            "samples": self.samples,
            "span_s": self.span_s,
            "reason": self.reason,
        }


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
