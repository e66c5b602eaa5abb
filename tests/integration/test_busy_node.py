"""A busy node, with real processes: every process watched, alerts only for what leaks.

The node's other processes are whatever else runs on the machine; each test finds its own by the
PIDs it started, and asks only about those."""

import json
import os
import subprocess

import pytest

from gpuscope.core.fleet.exporter import NodeAgent
from gpuscope.core.leak import LeakThresholds, LeakWatch
from gpuscope.core.node.live import MAX_PYTHON_ROWS, NodeSource

from helpers import gpuscope_cmd, wait_until

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="private memory as Linux's /proc gives it")

MB = 2**20

# Idle Python processes of 60 MB each (pages written, so that they are resident).
IDLE_60MB = """
import time
held = b"x" * (60 * 2**20)
print("ready", flush=True)
while True:
    time.sleep(1)
"""
# Programs that grow by the clock, not by their own pace: a slow machine changes no rate.
# `grow(rate, seconds)`: to rate x elapsed bytes (pages written), for `seconds`, then hold.
GROW = """
import sys, time
def grow(rate, seconds):
    keep, start = [], time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        while 100_000 * len(keep) < rate * elapsed:
            keep.append(b"x" * 100_000)
        time.sleep(0.05)
    return keep
"""
# A service leaking 1 MB/s from its start (~10 MB), up to 400 MB.
LEAKING = GROW + """
print("ready", flush=True)
held = grow(1e6, 400)
while True:
    time.sleep(1)
"""
# A service warming up: +150 MB in 15 s, then flat.
WARMING_UP = GROW + """
print("ready", flush=True)
held = grow(10e6, 15)
while True:
    time.sleep(1)
"""
# A run (a `pip install`, a test suite): grows 3 MB/s for argv[1] seconds, then exits.
RUN = GROW + """
print("ready", flush=True)
grow(3e6, float(sys.argv[1]))
"""
# One of several processes mapping one shared buffer (a file in shared memory), each touching
# more of it as time goes (2 MB/s, by the clock): their RSS grows faster than the leaking
# service's, their private memory does not grow.
SHARED = """
import mmap, sys, time
with open(sys.argv[1], "r+b") as f:
    buf = mmap.mmap(f.fileno(), 0)
print("ready", flush=True)
touched, start = 0, time.monotonic()
while touched < len(buf):
    while touched < min(len(buf), 2e6 * (time.monotonic() - start)):
        buf[touched] = 1
        touched += mmap.PAGESIZE
    time.sleep(0.05)
while True:
    time.sleep(1)
"""

# Faster rules than the defaults, for a test of a minute: 1 MB/s is a leak after ~10 s of growth.
THRESHOLDS = LeakThresholds(fast_rate=0.8e6)


def alerting(frame) -> set[int]:
    return {a.pid for a in frame.alerts if a.pid is not None}


@pytest.mark.timeout(240)
def test_a_leaking_service_among_idle_pythons_warm_ups_and_a_shared_buffer(spawn_python, tmp_path):
    idle = [spawn_python(IDLE_60MB) for _ in range(MAX_PYTHON_ROWS + 5)]
    # In shared memory (tmpfs) where there is one, as a shared buffer usually is.
    path = f"/dev/shm/gpuscope-test-{os.getpid()}" if os.path.isdir("/dev/shm") else str(tmp_path / "shared")
    with open(path, "wb") as f:
        f.truncate(150 * MB)
    try:
        sharing = [spawn_python(SHARED, path) for _ in range(3)]
        leaking = spawn_python(LEAKING)
        warming = spawn_python(WARMING_UP)
        # Read through the exporter, as a fleet reads the node.
        agent = NodeAgent("node", interval=0.5, thresholds=THRESHOLDS)
        source, watch = agent.source, agent.watch
        agent.start()
        try:
            def listed(pid: int) -> bool:
                frame = source.latest_frame()[0]
                return frame is not None and any(r.pid == pid for r in frame.processes)

            # Not among the largest Pythons (25 idle ones are larger), yet kept in detail: it grows.
            wait_until(lambda: listed(leaking.pid), timeout=30, interval=0.2, what="the leaking service in the table")
            # `ps` lists it too: every process with memory.
            ps = subprocess.run([*gpuscope_cmd(), "ps", "--json"], capture_output=True, text=True, timeout=60)
            assert ps.returncode == 0, ps.stderr
            assert {leaking.pid, *(p.pid for p in idle)} <= {row["pid"] for row in json.loads(ps.stdout)}
            wait_until(lambda: exported(agent, "gpuscope_process_leak", leaking.pid) == [1.0], timeout=120,
                       interval=0.5, what="the leaking service's alert, exported")
            frame = source.latest_frame()[0]
            others = {p.pid for p in (*idle, *sharing, warming)}
            groups = {**{p.pid: "idle" for p in idle}, **{p.pid: "sharing" for p in sharing}, warming.pid: "warming"}
            assert not alerting(frame) & others, [(groups.get(a.pid), a.reason) for a in frame.alerts]
            # The warm-up is over (15 s of growth, then flat): judged, and not a leak.
            warm = watch.assessment(("rss", warming.pid, _start(source, warming.pid)))
            assert warm is not None and warm.verdict != "leak", warm
            assert exported(agent, "gpuscope_process_leak", warming.pid) in ([], [0.0])
            # Each process touching the shared buffer grew in RSS, not in private memory.
            rows = {r.pid: r for r in frame.processes}
            for p in sharing:
                row = rows.get(p.pid)
                assert row is None or (row.rss_growth_bytes_per_s or 0) < 1 * MB, row
            # Every process is counted as seen, not only those in detail.
            seen = exported(agent, "gpuscope_exporter_processes", None, state="seen")
            in_detail = {r.pid for r in frame.processes}
            assert seen and seen[0] >= len(idle) + len(sharing) + 2 and seen[0] > len(in_detail), (seen, len(in_detail))
        finally:
            agent.stop()
    finally:
        os.unlink(path)


