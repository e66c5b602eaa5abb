"""A process's age and its life, as they count in a leak verdict: one rule for the live watch and the diagnosis."""

from __future__ import annotations

from dataclasses import replace

from gpuscope.core.leak._assessment import LeakAssessment

WARMUP_S = 20.0  # growth that begins in a process's first seconds is loading, a warm-up ...
SERVICE_LIFE_S = 600.0  # ... and growth that ends with a process that lived less, a run's


def warming_up(started: float, since: float | None, now: float, warmup_s: float = WARMUP_S) -> bool:
    """Growth that began in the process's first `warmup_s` seconds, while the process is not yet
    twice that old: as long again as the warm-up, to see whether it stops. `since`: when the
    growth began (None: now); all three on one clock."""
    age = now - started
    began = since - started if since is not None else age
    return age < warmup_s or (began < warmup_s and age < 2 * warmup_s)


def as_warming_up(a: LeakAssessment, started: float, now: float) -> LeakAssessment:
    """A leak verdict read again as a warm-up: "inconclusive", saying so."""
    return replace(a, verdict="inconclusive",
                   reason=f"{a.reason}; warming up: the process started {max(0.0, now - started):.0f} s ago")


def ended_run(life_s: float, service_life_s: float = SERVICE_LIFE_S) -> bool:
    """Growth that ended with its process, which lived `life_s` seconds: a run's (an install, a
    test suite, a batch job), when that life is shorter than a service's."""
    return life_s < service_life_s


def as_ended_run(a: LeakAssessment, life_s: float) -> LeakAssessment:
    """A growing series read again once its process has gone after a short life: "no-leak"."""
    return replace(a, verdict="no-leak", reason=(
        f"its growth ended with the process, which lived {max(0.0, life_s):.0f} s: "
        f"a run or a warm-up, not a leak ({a.reason})"))
