"""`gpuscope ramp` against real services on loopback, each with a limit it is built to have.

The capacities are low (ten to twenty requests a second, a worker's service time a sleep) and
kept by the clock, so a busy machine does not move them: a pool of N workers holding a request
S seconds serves N / S a second at most. What a busy machine does move is latency: a thread
wakes late, a starved client sends two requests together. So each pool's service time sits in
the middle of a bucket of its latency histogram, with 100 ms of room above it (200 ms in
(0.2, 0.3]): only a queue that keeps growing, which is what a load past the capacity makes,
moves the P99 the stop rule judges. Below the capacity, a query waits only behind a burst
larger than the pool.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET

import pytest

from helpers import SUPPORT, fake_nvml_env, free_port, gpuscope_cmd, wait_until

SERVICE = str(SUPPORT / "ramp_service.py")
FAST_RULE = ["--interval", "1", "--baseline-points", "8", "--step-seconds", "3", "--watch", "4"]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def ramp(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    return subprocess.run([*gpuscope_cmd(), "ramp", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def serve():
    """Start a service (argv), wait until it answers; stopped after the test."""
    started: list[subprocess.Popen] = []

    def start(*argv: str) -> str:
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        started.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        return line.split()[-1].rstrip("/")

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def pool(workers: int, service_ms: int) -> tuple[list[str], float]:
    """The test service's arguments for a pool, and the capacity it is built with (requests/s)."""
    return ["--workers", str(workers), "--service-ms", str(service_ms)], workers * 1000 / service_ms


def assert_knee_at(knee: dict, capacity: float, step: float) -> None:
    """What the ramp guarantees of a pool of known capacity C ramped by `step`. Below C the pool
    carries the load and the P99 holds: no knee there. At C the queue walks at random and may
    grow; past C it grows by what is sent beyond C a second, and the P99 with it: the knee comes
    at C + step, or a step later when a starved client let slots go and sent less than asked.
    Saturated, the knee is what it served: C less the hand-offs, within 5 %, and never more than
    C but for the requests already in service when the measuring began (the pool's size over the
    seconds measured: a few %; 2.4 % seen on a busy machine); at C without saturation, the middle
    of C - step and C."""
    assert capacity <= knee["rate"] <= capacity + 2 * step, knee
    if knee["method"] == "saturated":
        assert 0.95 * capacity <= knee["critical_rps"] <= 1.05 * capacity, knee
    else:
        assert capacity - step <= knee["critical_rps"] <= capacity, knee


