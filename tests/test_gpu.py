"""Checks that need a real NVIDIA GPU (run by scripts/gpu-check; skipped on machines without one).

They use only gpuscope's core (no TUI), so they run wherever python has torch, psutil,
nvidia-ml-py and pytest.
"""

import subprocess
import sys

import pytest

from gpuscope.core.node import NodeSource
from gpuscope.core.nvml import NvmlCollector

from helpers import wait_until

pytestmark = pytest.mark.gpu

CUDA_LEAKER = """
import time, torch
torch.empty(1, device="cuda")
print("ready", flush=True)
keep = []
while True:
    if len(keep) < 64:  # 32 MiB every 0.25 s (~134 MB/s), up to 2 GiB, then it plateaus
        keep.append(torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
    time.sleep(0.25)
"""
CUDA_FLAT = """
import time, torch
block = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
print("ready", flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture(scope="module")
def nvml_reading():
    reading = NvmlCollector().read()
    if reading.status is not None or not reading.devices:
        pytest.skip(f"no GPU through NVML here ({reading.status or 'no devices'})")
    return reading


@pytest.fixture(scope="module")
def cuda_torch():
    probe = subprocess.run([sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                           capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip("torch with CUDA is not available to this python")


def test_real_nvml_lists_devices(nvml_reading):
    for d in nvml_reading.devices:
        print(f"GPU{d.index} {d.name} used={d.memory_used} total={d.memory_total} util={d.utilization} temp={d.temperature} error={d.error}")
        assert d.error is None and d.name and d.memory_total and d.memory_total > 0
    assert nvml_reading.driver


def test_a_leaking_cuda_process_grows_and_a_flat_one_does_not(nvml_reading, cuda_torch, spawn_python):
    leaker = spawn_python(CUDA_LEAKER)
    flat = spawn_python(CUDA_FLAT)
    frames = []
    source = NodeSource(interval=0.5)
    source.start(frames.append)
    try:
        def rows_of(pid):
            return [r for r in (frames[-1].processes if frames else ()) if r.pid == pid and r.gpu is not None]

        def settled():
            lk, fl = rows_of(leaker.pid), rows_of(flat.pid)
            return (lk and fl and lk[0].gpu_growth_bytes_per_s and lk[0].gpu_growth_bytes_per_s > 20e6
                    and fl[0].gpu_growth_bytes_per_s is not None)

        wait_until(settled, timeout=90, interval=0.5, what="NVML to show the leaker growing and a trend for the flat one")
        for f in frames[::4]:
            for r in f.processes:
                if r.pid in (leaker.pid, flat.pid) and r.gpu is not None:
                    print(f"t={f.time:.1f} pid={r.pid} gpu={r.gpu} gpu_mem={r.gpu_memory_bytes} growth={r.gpu_growth_bytes_per_s}")
        lk, fl = rows_of(leaker.pid)[0], rows_of(flat.pid)[0]
        assert lk.gpu_memory_bytes is not None and fl.gpu_memory_bytes >= 512 << 20
        assert abs(fl.gpu_growth_bytes_per_s) < 2e6
    finally:
        source.stop()
