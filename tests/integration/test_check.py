"""`gpuscope check`: the CI memory gate, on real services.

The demo RAG service (its leak switched off with --no-leak, or on) driven by its own load
generator, and small Python programs that stay flat under noisy temporaries, crash mid-round, or
grow on a (fake-NVML) GPU. memray runs inside the services through gpuscope's probe. Rounds are
short (about a second of load each) so the whole file runs in about a minute.
"""

from __future__ import annotations

import json
import random
import socket
import stat
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from gpuscope.core.gate.report import to_junit, to_text
from gpuscope.core.gate.verdict import BASELINE_SCHEMA, Baseline, CheckRun, Memory, Round, Site, judge

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


def noisy_floors(rounds: int, per_round: float, seed: int) -> list[float]:
    """Floors of ~260 MB that scatter by +-5 % from round to round, rising `per_round` a round."""
    rng = random.Random(seed)
    return [260e6 + per_round * k + rng.uniform(-13e6, 13e6) for k in range(rounds + 1)]


def test_a_steady_rise_fails_however_noisy_the_floors_and_the_noise_alone_passes():
    # 10 MB a round in +-5 % scatter over 10 rounds: the trend's uncertainty shrinks with the rounds
    # (twice the largest residual, as allowed before, let 8 runs in 10 pass).
    for seed in range(10):
        leaking = judge(run_of(noisy_floors(10, 10e6, seed)), None)
        assert [c.name for c in leaking.failed] == ["rss-growth"], (seed, leaking.criteria)
        flat = judge(run_of(noisy_floors(10, 0.0, seed)), None)
        assert flat.passed, (seed, flat.criteria)


def with_sites(run: CheckRun, amounts: list[float], line: int = 11) -> CheckRun:
    """The run, its judged rounds carrying one site that held each of `amounts` at the round's end."""
    rounds = [replace(r, sites=(Site("do_GET", "svc.py", line, int(amounts[r.number - 1])),) if r.number > 0 else None)
              for r in run.rounds]
    return replace(run, rounds=tuple(rounds))


def test_a_site_that_kept_a_steady_amount_every_round_decides_where_the_floors_cannot():
    # 3 rounds of floors scattered +-5 %: the floors alone cannot tell 10 MB a round from noise.
    floors = [260e6, 262e6, 268e6, 275e6]  # +5 MB a round: within 3 % of 260 MB
    assert judge(run_of(floors), None).passed
    steady = judge(with_sites(run_of(floors), [10e6, 10e6, 10e6]), None)
    assert [c.name for c in steady.failed] == ["sites"]
    message = next(c.message for c in steady.criteria if c.name == "sites")
    assert "do_GET (svc.py:11) kept 9.5 MiB in each of the 3 tracked rounds" in message, message
    # a buffer of a random size replaced every round is no steady amount
    assert judge(with_sites(run_of(floors), [17e6, 22e6, 21e6]), None).passed
    # the same amount every round, but the floor fell: an object replaced by one of its size
    assert judge(with_sites(run_of([260e6, 258e6, 259e6, 255e6]), [10e6, 10e6, 10e6]), None).passed
    # the baseline kept as much at the same line: no growth against it
    base = Baseline("base.json", with_sites(run_of(floors), [10e6, 10e6, 10e6]).rounds, {})
    assert judge(with_sites(run_of(floors), [10e6, 10e6, 10e6]), base).passed


def test_the_summary_words_and_a_load_that_never_ran():
    never = CheckRun("svc", {"mode": "load", "rounds": 3, "load": "curl x"}, (), stopped="the service never got ready",
                     stopped_by="service")
    verdict = judge(never, None)
    load = next(c for c in verdict.criteria if c.name == "load")
    assert load.passed is None and "never ran" in load.message
    text = to_text(never, verdict, None)
    assert "FAIL (1 of 1 criterion failed)" in text, text
    falling = judge(run_of([100e6, 99.9e6, 99.8e6, 99.7e6]), None)
    growth = next(c for c in falling.criteria if c.name == "rss-growth")
    assert "floor fell 97.7 KiB per round" in growth.message and "-" not in growth.message.split("per round")[0]
    # Jenkins xUnit's junit-10.xsd allows `skipped` on a <testsuite>, not on <testsuites>
    root = ET.fromstring(to_junit(never, verdict, None).split("\n", 1)[1])
    assert "skipped" not in root.attrib and root.find("testsuite").get("skipped") is not None


