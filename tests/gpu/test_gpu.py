"""Checks that need a real NVIDIA GPU (run by scripts/gpu-check; skipped on machines without one).

The `test_probe_*` checks run gpuscope's probe inside CUDA processes (torch allocator figures, the
torch-history rung, the cost of recording history); they need torch with CUDA, not NVML.

They use only gpuscope's core (no TUI), so they run wherever python has torch, psutil,
nvidia-ml-py and pytest.
"""

import subprocess
import sys

import pytest

from gpuscope.core.diagnosis.recorded import source_evidence
from gpuscope.core.node.live import NodeSource
from gpuscope.core.node.nvml import NvmlCollector

from helpers import require_gpu, wait_until

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
        require_gpu(f"no GPU through NVML here ({reading.status or 'no devices'})")
    return reading


@pytest.fixture(scope="module")
def cuda_torch():
    probe = subprocess.run([sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                           capture_output=True, timeout=120)
    if probe.returncode != 0:
        require_gpu("torch with CUDA is not available to this python")


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


# -- the probe inside a CUDA process (torch allocator figures, torch-history rung, cost) -------------

PROBED_CUDA = """
import os, sys, time, torch
from gpuscope import probe
torch.empty(1, device="cuda")
assert probe.start()
print("ready", flush=True)
"""
PROBED_CUDA_LEAKER = PROBED_CUDA + """
kv = []
def keep_kv(step):
    kv.append(torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))  # 16 MiB kept per step
def scratch(step):
    return torch.empty(8 << 20, dtype=torch.uint8, device="cuda").sum()  # 8 MiB, freed at once
step = 0
while True:
    if len(kv) < 256:  # at most 4 GiB
        keep_kv(step)
    scratch(step); step += 1
    time.sleep(0.1)
"""
PROBED_CUDA_CHURN = PROBED_CUDA + """
import random
rng = random.Random(3)
def churn(mib):
    x = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    del x
started = time.monotonic()
while True:
    # Ever larger requests, paced by the clock (not by how fast this GPU is): each second's largest
    # fits no cached block, so the cache grows by it each second (32 MiB, 2 MiB more a second); nothing is held.
    ceiling = min(32 + 2 * int(time.monotonic() - started), 256)
    churn(rng.randint(ceiling - 8, ceiling))
    time.sleep(0.02)
"""
PROBED_CUDA_TIMING = PROBED_CUDA + """
def timed(n=20000):
    started = time.perf_counter()
    for _ in range(n):
        x = torch.empty(256, device="cuda")
        del x
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / n * 1e6
for flag in sys.argv[1:]:
    while not os.path.exists(flag):
        time.sleep(0.02)
    print("%.3f" % timed(), flush=True)
time.sleep(600)
"""


def _stats(pid):
    from gpuscope.core.target import probe_client

    with probe_client.probe_for(pid, timeout=30) as client:
        return client.stats()["devices"][0]


def test_probe_a_cuda_leak_grows_allocated_and_torch_history_names_it(cuda_torch, spawn_python):
    from gpuscope.core.diagnosis import ladder as allocations

    child = spawn_python(PROBED_CUDA_LEAKER)
    first = _stats(child.pid)
    second = wait_until(lambda: (s := _stats(child.pid))["allocated"] >= first["allocated"] + (160 << 20) and s,
                        timeout=60, what="allocated to grow by 160 MiB")
    print(f"leaker: allocated {first['allocated']} -> {second['allocated']}, reserved {first['reserved']} -> "
          f"{second['reserved']}, retries {second['num_alloc_retries']}, ooms {second['num_ooms']}")
    result = allocations.attribute(child.pid, 3.0)
    for rung in result.rungs:
        print(f"rung {rung.method}: {rung.status}: {rung.detail}")
    for s in result.suspects[:3]:
        print(f"suspect {s.function} {s.file}:{s.line} bytes={s.bytes} share={s.share:.3f} count={s.count}")
    assert result.method == "torch-history" and result.suspects[0].function == "keep_kv"
    assert result.suspects[0].bytes >= 16 << 20 and result.suspects[0].share > 0.9


def test_probe_a_churning_allocator_grows_reserved_with_allocated_flat(cuda_torch, spawn_python):
    from gpuscope.core.diagnosis import ladder as allocations
    from gpuscope.core.target import probe_client

    child = spawn_python(PROBED_CUDA_CHURN)
    first = _stats(child.pid)
    last = wait_until(lambda: (s := _stats(child.pid))["reserved"] >= first["reserved"] + (512 << 20) and s,
                      timeout=60, what="reserved to grow by 512 MiB")
    print(f"churn: allocated {first['allocated']} -> {last['allocated']}, reserved {first['reserved']} -> "
          f"{last['reserved']}, allocated peak {last['allocated_peak']}, inactive_split {last['inactive_split']}")
    assert last["allocated"] < 300 << 20  # at most the one live scratch tensor
    with probe_client.probe_for(child.pid, timeout=30) as client:
        held = allocations.torch_history_suspects(client, child.pid, 2.0)
    print(f"churn: torch-history suspects {[(s.function, s.bytes) for s in held]}")
    assert sum(s.bytes or 0 for s in held) < 300 << 20


def test_the_console_source_shows_torch_beside_nvml_and_classifies_cache_growth(cuda_torch, spawn_python):
    """What the console's detail panel shows, from real NVML and a real probe: NVML >= reserved >=
    allocated for the churning process, and the diagnosis calls its growth cache-growth."""
    import time as _time

    from gpuscope.core.diagnosis.steps import diagnose
    from gpuscope.core.node.live import NodeSource

    child = spawn_python(PROBED_CUDA_CHURN)
    source = NodeSource(interval=0.5, focus_pid=child.pid)
    frames = []
    source.start(frames.append)
    try:
        started = _time.monotonic()
        wait_until(lambda: _time.monotonic() - started > 20 and frames and any(t.pid == child.pid for t in frames[-1].torch),
                   timeout=90, what="20 s of samples with the probe's figures")
        frame = frames[-1]
        torch = next(t for t in frame.torch if t.pid == child.pid)
        nvml = sum(r.gpu_memory_bytes or 0 for r in frame.processes if r.pid == child.pid and r.gpu is not None)
        print(f"console: NVML {nvml}, torch reserved {torch.reserved_bytes}, allocated {torch.allocated_bytes}, "
              f"other (context + libraries) {nvml - torch.reserved_bytes}")
        assert nvml >= torch.reserved_bytes >= torch.allocated_bytes
        d = diagnose(source_evidence(source, child.pid, 600))
        print(f"console: diagnosis {d.verdict} ({d.pattern}) over {d.duration_s:.0f} s")
        assert d.pattern == "cache-growth" and d.verdict == "no-leak", d.to_text()
    finally:
        source.stop()


def test_probe_cost_per_allocation_with_history_on(cuda_torch, spawn_python, tmp_path):
    from gpuscope.core.target import probe_client

    off, on = tmp_path / "off", tmp_path / "on"
    child = spawn_python(PROBED_CUDA_TIMING, str(off), str(on))
    off.touch()
    without = float(child.stdout.readline())
    with probe_client.probe_for(child.pid, timeout=30) as client:
        client.history_start()
        on.touch()
        with_history = float(child.stdout.readline())
        snap = client.snapshot(limit=1)
        client.history_stop()
    print(f"cost per allocation+free of a small tensor: {without:.2f} us without history, {with_history:.2f} us with "
          f"history (state, python stacks): +{with_history - without:.2f} us; snapshot of {snap['blocks']} live blocks")
    assert with_history < without + 200  # a few microseconds expected; 200 us would be a regression
