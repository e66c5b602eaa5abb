"""Guarantees of the core's judgements that each rest on one rule, with a shape of data that only
that rule decides: held bytes that stop rising before the end, a latency jump early in the
history, processes that grow at different rates, a tracker that replies late, and a fleet view
that nobody looks at."""

from __future__ import annotations

import random
import threading
from dataclasses import replace

from frames import leaking_evidence
from gpuscope.core.diagnosis import investigation
from gpuscope.core.diagnosis.attribution import Attribution
from gpuscope.core.diagnosis.steps import diagnose, growth_ranking
from gpuscope.core.fleet.collector import FleetSnapshot, FleetSource
from gpuscope.core.leak import held_trend
from gpuscope.core.node.model import ProcessRow
from gpuscope.core.serving.changepoint import BASELINE_MIN, latency_jump
from helpers import wait_until

MB = 1e6

# -- held bytes: a leak only when the rise lasts to the end of the tracking ------------------------


def test_held_bytes_that_stopped_rising_before_the_end_are_a_bounded_cache_not_a_leak():
    """Twelve seconds of a steady 1 MB/s, then seven flat: steady (Kendall's tau over 0.9), large
    and fast enough over the whole window, yet it stopped; the same rise kept to the end is a leak."""
    times = [float(t) for t in range(20)]
    stopped = held_trend(times, [min(t, 12.0) * MB for t in times])
    assert stopped.kind == "levelled", stopped
    kept_on = held_trend(times, [t * MB for t in times])
    assert kept_on.kind == "rising" and abs(kept_on.growth_bytes_per_s - MB) < 1, kept_on


# -- the P99 change point: its baseline is the older history only ---------------------------------


def test_a_p99_jump_early_in_the_history_is_still_found_against_the_level_before_it():
    """The jump is at 40 % of the history: over the whole history the median is the new level, and
    nothing would stand out; over the older half it is the old level."""
    rng = random.Random(7)
    points = [(float(i), 0.5 * (1 + rng.uniform(-0.1, 0.1))) for i in range(40)]
    points += [(float(40 + i), 1.5 * (1 + rng.uniform(-0.1, 0.1))) for i in range(50)]
    jump = latency_jump(points)
    assert jump is not None, "a tripled P99 over the last 60 % of the history was not found"
    assert 38 <= jump.started <= 42 and 0.45 < jump.before_s < 0.55 and 1.35 < jump.after_s < 1.65, jump


def test_too_little_history_says_nothing_however_clear_the_jump():
    """Fewer than BASELINE_MIN + 3 points: no baseline to speak of, whatever they show."""
    short = [(float(i), 0.5) for i in range(6)] + [(float(6 + i), 2.0) for i in range(BASELINE_MIN + 2 - 6)]
    assert latency_jump(short) is None
    longer = short + [(float(len(short)), 2.0)]  # one more point: enough to judge
    assert latency_jump(longer) is not None


def test_one_raised_point_at_the_end_is_not_a_jump_yet():
    """The last P99 25 % up on a steady history: a start, but not the accumulated evidence of a
    shift (LIMIT_H deviations)."""
    points = [(float(i), 0.5) for i in range(30)] + [(30.0, 0.625)]
    assert latency_jump(points) is None


def test_a_clean_shift_of_a_fifth_held_a_few_points_is_a_jump_against_a_noiseless_history():
    """A history without noise has a spread of 5 % of its level: a 22 % shift held three points
    adds up past LIMIT_H deviations."""
    points = [(float(i), 0.5) for i in range(20)] + [(float(20 + i), 0.61) for i in range(3)]
    jump = latency_jump(points)
    assert jump is not None and jump.started == 20.0 and jump.before_s == 0.5 and jump.after_s == 0.61, jump


# -- step 4: processes ranked by how fast they grow ---------------------------------------------------


def _host_row(pid: int, growth: float) -> ProcessRow:
    return ProcessRow(pid, "svc", None, None, 2 << 30, 10.0, f"python worker_{pid}.py", "python", True, None, growth)


def test_step_4_ranks_the_processes_fastest_growth_first_and_names_the_fastest():
    """The process under diagnosis grows 6 MB/s; another grows 9 MB/s and two more slower. Step 4
    ranks them by growth, fastest first, and says the faster one should be diagnosed as well."""
    rates = {4242: 6 * MB, 5100: 9 * MB, 9001: 0.5 * MB, 777: 2 * MB}
    ev = replace(leaking_evidence(4242, rate=rates[4242]), processes=tuple(_host_row(p, g) for p, g in rates.items()))
    assert [pid for pid, _ in growth_ranking(ev, "host")] == [5100, 4242, 777, 9001]
    step = diagnose(ev).steps[3]
    assert (step.number, step.title) == (4, "Locate the process"), step
    assert [r["pid"] for r in step.evidence["ranking"]] == [5100, 4242, 777, 9001], step.evidence
    assert step.finding.startswith("PID 5100 (worker_5100.py") and " grows faster on this host" in step.finding, step.finding
    assert "gpuscope diagnose --pid 5100" in step.next, step.next


