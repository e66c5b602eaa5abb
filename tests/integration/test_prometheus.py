"""The Prometheus source against a real Prometheus (Debian's package, 2.42), and its secrets.

One Prometheus per module, on a free loopback port with a temporary data dir and a
1 s scrape interval, scraping the demo RAG service and this test's own endpoints: a static
exposition (the SGLang sample), a linear one (known rates) and a dcgm-exporter-like one (the
fleet view). The same data read by the scrape source and by PromQL must agree: quantiles to
1e-9 with --window 0, rates within what scrape timing allows.
"""

from __future__ import annotations

import json
import math
import subprocess
import time

import pytest

from gpuscope.core.serving.profiles import BUILTIN_PROFILES
from gpuscope.core.serving.prometheus import PrometheusCollector
from gpuscope.core.serving.scrape import ScrapeCollector
from gpuscope.core.serving.source import ServingSource, observe
from gpuscope.core.serving.model import SIGNAL_NAMES, ServingSnapshot
from helpers import FIXTURES, free_port, gpuscope_cmd, wait_until
from prometheus_server import Prometheus, running_prometheus
from metrics_server import MetricsServer, RawServer, Reply, ask, demo_service, linear_exposition

TOKEN = "tok-Zq81-very-secret"
PASSWORD = "pa55-w0rd-secret"


