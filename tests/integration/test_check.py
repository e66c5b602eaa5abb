"""`gpuscope check`: the CI memory gate, on real services.

The demo RAG service (its leak switched off with --no-leak, or on) driven by its own load
generator, and small Python programs that stay flat under noisy temporaries, crash mid-round, or
grow on a (fake-NVML) GPU. memray runs inside the services through gpuscope's probe. Rounds are
short (about a second of load each) so the whole file runs in about a minute.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET

import pytest

from gpuscope.core.gate.verdict import BASELINE_SCHEMA, Baseline, CheckRun, Memory, Round, judge

from helpers import LEAKER, fake_nvml_env, gpuscope_cmd

PY = sys.executable
CHECK_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(*args: str, env: dict | None = None, timeout: float = CHECK_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([*gpuscope_cmd(), "check", *args], capture_output=True, text=True, timeout=timeout, env=env)


def demo_args(*service_args: str, rounds: int = 2) -> list[str]:
    """A check of the demo service on a free port, loaded for ~1 s per round by its own load generator."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    load = f"{PY} -m gpuscope.demo.load --url {url} --duration 1 --rate 20"
    return ["--rounds", str(rounds), "--load", load, "--metrics-url", f"{url}/metrics",
            "--", PY, "-m", "gpuscope.demo.service", "--port", str(port), *service_args]


