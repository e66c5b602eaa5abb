"""`gpuscope exporter`: real exporters on loopback standing for two nodes (fake NVML on one, no NVML
on the other), a real leaking process, a real Prometheus (Debian's package) scraping both with
the rules of `gpuscope rules` (at a short horizon) loaded; and the pieces alone (selection of
processes, the cgroup's pod and container, bad input)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.core.fleet.exporter import choose_exported
from gpuscope.core.node.cgroup import parse_cgroup
from gpuscope.core.node.host import HostProcess
from gpuscope.core.leak import LeakThresholds
from gpuscope.core.fleet.rules import EVALUATION_INTERVAL, render_rules
from helpers import fake_nvml_env, free_port, gpuscope_cmd, wait_until
from prometheus_server import prometheus_with_config

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
SCRAPE_S = 1  # how often the test's Prometheus scrapes the exporters
FAST_LEAKER = """
import time
keep = []
print("ready", flush=True)
while True:
    keep.append(bytearray(b"x" * 1_000_000))   # 10 MB/s, steadily
    time.sleep(0.1)
"""


def scrape(url: str) -> dict[str, list]:
    with _DIRECT.open(url, timeout=10) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@contextlib.contextmanager
def exporter(node: str, env: dict[str, str], *args: str):
    port = free_port()
    proc = subprocess.Popen([*gpuscope_cmd(), "--refresh", "0.5", "exporter", "--listen", f"127.0.0.1:{port}",
                             "--node-name", node, *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_until(lambda: proc.poll() is not None or _answers(url), timeout=30, what=f"exporter {node}")
        assert proc.poll() is None, proc.stderr.read()
        yield proc, url, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return bool(scrape(url))
    except OSError:
        return False


@contextlib.contextmanager
def prometheus_with_rules(tmp: Path, targets: dict[str, str], rules: str):
    (tmp / "rules.yml").write_text(rules)
    config = (
        f"global:\n  scrape_interval: {SCRAPE_S}s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: [{tmp / 'rules.yml'}]\nscrape_configs:\n  - job_name: gpuscope\n    static_configs:\n"
        + "".join(f"      - targets: ['{target}']\n        labels: {{host: {name}}}\n" for name, target in targets.items())
    )
    with prometheus_with_config(tmp, config) as prom:
        yield prom


@pytest.fixture
def leaker():
    proc = subprocess.Popen([sys.executable, "-c", FAST_LEAKER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_two_nodes_in_prometheus_the_leak_fires_and_a_dead_node_is_down_not_zero(tmp_path, leaker):
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"devices": [
        {"name": "NVIDIA H200", "uuid": "GPU-a0", "total": 150_000_000_000,
         "compute": [{"pid": leaker.pid, "used": "rss"}]},
        {"name": "NVIDIA H200", "uuid": "GPU-a1", "total": 150_000_000_000, "compute": []},
    ]}))
    no_nvml = tmp_path / "none.json"
    no_nvml.write_text(json.dumps({"init_error": "LibraryNotFound"}))
    rules = render_rules(LeakThresholds(), ttft_p95_s=0.8, e2e_latency_p95_s=4.0, horizons_s=(30,))
    with exporter("node-a", fake_nvml_env(scenario)) as (_, url_a, port_a), \
            exporter("node-b", fake_nvml_env(no_nvml)) as (proc_b, url_b, port_b):
        # node-b has no NVML: it says so in a metric and still serves host memory
        def nvml_said():
            b = scrape(url_b)
            said = b.get("gpuscope_nvml_up")
            return b if said and "driver" in said[0].labels["reason"] else None

        b = wait_until(nvml_said, timeout=20, what="node-b to say NVML cannot be read")
        assert [s.value for s in b["gpuscope_nvml_up"]] == [0.0]
        assert b["gpuscope_process_resident_memory_bytes"]
        assert not b["gpuscope_gpu_memory_used_bytes"]

        targets = {"node-a": f"127.0.0.1:{port_a}", "node-b": f"127.0.0.1:{port_b}"}
        with prometheus_with_rules(tmp_path, targets, rules) as prom:
            pid = str(leaker.pid)
            wait_until(lambda: prom.value('count(up{job="gpuscope"} == 1)') == 2, timeout=30, what="both scraped")
            leak = f'gpuscope_process_leak{{node="node-a",pid="{pid}",memory="gpu",gpu="0"}}'
            wait_until(lambda: prom.value(leak) == 1, timeout=60, what="the exporter's own leak verdict")
            assert prom.value(f'gpuscope_process_gpu_memory_bytes{{node="node-a",pid="{pid}",gpu="0"}}') > 0
            # The fleet's first process by growth is the leaker, with its node.
            top = prom.query("topk(1, gpuscope_process_memory_growth_bytes_per_second{memory=\"gpu\"})")
            assert (top[0]["metric"]["node"], top[0]["metric"]["pid"]) == ("node-a", pid)
            # The rules carry the leak test into Prometheus: the alert fires for the leaker only.
            alert = 'ALERTS{alertname="GpuscopeLeakProcessGpuMemory",alertstate="firing"}'
            wait_until(lambda: prom.query(alert), timeout=90, interval=1, what="the leak alert to fire")
            fired = prom.query(alert)
            assert {(r["metric"]["node"], r["metric"]["pid"]) for r in fired} == {("node-a", pid)}

            # The leaker exits: its series go stale at the next scrape, and at the rules' next
            # evaluation its alerts resolve and its recorded trends end. Timed by Prometheus's own
            # clock (the times of its samples and evaluations), not the test's.
            leaker.kill()
            leaker.wait(timeout=10)
            mine = f'{{node="node-a",pid="{pid}"}}'
            trends = f'{{__name__=~"gpuscope:process_.+:floor_deriv.+",node="node-a",pid="{pid}"}}'
            wait_until(lambda: not prom.query(f"ALERTS{mine}") and not prom.query(trends), timeout=60, interval=1,
                       what="the alert to resolve and the recorded trend to end")
            last = max(float(t) for s in prom.query(f"gpuscope_process_gpu_memory_bytes{mine}[10m]")
                       for t, _ in s["values"])  # the last scrape that had the process
            # Both were there while it lived (a loaded machine may have let the alert lapse for a while).
            assert prom.query(f"ALERTS{mine}[10m]", at=last) and prom.query(trends, at=last)
            ended = last + SCRAPE_S + int(EVALUATION_INTERVAL.rstrip("s")) + 1  # one scrape, one evaluation, 1 s slack
            assert prom.query(f"ALERTS{mine}", at=ended) == [], "the alert outlived its process"
            assert prom.query(trends, at=ended) == [], "the recorded trend outlived its process"

            # A node whose exporter is gone is down (up == 0), and its series go stale, not to zero.
            proc_b.kill()
            proc_b.wait(timeout=10)
            wait_until(lambda: prom.value('up{host="node-b"}') == 0, timeout=30, what="node-b down")
            wait_until(lambda: prom.value('count(gpuscope_process_resident_memory_bytes{node="node-b"})') is None,
                       timeout=30, what="node-b's series to go stale")
            assert prom.value('up{host="node-a"}') == 1


def test_choose_exported_keeps_the_top_of_each_ranking_and_every_alert():
    procs = [HostProcess(pid, 1.0, "u", "python", "python x", rss, None, True) for pid, rss in
             ((1, 10), (2, 20), (3, 30), (4, 40), (5, 50), (6, 60))]
    gpu = {1: 900.0, 2: 800.0}
    growth = {3: 5.0, 4: 1.0, 2: -3.0}
    chosen = [p.pid for p in choose_exported(procs, gpu, growth, alerting={4}, top=1)]
    assert chosen == [1, 3, 4, 6]  # GPU: 1; RSS: 6; growth: 3; alert: 4


def test_the_process_series_name_its_pod_container_and_where_it_runs():
    # The host collector reads each process's cgroup once (gpuscope.core.node.cgroup): every series
    # carries the pod and the container, the info series also the short name the console shows.
    from gpuscope.core.fleet.exporter import NodeCollector
    from gpuscope.core.leak import LeakWatch
    from gpuscope.core.node.model import Frame, NvmlReading, ProcessRow

    pod = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
    cgroup = parse_cgroup(("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + pod.replace("-", "_")
                           + ".slice/cri-containerd-" + "ab" * 32 + ".scope\n").encode())
    unit = parse_cgroup(b"0::/system.slice/rag\x1b[2J.service\n")
    procs = (HostProcess(4242, 1.0, "svc", "python", "python serve.py", 10_000_000, 0.0, True, cgroup=cgroup),
             HostProcess(4243, 1.0, "svc", "python", "python rag.py", 20_000_000, 0.0, True, cgroup=unit))
    rows = tuple(ProcessRow(p.pid, "svc", None, None, p.rss_bytes, 0.0, p.command, runs_in=p.cgroup.name) for p in procs)
    collector = NodeCollector("node-a", clock=lambda: 1000.0)
    collector.accept(Frame(1000.0, "node-a", None, NvmlReading(status="NVML unavailable: no NVIDIA driver"), rows),
                     procs, LeakWatch())
    families = _exposition(collector)
    info = {s.labels["pid"]: s.labels for s in families["gpuscope_process_info"]}
    assert (info["4242"]["pod_uid"], info["4242"]["container_id"]) == (pod, "ab" * 32)
    assert info["4242"]["runs_in"] == "pod:1b2c3d4e/ctr:" + "ab" * 6
    assert info["4243"]["runs_in"] == "rag␛[2J.service" and info["4243"]["container_id"] == ""
    rss = {s.labels["pid"]: s.labels for s in families["gpuscope_process_resident_memory_bytes"]}
    assert rss["4242"]["pod_uid"] == pod and "runs_in" not in rss["4242"]  # on the info series only


@pytest.mark.parametrize(("args", "says"), [
    (["--listen", "9835"], "HOST:PORT"),
    (["--listen", "127.0.0.1:http"], "whole number"),
    (["--listen", "127.0.0.1:70000"], "0 to 65535"),
    (["--tls-cert", "c.pem"], "go together"),
    (["--tls-client-ca", "ca.pem"], "needs --tls-cert"),
])
def test_bad_options_are_one_line_and_exit_2(args, says):
    done = subprocess.run([*gpuscope_cmd(), "exporter", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def test_a_taken_port_or_missing_certificate_is_one_line_and_exit_1(tmp_path):
    with exporter("n", dict(os.environ)) as (_, _, port):
        done = subprocess.run([*gpuscope_cmd(), "exporter", "--listen", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 1 and done.stderr.count("\n") == 1 and "cannot serve" in done.stderr, done.stderr
    missing = str(tmp_path / "nope.pem")
    done = subprocess.run([*gpuscope_cmd(), "exporter", "--listen", f"127.0.0.1:{free_port()}",
                           "--tls-cert", missing, "--tls-key", missing], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "cannot serve" in done.stderr, done.stderr


def test_exporter_imports_neither_the_console_nor_torch():
    code = ("import sys; from gpuscope.cli import main; from gpuscope.commands import exporter; "
            "import gpuscope.core.fleet.exporter; "
            "print(sorted(m for m in sys.modules if m.startswith(('textual', 'torch', 'gpuscope.tui'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def _exposition(collector) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    registry.register(collector)
    return {f.name: f.samples for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_slow_sampling_keeps_the_growth_series_and_says_its_pace_and_the_command_is_on_one_series():
    # A loaded node sampled every 15 s: the growth window widens to six of its samples instead of
    # leaving the leaking process without a growth series (30 s held at most 2-3 of them).
    from gpuscope.core.fleet.exporter import NodeCollector
    from gpuscope.core.leak import LeakWatch
    from gpuscope.core.node.model import Frame, HostProcess, NvmlReading, ProcessRow

    now = [1000.0]
    collector = NodeCollector("node-a", clock=lambda: now[0])
    watch = LeakWatch()
    proc = HostProcess(4242, 1.0, "svc", "python", "python serve.py --token=abc", 0, 0.0, True)
    for k in range(8):
        rss = 100_000_000 + 1_000_000 * 15 * k  # 1 MB/s
        watch.add(("rss", 4242, 1.0), now[0], rss)
        p = HostProcess(proc.pid, proc.create_time, proc.user, proc.name, proc.command, rss, 0.0, True)
        row = ProcessRow(4242, "svc", None, None, rss, 0.0, "python serve.py")
        collector.accept(Frame(now[0], "node-a", None, NvmlReading(status="NVML unavailable: no NVIDIA driver"),
                               (row,)), (p,), watch)
        now[0] += 15.0
    families = _exposition(collector)
    growth = families["gpuscope_process_memory_growth_bytes_per_second"]
    assert [s.value for s in growth] == [pytest.approx(1e6, rel=0.05)], growth
    assert "command" not in growth[0].labels
    info = families["gpuscope_process_info"]
    assert len(info) == 1 and info[0].labels["pid"] == "4242" and "serve.py" in info[0].labels["command"]
    assert all("command" not in s.labels for name, ss in families.items() if name != "gpuscope_process_info"
               for s in ss)
    assert [s.value for s in families["gpuscope_exporter_sample_interval_seconds"]] == [15.0]
    # scraped 15 s after the latest sample arrived: the exporter says how old what it serves is
    assert [s.value for s in families["gpuscope_exporter_sample_age_seconds"]] == [15.0]
    assert [s.labels["reason"] for s in families["gpuscope_nvml_up"]] == ["no-driver"]
