"""gpuscope at 80x24 in a real terminal (tmux): a node whose GPU processes outnumber the screen."""

import json
import subprocess

import pytest

from helpers import fake_nvml_env, gpuscope_cmd, wait_until

pytestmark = pytest.mark.terminal

GIB = 1 << 30


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(12)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def test_at_80x24_the_console_opens_on_the_biggest_gpu_processes(tmux_session, sleepers, tmp_path):
    # Each sleeper holds a different share of GPU memory; the last one the most.
    compute = [{"pid": pid, "used": (n + 1) * GIB} for n, pid in enumerate(sleepers)]
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"devices": [{"name": "NVIDIA H200", "total": 141 * GIB, "util": 50, "temp": 60,
                                                 "compute": compute}]}))
    env = fake_nvml_env(scenario)
    env["TERM"] = "xterm-256color"
    tmux = tmux_session(gpuscope_cmd() + ["--refresh", "0.5"], size=(80, 24),
                        env={k: env[k] for k in ("PYTHONPATH", "GPUSCOPE_FAKE_NVML", "TERM")})

    def table():
        lines = tmux.screen().splitlines()
        at = next((i for i, ln in enumerate(lines) if ln.split()[:2] == ["PID", "USER"]), None)
        return (lines[at], lines[at + 1:]) if at is not None else None

    def gpu_rows_shown():
        shown = table()
        if shown is None:
            return None
        pids = [int(ln.split()[0]) for ln in shown[1] if ln.split() and ln.split()[0].isdigit()]
        return shown if pids[:8] == sleepers[::-1][:8] else None

    # The first rows under the header are the biggest GPU processes: the view is at the top, not
    # wherever the host process the cursor first stood on went when NVML's processes came.
    wait_until(gpu_rows_shown, timeout=60, interval=0.3, what="the GPU processes, biggest first, at the top")
    tmux.keys("q")
    wait_until(tmux.dead, timeout=20, what="gpuscope to exit on q")
