"""Another user's processes serve probe sockets that accept a connection and never answer (or never
accept at all). The node's sampling asks every probe it finds on each read: those must not slow it.

Each read is bounded by what it waits for all probes together, not by one timeout per probe; a real
probe among the silent ones is still read.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import SYSTEM_PYTHON
from gpuscope.core.node import torch_memory
from gpuscope.core.node.torch_memory import TorchMemoryCollector
from gpuscope.core.target import privilege, probe_client
from helpers import SUPPORT, wait_until

SILENT = 8
# A probe socket where the gpuscope probe of this user's process would be: it accepts every
# connection and never answers (or, `queue`, never accepts: connections wait in its queue).
SILENT_PROBE = """
import os, socket, sys, tempfile, time
folder = os.path.join(tempfile.gettempdir(), "gpuscope-%d" % os.getuid())
os.makedirs(folder, mode=0o700, exist_ok=True)
os.chmod(folder, 0o700)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
path = os.path.join(folder, "probe-%d.sock" % os.getpid())
sock.bind(path)
sock.listen(0 if sys.argv[1] == "queue" else 64)
print("ready", flush=True)
held = []
while True:
    if sys.argv[1] == "queue":
        time.sleep(1)
    else:
        held.append(sock.accept()[0])
"""
REAL_PROBE = f"""
import sys, time
sys.path.insert(0, {str(SUPPORT)!r})
import fake_cuda_torch as torch
from gpuscope import probe
assert probe.start(), probe.last_error()
kept = torch.empty(8 << 20)
print("ready", flush=True)
while True:
    time.sleep(0.2)
"""


def socket_of(proc: subprocess.Popen) -> str:
    return next(p.path for p in probe_client.list_probes(clean=False) if p.pid == proc.pid)


def start_silent(other_user, how: str) -> list[subprocess.Popen]:
    started = [other_user.popen([SYSTEM_PYTHON, "-c", SILENT_PROBE, how], stdout=subprocess.PIPE, text=True)
               for _ in range(SILENT)]
    for proc in started:
        assert privilege.read_until(proc.stdout, time.monotonic() + 20, line=True).strip() == "ready"
    return started


@pytest.fixture
def probe_folder(other_user):
    """The other user's probe folder, removed afterwards (other tests make it afresh)."""
    folder = Path(tempfile.gettempdir()) / f"gpuscope-{other_user.uid}"
    yield folder
    for proc in other_user.children:
        proc.kill()
        proc.wait(10)
    subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], timeout=30)


def test_silent_probes_of_another_user_do_not_slow_the_allocator_read(other_user, probe_folder, spawn_python):
    silent = start_silent(other_user, "accept") + start_silent(other_user, "queue")
    assert all(os.path.dirname(p) == str(probe_folder) for p in map(socket_of, silent))
    real = spawn_python(REAL_PROBE)
    wait_until(lambda: probe_client.probe_path(real.pid), timeout=20, what="the real probe's socket")
    listed = {p.pid for p in probe_client.list_probes()}
    assert {p.pid for p in silent} | {real.pid} <= listed  # every silent one is asked
    collector = TorchMemoryCollector()
    try:
        slowest = 0.0
        seen = None
        deadline = time.monotonic() + 30
        while seen is None:
            assert time.monotonic() < deadline, "the real probe was never read among the silent ones"
            started = time.monotonic()
            read = collector.read()
            slowest = max(slowest, time.monotonic() - started)
            seen = next((t for t in read if t.pid == real.pid), None)
        for _ in range(3):
            started = time.monotonic()
            collector.read()
            slowest = max(slowest, time.monotonic() - started)
        # Asked one after another, 16 silent probes took 16 x READ_TIMEOUT_S a read; asked together,
        # a read waits READ_WAIT_S for all of them (the rest is listing, bounded generously here).
        assert slowest < torch_memory.READ_WAIT_S + 2.0, slowest
        assert slowest < SILENT * torch_memory.READ_TIMEOUT_S
        assert seen.allocated_bytes and seen.allocated_bytes >= 8 << 20
    finally:
        collector.close()
    assert all(p.poll() is None for p in silent)


def test_more_silent_probes_than_a_read_asks_crowd_out_no_probe_that_answers(other_user, probe_folder, spawn_python):
    """A read asks at most MAX_PROBES probes, by PID: silent ones of lower PIDs took every place,
    and a real probe started after them was never read."""
    silent = []
    for _ in range(torch_memory.MAX_PROBES + 4):
        proc = other_user.popen([SYSTEM_PYTHON, "-c", SILENT_PROBE, "accept"], stdout=subprocess.PIPE, text=True)
        assert privilege.read_until(proc.stdout, time.monotonic() + 20, line=True).strip() == "ready"
        silent.append(proc)
    real = spawn_python(REAL_PROBE)
    wait_until(lambda: probe_client.probe_path(real.pid), timeout=20, what="the real probe's socket")
    listed = sorted(p.pid for p in probe_client.list_probes())
    if listed.index(real.pid) < torch_memory.MAX_PROBES:
        pytest.skip("PIDs wrapped: the real probe is not behind the silent ones")
    collector = TorchMemoryCollector()
    try:
        seen = None
        deadline = time.monotonic() + 20  # a few reads (each waits READ_WAIT_S), with room for a slow machine
        while seen is None:
            assert time.monotonic() < deadline, "the real probe was never read behind the silent ones"
            seen = next((t for t in collector.read() if t.pid == real.pid), None)
        assert seen.allocated_bytes and seen.allocated_bytes >= 8 << 20
    finally:
        collector.close()