def dcgm_exposition(start: float):
    """Two GPUs on two hosts: one fills at 2 MiB/s, one is flat (dcgm-exporter's labels)."""

    def body() -> str:
        used = 1000.0 + 2.0 * (time.time() - start)
        common = 'DCGM_FI_DRIVER_VERSION="550.54",container="server",namespace="llm"'
        return (
            "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
            f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-aaaa",Hostname="node-a",{common},pod="vllm-0"}} {used!r}\n'
            f'DCGM_FI_DEV_FB_USED{{gpu="1",UUID="GPU-bbbb",Hostname="node-b",{common},pod="vllm-1"}} 5000\n'
        )

    return body


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(prometheus, demo base URL, test endpoints server)."""
    tmp = tmp_path_factory.mktemp("prometheus")
    with demo_service() as demo, MetricsServer() as endpoints:
        started = time.time()
        endpoints.route("/static", Reply((FIXTURES / "sglang_metrics.txt").read_text()))
        endpoints.route("/linear", Reply(linear_exposition(slope=10.0, start=started)))
        endpoints.route("/dcgm", Reply(dcgm_exposition(started)))
        here = f"127.0.0.1:{endpoints.port}"
        demo_target = demo.removeprefix("http://")
        jobs = [("demo", "/metrics", demo_target), ("static", "/static", here), ("linear", "/linear", here), ("dcgm", "/dcgm", here)]
        with running_prometheus(tmp, jobs) as prom:
            for i in range(3):
                ask(demo, f"why is memory growing {i}")
            yield prom, demo, endpoints


def scrape_side(url: str, window_s: float) -> ServingSnapshot:
    return observe(ScrapeCollector([url], window_s=window_s, profiles=BUILTIN_PROFILES))


def prometheus_side(prom: Prometheus, window_s: float, job: str) -> ServingSnapshot:
    return observe(PrometheusCollector(prom.url, window_s=window_s, profiles=BUILTIN_PROFILES, job=job))


def assert_same(a: float | None, b: float | None, tol: float) -> None:
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        assert math.isclose(a, b, rel_tol=tol, abs_tol=tol), (a, b)


def test_window_0_quantiles_agree_on_a_static_exposition(stack):
    prom, _, endpoints = stack
    wait_until(lambda: prom.value('up{job="static"}') == 1, timeout=20, what="a scrape of /static")
    local = scrape_side(endpoints.url("/static"), 0)
    remote = prometheus_side(prom, 0, "static")
    assert local.ok and remote.ok, (local.state, remote.state)
    assert local.profile == remote.profile == "sglang"
    assert remote.target == f'{prom.url}{{job="static"}}' and remote.source == "prometheus"
    for name in SIGNAL_NAMES:
        assert_same(local.signals.get(name), remote.signals.get(name), 1e-9)
    assert local.signals.e2e_latency_p95_s is not None and local.signals.queue_depth == 2826


def test_window_0_quantiles_and_stages_agree_on_the_demo(stack):
    prom, demo, _ = stack
    # the demo is idle: wait until Prometheus has scraped its final state
    wait_until(
        lambda: prom.value('sum(rag_request_latency_seconds_count{job="demo"})') == 3,
        timeout=20, what="Prometheus to see the demo's 3 requests",
    )
    local, remote = scrape_side(f"{demo}/metrics", 0), prometheus_side(prom, 0, "demo")
    assert local.profile == remote.profile == "rag"
    for name in SIGNAL_NAMES:
        assert_same(local.signals.get(name), remote.signals.get(name), 1e-9)
    assert [s.name for s in local.stages] == [s.name for s in remote.stages] == ["retriever", "reranker", "llm"]
    for a, b in zip(local.stages, remote.stages):
        for field in ("p50_s", "p95_s", "p99_s", "share"):
            assert_same(getattr(a, field), getattr(b, field), 1e-9)


def test_rates_agree_within_scrape_timing(stack):
    prom, _, endpoints = stack
    local = scrape_side(endpoints.url("/linear"), 3.0)  # 3 s, while Prometheus scrapes too
    # a series younger than the window is extrapolated only half a step back: wait for history
    wait_until(
        lambda: (prom.value('count_over_time(rag_token_output_total{job="linear"}[6s])') or 0) >= 5,
        timeout=20, what="six seconds of /linear",
    )
    remote = prometheus_side(prom, 3.0, "linear")
    assert local.ok and remote.ok
    # Both stamp a sample when the scrape starts, and the server reads its clock a little later:
    # exact up to that jitter (a few ms in a 3 s window; more on a loaded machine).
    for side in (local, remote):
        assert side.signals.requests_per_s == pytest.approx(11.0, rel=0.05)
        assert side.signals.tokens_per_s == pytest.approx(400.0, rel=0.05)
    assert_same(local.signals.requests_per_s, remote.signals.requests_per_s, 0.05)
    assert_same(local.signals.error_rate, remote.signals.error_rate, 1e-6)
    assert_same(local.signals.e2e_latency_p50_s, remote.signals.e2e_latency_p50_s, 1e-6)


def test_fleet_view_ranks_gpus_by_memory_growth(stack):
    prom, _, _ = stack
    wait_until(
        lambda: (prom.value('min(count_over_time(DCGM_FI_DEV_FB_USED[1m]))') or 0) >= 3,
        timeout=20, what="three dcgm scrapes",
    )
    snap = prometheus_side(prom, 0, "demo")  # the fleet is not limited by --job
    top, flat = snap.fleet
    assert (top.host, top.gpu, top.uuid, top.pod, top.namespace) == ("node-a", "0", "GPU-aaaa", "vllm-0", "llm")
    assert top.growth_mib_per_s == pytest.approx(2.0, rel=0.05) and top.used_mib > 1000
    assert (flat.host, flat.growth_mib_per_s, flat.used_mib) == ("node-b", 0.0, 5000.0)


def test_live_prometheus_source(stack):
    prom, _, _ = stack
    # a series younger than the window is extrapolated only half a step back: wait for history
    wait_until(
        lambda: (prom.value('count_over_time(rag_token_output_total{job="linear"}[6s])') or 0) >= 5,
        timeout=20, what="six seconds of /linear",
    )
    source = ServingSource(
        PrometheusCollector(prom.url, window_s=3.0, profiles=BUILTIN_PROFILES, job="linear"), interval=0.2
    )
    got: list[ServingSnapshot] = []
    source.start(got.append)
    try:
        wait_until(lambda: len(got) >= 2, timeout=20, what="two snapshots")
    finally:
        source.stop()
    assert got[-1].ok and got[-1].profile == "rag" and got[-1].signals.requests_per_s == pytest.approx(11, rel=0.05)


def test_command_with_prometheus_and_secrets_never_shown(stack):
    prom, _, _ = stack
    # This worker's Prometheus may not have scraped the demo yet: its profile needs its series.
    wait_until(lambda: prom.value('sum(rag_request_latency_seconds_count{job="demo"})') == 3,
               timeout=20, what="Prometheus to see the demo's 3 requests")
    url = prom.url.replace("http://", f"http://admin:{PASSWORD}@")
    out = subprocess.run(
        [*gpuscope_cmd(), "metrics", "--prometheus", url, "--job", "demo", "--window", "0", "--json"],
        capture_output=True, text=True, timeout=60, env=_env(GPUSCOPE_PROMETHEUS_TOKEN=TOKEN),
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["source"] == "prometheus" and doc["profile"] == "rag"
    assert doc["target"] == f'{prom.url}{{job="demo"}}'
    assert list(doc["stages"]) == ["retriever", "reranker", "llm"]
    assert PASSWORD not in out.stdout + out.stderr and TOKEN not in out.stdout + out.stderr


# -- without a Prometheus server ----------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_PROMETHEUS_")}
    env.update(extra)
    return env


def run_metrics(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*gpuscope_cmd(), "metrics", *args], capture_output=True, text=True, timeout=60, env=_env(**env)
    )


def test_prometheus_down_is_a_plain_failure():
    port = free_port()
    started = time.monotonic()
    out = run_metrics("--prometheus", f"http://admin:{PASSWORD}@127.0.0.1:{port}", "--window", "0")
    assert time.monotonic() - started < 15
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2
    assert lines[0] == f"gpuscope: cannot reach Prometheus at http://127.0.0.1:{port}: connection refused"
    assert PASSWORD not in out.stderr


def test_refused_credentials_are_said_without_the_secret():
    with MetricsServer() as fake:
        fake.route("/api/v1/label/__name__/values", Reply('{"status":"error","error":"unauthorized"}', status=401))
        out = run_metrics("--prometheus", fake.url(""), "--window", "0", GPUSCOPE_PROMETHEUS_TOKEN=TOKEN)
        assert fake.seen and fake.seen[0][1]["Authorization"] == f"Bearer {TOKEN}"  # it was sent ...
    assert out.returncode == 1
    assert "refused the credentials (HTTP 401)" in out.stderr and "GPUSCOPE_PROMETHEUS_TOKEN" in out.stderr
    assert TOKEN not in out.stdout + out.stderr  # ... and never shown


def test_something_that_is_not_prometheus():
    with MetricsServer() as fake:
        fake.route("/api/v1/label/__name__/values", Reply("<html>hello</html>", content_type="text/html"))
        out = run_metrics("--prometheus", fake.url(""), "--window", "0")
    assert out.returncode == 1
    assert "does not answer like a Prometheus server" in out.stderr and "Traceback" not in out.stderr


def test_basic_auth_from_the_environment_is_sent_and_not_shown():
    with MetricsServer() as fake:
        out = run_metrics(
            "--prometheus", fake.url(""), "--window", "0",
            GPUSCOPE_PROMETHEUS_USER="ops", GPUSCOPE_PROMETHEUS_PASSWORD=PASSWORD,
        )
        sent = fake.seen[0][1]["Authorization"]
    assert sent.startswith("Basic ") and out.returncode == 1  # the fake answers 404
    assert PASSWORD not in out.stdout + out.stderr


def test_bad_auth_settings_are_usage_errors():
    out = run_metrics("--prometheus", "http://127.0.0.1:9", GPUSCOPE_PROMETHEUS_USER="ops")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "gpuscope: basic auth for Prometheus needs both a user and a password: set GPUSCOPE_PROMETHEUS_PASSWORD"
    )


def test_live_source_with_prometheus_down_says_unreachable_and_retries():
    port = free_port()
    collector = PrometheusCollector(f"http://127.0.0.1:{port}", window_s=30.0, profiles=BUILTIN_PROFILES, retries=0)
    source = ServingSource(collector, interval=0.1)
    got: list[ServingSnapshot] = []
    source.start(got.append)
    try:
        wait_until(lambda: len(got) >= 2, timeout=10, what="two snapshots (a retry)")
    finally:
        source.stop()
    assert got[-1].state.startswith("unreachable since ")
    assert got[-1].state.endswith(f", retrying (cannot reach Prometheus at http://127.0.0.1:{port}: connection refused)")


def test_slow_prometheus_times_out():
    with MetricsServer() as slow:
        slow.route("/api/v1/label/__name__/values", Reply('{"status":"success","data":[]}', delay=30))
        collector = PrometheusCollector(slow.url(""), window_s=0, profiles=BUILTIN_PROFILES, timeout=0.3, retries=0)
        started = time.monotonic()
        snap = observe(collector)
    assert time.monotonic() - started < 5
    assert snap.state == f"no answer from Prometheus at {slow.url('')} within 0.3 s"


def test_a_restarting_prometheus_is_asked_again():
    """502/503/504 (a proxy in front of a Prometheus that restarts) and refused connections are
    retried with a backoff, within the request's one deadline."""
    answers = [b"503 Service Unavailable", b"502 Bad Gateway", b"200 OK"]

    def restarting(request, conn, closing) -> None:
        status = answers.pop(0) if answers else b"200 OK"
        names = request.path.startswith("/api/v1/label/")
        body = b'{"status":"success","data":[]}' if names else b'{"status":"success","data":{"result":[]}}'
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    with RawServer(restarting) as server:
        snap = observe(PrometheusCollector(server.url(""), window_s=0, profiles=BUILTIN_PROFILES, retries=0))
        assert snap.state == f"Prometheus at {server.url('')} answered HTTP 503"
        started = time.monotonic()
        snap = observe(PrometheusCollector(server.url(""), window_s=0, profiles=BUILTIN_PROFILES, retries=2))
        assert snap.ok, snap.state
        assert 0.25 <= time.monotonic() - started < 3  # 0.25 s after the 502
        assert len(server.seen) == 4  # 503; 502, then the names and the query