KEEPER = """
import http.server, random, sys
leak = sys.argv[2] == "leak"
base = bytearray(250_000_000)
kept = []
held = bytearray(0)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global held
        held = bytearray(random.randint(0, 26_000_000))  # what a request leaves held varies: +-5 %
        if leak:
            kept.append(bytearray(10_000_000))  # the leaking line
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.mark.parametrize("kind", ["leak", "noise"])
def test_10_mb_a_round_in_5_percent_noise_fails_on_its_line_and_the_noise_alone_passes(tmp_path, kind):
    service = program(tmp_path, "keeper.py", KEEPER)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    # The request comes a second into the round: the round's tracker starts with the round, and on a
    # loaded machine asking the probe to start takes a while.
    load = f"{PY} -c \"import time, urllib.request; time.sleep(1.0); urllib.request.urlopen('{url}').read(); time.sleep(0.3)\""
    out = check("--json", "--ready-url", url, "--load", load, "--", PY, service, str(port), kind)
    result = json.loads(out.stdout)
    criteria = {c["name"]: c for c in result["criteria"]}
    if kind == "noise":
        assert out.returncode == 0, out.stdout + out.stderr
        return
    assert out.returncode == 1 and criteria["sites"]["status"] == "fail", out.stdout + out.stderr
    assert "keeper.py:14) kept 9.5 MiB in each of the 3 tracked rounds" in criteria["sites"]["message"]


def test_a_round_slower_than_the_one_before_is_tracked_to_its_end(tmp_path):
    """The warm-up round's load asks at once; every later round's waits 1.5 s first (a slow round,
    as a busy machine makes them). Asked for the warm-up round's length only, memray would have
    stopped before the request; it tracks until the round's busy part ends."""
    service = program(tmp_path, "keeper.py", KEEPER)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    marker = str(tmp_path / "warmed")
    load = (f"{PY} -c \"import os, time, urllib.request; os.path.exists('{marker}') and time.sleep(1.5); "
            f"open('{marker}', 'w').close(); urllib.request.urlopen('{url}').read()\"")
    out = check("--json", "--ready-url", url, "--load", load, "--", PY, service, str(port), "leak")
    criteria = {c["name"]: c for c in json.loads(out.stdout)["criteria"]}
    assert out.returncode == 1 and criteria["sites"]["status"] == "fail", out.stdout + out.stderr
    assert "keeper.py:14) kept 9.5 MiB in each of the 3 tracked rounds" in criteria["sites"]["message"]


BATCH = """
import sys, time
held = bytearray(int(sys.argv[1]) * 1_000_000)  # the job's peak
time.sleep(0.6)
if len(sys.argv) > 3:
    del held
    kept = bytearray(int(sys.argv[3]) * 1_000_000)  # what the job holds at its end
    time.sleep(0.6)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


def test_a_batch_that_keeps_more_at_its_end_fails_though_its_peak_is_the_baseline_s(tmp_path):
    """A job that peaks at 60 MB, then holds 5 MB at its end; the same job holding 40 MB at its end
    (what it kept grew: pytest-memray's limit_leaks, not limit_memory) fails `rss-retained` alone."""
    job = program(tmp_path, "job.py", BATCH)
    base = tmp_path / "batch-baseline.json"
    made = check("--batch", "--rounds", "2", "--baseline", str(base), "--update-baseline", "--", PY, job, "60", "0", "5")
    assert made.returncode == 0, made.stdout + made.stderr
    kept = check("--batch", "--rounds", "2", "--baseline", str(base), "--json", "--", PY, job, "60", "0", "40")
    criteria = {c["name"]: c["status"] for c in json.loads(kept.stdout)["criteria"]}
    assert kept.returncode == 1 and criteria == {"command": "pass", "rss-peak": "pass", "rss-retained": "fail"}, \
        kept.stdout


def test_a_batch_command_is_run_each_round_and_its_peak_compared_with_the_baseline(tmp_path):
    job = program(tmp_path, "job.py", BATCH)
    base = tmp_path / "batch-baseline.json"
    made = check("--batch", "--rounds", "2", "--baseline", str(base), "--update-baseline", "--", PY, job, "20")
    assert made.returncode == 0, made.stdout + made.stderr  # a command that finishes is no failure
    same = check("--batch", "--rounds", "2", "--baseline", str(base), "--json", "--", PY, job, "20")
    assert same.returncode == 0, same.stdout + same.stderr
    result = json.loads(same.stdout)
    assert result["settings"]["mode"] == "batch" and [r["round"] for r in result["rounds"]] == [0, 1, 2]
    assert {c["name"]: c["status"] for c in result["criteria"]} == {"command": "pass", "rss-peak": "pass",
                                                                   "rss-retained": "pass"}
    bigger = check("--batch", "--rounds", "2", "--baseline", str(base), "--json", "--", PY, job, "80")
    assert bigger.returncode == 1, bigger.stdout + bigger.stderr
    failed = {c["name"] for c in json.loads(bigger.stdout)["criteria"] if c["status"] == "fail"}
    assert "rss-peak" in failed
    crashed = check("--batch", "--rounds", "2", "--", PY, job, "20", "3")
    assert crashed.returncode == 1 and "exited with status 3" in crashed.stdout, crashed.stdout
    assert check("--batch", "--load", "true", "--", PY, job).returncode == 2