def test_the_demo_with_a_known_capacity_breaks_there(serve):
    """Three workers of 300 ms: 10 queries/s. The ramp goes 4, 5, ... and breaks at 10 to 12. A
    query takes ~300 ms, inside the demo's 250-500 ms latency bucket: a slow one on a busy machine
    does not cross into the next."""
    url = serve("-m", "gpuscope.demo.service", "--port", "0", "--no-leak", "--no-probe", "--workers", "3",
                "--service-ms", "300")
    capacity = 3 * 1000 / 300
    done = ramp("--target", f"{url}/query?q=gpu+memory+growth", "--metrics-url", f"{url}/metrics",
                "--start-rps", "4", "--step-rps", "1", "--max-rps", "20", *FAST_RULE, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["schema"] == "gpuscope.ramp/1"
    assert result["stopped_by"] == "p99" and result["p99_source"] == "service"
    knee = result["knee"]
    assert_knee_at(knee, capacity, 1)
    assert knee["uncertainty_rps"] < 1.0
    moved = {m["name"]: m for m in knee["moved"]}
    assert moved["queue"]["at"] > moved["queue"]["before"]  # requests waited for a worker
    assert all(s["service"]["e2e_latency_p99_s"] is not None for s in result["steps"])


def test_a_service_whose_latency_breaks_at_a_known_throughput(serve, tmp_path):
    """Four workers of 200 ms: 20 requests/s. Markdown (with its chart) and JUnit say the same knee,
    and a CI job that needs 25/s fails."""
    args, capacity = pool(4, 200)
    url = serve(SERVICE, *args)
    md, junit = tmp_path / "ramp.md", tmp_path / "ramp.xml"
    done = ramp("--target", f"{url}/work", "--metrics-url", f"{url}/metrics", "--start-rps", "10", "--step-rps", "2",
                "--max-rps", "40", *FAST_RULE, "--json", "--markdown", str(md), "--junit", str(junit), "--min-rps", "25")
    assert done.returncode == 1 and "below --min-rps 25" in done.stderr, done.stderr
    result = json.loads(done.stdout)
    assert result["stopped_by"] == "p99" and result["p99_source"] == "service"
    # the rule as given, the incident's defaults for what was not: 3.2 sd, drift 0.5, three breaks
    assert result["settings"]["rule"] == {"interval_s": 1.0, "baseline_points": 8, "threshold": 3.2, "drift": 0.5,
                                          "breaks": 3, "watch_s": 4.0, "min_spread": 0.05}
    # at every step both P99s: the service's histograms and gpuscope's own measure
    assert all(s["client_p99_s"] and s["service"]["e2e_latency_p99_s"] for s in result["steps"])
    knee = result["knee"]
    assert_knee_at(knee, capacity, 2)
    text = md.read_text()
    assert f"critical throughput {knee['critical_rps']:.2f}" in text and "P99 ms" in text  # the chart's legend
    assert oct(md.stat().st_mode & 0o777) == "0o600"
    suite = ET.parse(junit).getroot().find("testsuite")
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == [f"step {knee['step']} at {knee['rate']:g} requests/s"]


KV_REQUESTS = 40  # the requests the vLLM-named test service's KV-cache holds


@pytest.mark.parametrize("output", ["json", "text"])
def test_a_kv_cache_that_fills_with_the_queue_is_named_at_the_knee(serve, tmp_path, output):
    """A service with vLLM's names whose KV-cache holds every request from its arrival to its answer
    (4 workers of 200 ms: 20 requests/s). Past the capacity the queue grows and the cache fills with
    it: the knee names the KV-cache among what moved, fuller than the step before, and at least as
    full as the queue alone makes it (both gauges from one scrape)."""
    args, capacity = pool(4, 200)
    url = serve(SERVICE, *args, "--vllm", "--kv-requests", str(KV_REQUESTS))
    done = ramp("--target", f"{url}/work", "--metrics-url", f"{url}/metrics", "--start-rps", "12", "--step-rps", "5",
                "--max-rps", "40", *FAST_RULE, *(["--json"] if output == "json" else []))
    assert done.returncode == 0, done.stderr
    if output == "json":
        result = json.loads(done.stdout)
        assert result["stopped_by"] == "p99" and result["p99_source"] == "service"
        assert_knee_at(result["knee"], capacity, 5)
        moved = {m["name"]: m for m in result["knee"]["moved"]}
        kv, queue = moved["KV-cache"], moved["queue"]
        assert kv["unit"] == "fraction" and all(s["service"]["kv_cache_usage"] is not None for s in result["steps"])
    else:
        line = next(line for line in done.stdout.splitlines() if line.startswith("at the knee: "))
        found = re.search(r"queue (\d+\.\d) -> (\d+\.\d); KV-cache (\d+\.\d)% -> (\d+\.\d)%", line)
        assert found, line
        queue = {"before": float(found[1]), "at": float(found[2])}
        kv = {"before": float(found[3]) / 100, "at": float(found[4]) / 100}
    assert queue["at"] > queue["before"]
    assert 0 <= kv["before"] < kv["at"] <= 1, kv
    assert kv["at"] >= min(1.0, queue["at"] / KV_REQUESTS) - 0.001, (kv, queue)  # text rounds to 0.1 %


def test_a_service_that_errors_instead_of_slowing_down_stops_at_the_error_limit(serve):
    url = serve(SERVICE, "--error-above", "12")
    done = ramp("--target", f"{url}/work", "--metrics-url", f"{url}/metrics", "--start-rps", "6", "--step-rps", "2",
                "--max-rps", "40", "--max-error-rate", "5", *FAST_RULE, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["stopped_by"] == "error-rate", result["stop_reason"]
    knee = result["knee"]
    assert knee["rate"] in (12, 14, 16)  # at 12/s only when bursts pass the bucket
    # What it served there (a loaded machine sends in bursts, so the bucket may let a step more through).
    assert 10.0 <= knee["critical_rps"] <= knee["rate"], knee
    assert {m["name"] for m in knee["moved"]} >= {"error rate"}


def test_a_chat_service_that_keeps_memory_per_turn_names_it_and_its_code(tmp_path):
    """Started by the ramp under the probe: 512 KiB kept a turn, found by the slope and by memray."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    done = ramp("--target", f"{url}/v1/chat/completions", "--chat", "--turns", "3", "--metrics-url", f"{url}/metrics",
                "--start-rps", "8", "--step-rps", "4", "--max-rps", "16", "--interval", "1", "--baseline-points", "6",
                "--step-seconds", "3", "--json", "--", sys.executable, SERVICE, "--port", str(port), "--keep-kb", "512",
                timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["mode"] == "chat" and result["stopped_by"] == "max-rate"
    memory = result["memory"]
    assert memory["per_turn_bytes"] == pytest.approx(512 * 1024, rel=0.1)
    assert memory["per_request_bytes"] == pytest.approx(512 * 1024, rel=0.1)
    top = memory["sites"][0]
    assert top["function"] == "remember_request" and top["file"].endswith("ramp_service.py")
    assert top["bytes_per_request"] == pytest.approx(512 * 1024, rel=0.15)
    # its code path, as the diagnosis names it: the request handler that called it, innermost first
    path = [(f["function"], f["file"].rsplit("/", 1)[-1]) for f in top["stack"]]
    assert path[:2] == [("remember_request", "ramp_service.py"), ("_serve", "ramp_service.py")], path
    assert ("do_POST", "ramp_service.py") in path
    assert all(s["turns"] == s["ok"] for s in result["steps"])  # every answer was a turn of a conversation


def scraped(url: str) -> dict[str, float]:
    """The service's /metrics as {series: value} (the series with its labels, as written)."""
    with _OPENER.open(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


QUICK = ["--start-rps", "10", "--max-rps", "10", "--interval", "0.5", "--baseline-points", "4", "--step-seconds", "0.5"]


def test_a_body_file_is_posted_whole_with_every_request(serve, tmp_path):
    url = serve(SERVICE)
    body = tmp_path / "body.json"
    body.write_bytes(b'{"query": "why is gpu memory growing", "k": 8}' * 20)
    done = ramp("--target", f"{url}/work", "--body", str(body), *QUICK, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # Why the ramp stopped is not this test's business: one slow request on a busy machine can
    # end a half-second step by its P99 (seen once) before the maximum rate; the bodies sent are.
    assert result["mode"] == "http" and result["stopped_by"] in ("max-rate", "p99"), result["stopped_by"]
    ok, sent = sum(s["ok"] for s in result["steps"]), sum(s["sent"] for s in result["steps"])
    got = scraped(url)
    assert ok >= 10 and ok <= got["ramp_test_bodies_total"] <= sent  # a request cut off at the end may have arrived
    assert got["ramp_test_body_bytes_total"] == got["ramp_test_bodies_total"] * body.stat().st_size
    assert got["ramp_test_bodies_distinct"] == 1


def test_a_template_posts_a_different_body_each_request(serve):
    url = serve(SERVICE)
    done = ramp("--target", f"{url}/work", "--template", '{"query": "why is gpu memory growing {n}"}', *QUICK, "--json")
    assert done.returncode == 0, done.stderr
    got = scraped(url)
    assert got["ramp_test_bodies_total"] >= 10
    assert got["ramp_test_bodies_distinct"] == got["ramp_test_bodies_total"]


def test_chat_conversations_keep_their_context_turn_after_turn(serve):
    """Two workers, so each holds its conversation through its turns: every request the service
    got carried the conversation so far, its own answers included; turns 1, 2 and 3 all came."""
    url = serve(SERVICE)
    done = ramp("--target", f"{url}/v1/chat/completions", "--chat", "--turns", "3", "--concurrency", "2", *QUICK,
                "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["mode"] == "chat" and all(s["turns"] == s["ok"] for s in result["steps"])
    got = scraped(url)
    turns = [got.get(f'ramp_test_chat_turns_total{{turn="{t}"}}', 0) for t in (1, 2, 3, 4)]
    assert turns[0] >= turns[1] >= turns[2] >= 2 and turns[3] == 0, turns
    assert got['ramp_test_chat_context_total{kept="yes"}'] == sum(turns)
    assert got.get('ramp_test_chat_context_total{kept="no"}', 0) == 0


def table(lines: list[str], first: str) -> list[dict[str, str]]:
    """The rows of a text or Markdown table whose header begins with `first`, as {column: cell}
    (text cells are two spaces apart at least, a latency such as "212 ms" has one)."""
    def cells(line: str) -> list[str]:
        if line.startswith("|"):
            return [c.strip() for c in line.strip("|").split("|")]
        return re.split(r"\s{2,}", line.strip())

    header = next(k for k, line in enumerate(lines) if cells(line)[0] == first)
    names = cells(lines[header])
    rows = []
    for line in lines[header + 1:]:
        if not line.strip() or line.startswith("|---"):
            if rows:
                break
            continue
        rows.append(dict(zip(names, cells(line))))
    return rows


def ms(cell: str) -> float:
    number, unit = cell.split()
    return float(number) * (1000 if unit == "s" else 1)


TEXT_COLUMNS = ("step", "asked/s", "served/s", "P95 cli", "P99 cli", "P95 svc", "P99 svc", "TTFT P95", "tok/s", "errors",
                "queue", "mem/req", "GPU grown")
MARKDOWN_COLUMNS = ("step", "asked/s", "served/s", "P95 client", "P99 client", "P95 service", "P99 service", "TTFT P95",
                    "tokens/s", "errors", "queue", "memory/request", "GPU memory grown")


def test_the_time_limit_ends_the_ramp_and_the_text_says_what_was_measured(tmp_path):
    """--max-time inside the baseline: no knee, the time limit named, and the step measured so far
    in the text (the default output) and the Markdown, with every figure of a step: both P95s and
    P99s, the TTFT (a quarter of the 200 ms service time after a worker takes a query: under the
    service's P95), tokens/s, errors, queue, memory per request, and GPU memory (the fake driver
    playing the service's RSS as its memory on the device)."""
    args, _ = pool(4, 200)
    proc = subprocess.Popen([sys.executable, SERVICE, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = proc.stdout.readline().split()[-1].rstrip("/")
        scenario = tmp_path / "nvml.json"
        scenario.write_text(json.dumps({"devices": [{"name": "NVIDIA H200", "compute": [{"pid": proc.pid, "used": "rss"}]}]}))
        md = tmp_path / "ramp.md"
        started = time.monotonic()
        done = subprocess.run([*gpuscope_cmd(), "ramp", "--target", f"{url}/work", "--metrics-url", f"{url}/metrics",
                               "--pid", str(proc.pid), "--no-memray", "--start-rps", "5", "--interval", "0.5",
                               "--max-time", "3", "--markdown", str(md)],
                              capture_output=True, text=True, timeout=60, env=fake_nvml_env(scenario))
    finally:
        proc.terminate()
        proc.wait(10)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    lines = done.stdout.splitlines()
    assert lines[0].endswith(": no knee found: the time limit was reached"), lines[0]
    assert "the stop rule judged the service's P99 (the service histograms)" in done.stdout
    for rows, columns in ((table(lines, "step"), TEXT_COLUMNS), (table(md.read_text().splitlines(), "step"), MARKDOWN_COLUMNS)):
        assert len(rows) == 1 and tuple(rows[0]) == columns, rows
        row = list(rows[0].values())
        assert row[:2] == ["1", "5"] and 0 < float(row[2]) <= 5.5  # served/s of the one step
        latencies = [ms(c) for c in row[3:8]]  # P95 and P99, client and service; TTFT
        assert all(v > 0 for v in latencies) and latencies[4] < latencies[2], row
        assert float(row[8]) > 0 and row[9].endswith("%") and float(row[10]) >= 0  # tokens/s, errors, queue
        assert all(re.fullmatch(r"[+-]\d+(\.\d)?[BKMGT]", c) for c in row[11:]), row  # memory per request, GPU


def test_gpu_memory_kept_per_request_is_the_service_processes_own_on_its_devices(tmp_path):
    """--pid: the service's GPU memory through NVML (the fake driver, playing its RSS as its memory
    on the device) at every interval, read then (a reading asked an interval before would lag the
    requests served, and under a rising load read low), and what it keeps per request on the
    GPU: 256 KiB."""
    proc = subprocess.Popen([sys.executable, SERVICE, "--keep-kb", "256"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        url = proc.stdout.readline().split()[-1].rstrip("/")
        scenario = tmp_path / "nvml.json"
        scenario.write_text(json.dumps({"devices": [{"name": "NVIDIA H200", "compute": [{"pid": proc.pid, "used": "rss"}]}]}))
        done = subprocess.run([*gpuscope_cmd(), "ramp", "--target", f"{url}/work", "--pid", str(proc.pid), "--no-memray",
                               "--start-rps", "4", "--step-rps", "8", "--max-rps", "20", "--interval", "1",
                               "--baseline-points", "4", "--step-seconds", "2", "--json"],
                              capture_output=True, text=True, timeout=90, env=fake_nvml_env(scenario))
    finally:
        proc.terminate()
        proc.wait(10)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert all(i["gpu_bytes"] for i in result["intervals"])
    assert result["memory"]["gpu_per_request_bytes"] == pytest.approx(256 * 1024, rel=0.1)
    assert all(s["gpu_growth_bytes"] > 0 for s in result["steps"])


def test_ctrl_c_stops_the_load_at_once_and_still_writes_what_was_measured(serve, tmp_path):
    url = serve(SERVICE, "--workers", "4", "--service-ms", "20")
    md = tmp_path / "ramp.md"
    proc = subprocess.Popen([*gpuscope_cmd(), "ramp", "--target", f"{url}/work", "--metrics-url", f"{url}/metrics",
                             "--start-rps", "20", "--interval", "1", "--json", "--markdown", str(md)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    wait_until(lambda: lines.append(proc.stderr.readline()) or sum("served" in line for line in lines) >= 3,
               timeout=30, what="three intervals")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 130
    result = json.loads(out)
    assert result["stopped_by"] == "interrupted" and len(result["intervals"]) >= 3
    assert md.exists()

    def served() -> float:
        with _OPENER.open(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("rag_request_total{"))

    before = served()
    time.sleep(1.0)
    assert served() == before  # nothing more was sent after gpuscope ended


@pytest.mark.parametrize("args, expected", [
    ([], "give --target URL"),
    (["--target", "ftp://x/"], "http:// or https://"),
    (["--target", "http://127.0.0.1:1/", "--template", "no number"], "{n}"),
    (["--load-command", "hey -q 5 http://x"], "give --metrics-url"),
    (["--load-command", "hey http://x", "--metrics-url", "http://127.0.0.1:1/metrics"], "{rate}"),
    (["--target", "http://127.0.0.1:1/", "--start-rps", "50", "--max-rps", "10"], "at most the maximum"),
    (["--target", "http://127.0.0.1:1/", "--baseline-points", "2"], "3 points or more"),
    (["--target", "http://127.0.0.1:1/", "--body", "/nonexistent/body"], "--body /nonexistent/body"),
])
def test_bad_options_are_one_line(args, expected):
    done = ramp(*args, timeout=30)
    assert done.returncode == 2
    assert expected in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_target_nothing_listens_on_is_one_line_before_any_ramp():
    port = free_port()
    done = ramp("--target", f"http://127.0.0.1:{port}/x", timeout=30)
    assert done.returncode == 1
    assert done.stderr.strip() == f"gpuscope: cannot reach --target http://127.0.0.1:{port}/x: Connection refused"


def test_a_load_command_is_run_per_step_with_its_rate(serve, tmp_path):
    """The user's load tool (here: curl in a loop) gets each step's rate; latency from the histograms."""
    args, capacity = pool(2, 200)
    url = serve(SERVICE, *args)
    rates = tmp_path / "rates"
    tool = tmp_path / "load.py"
    tool.write_text(
        "import sys, time, threading, urllib.request\n"
        f"open({str(rates)!r}, 'a').write(sys.argv[1] + '\\n')\n"
        "rate = float(sys.argv[1]); opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
        "def one():\n"
        "    try: opener.open(sys.argv[2], timeout=10).read()\n"
        "    except OSError: pass\n"
        "while True:\n"
        "    threading.Thread(target=one, daemon=True).start(); time.sleep(1 / rate)\n")
    done = ramp("--load-command", f"{sys.executable} {tool} {{rate}} {url}/work", "--metrics-url", f"{url}/metrics",
                "--start-rps", "4", "--step-rps", "2", "--max-rps", "30", *FAST_RULE, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["mode"] == "command" and result["p99_source"] == "service"
    assert result["stopped_by"] == "p99"
    assert_knee_at(result["knee"], capacity, 2)  # served as the service counted it
    assert rates.read_text().split()[:3] == ["4", "6", "8"]


def test_the_service_signals_can_come_from_prometheus(serve, tmp_path):
    """A real Prometheus scraping the service every second: the P99s the rule judges are its own."""
    from prometheus_server import running_prometheus

    args, capacity = pool(4, 200)
    url = serve(SERVICE, *args)
    with running_prometheus(tmp_path, [("ramped", "/metrics", url.split("//")[1])]) as prom:
        wait_until(lambda: prom.value('up{job="ramped"}') == 1, timeout=30, what="Prometheus scraping the service")
        done = ramp("--target", f"{url}/work", "--prometheus", prom.url, "--job", "ramped", "--start-rps", "12",
                    "--step-rps", "4", "--max-rps", "40", "--interval", "2", "--baseline-points", "6",
                    "--step-seconds", "4", "--watch", "4", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["p99_source"] == "service" and result["stopped_by"] == "p99"
    assert_knee_at(result["knee"], capacity, 4)


HOSTILE = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            if self.path.startswith("/huge"):
                while True:  # an endless answer, as fast as it can
                    self.wfile.write(b"x" * 65536)
            while True:  # a byte a second, for ever
                self.wfile.write(b"x"); self.wfile.flush(); time.sleep(1)
        except OSError:
            pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
"""


@pytest.mark.parametrize("path, expected", [("/huge", "over 4 MiB"), ("/drip", "no answer within 2 s")])
def test_a_hostile_service_costs_bounded_answers_and_ends_at_the_error_limit(serve, tmp_path, path, expected):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)
    url = serve(str(script))
    started = time.monotonic()
    done = ramp("--target", f"{url}{path}", "--timeout", "2", "--start-rps", "5", *FAST_RULE, "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["stopped_by"] == "error-rate" and result["steps"][0]["ok"] == 0
    assert time.monotonic() - started < 30
    assert expected in done.stderr or expected in json.dumps(result)
