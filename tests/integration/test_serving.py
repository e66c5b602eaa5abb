"""The scrape source live (ServingSource), once (observe), and `gpuscope metrics` end to end."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import subprocess
import sys
import time

import pytest

from gpuscope.core.serving.profiles import BUILTIN_PROFILES
from gpuscope.core.serving.promql import histogram_quantile
from gpuscope.core.serving.scrape import ScrapeCollector
from gpuscope.core.serving.source import ServingSource, make_collector, observe, scrape_schedule
from gpuscope.core.serving.model import SCHEMA, SIGNAL_NAMES, ServingSnapshot
from helpers import gpuscope_cmd, wait_until
from metrics_server import MetricsServer, Reply, ask, demo_service, linear_exposition

STATIC = """# TYPE rag_request_latency_seconds histogram
rag_request_latency_seconds_bucket{le="0.1"} 4
rag_request_latency_seconds_bucket{le="1.0"} 8
rag_request_latency_seconds_bucket{le="+Inf"} 10
rag_request_latency_seconds_sum 3
rag_request_latency_seconds_count 10
"""
STATIC_2 = STATIC.replace('"1.0"} 8', '"1"} 10').replace("} 4", "} 0").replace("+Inf\"} 10", "+Inf\"} 20")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collector(*urls: str, window_s: float = 0.0, timeout: float = 5.0) -> ScrapeCollector:
    return ScrapeCollector(list(urls), window_s=window_s, profiles=BUILTIN_PROFILES, timeout=timeout)


class Received:
    """Snapshots handed to the callback (on the source's thread)."""

    def __init__(self) -> None:
        self.snapshots: list[ServingSnapshot] = []

    def __call__(self, snapshot: ServingSnapshot) -> None:
        self.snapshots.append(snapshot)

    @property
    def last(self) -> ServingSnapshot | None:
        return self.snapshots[-1] if self.snapshots else None


@pytest.fixture
def server():
    with MetricsServer() as s:
        yield s


@pytest.fixture
def running():
    """Start ServingSources; every one is stopped after the test."""
    sources: list[ServingSource] = []

    def start(c, **kwargs) -> Received:
        source = ServingSource(c, **kwargs)
        received = Received()
        source.start(received)
        sources.append(source)
        return received

    yield start
    for s in sources:
        s.stop()


# -- live ----------------------------------------------------------------------------------------------


def test_live_rates_quantiles_and_history(server, running):
    server.route("/metrics", Reply(linear_exposition(slope=10.0)))
    # A window long beside the delay of a loaded machine between a scrape's timestamp and the
    # server's clock read (tens of milliseconds): the rates' error is that delay over the window.
    got = running(collector(server.url(), window_s=3.0), interval=0.1)
    # a full window of scrapes behind the newest snapshot
    wait_until(lambda: got.last and len(got.last.history) >= 35, timeout=30, what="a full window")
    snap = got.last
    assert snap.ok and snap.profile == "rag" and snap.source == "scrape" and snap.target == server.url()
    s = snap.signals
    # exact up to the jitter between the scrape's timestamp and the server's clock read
    assert s.requests_per_s == pytest.approx(11.0, rel=0.1)
    assert s.tokens_per_s == pytest.approx(400.0, rel=0.1)
    assert s.error_rate == pytest.approx(1 / 11, rel=1e-6)
    assert (s.e2e_latency_p50_s, s.e2e_latency_p99_s) == (pytest.approx(0.1), pytest.approx(0.5))
    assert snap.history[-1].signals == s and snap.series("requests_per_s")[-1] == (snap.history[-1].time, s.requests_per_s)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.state = "x"  # type: ignore[misc]


def test_down_target_is_a_state_not_a_crash(running):
    url = f"http://127.0.0.1:{free_port()}/metrics"
    got = running(collector(url, window_s=5.0), interval=0.1)
    wait_until(lambda: got.last, timeout=10, what="a snapshot")
    assert re.fullmatch(
        rf"unreachable since \d\d:\d\d:\d\d, retrying \(cannot reach {re.escape(url)}: connection refused\)",
        got.last.state,
    )
    assert got.last.profile is None and got.last.as_of is None


def test_slow_target_times_out_and_stop_does_not_wait_for_it(server, running):
    server.route("/metrics", Reply(STATIC, delay=30))
    c = collector(server.url(), timeout=0.3)
    source = ServingSource(c, interval=0.1)
    got = Received()
    source.start(got)
    try:
        wait_until(lambda: got.last, timeout=10, what="a snapshot")
        assert got.last.state.startswith("unreachable since ") and "within 0.3 s" in got.last.state
    finally:
        started = time.monotonic()
        source.stop()
        assert time.monotonic() - started < 2.5


@pytest.mark.parametrize(
    "reply, state",
    [
        (Reply("boom", status=500), r"http://127\.0\.0\.1:\d+/metrics answered HTTP 500 Internal Server Error"),
        (Reply("Service Unavailable\n<html>\n"), r"http://127\.0\.0\.1:\d+/metrics: not metrics \(an HTML page\)"),
        (Reply("this is { not metrics\n"), r"http://127\.0\.0\.1:\d+/metrics: not metrics \(1 unparseable line, no sample\)"),
        (Reply("# HELP vllm:num_requests_waiting q\n# TYPE vllm:num_requests_waiting gauge\n"),
         r"http://127\.0\.0\.1:\d+/metrics: not metrics \(no sample in it\)"),
    ],
    ids=["http-500", "html", "garbage", "no-samples"],
)
def test_wrong_answers_are_states_and_it_recovers(server, running, reply, state):
    server.route("/metrics", Reply(STATIC))
    got = running(collector(server.url()), interval=0.1)
    wait_until(lambda: got.last and got.last.ok, timeout=10, what="a good snapshot")
    good = got.last
    server.route("/metrics", reply)
    wait_until(lambda: not got.last.ok, timeout=10, what="the error state")
    bad = got.last
    assert re.fullmatch(state, bad.state)
    # the last good signals stay, marked as not current
    assert bad.signals == good.signals and bad.as_of is not None and bad.as_of < bad.time
    server.route("/metrics", Reply(STATIC))
    wait_until(lambda: got.last.ok, timeout=10, what="recovery")


def test_malformed_lines_are_skipped_and_counted(server, running):
    # A bad line in a family the profile reads is counted; lines of families it does not read
    # are never parsed (that is what keeps a 5 MB scrape affordable), so not counted either.
    broken = STATIC.replace('rag_request_latency_seconds_sum 3', 'rag_request_latency_seconds_bucket{le="0.5" 6\nrag_request_latency_seconds_sum 3')
    server.route("/metrics", Reply(broken + "...\ncurl localhost:9400/metrics\n"))
    got = running(collector(server.url()), interval=0.1)
    wait_until(lambda: got.last, timeout=10, what="a snapshot")
    assert got.last.ok and got.last.malformed_lines == 1
    assert got.last.signals.e2e_latency_p50_s == histogram_quantile(0.5, [(0.1, 4), (1.0, 8), (float("inf"), 10)])


# -- once (the headless path) ---------------------------------------------------------------------------


def test_several_targets_sum_like_sum_by_le():
    with MetricsServer() as a, MetricsServer() as b:
        a.route("/metrics", Reply(STATIC))
        b.route("/metrics", Reply(STATIC_2))
        snap = observe(collector(a.url(), b.url()))
    assert snap.ok and snap.target == f"{a.url()},{b.url()}"
    # "1.0" and "1" are one bucket: 4+0 <= 0.1, 8+10 <= 1, 30 in all
    summed = [(0.1, 4.0), (1.0, 18.0), (float("inf"), 30.0)]
    assert snap.signals.e2e_latency_p50_s == histogram_quantile(0.5, summed)
    assert snap.signals.e2e_latency_p95_s == histogram_quantile(0.95, summed)


def test_observe_a_window(server):
    server.route("/metrics", Reply(linear_exposition(slope=10.0)))
    lines: list[str] = []
    started = time.monotonic()
    snap = observe(collector(server.url(), window_s=1.0), progress=lines.append)
    assert 0.9 < time.monotonic() - started < 3.0
    assert len(lines) == 1 and lines[0].startswith(f"observing {server.url()} for 1 s")
    assert snap.ok and snap.window_s == 1.0
    assert snap.signals.requests_per_s == pytest.approx(11.0, rel=0.1)
    assert len([r for r in server.seen if r[0] == "/metrics"]) == len(scrape_schedule(1.0))


def test_schedule_reads_about_once_a_second_inside_the_window():
    assert scrape_schedule(0) == [0.0]
    offsets = scrape_schedule(30.0)
    assert len(offsets) == 31 and offsets[-1] < 30.0 and offsets[-1] > 29.9
    assert len(scrape_schedule(2.0)) == 5  # at least five reads


def test_observe_stops_at_the_first_failure():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    started = time.monotonic()
    snap = observe(collector(url, window_s=30.0))
    assert time.monotonic() - started < 2
    assert snap.state == f"cannot reach {url}: connection refused"


def test_job_filters_only_with_prometheus():
    with pytest.raises(ValueError, match="--job and --instance"):
        make_collector(window_s=0, metrics_urls=["http://127.0.0.1:1/metrics"], job="x")


# -- the command, end to end ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    with demo_service() as base:
        for i in range(4):
            ask(base, f"gpu memory growing on node {i}")
        yield base


def metrics_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*gpuscope_cmd(), "metrics", *args], capture_output=True, text=True, timeout=timeout)


