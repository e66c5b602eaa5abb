"""`gpuscope exporter` read as Prometheus reads it, from a real exporter on loopback (fake NVML
with the process on GPU 0): every family of the contract, the leak detector's `verdict` and
`pattern` labels for a leaking process whose command line carries terminal controls, and no
control character in any label of any series."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from gpuscope.core.leak import PATTERNS, VERDICTS
from helpers import fake_nvml_env, wait_until
from test_exporter import FAST_LEAKER, exporter, scrape

FAMILIES = {
    "gpuscope_gpu_memory_used_bytes", "gpuscope_gpu_memory_total_bytes", "gpuscope_process_gpu_memory_bytes",
    "gpuscope_process_resident_memory_bytes", "gpuscope_process_memory_growth_bytes_per_second",
    "gpuscope_process_leak_verdict", "gpuscope_process_leak", "gpuscope_process_leak_confidence",
    "gpuscope_process_leak_growth_bytes_per_second", "gpuscope_process_torch_allocated_bytes",
    "gpuscope_process_torch_reserved_bytes", "gpuscope_nvml_up", "gpuscope_exporter_sample_age_seconds",
    "gpuscope_exporter_processes", "gpuscope_exporter_scrape_duration_seconds", "gpuscope_exporter_scrapes",
    "gpuscope_exporter_errors", "gpuscope_exporter_ready",
}
# The command line's owner chooses every character: an OSC retitling the terminal, a forged line.
HOSTILE_ARGS = ["\x1b]0;owned\x07", "ok\nforged_metric 1", "\u202eevil"]
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_the_verdict_and_pattern_labels_and_no_control_character_in_any_label(tmp_path):
    # A short command line, so that the hostile arguments are within the label's 80 characters.
    (tmp_path / "l").write_text(FAST_LEAKER)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    leaker = subprocess.Popen(["python", "-c", "exec(open('l').read())", *HOSTILE_ARGS], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert leaker.stdout.readline().strip() == "ready"
        scenario = tmp_path / "nvml.json"
        scenario.write_text(json.dumps({"devices": [
            {"name": "NVIDIA H200\x1b[2J", "uuid": "GPU-a0", "total": 150_000_000_000,
             "compute": [{"pid": leaker.pid, "used": "rss"}]}]}))
        with exporter("node-a", fake_nvml_env(scenario)) as (_, url, _port):
            pid = str(leaker.pid)

            def leak_verdict():
                metrics = scrape(url)
                mine = [s for s in metrics.get("gpuscope_process_leak_verdict", ())
                        if s.labels["pid"] == pid and s.labels["memory"] == "gpu" and s.labels["verdict"] == "leak"]
                return (metrics, mine[0]) if mine else None

            metrics, verdict = wait_until(leak_verdict, timeout=90, interval=0.5, what="the leaker's leak verdict")
    finally:
        leaker.kill()
        leaker.wait()
    assert FAMILIES <= set(metrics), sorted(FAMILIES - set(metrics))
    assert verdict.value == 1.0 and verdict.labels["gpu"] == "0"
    assert verdict.labels["pattern"] == "steady-growth", verdict.labels
    # one verdict series per memory series, each with a known verdict and pattern
    for s in metrics["gpuscope_process_leak_verdict"]:
        assert s.labels["verdict"] in VERDICTS and s.labels["pattern"] in PATTERNS, s.labels
    firing = [s for s in metrics["gpuscope_process_leak"] if s.labels["pid"] == pid and s.labels["memory"] == "gpu"]
    assert [s.value for s in firing] == [1.0], firing
    # Every label of every series printable: the controls shown as visible characters, kept in place.
    for name, samples in metrics.items():
        for s in samples:
            for key, value in s.labels.items():
                assert not CONTROL.search(value), (name, key, value)
    command = next(s.labels["command"] for s in metrics["gpuscope_process_info"] if s.labels["pid"] == pid)
    assert "\u241b]0;owned\u2407" in command and "ok\u240aforged_metric 1" in command, command
    assert "forged_metric" not in metrics and len(command) <= 80, command
    names = {s.labels["name"] for s in metrics["gpuscope_gpu_memory_used_bytes"]}
    assert names == {"NVIDIA H200\u241b[2J"}, names