@pytest.mark.timeout(180)
def test_growth_that_ends_with_its_process_is_not_a_leak(spawn_python):
    # A warm-up of 8 s (alerts from 16 s of age) keeps the run short: it must outlive its alert.
    run = spawn_python(RUN, "40")
    frames = []
    watch = LeakWatch(thresholds=THRESHOLDS, warmup_s=8.0)
    source = NodeSource(interval=0.5, thresholds=THRESHOLDS, watch=watch)
    source.start(lambda f: frames.__setitem__(slice(None), [f]))  # the latest only
    try:
        start = wait_until(lambda: _start(source, run.pid), timeout=30, what="the run in the table")
        # Alive, past its warm-up and still growing: nothing tells it from a leaking service yet.
        wait_until(lambda: run.pid in alerting(frames[-1]), timeout=90, interval=0.2, what="the run's alert")
        young = [a for a in frames[-1].alerts if a.pid == run.pid][0]
        assert young.since is not None
        run.wait(timeout=60)
        # Its growth ended with it, after a short life: withdrawn, not listed as an ended leak.
        wait_until(lambda: watch.assessment(("rss", run.pid, start)) is not None
                   and watch.assessment(("rss", run.pid, start)).verdict == "no-leak", timeout=30, interval=0.2,
                   what="the run's growth judged once it exited")
        # The frame after that judgement withdraws the alert (the one before it may still show it).
        wait_until(lambda: run.pid not in alerting(frames[-1]), timeout=10, interval=0.2, what="the alert withdrawn")
        assert "ended with the process" in watch.assessment(("rss", run.pid, start)).reason
    finally:
        source.stop()


def exported(agent: NodeAgent, family: str, pid: int | None, **labels: str) -> list[float]:
    """The values of one metric family the exporter would serve now, for one process."""
    return [sample.value for metric in agent.collector.collect() if metric.name == family
            for sample in metric.samples
            if (pid is None or sample.labels.get("pid") == str(pid))
            and all(sample.labels.get(k) == v for k, v in labels.items())]


def _start(source: NodeSource, pid: int) -> float | None:
    snap = source.last_host
    return next((p.create_time for p in snap.processes if p.pid == pid), None) if snap is not None else None


def test_a_process_younger_than_its_warm_up_raises_no_alert():
    """The rule itself, on a series fed as the live source feeds it: a fast rise in a process's
    first seconds is "warming up"; the same rise in an older process is a leak."""
    for started, expected in ((1000.0, "inconclusive"), (900.0, "leak")):
        watch = LeakWatch(thresholds=THRESHOLDS)
        for i in range(70):  # 35 s at 2 samples/s, 2 MB/s
            t = 1000.0 + i / 2
            watch.add("p", t, 10 * MB + 2 * MB * (t - 1000.0), started=started)
            watch.update()
        a = watch.assessment("p")
        assert a is not None and a.verdict == expected, (started, a)
        if expected == "inconclusive":
            assert "warming up" in a.reason



@pytest.mark.timeout(180)
def test_the_diagnosis_of_a_young_grower_says_it_is_warming_up_and_once_it_exits_that_it_was_a_run(spawn_python):
    from gpuscope.core.diagnosis.recorded import source_evidence
    from gpuscope.core.diagnosis.steps import diagnose

    run = spawn_python(RUN, "300")
    source = NodeSource(interval=0.5, focus_pid=run.pid, thresholds=THRESHOLDS)
    source.start(lambda f: None)
    try:
        def judged(exited: bool):
            ev = source_evidence(source, run.pid, 60.0)
            if ev.exited != exited or len(ev.rss.known()) < 20:
                return None
            d = diagnose(ev, THRESHOLDS)
            return d if d.verdict == "leak" or exited else None  # judged once the growth is clear

        # Young, growing fast from its first seconds: a leak by the rates, and said to be maybe a warm-up.
        young = wait_until(lambda: judged(False), timeout=60, interval=0.5, what="a diagnosis of the young run")
        assert young.verdict == "leak", young.to_text()
        assert "warming up" in young.steps[5].finding, young.to_text()
        run.kill()
        run.wait(timeout=10)
        # Gone after a short life: its growth ended with it.
        ended = wait_until(lambda: judged(True), timeout=30, interval=0.5, what="a diagnosis once the run exited")
        assert ended.verdict == "no-leak", ended.to_text()
        assert "ended with the process" in ended.steps[5].finding
    finally:
        source.stop()