def test_command_window_0_on_the_demo_service(demo):
    out = metrics_cmd("--metrics-url", f"{demo}/metrics", "--window", "0", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    # the contract's seven keys in order, then the ones added since
    assert list(doc) == ["schema", "source", "target", "profile", "window_s", "signals", "stages", "format", "p99_jump"]
    assert (doc["schema"], doc["source"], doc["target"], doc["profile"]) == (SCHEMA, "scrape", f"{demo}/metrics", "rag")
    assert doc["format"].startswith("text/plain; version=") and doc["p99_jump"] is None  # as the server declares it
    assert doc["window_s"] == 0.0
    assert list(doc["signals"]) == list(SIGNAL_NAMES)
    assert doc["signals"]["tokens_per_s"] is None and doc["signals"]["requests_per_s"] is None
    assert doc["signals"]["kv_cache_usage"] is None  # the demo has no KV cache: null, not 0
    assert 0 < doc["signals"]["e2e_latency_p50_s"] <= doc["signals"]["e2e_latency_p95_s"] <= doc["signals"]["e2e_latency_p99_s"]
    assert list(doc["stages"]) == ["retriever", "reranker", "llm"]
    for stage in doc["stages"].values():
        assert list(stage) == ["p50_s", "p95_s", "p99_s", "share"]
        assert stage["p95_s"] > 0
    assert sum(s["share"] for s in doc["stages"].values()) == pytest.approx(1.0)


def test_command_window_3_under_load(demo):
    load = subprocess.Popen(
        [sys.executable, "-m", "gpuscope.demo.load", "--url", demo, "--rate", "6", "--concurrency", "2", "--duration", "20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        out = metrics_cmd("--metrics-url", f"{demo}/metrics", "--window", "3", "--json")
    finally:
        load.kill()
        load.wait(timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"observing {demo}/metrics for 3 s")
    signals = json.loads(out.stdout)["signals"]
    assert signals["tokens_per_s"] > 0 and signals["requests_per_s"] > 0


def test_command_table(demo):
    out = metrics_cmd("--metrics-url", f"{demo}/metrics", "--window", "0")
    assert out.returncode == 0, out.stderr
    assert "profile: rag" in out.stdout and re.search(r"e2e latency p95\s+\d", out.stdout)
    assert re.search(r"^\s+retriever\s+\d", out.stdout, re.M)


@pytest.mark.parametrize(
    "route, args, pattern",
    [
        (None, [], r"gpuscope: cannot reach http://127\.0\.0\.1:\d+/metrics: connection refused"),
        (Reply("boom", status=500), [], r"gpuscope: http://127\.0\.0\.1:\d+/metrics answered HTTP 500"),
        (Reply("this is not\nan exposition\n"), [], r"gpuscope: .*/metrics: not metrics \(2 unparseable lines, no sample\)"),
    ],
    ids=["unreachable", "http-500", "garbage"],
)
def test_command_errors_are_one_or_two_plain_lines(route, args, pattern):
    with MetricsServer() as s:
        url = s.url() if route else f"http://127.0.0.1:{free_port()}/metrics"
        if route:
            s.route("/metrics", route)
        out = metrics_cmd("--metrics-url", url, "--window", "0", *args, timeout=30)
    assert out.returncode == 1
    assert out.stdout == "" and "Traceback" not in out.stderr
    assert 1 <= len(out.stderr.strip().splitlines()) <= 2
    assert re.match(pattern, out.stderr)


DEAD = "http://127.0.0.1:9/metrics"  # never reached: the input is refused first


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--metrics-url", DEAD, "--window", "-1"], r"gpuscope: argument --window: must be at least 0 seconds"),
        (["--metrics-url", DEAD, "--window", "abc"], r"gpuscope: argument --window: expected a number of seconds"),
        (["--metrics-url", DEAD, "--window", "0.5"], r"gpuscope: --window must be 0 or at least 1 second"),
        (["--metrics-url", DEAD, "--window", "7200"], r"gpuscope: --window 7200 with --metrics-url would watch"),
        (["--metrics-url", DEAD, "--job", "x"], r"gpuscope: --job and --instance filter a Prometheus server"),
        (["--metrics-url", "localhost:8000/metrics"], r"gpuscope: not an http\(s\) URL: 'localhost:8000/metrics'"),
        ([], r"gpuscope: one of the arguments --metrics-url --prometheus is required"),
    ],
    ids=["negative", "not-a-number", "sub-second", "too-long", "job-without-prometheus", "not-a-url", "no-source"],
)
def test_command_bad_input_exits_2(args, pattern):
    out = metrics_cmd(*args, timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert re.match(pattern, out.stderr)


@pytest.mark.parametrize("window", [[], ["--window", "30"]], ids=["now", "window-30"])
def test_command_fails_on_the_first_scrape_of_what_is_not_metrics(window):
    with MetricsServer() as s:
        s.route("/metrics", Reply("this is { not metrics\n"))
        started = time.monotonic()
        out = metrics_cmd("--metrics-url", s.url(), *window, timeout=30)
    assert time.monotonic() - started < 10 and len([p for p, _ in s.seen if p == "/metrics"]) == 1
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines()[0] == f"gpuscope: {s.url()}: not metrics (1 unparseable line, no sample)"
