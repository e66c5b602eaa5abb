"""The fleet from Prometheus: two real exporters on loopback standing for two nodes (fake NVML on
node-a with a real leaking child on its GPU 0; no NVML on node-b), one real Prometheus scraping
both every second for the whole module. The fleet rows, the attach command built from them and
run (a fake `ssh` first on PATH), and `gpuscope diagnose --node` from the history alone."""

from __future__ import annotations

import contextlib
import threading
import urllib.request
import json
import os
import subprocess
import sys

import pytest

from gpuscope.core.fleet.attach import DEFAULT_ATTACH, AttachRefused, attach_argv, run_attach
from gpuscope.core.fleet.collector import FleetProcess, fleet_rows, open_client, read_fleet
from helpers import fake_nvml_env, gpuscope_cmd, wait_until
from test_exporter import FAST_LEAKER, exporter
from prometheus_server import prometheus_with_config


class Fleet(tuple):
    """(url, leaker's PID), unpacked as such, with node-a's scenario file beside."""

    def __new__(cls, url, pid, scenario, metrics=""):
        self = super().__new__(cls, (url, pid))
        self.scenario = scenario
        self.metrics = metrics  # node-a's exporter
        return self


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(Prometheus URL, the leaker's PID) with both nodes scraped; node-a's target carries the
    `pod` and `namespace` labels the Prometheus Operator gives an exporter's pod. `fleet.scenario`
    is node-a's fake NVML scenario (read again by its exporter when it changes)."""
    tmp = tmp_path_factory.mktemp("fleet")
    leaker = subprocess.Popen([sys.executable, "-c", FAST_LEAKER], stdout=subprocess.PIPE, text=True)
    try:
        assert leaker.stdout.readline().strip() == "ready"
        scenario = tmp / "nvml.json"
        scenario.write_text(json.dumps({"devices": [
            {"name": "NVIDIA H200", "uuid": "GPU-a0", "total": 150_000_000_000,
             "compute": [{"pid": leaker.pid, "used": "rss"}]},
        ]}))
        no_nvml = tmp / "none.json"
        no_nvml.write_text(json.dumps({"init_error": "LibraryNotFound"}))
        with contextlib.ExitStack() as stack:
            _, _, port_a = stack.enter_context(exporter("node-a", fake_nvml_env(scenario)))
            _, _, port_b = stack.enter_context(exporter("node-b", fake_nvml_env(no_nvml)))
            config = (
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpuscope\n"
                "    static_configs:\n"
                f"      - targets: ['127.0.0.1:{port_a}']\n"
                "        labels: {pod: gpuscope-exporter-x7k2p, namespace: monitoring}\n"
                f"      - targets: ['127.0.0.1:{port_b}']\n"
            )
            prom = stack.enter_context(prometheus_with_config(tmp, config))
            yield Fleet(prom.url, leaker.pid, scenario, f"http://127.0.0.1:{port_a}/metrics")
    finally:
        leaker.kill()
        leaker.wait(timeout=10)


def _fleet_with_leaker(url: str, pid: int):
    client = open_client(url, env={})
    try:
        snapshot = read_fleet(client)
    finally:
        client.close()
    nodes = {p.node for p in snapshot.processes}
    leaker = next((p for p in snapshot.processes if (p.node, p.pid) == ("node-a", pid) and p.gpus), None)
    return (snapshot, leaker) if {"node-a", "node-b"} <= nodes and leaker is not None else None


def test_fleet_rows_carry_both_nodes_sorted_by_growth(fleet):
    url, pid = fleet
    snapshot, leaker = wait_until(lambda: _fleet_with_leaker(url, pid), timeout=60, interval=1,
                                  what="both nodes' processes, the leaker's GPU among them")
    growth = [p.growth_bytes_per_s for p in snapshot.processes]
    known = [g for g in growth if g is not None]
    assert growth[:len(known)] == sorted(known, reverse=True), growth  # too new for a rate: last
    assert leaker.gpus == (0,) and leaker.gpu_bytes and leaker.gpu_bytes > 0
    assert leaker.pod == "gpuscope-exporter-x7k2p" and leaker.namespace == "monitoring"
    assert "python" in leaker.command
    assert any(p.node == "node-b" and not p.gpus for p in snapshot.processes)

    def paced():  # the pace of the view's reads: once Prometheus has two scrapes of an exporter
        client = open_client(url, env={})
        try:
            return read_fleet(client).scrape_interval_s
        finally:
            client.close()

    assert wait_until(paced, timeout=10, interval=0.5, what="the scrape interval") == pytest.approx(1.0, abs=0.3)

    # Another reader of the exporter (a readiness probe, a second Prometheus) changes nothing.
    stop = threading.Event()

    def read_often():
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not stop.wait(0.1):
            with contextlib.suppress(OSError):
                opener.open(fleet.metrics, timeout=2).read()

    reader = threading.Thread(target=read_often, daemon=True)
    reader.start()
    try:
        stop.wait(5)  # Prometheus scrapes node-a five times meanwhile, the reader ~50 times
        assert paced() == pytest.approx(1.0, abs=0.3)
    finally:
        stop.set()
        reader.join(timeout=5)


def test_hostile_label_values_are_refused_and_made_printable():
    bad = [
        FleetProcess(node="-oProxyCommand=touch /tmp/x", pid=1, start_time="1"),
        FleetProcess(node="node a", pid=1, start_time="1"),
        FleetProcess(node="node-a;reboot", pid=1, start_time="1"),
        FleetProcess(node="node-a", pid=0, start_time="1"),
    ]
    for process in bad:
        with pytest.raises(AttachRefused, match="refused"):
            attach_argv(DEFAULT_ATTACH, process)
    kubectl = "kubectl exec -it {pod} -- gpuscope --pid {pid}"
    with pytest.raises(AttachRefused, match="pod"):
        attach_argv(kubectl, FleetProcess(node="node-a", pid=7, start_time="1", pod="--kubeconfig=/tmp/evil"))
    with pytest.raises(AttachRefused, match="no pod label"):
        attach_argv(kubectl, FleetProcess(node="node-a", pid=7, start_time="1"))
    for template in ("{node} --pid {pid}", "ssh {host}", "ssh 'unclosed"):
        with pytest.raises(AttachRefused):
            attach_argv(template, FleetProcess(node="node-a", pid=7, start_time="1"))
    # A label with terminal controls comes out printable and bounded.
    rows, _ = fleet_rows([{"metric": {"__gpuscope_query": "", "gpuscope_query": "growth", "node": "n\x1b]0;pwned\x07",
                                      "pid": "42", "start_time": "1", "command": "x" * 500, "memory": "rss", "gpu": ""},
                           "value": [0, "5"]}])
    assert "\x1b" not in rows[0].node and "\x07" not in rows[0].node and len(rows[0].command) <= 80
    # Where it runs comes with its command line, from the info series.
    placed, _ = fleet_rows([{"metric": {"gpuscope_query": "info", "node": "n", "pid": "42", "start_time": "1",
                                        "command": "python serve.py", "runs_in": "rag.service\x1b[2J"},
                             "value": [0, "1"]}])
    assert placed[0].runs_in.startswith("rag.service") and "\x1b" not in placed[0].runs_in, placed[0]
    with pytest.raises(AttachRefused):
        attach_argv(DEFAULT_ATTACH, rows[0])


def test_attach_runs_the_template_without_a_shell(fleet, tmp_path, monkeypatch):
    url, pid = fleet
    _, leaker = wait_until(lambda: _fleet_with_leaker(url, pid), timeout=60, interval=1, what="the leaker's row")
    record = tmp_path / "argv.json"
    ssh = tmp_path / "bin" / "ssh"
    ssh.parent.mkdir()
    ssh.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\nsys.exit(3)\n")
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{ssh.parent}{os.pathsep}{os.environ['PATH']}")
    assert run_attach(attach_argv(DEFAULT_ATTACH, leaker)) == 3
    assert json.loads(record.read_text()) == ["-t", "node-a", "gpuscope", "--pid", str(pid)]
    kubectl = attach_argv("kubectl exec -it {pod} -n {namespace} -- gpuscope --pid={pid}", leaker)
    assert kubectl == ["kubectl", "exec", "-it", "gpuscope-exporter-x7k2p", "-n", "monitoring", "--", "gpuscope",
                       f"--pid={pid}"]


def _diagnose(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*gpuscope_cmd(), "diagnose", "--prometheus", url, *args],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_remote_diagnose_says_leak_and_that_the_code_path_needs_the_node(fleet):
    url, pid = fleet
    wait_until(lambda: _fleet_with_leaker(url, pid), timeout=60, interval=1, what="the leaker's series")

    said = []

    def leak():
        done = _diagnose(url, "--node", "node-a", "--pid", str(pid), "--duration", "120", "--json")
        said[:] = [done.stderr]
        report = json.loads(done.stdout) if done.returncode == 0 else {}
        return report if report.get("verdict") == "leak" else None

    report = wait_until(leak, timeout=60, interval=2, what="the history to read as a leak")
    assert said == [""]
    assert report["schema"] == "gpuscope.diagnosis/1" and report["pid"] == pid
    assert report["memory"]["source"] == "gpu" and report["memory"]["growth_bytes_per_s"] > 1e6
    steps = {s["number"]: s for s in report["steps"]}
    assert sorted(steps) == [1, 2, 3, 4, 5, 6, 7]
    assert steps[1]["status"] == "alert" and steps[6]["status"] == "alert"
    assert steps[7]["status"] == "skipped"
    assert f"run 'gpuscope diagnose --pid {pid}' on node-a" in steps[7]["finding"]

    text = _diagnose(url, "--node", "node-a", "--pid", str(pid), "--duration", "120")
    assert text.returncode == 0 and "needs the node" in text.stdout


def test_remote_diagnose_of_a_process_the_exporter_lacks_is_one_line_and_exit_1(fleet):
    url, _ = fleet
    done = _diagnose(url, "--node", "node-a", "--pid", "999999999", "--duration", "60")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "no gpuscope exporter series of PID 999999999 on node node-a" in done.stderr
    assert not done.stdout


def test_fleet_rows_are_one_per_process_fastest_first():
    def series(part, pid, value, **labels):
        return {"metric": {"gpuscope_query": part, "node": "n1", "pid": str(pid), "start_time": "5", **labels},
                "value": [0, str(value)]}

    rows, interval = fleet_rows([
        series("growth", 1, 10, memory="rss", gpu=""),
        series("growth", 2, 3e6, memory="gpu", gpu="1"),
        series("growth", 2, 5, memory="rss", gpu=""),
        series("gpu", 2, 4e9, gpu="1"),
        series("verdict", 2, 1, memory="gpu", gpu="1", verdict="leak", pattern="steady-growth"),
        series("verdict", 2, 1, memory="rss", gpu="", verdict="no-leak", pattern="flat"),
        series("leak", 2, 1, memory="gpu", gpu="1"),
        {"metric": {"gpuscope_query": "interval"}, "value": [0, "15"]},
    ])
    assert [(r.pid, r.growth_bytes_per_s, r.growth_memory) for r in rows] == [(2, 3e6, "gpu"), (1, 10.0, "rss")]
    assert rows[0].gpus == (1,) and rows[0].gpu_bytes == 4e9 and rows[0].verdict == "leak" and rows[0].alerting
    assert interval == 15.0


def test_a_process_too_new_for_a_growth_rate_is_listed_last_without_one(fleet):
    url, pid = fleet
    wait_until(lambda: _fleet_with_leaker(url, pid), timeout=60, interval=1, what="the leaker's row")
    newcomer = subprocess.Popen(["sleep", "600"])
    before = fleet.scenario.read_text()
    try:
        scenario = json.loads(before)
        scenario["devices"][0]["compute"].append({"pid": newcomer.pid, "used": 9_000_000_000})
        fleet.scenario.write_text(json.dumps(scenario))

        def listed_without_growth():
            client = open_client(url, env={})
            try:
                rows = read_fleet(client).processes
            finally:
                client.close()
            row = next((p for p in rows if (p.node, p.pid) == ("node-a", newcomer.pid)), None)
            return (rows, row) if row is not None and row.growth_bytes_per_s is None else None

        rows, row = wait_until(listed_without_growth, timeout=30, interval=0.2,
                               what="the new process's row before its growth rate")
        assert row.gpus == (0,) and row.gpu_bytes == 9e9 and row.rss_bytes and "sleep" in row.command
        assert row.verdict == "" and not row.alerting
        growing = [p for p in rows if p.growth_bytes_per_s is not None]
        assert rows[:len(growing)] == tuple(growing)  # the new ones after every growth
    finally:
        fleet.scenario.write_text(before)
        newcomer.kill()
        newcomer.wait(timeout=10)
