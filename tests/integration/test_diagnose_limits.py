"""The diagnosis where it cannot see everything: attaching refused, and a service allocating about
1 GB/s whose allocation capture reaches its cap. Either way the diagnosis ends within its
budget and says, in its steps and its evidence lines, what it could not do or keep."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from gpuscope.core.diagnosis.steps import diagnose
from gpuscope.core.diagnosis.evidence import evidence_lines
from gpuscope.core.diagnosis.investigation import investigate

from helpers import canary_says, gpuscope_cmd

REFUSAL = "gdb's call killed the throwaway process (SIGSEGV)"

SLOW_LEAKER = """
    import time
    kept = []
    def leak():
        kept.append(bytearray(200_000))
    print("ready", flush=True)
    for _ in range(3000):  # bounded: at most 600 MB, over 5 min
        leak(); time.sleep(0.1)
"""

# About 1 GB/s: a million 1 KiB buffers a second (each from malloc, freed at once), for at most
# two minutes. The capture cap is lowered to 8 MiB inside the process so that this rate fills it
# on any machine, however slow: the cap, not the machine, ends the tracking.
CHURN = """
    import sys, time
    probe = sys.modules.get("gpuscope.probe") or sys.modules.get("gpuscope_probe")
    assert probe is not None, "not started under gpuscope run"
    probe.MAX_CAPTURE = 8 << 20
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for _ in range(10000):
            buffer = bytearray(1024)
"""


def _start(tmp_path, name: str, code: str, *, probe: bool) -> subprocess.Popen:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(code))
    command = [sys.executable, str(script)]
    proc = subprocess.Popen(gpuscope_cmd() + ["run", "--", *command] if probe else command,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_attaching_refused_is_said_in_the_rungs_the_code_path_step_and_the_evidence(tmp_path, monkeypatch):
    canary_says(monkeypatch, REFUSAL)  # gdb would harm processes here: memray must not be attached
    proc = _start(tmp_path, "leaker", SLOW_LEAKER, probe=False)
    try:
        d = diagnose(investigate(proc.pid, 8.0))
        assert proc.poll() is None  # the target lives
    finally:
        proc.kill()
        proc.wait()
    rungs = d.steps[6].evidence["rungs"]
    memray = next(r for r in rungs if r["method"] == "memray")
    assert memray["status"] == "failed" and REFUSAL in memray["detail"], rungs
    assert d.steps[6].status != "skipped" and REFUSAL in d.steps[6].finding, d.steps[6]
    assert any(line.startswith("memray: failed") and REFUSAL in line for line in evidence_lines(d)[7])
    assert d.instrument is None or d.instrument.method != "memray"  # nothing of memray ran inside
    text = d.to_text()
    assert "memray: failed" in text and "gdb" in text


def test_a_service_allocating_a_gigabyte_a_second_is_diagnosed_in_time_and_the_cut_capture_said(tmp_path):
    duration = 15
    proc = _start(tmp_path, "churn", CHURN, probe=True)
    try:
        # A hang is caught by the timeout; that the watch stops at the budget and its grace is
        # held by tests/integration/test_guarantees_trackers.py, on the diagnosis's own clock.
        out = subprocess.run(gpuscope_cmd() + ["diagnose", "--pid", str(proc.pid), "--duration", str(duration)],
                             capture_output=True, text=True, timeout=duration + 60)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 0, out.stderr
    # Said where the memray rung is reported: the code-path step and its evidence.
    assert "- memray: " in out.stdout and "its capture reached its size cap" in out.stdout, out.stdout
    assert "- instrument: " in out.stdout and "**leak**" not in out.stdout, out.stdout


def test_a_tracker_that_ends_late_is_still_followed_by_a_watch_of_its_own(tmp_path, monkeypatch):
    """On a loaded machine a tracker's reply can come after the budget: the memory trend still
    gets `AFTER_MIN_S` of samples after it, and the diagnosis still ends within the stop grace."""
    from gpuscope.core.diagnosis import ladder as allocations
    from gpuscope.core.diagnosis import investigation
    from gpuscope.core.diagnosis.attribution import Attribution

    duration = 8.0
    proc = _start(tmp_path, "leaker", SLOW_LEAKER, probe=False)

    def late(pid, track, **kwargs):
        began = time.time()
        time.sleep(duration - investigation.schedule(duration)[0] + 0.5)  # its reply after the budget
        return Attribution(pid, (), (), None, "none", window=(began, time.time()))

    monkeypatch.setattr(allocations, "attribute", late)
    try:
        evidence = investigate(proc.pid, duration)
    finally:
        proc.kill()
        proc.wait()
    after = [t for t in evidence.rss.times if t > evidence.instrumented[0][1]]
    # The tracker ended 8.5 s in: watched at least until 12 s (the grace), where the old watch had
    # stopped at 8 s, with nothing after the tracker. (The cap at the grace: test_guarantees_trackers.)
    assert after and after[-1] - after[0] >= 2.5, (evidence.instrumented, after)
