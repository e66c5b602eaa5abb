"""The fleet view in a real terminal: the console with --prometheus against a real Prometheus
scraping a real exporter (fake NVML), `f` lists a leaking process, Enter hands the terminal to the
`[fleet] attach` command (a script that prints its arguments and waits for Enter) and the console
comes back when it ends."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from helpers import answers, fake_nvml_env, free_port, gpuscope_cmd, wait_until
from prometheus_server import prometheus_with_config

pytestmark = pytest.mark.terminal

FLEET = "fleet · "  # the fleet view's status line
RATE = 2e9  # bytes/s of (fake) GPU memory: faster than anything else on the machine, so the first row
ATTACH_SCRIPT = """#!/bin/sh
printf 'attach-probe argv: %s\\n' "$*"
printf 'press Enter to go back\\n'
read -r _
"""


@contextlib.contextmanager
def _process(args: list[str], env: dict[str, str] | None = None):
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(Prometheus URL, the leaking process's PID): one exporter (node-a) whose fake GPU holds a
    `sleep` whose memory grows at RATE, scraped every second by a real Prometheus."""
    tmp = tmp_path_factory.mktemp("fleet-terminal")
    scenario = tmp / "nvml.json"
    stop = threading.Event()
    with contextlib.ExitStack() as stack:
        leaker = stack.enter_context(_process(["sleep", "600"]))
        started = time.time()

        def write_scenario() -> None:
            used = int(1e9 + RATE * (time.time() - started))
            body = json.dumps({"devices": [{"name": "NVIDIA H200", "uuid": "GPU-t0", "total": 150_000_000_000,
                                            "compute": [{"pid": leaker.pid, "used": used}]}]})
            (tmp / "nvml.tmp").write_text(body)
            os.replace(tmp / "nvml.tmp", scenario)  # whole files only

        def grow() -> None:
            while not stop.wait(0.25):
                write_scenario()

        write_scenario()
        writer = threading.Thread(target=grow, daemon=True)
        writer.start()
        stack.callback(writer.join, 5)
        stack.callback(stop.set)
        port = free_port()
        env = {**fake_nvml_env(scenario), "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "state")}
        stack.enter_context(_process([*gpuscope_cmd(), "--refresh", "0.5", "exporter", "--listen", f"127.0.0.1:{port}",
                                      "--node-name", "node-a"], env))
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/metrics"), timeout=30, what="the exporter")
        prometheus = stack.enter_context(prometheus_with_config(tmp, (
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpuscope\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")))
        yield prometheus.url, leaker.pid


def row_of(screen: str, pid: int) -> str:
    return next((line for line in screen.splitlines() if line.lstrip().startswith("node-a") and f" {pid} " in line), "")


def test_enter_on_a_fleet_row_hands_the_terminal_to_the_attach_command_and_comes_back(fleet, tmux_session, tmp_path):
    url, pid = fleet
    script = tmp_path / "attach-probe"
    script.write_text(ATTACH_SCRIPT)
    script.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'[fleet]\nattach = "{script} --node {{node}} --pid {{pid}}"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "TERM": "xterm-256color"}
    tmux = tmux_session([*gpuscope_cmd(), "--config", str(config), "--refresh", "0.5", "--prometheus", url], env=env)
    wait_until(lambda: "HOST" in tmux.screen(), timeout=30, what="the console")

    tmux.keys("f")
    wait_until(lambda: FLEET in tmux.screen(), timeout=10, what="the fleet view")
    screen = wait_until(lambda: (lambda s: s if row_of(s, pid) and "+" in row_of(s, pid) else None)(tmux.screen()),
                        timeout=60, interval=0.5, what="the leaking process's row, growing")
    first = next(line for line in screen.splitlines() if line.lstrip().startswith("node-a"))
    assert f" {pid} " in first, screen  # the fastest growth is the first row, where the cursor starts
    # Its footer offers its own keys only, and the console's do nothing here: `w` on a fleet row
    # must not diagnose a process of this node.
    footer = screen.rstrip().splitlines()[-1]
    assert "Attach" in footer and not any(key in footer for key in ("Diagnose", "Filter", "Stacks", "Alloc")), footer
    tmux.keys("w")  # keys are read in order: had `w` opened a diagnosis, Enter would go to it, not to the row
    tmux.keys("Enter")
    suspended = wait_until(lambda: (lambda s: s if "press Enter to go back" in s else None)(tmux.screen()),
                           timeout=15, what="the attach command's output")
    assert f"attach-probe argv: --node node-a --pid {pid}" in suspended
    assert FLEET not in suspended and "HOST" not in suspended  # the console gave the whole terminal away

    tmux.keys("Enter")
    back = wait_until(lambda: (lambda s: s if FLEET in s and row_of(s, pid) else None)(tmux.screen()),
                      timeout=15, what="the fleet view again")
    assert "attach-probe" not in back
    wait_until(lambda: "exit status 0" in tmux.screen(), timeout=10, what="the console's word on the return")
    tmux.keys("f")  # f again: back to the node
    wait_until(lambda: FLEET not in tmux.screen() and "HOST" in tmux.screen(), timeout=10,
               what="the console's main screen")