def program(tmp_path, name: str, code: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def comparable_from(result: dict) -> int:
    """The round from which the floors hold memray's own memory: 0, or the one a note names."""
    late = [n for n in result["notes"] if "memray was first loaded" in n]
    return int(late[0].split("before round ")[1].split()[0]) if late else 0


@pytest.fixture(scope="module")
def demo_baseline(tmp_path_factory):
    """A baseline of the demo service with its leak switched off: the known-good run."""
    folder = tmp_path_factory.mktemp("baseline")
    path = folder / "demo-baseline.json"
    out = check("--baseline", str(path), "--update-baseline", *demo_args("--no-leak"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["schema"] == BASELINE_SCHEMA
    assert [r["round"] for r in data["rounds"]] == [0, 1, 2]
    assert all(r["memory"]["rss"]["floor"] > 0 and r["requests"] > 0 for r in data["rounds"])
    return path


def test_demo_without_leak_passes_against_its_own_baseline_three_times_of_three(demo_baseline):
    for attempt in range(3):
        out = check("--baseline", str(demo_baseline), "--json", *demo_args("--no-leak"))
        result = json.loads(out.stdout)
        assert out.returncode == 0, (attempt, out.stdout, out.stderr)
        assert result["schema"] == "gpuscope.check/1" and result["verdict"] == "pass"
        growth = next(c for c in result["criteria"] if c["name"] == "rss-growth")
        assert growth["status"] == "pass", growth
        judged = [r for r in result["rounds"] if not r["warmup"]]
        assert len(judged) == 2 and all(r["completed"] and r["requests"] > 0 and r["p95_s"] > 0 for r in judged)
        assert all(r["sites"] is not None for r in judged), judged  # memray ran in every judged round
        assert not any(s["function"] == "_remember" for r in judged for s in r["sites"])  # the leak is off


def test_demo_with_the_leak_fails_and_names_the_leaking_function(demo_baseline, tmp_path):
    junit, markdown = tmp_path / "check.xml", tmp_path / "check.md"
    out = check("--baseline", str(demo_baseline), "--junit", str(junit), "--markdown", str(markdown),
                *demo_args("--leak-kb", "640"))  # ~6 MB per second of load: far beyond the tolerance
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout
    assert text.startswith("gpuscope check: FAIL")
    assert "FAIL    rss-growth" in text
    # The code named in the failure: the retriever's unbounded cache, with file:line.
    assert "Sites that grew" in text, text
    sites = text.split("Sites that grew", 1)[1]
    first = sites.splitlines()[1]
    assert "_remember" in first and "gpuscope/demo/service.py:" in first, sites
    for path in (junit, markdown):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert {"round 0 (warm-up)", "round 1", "round 2", "command", "load", "rss-growth", "leak"} <= set(cases)
    failure = cases["rss-growth"].find("failure")
    assert failure is not None and "_remember" in failure.text
    assert cases["round 1"].find("failure") is not None and cases["command"].find("failure") is None
    assert int(suite.get("failures")) >= 3
    md = markdown.read_text()
    assert "## gpuscope check: **FAIL**" in md and "`_remember`" in md and "RSS floor (MiB) by round" in md
    assert "Memory allocated during a round" in md and "Memory memory" not in md


NOISY_FLAT = """
import random, time
held = bytearray(20_000_000)  # what the service keeps for its life
print("ready", flush=True)
while True:
    # Requests' temporaries: 40-80 MB each (one or two at once; above glibc's largest mmap
    # threshold, 32 MiB, so freeing one gives it back), held for a moment, then freed: the peaks
    # swing by up to 160 MB while what stays never changes. Between requests the service idles
    # at least 0.15 s (longer than gpuscope's 0.1 s between samples).
    tmp = [bytearray(random.randint(40, 80) * 1_000_000) for _ in range(random.randint(1, 2))]
    time.sleep(random.uniform(0.02, 0.15))
    del tmp
    time.sleep(random.uniform(0.15, 0.25))
"""


def test_a_flat_service_with_noisy_temporaries_passes(tmp_path):
    noisy = program(tmp_path, "noisy.py", NOISY_FLAT)
    # A quiet part of 1 s holds two or more of the service's idle gaps even when a loaded machine
    # slows its requests and the sampling (at the default quarter round, 0.5 s, it once held none).
    out = check("--rounds", "3", "--round-seconds", "2", "--settle", "1", "--json", "--", PY, noisy)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    rss = [r["memory"]["rss"] for r in result["rounds"]]
    assert max(m["peak"] - m["floor"] for m in rss) > 40_000_000, out.stdout  # the temporaries were seen ...
    first = comparable_from(result)
    floors = [r["memory"]["rss"]["floor"] for r in result["rounds"] if r["round"] >= first]
    assert max(floors) - min(floors) < 10_000_000, out.stdout  # ... and the floors left them out
    criteria = {c["name"]: c for c in result["criteria"]}
    assert criteria["rss-growth"]["status"] == "pass" and criteria["leak"]["status"] == "pass"


FLAT = """
import time
held = bytearray(20_000_000)
while True:
    time.sleep(0.05)
"""


def test_a_probe_that_shows_late_is_primed_then_and_the_growth_judged_from_that_round(tmp_path):
    # The shell execs Python (same PID) after the check's wait for a probe and mid-way through the
    # warm-up round: memray is first loaded before round 1 or 2, and the floors before it (a
    # shell's, without the interpreter or memray) are no part of the growth line.
    flat = program(tmp_path, "flat.py", FLAT)
    out = check("--rounds", "3", "--round-seconds", "2", "--json", "--", "/bin/sh", "-c", f"sleep 4; exec {PY} {flat}")
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    late = [n for n in result["notes"] if "memray was first loaded" in n]
    assert len(late) == 1 and "its probe showed late" in late[0], result["notes"]
    first = comparable_from(result)
    rounds = {r["round"]: r for r in result["rounds"]}
    assert rounds[0]["memory"]["rss"]["floor"] < rounds[first]["memory"]["rss"]["floor"] - 10_000_000
    assert all(rounds[n]["sites"] is not None for n in range(first, 4)), result["rounds"]
    growth = next(c for c in result["criteria"] if c["name"] == "rss-growth")
    assert growth["status"] == "pass" and abs(growth["figures"]["growth_per_round_bytes"]) < 1_000_000, growth


CRASHES_IN_ROUND_2 = """
import os, sys, time
held = bytearray(10_000_000)
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.exit(3)
"""
# Each run counts the rounds; the third (round 2, after the warm-up and round 1) tells the service
# to crash and keeps loading for a second: the service dies mid-round.
COUNTING_LOAD = (
    "n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}; "
    "if [ $n -eq 2 ]; then touch {crash}; fi; sleep 1"
)


def test_a_service_that_crashes_mid_round_fails_with_its_exit_status_and_keeps_the_rounds(tmp_path):
    service = program(tmp_path, "crashes.py", CRASHES_IN_ROUND_2)
    crash, count = tmp_path / "crash-now", tmp_path / "count"
    load = COUNTING_LOAD.format(count=count, crash=crash)
    junit = tmp_path / "check.xml"
    out = check("--rounds", "3", "--load", load, "--json", "--junit", str(junit), "--", PY, service, str(crash))
    assert out.returncode == 1, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["verdict"] == "fail" and result["exit_status"] == 3
    assert "exited with status 3 during round 2" in result["stopped"]
    command = next(c for c in result["criteria"] if c["name"] == "command")
    assert command["status"] == "fail" and command["figures"]["exit_status"] == 3
    rounds = {r["round"]: r for r in result["rounds"]}
    assert rounds[0]["completed"] and rounds[1]["completed"] and rounds[1]["memory"]["rss"]["floor"] > 10_000_000
    assert not rounds[2]["completed"] and 3 not in rounds
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["round 2"].find("failure") is not None
    assert cases["round 3"].find("skipped") is not None
    assert cases["command"].find("failure").get("message").endswith("exited with status 3 during round 2")


def test_a_growing_gpu_service_already_running_fails_on_its_device(tmp_path, spawn_python):
    leaker = spawn_python(LEAKER)
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"devices": [{"name": "NVIDIA H200", "compute": [{"pid": leaker.pid, "used": "rss"}]}]}))
    out = check("--pid", str(leaker.pid), "--rounds", "2", "--warmup-rounds", "0", "--round-seconds", "3", "--json",
                env=fake_nvml_env(scenario))
    assert out.returncode == 1, out.stdout + out.stderr
    result = json.loads(out.stdout)
    criteria = {c["name"]: c for c in result["criteria"]}
    assert criteria["gpu0-growth"]["status"] == "fail", criteria
    assert criteria["gpu0-growth"]["figures"]["growth_per_round_bytes"] > 1_000_000
    assert all("gpu0" in r["memory"] for r in result["rounds"])
    assert leaker.poll() is None  # a service the check did not start is left running


