"""gpuscope against servers as they ship today: prometheus_client (the version installed, 0.26
as of writing) serving vLLM V1's and SGLang's metrics, read in every format that client
serves, and scraped by a real Prometheus (Debian's 2.42) so that `--metrics-url` and
`--prometheus` can be compared on the same numbers.

prometheus_client 0.26 asked for OpenMetrics writes `vllm:x` as `vllm_x` in sample lines but not
in `# TYPE` lines (client_python#1177), and Prometheus 2.x asks for OpenMetrics first: what it
stores is `vllm_x`. Both must read as vLLM, with every signal.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import time

import pytest

from gpuscope.core.serving import fetch
from gpuscope.core.serving.exposition import ACCEPT, Endpoint
from gpuscope.core.serving.scrape import scrape
from gpuscope.core.serving.profiles import BUILTIN_PROFILES
from gpuscope.core.serving.prometheus import PrometheusCollector
from gpuscope.core.serving.scrape import ScrapeCollector
from gpuscope.core.serving.source import observe
from gpuscope.core.serving.model import SIGNAL_NAMES, ServingSnapshot
from helpers import gpuscope_cmd, wait_until
from real_servers import ACCEPTS, TOKENS_PER_REQUEST, llm_server
from prometheus_server import running_prometheus

KINDS = ("vllm", "sglang")
RATE = 10.0  # requests a second of the live server
# what each server exposes: every signal but the rates, which need a window
EXPECTED = {"queue_depth": 3.0, "kv_cache_usage": 0.42, "error_rate": 0.1}  # 5 aborted of 50


@pytest.fixture(scope="module")
def servers():
    """Static vLLM and SGLang servers (50 finished requests), and a live vLLM one."""
    with llm_server("vllm") as vllm, llm_server("sglang") as sglang, llm_server("vllm", rate=RATE) as live:
        yield {"vllm": vllm, "sglang": sglang, "live": live}


def once(url: str, window_s: float = 0.0) -> ServingSnapshot:
    snapshot = observe(ScrapeCollector([url], window_s=window_s, profiles=BUILTIN_PROFILES))
    assert snapshot.ok, snapshot.state
    return snapshot


def assert_same(a: ServingSnapshot, b: ServingSnapshot, tol: float = 1e-9) -> None:
    assert a.profile == b.profile
    for name in SIGNAL_NAMES:
        x, y = a.signals.get(name), b.signals.get(name)
        assert (x is None) == (y is None) and (x is None or math.isclose(x, y, rel_tol=tol, abs_tol=tol)), (name, x, y)
    assert_same_stages({s.name: s.to_json() for s in a.stages}, {s.name: s.to_json() for s in b.stages}, tol)


def assert_same_stages(a: dict, b: dict, tol: float = 1e-9) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name] == pytest.approx(b[name], rel=tol, abs=tol), name


# -- every format the client serves -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_text_format_is_asked_for_and_read_whole(servers, kind):
    snapshot = once(f"{servers[kind]}/metrics")
    assert snapshot.profile == kind and snapshot.format == "text/plain; version=0.0.4"
    assert snapshot.malformed_lines == 0
    for name in SIGNAL_NAMES:
        if name in ("tokens_per_s", "requests_per_s"):
            assert snapshot.signals.get(name) is None  # window 0: no rates
        else:
            assert snapshot.signals.get(name) is not None, name
    for name, value in EXPECTED.items():
        assert snapshot.signals.get(name) == pytest.approx(value)
    stages = {"vllm": ["queue", "prefill", "decode"], "sglang": ["decode_forward", "prefill_forward", "prefill_waiting"]}
    assert [s.name for s in snapshot.stages] == stages[kind]


@pytest.mark.parametrize("served_as", sorted(ACCEPTS))
@pytest.mark.parametrize("kind", KINDS)
def test_every_format_the_client_serves_reads_the_same(servers, kind, served_as):
    url = f"{servers[kind]}/as/{served_as}"
    exposition = scrape(Endpoint.parse(url), 5)
    media = "application/openmetrics-text" if "openmetrics" in ACCEPTS[served_as].split(",")[0] else "text/plain"
    assert exposition.format.startswith(media) and exposition.malformed == 0
    assert f"{kind}:e2e_request_latency_seconds_bucket" in exposition.series  # whatever the spelling sent
    text = fetch.get(url, where=url, timeout=5, max_bytes=16 << 20, headers={"Accept": ACCEPT}).body.decode()
    sent = {
        "prometheus-2": f"\n{kind}_e2e_request_latency_seconds_bucket{{",  # client_python#1177, as served today
        "openmetrics-values": f"\nU__{kind}_3a_e2e__request__latency__seconds__bucket{{",
    }.get(served_as, f"\n{kind}:e2e_request_latency_seconds_bucket{{")
    assert sent in text
    assert_same(once(url), once(f"{servers[kind]}/metrics"))


# -- "now" from the command line ------------------------------------------------------------------------


def run_metrics(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*gpuscope_cmd(), *args], capture_output=True, text=True, errors="replace", timeout=60,
                          env={**os.environ, **(env or {})})


def test_metrics_now_is_two_scrapes_a_few_seconds_apart(servers):
    url = f"{servers['live']}/metrics"
    started = time.monotonic()
    out = run_metrics("metrics", "--metrics-url", url, "--json")
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert took > 2.8, took  # two scrapes 2.9 s apart (a hang is the run's timeout)
    assert out.stderr == f"observing {url} for 3 s (2 scrapes, 2.9 s apart)\n"
    doc = json.loads(out.stdout)
    assert doc["window_s"] == 3.0 and doc["profile"] == "vllm" and doc["format"] == "text/plain; version=0.0.4"
    signals = doc["signals"]
    assert signals["requests_per_s"] == pytest.approx(RATE, rel=0.2)
    assert signals["tokens_per_s"] == pytest.approx(RATE * TOKENS_PER_REQUEST, rel=0.2)
    assert all(v is not None for v in signals.values()), signals


def test_metrics_window_keeps_its_meaning(servers):
    out = run_metrics("metrics", "--metrics-url", f"{servers['live']}/metrics", "--window", "2", "--json")
    assert out.returncode == 0, out.stderr
    assert "for 2 s (5 scrapes, 0.5 s apart)" in out.stderr  # at least five, about one a second
    doc = json.loads(out.stdout)
    assert doc["window_s"] == 2.0 and doc["signals"]["requests_per_s"] == pytest.approx(RATE, rel=0.2)


def test_metrics_watch_prints_again_every_refresh(servers):
    url = f"{servers['live']}/metrics"
    proc = subprocess.Popen([*gpuscope_cmd(), "--refresh", "0.5", "metrics", "--metrics-url", url, "--watch", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while len(lines) < 4 and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                lines.append(proc.stdout.readline())
        proc.send_signal(signal.SIGINT)
        # Drained while it stops: a child blocked on a full pipe could not exit at all.
        proc.communicate(timeout=30)
        assert proc.returncode == 130
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    docs = [json.loads(line) for line in lines]
    assert len(docs) == 4 and all(d["window_s"] == 3.0 and d["profile"] == "vllm" for d in docs)
    assert [d["signals"]["requests_per_s"] for d in docs] == pytest.approx([RATE] * 4, rel=0.35)


def test_metrics_and_ps_take_the_settings_of_config(servers, tmp_path):
    config = tmp_path / "gpuscope.toml"
    config.write_text('[profiles.vllm]\nqueue = "vllm:num_requests_running"\n')  # 8 running, 3 waiting
    url = f"{servers['vllm']}/metrics"
    out = run_metrics("--config", str(config), "metrics", "--metrics-url", url, "--window", "0", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["signals"]["queue_depth"] == 8.0
    out = run_metrics("metrics", "--metrics-url", url, "--window", "0", "--json", env={"GPUSCOPE_CONFIG": str(config)})
    assert json.loads(out.stdout)["signals"]["queue_depth"] == 8.0
    config.write_text("[profiles.vllm]\nqueue = 3\n")
    out = run_metrics("--config", str(config), "metrics", "--metrics-url", url, "--window", "0")
    assert out.returncode == 2 and out.stderr.startswith(f"gpuscope: {config}, line 2: profiles.vllm.queue: ")
    config.write_text('[console]\nrefresh_s = "fast"\n')
    for command in (["metrics", "--metrics-url", url, "--window", "0"], ["ps"]):
        out = run_metrics("--config", str(config), *command)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (command, out.stderr)
        assert out.stderr.startswith(f"gpuscope: {config}, line 2: console.refresh_s: ")
        assert len(out.stderr.strip().splitlines()) == 1
    missing = tmp_path / "missing.toml"
    out = run_metrics("--config", str(missing), "ps")
    assert out.returncode == 2 and out.stderr.strip() == f"gpuscope: {missing}: no such configuration file (set by --config)"


# -- a real Prometheus scraping the same servers ----------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(servers, tmp_path_factory):
    jobs = [(name, "/metrics", base.removeprefix("http://")) for name, base in servers.items()]
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), jobs) as prom:
        wait_until(lambda: all(prom.value(f'up{{job="{name}"}}') == 1 for name in servers), timeout=30,
                   what="Prometheus to scrape the three servers")
        yield prom


def remote(prom, job: str, window_s: float = 0.0) -> ServingSnapshot:
    snapshot = observe(PrometheusCollector(prom.url, window_s=window_s, profiles=BUILTIN_PROFILES, job=job))
    assert snapshot.ok, snapshot.state
    return snapshot


@pytest.mark.parametrize("kind", KINDS)
def test_prometheus_stores_escaped_names_and_both_paths_agree(servers, prometheus, kind):
    stored = prometheus.get("/api/v1/label/__name__/values")["data"]
    assert f"{kind}_e2e_request_latency_seconds_bucket" in stored  # what Prometheus 2.x made of `{kind}:`
    assert not any(name.startswith(f"{kind}:") for name in stored)
    local, far = once(f"{servers[kind]}/metrics"), remote(prometheus, kind)
    assert far.profile == kind and far.format is None
    assert_same(local, far)
    assert far.signals.queue_depth == 3.0


def test_rates_agree_through_prometheus(servers, prometheus):
    wait_until(lambda: (prometheus.value('count_over_time(up{job="live"}[6s])') or 0) >= 5, timeout=30,
               what="six seconds of the live server in Prometheus")
    local, far = once(f"{servers['live']}/metrics", window_s=3.0), remote(prometheus, "live", window_s=3.0)
    for side in (local, far):
        assert side.signals.requests_per_s == pytest.approx(RATE, rel=0.2)
        assert side.signals.tokens_per_s == pytest.approx(RATE * TOKENS_PER_REQUEST, rel=0.2)
    assert local.signals.error_rate == pytest.approx(far.signals.error_rate, abs=0.05)


def test_the_command_gives_the_same_numbers_from_both_sources(servers, prometheus):
    direct = run_metrics("metrics", "--metrics-url", f"{servers['sglang']}/metrics", "--window", "0", "--json")
    through = run_metrics("metrics", "--prometheus", prometheus.url, "--job", "sglang", "--window", "0", "--json")
    assert direct.returncode == 0 and through.returncode == 0, direct.stderr + through.stderr
    a, b = json.loads(direct.stdout), json.loads(through.stdout)
    assert a["profile"] == b["profile"] == "sglang" and (a["format"], b["format"]) == ("text/plain; version=0.0.4", None)
    assert a["signals"] == pytest.approx(b["signals"], rel=1e-9)
    assert_same_stages(a["stages"], b["stages"])