def test_step_4_ranks_the_five_fastest():
    rates = {pid: (pid - 4000) * 1e4 for pid in range(4001, 4008)}
    ev = replace(leaking_evidence(4007), processes=tuple(_host_row(p, g) for p, g in rates.items()))
    assert [pid for pid, _ in growth_ranking(ev, "host")] == [4007, 4006, 4005, 4004, 4003]


def test_step_4_says_the_process_under_diagnosis_grows_fastest_when_it_does():
    rates = {4242: 6 * MB, 5100: 1 * MB, 9001: 0.5 * MB}
    ev = replace(leaking_evidence(4242, rate=rates[4242]), processes=tuple(_host_row(p, g) for p, g in rates.items()))
    step = diagnose(ev).steps[3]
    assert step.finding.startswith("PID 4242 (serve.py") and " grows fastest on this host" in step.finding, step.finding


# -- the stop grace: the watch never runs past it, however late a tracker replies ------------------


def test_the_watch_after_a_late_tracker_ends_at_the_stop_grace():
    """A tracker that ends 0.1 s before the grace runs out would, unbounded, be followed by
    `AFTER_MIN_S` of watching: the grace caps it. One that ends in time gets its `AFTER_MIN_S`."""
    duration, grace, after = 8.0, investigation.STOP_GRACE_S, investigation.AFTER_MIN_S
    late = duration + grace - 0.1
    tracked = [Attribution(4242, (), (), None, "none", window=(0.0, late))]
    assert investigation._watch_end(duration, late, tracked) == duration + grace
    assert investigation._watch_end(duration, duration - 3, tracked) == duration + after - 3
    assert investigation._watch_end(duration, 2.0, tracked) == duration  # ended early: the plain budget
    assert investigation._watch_end(duration, None, tracked) == duration + grace  # still awaited
    assert investigation._watch_end(duration, duration + 1, []) == duration  # no tracker ran: the budget
    assert investigation.schedule(30.0) == (0.3 * 30.0, 0.4 * 30.0)  # watched before, then tracked
    assert investigation.schedule(100.0)[1] == investigation.TRACK_MAX_S


# -- the fleet view asks Prometheus only while it is open -----------------------------------------


def _counting_source(interval_s: float) -> tuple[FleetSource, list[float]]:
    reads: list[float] = []
    lock = threading.Lock()

    def read() -> FleetSnapshot:
        with lock:
            reads.append(0.0)
        return FleetSnapshot(0.0, "prometheus")

    source = FleetSource(read, "prometheus")
    source.interval_s = interval_s
    return source, reads


def test_the_fleet_source_asks_only_between_start_and_pause():
    """A paused source asks no more (a read in flight may still finish) while a second one, started
    at the same pace, reads again and again: the time that passed would have brought reads."""
    source, reads = _counting_source(0.02)
    witness, witnessed = _counting_source(0.02)
    try:
        source.start(lambda snapshot: None)
        wait_until(lambda: len(reads) >= 3, timeout=30, what="the open fleet view's reads")
        source.pause()
        paused_at = len(reads)
        witness.start(lambda snapshot: None)
        wait_until(lambda: len(witnessed) >= 15, timeout=60, what="fifteen reads of the open one")
        assert len(reads) <= paused_at + 1, (paused_at, len(reads))
        source.start(lambda snapshot: None)  # open again: it reads again
        wait_until(lambda: len(reads) >= paused_at + 3, timeout=30, what="reads once open again")
    finally:
        source.stop()
        witness.stop()


def test_the_diagnosis_names_where_the_process_runs():
    # Step 4 asks the operator to confirm the service: its unit or container is in its name, for the
    # process under diagnosis and for another that grows faster.
    rates = {4242: 6 * MB, 5100: 9 * MB}
    hosts = tuple(replace(_host_row(p, g), runs_in="docker:4f0c5d1e2a3b" if p == 5100 else "") for p, g in rates.items())
    ev = replace(leaking_evidence(4242, rate=rates[4242]), processes=hosts, runs_in="rag.service")
    d = diagnose(ev)
    step = d.steps[3]
    assert step.finding.startswith("PID 5100 (worker_5100.py · docker:4f0c5d1e2a3b · python)"), step.finding
    assert "PID 4242 (serve.py --api-key *** · rag.service · python)" in step.finding, step.finding
    assert d.runs_in == "rag.service" and d.to_json()["runs_in"] == "rag.service"
    assert "runs in: `rag.service`" in d.to_text()