@pytest.mark.parametrize(
    ("load", "expected"),
    [
        ("exit 7", "the load command exited with status 7 in round 0"),
        ("sleep 30", "the load command ran past the round timeout (1 s) in round 0"),
    ],
)
def test_a_failing_load_command_fails_the_load_criterion_not_the_service(load, expected):
    started = time.monotonic()
    out = check("--no-memray", "--round-timeout", "1", "--load", load, "--json", "--", PY, "-c", "import time; time.sleep(60)")
    assert out.returncode == 1, out.stdout + out.stderr
    assert time.monotonic() - started < 20  # the load command was stopped, and the service
    criteria = {c["name"]: c for c in json.loads(out.stdout)["criteria"]}
    assert criteria["load"]["status"] == "fail" and criteria["load"]["message"] == expected
    assert criteria["command"]["status"] == "pass"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist: write one from a known-good run with --update-baseline"),
        ('{"schema": "gpuscope.check/1", "rounds": []}', "has schema 'gpuscope.check/1' (a check result, not a baseline)"),
        ('{"schema": "gpuscope.check-baseline/1", "rounds": [{"round": 0, "mem', "is not valid JSON (corrupt or truncated)"),
        ('{"schema": "gpuscope.check-baseline/1", "rounds": [{"round": "x"}]}', "is damaged ("),
    ],
    ids=["missing", "other-schema", "corrupt", "damaged"],
)
def test_a_bad_baseline_is_one_line_and_nothing_starts(tmp_path, content, expected):
    baseline = tmp_path / "baseline.json"
    if content is not None:
        baseline.write_text(content)
    started = tmp_path / "started"
    out = check("--baseline", str(baseline), "--round-seconds", "1", "--", PY, "-c",
                f"open({str(started)!r}, 'w').close()", timeout=30)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and expected in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == "" and not started.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--load", "true", "--round-seconds", "2", "--", PY], "--round-seconds is for rounds without --load"),
        (["--update-baseline", "--", PY], "--update-baseline writes the file given with --baseline F"),
        (["--tolerance", "150", "--", PY], "--tolerance is a percentage"),
        (["--rounds", "2"], "give the service to run after '--'"),
        (["--", "/no/such/program"], "no such program: /no/such/program"),
        (["--junit", "/no/such/folder/check.xml", "--", PY], "/no/such/folder/check.xml: no such folder"),
    ],
)
def test_bad_options_are_one_line(args, expected):
    out = check(*args, timeout=30)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and expected in out.stderr, out.stderr


# -- the comparison itself, over figures (no processes) ---------------------------------------------


def rounds_of(floors, requests=None) -> tuple[Round, ...]:
    return tuple(Round(i, i == 0, 1.0, {"rss": Memory(int(f), int(f))}, requests[i] if requests else None)
                 for i, f in enumerate(floors))


def run_of(floors, requests=None) -> CheckRun:
    return CheckRun("svc", {"mode": "time", "rounds": len(floors) - 1}, rounds_of(floors, requests))


def baseline_of(floors, requests=None) -> Baseline:
    return Baseline("base.json", rounds_of(floors, requests), {})


def test_growth_beyond_the_tolerance_of_the_floor_fails_and_within_it_passes():
    base = baseline_of([100e6, 100.1e6, 100.2e6, 100.3e6])
    assert judge(run_of([100e6, 101e6, 102e6, 103e6]), base).passed  # +1 MB/round: 1 % of 100 MB
    failed = judge(run_of([100e6, 105e6, 110e6, 115e6]), base)  # +5 MB/round
    assert not failed.passed and [c.name for c in failed.failed] == ["rss-growth"]
    assert set(failed.round_failures) == {1, 2, 3}
    assert judge(run_of([100e6, 105e6, 110e6, 115e6]), base, tolerance_pct=6).passed


def test_the_noise_of_the_rounds_widens_the_allowance():
    # Floors that scatter by 20 MB around a flat line: an 8 MB/round slope through such floors is
    # noise, not growth (3 % of the floor alone would allow 3 MB/round).
    noisy = baseline_of([100e6, 120e6, 100e6, 120e6])
    assert judge(run_of([100e6, 100e6, 120e6, 120e6]), noisy).passed
    # A steady 4 MB/round, against a quiet baseline, is growth.
    assert not judge(run_of([100e6, 104e6, 108e6, 112e6]), baseline_of([100e6] * 4)).passed


def test_the_baseline_growth_is_compared_per_request():
    base = baseline_of([100e6, 110e6, 120e6, 130e6], requests=[10, 10, 10, 10])  # 1 MB per request
    assert judge(run_of([100e6, 120e6, 140e6, 160e6], requests=[20] * 4), base).passed  # twice the load
    assert not judge(run_of([100e6, 120e6, 140e6, 160e6], requests=[10] * 4), base).passed  # twice per request
