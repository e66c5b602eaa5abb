"""Leak or not: a detector over one memory series (device memory, a process's GPU memory, RSS).

A trend on raw samples raises false alarms (every batch buffer, every GC pause); memory that
*stays* shows in the floor: the minimum of each slice of the window. So the detector works on
floors, with the robust slope of `growth.theil_sen` through them, and tells what kind of change it
sees before it calls anything a leak:

- **steady-growth**: the floor keeps rising (a leak when fast enough for long enough, see below);
- **step-then-plateau**: a one-time rise, then flat (model load, KV-cache or CUDA context warm-up);
  a step wins over a ramp when a one-break piecewise-constant fit leaves under `step_ratio` (0.7)
  of the residuals of the Theil-Sen line; a ramp that stopped is found the same way (a line, then
  a constant); either is "no-leak" once the flat part is long enough, "inconclusive" before;
- **sawtooth**: big swings that fall back to a flat floor (batch buffers filled and freed);
- **flat**: the floor moves less than the noise (or `flat_bytes`);
- **falling**: the floor went down;
- **cache-growth**: torch's reserved memory grows while allocated does not (only when the caller
  passes both series): the caching allocator keeping freed blocks, not a leak;
- **insufficient-data**: too few samples or too short a span to say anything.

When is growth a leak? The floor slope must reach the alert rate for the time it has lasted,
`LeakThresholds.alert_rate(duration)`: 5 MB/s sustained for 10 s (a fast leak), 1 GB over 2 h
(~0.14 MB/s, a slow leak), and in between and beyond on the straight line through those two
points in log-log space (rate ~ duration^-0.545: the longer the growth lasts, the lower the rate
that counts, down to `min_rate`). And the growth must be real: a confidence of `min_confidence`
or more (it rises with the evidence: the agreement of the slope's sign across the floors -
Kendall's tau, i.e. Mann-Kendall's S over the number of pairs - the number of floors and the
time span); a slope `min_z` standard errors clear of the series' own sample noise; the same
without the newest floor (a burst that just began is not a leak); and no single floor-to-floor
jump carrying most of the rise (bursts back to back are not a ramp). Growth that falls short is
"inconclusive", with its rate, its confidence and what it lacks.

Samples are summarised as they arrive into a bounded, multi-resolution sketch (`FloorSketch`):
fine buckets for the last minute, coarser ones further back, each keeping its minimum (and when),
its maximum, its sum and its largest fall. The growth of a stretch's floor is defined once,
`floor_growth`: the Theil-Sen slope through the minima of the floors the detector cuts (the GROW
column and the diagnosis of a stretch too short to judge read it). A series is judged over several
horizons (10 s, 40 s, 160 s, ... and the whole window) so that a leak that started a minute ago is
seen in a long, quiet history; a short horizon's "leak" is ignored when a longer one sees a
sawtooth (its fill phase).
`assess()` does this once over given samples; `LeakWatch` keeps one sketch per series and
re-judges incrementally, which costs O(buckets), not O(samples), per tick.

Pure Python; no numpy. Sizes are bytes; rates bytes per second; the texts read them as `units` does.

The package's modules, by role (the interface is this package; the modules are private):
`_assessment` (the thresholds and what a judgement says), `_sketch` (the floor sketch),
`_floors` (a stretch's floors and their growth), `_analysis` (judging a series: `assess()`),
`_held` (an allocation site's held bytes, and when a tracker has seen enough), `_life` (a
process's age and life: warm-ups and runs are not leaks), `_watch` (the live watch), and `growth`
(the robust slope, public: the gate and the diagnosis use it too). It uses only `gpuscope.core.common`.
"""

from gpuscope.core.leak._assessment import GROWING, LeakAssessment, LeakThresholds, PATTERNS, VERDICTS
from gpuscope.core.leak._sketch import FloorSketch
from gpuscope.core.leak._floors import floor_growth
from gpuscope.core.leak._analysis import assess, kendall_tau
from gpuscope.core.leak._held import HELD_MIN_RISE, HeldEvidence, HeldTrend, SETTLE_HORIZON_S, SETTLE_MIN_POINTS, SETTLE_MIN_S, SETTLE_SKIP_S, SETTLE_TAU, Settled, held_evidence, held_trend, rising_evidence, tracking_settled
from gpuscope.core.leak._watch import LeakAlert, LeakWatch
from gpuscope.core.leak._life import SERVICE_LIFE_S, WARMUP_S, as_ended_run, ended_run, warming_up

__all__ = [
    "FloorSketch",
    "GROWING",
    "HELD_MIN_RISE",
    "HeldEvidence",
    "HeldTrend",
    "LeakAlert",
    "LeakAssessment",
    "LeakThresholds",
    "LeakWatch",
    "PATTERNS",
    "SERVICE_LIFE_S",
    "SETTLE_HORIZON_S",
    "SETTLE_MIN_POINTS",
    "SETTLE_MIN_S",
    "SETTLE_SKIP_S",
    "SETTLE_TAU",
    "Settled",
    "VERDICTS",
    "WARMUP_S",
    "as_ended_run",
    "ended_run",
    "assess",
    "floor_growth",
    "held_evidence",
    "rising_evidence",
    "held_trend",
    "kendall_tau",
    "tracking_settled",
    "warming_up",
]
