"""Another user crowds the node with Python processes that touch one shared buffer, more of it as
time goes: each one's RSS rises and passes a service that really grows. The node still keeps that
service in detail (the console's table, `ps`, the exporter), because what it ranks by growth is
private memory (resident less shared pages), which touching a shared buffer does not raise.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import SYSTEM_PYTHON
from gpuscope.core.fleet.exporter import NodeAgent
from gpuscope.core.node.live import MAX_GROWING_ROWS, MAX_PYTHON_ROWS, MAX_RSS_ROWS
from gpuscope.core.target import privilege
from helpers import gpuscope_cmd, wait_until

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="private memory as Linux's /proc gives it")

MB = 2**20
# More of them than the rows kept for growth, for Pythons and for RSS.
CROWD = max(MAX_GROWING_ROWS, MAX_PYTHON_ROWS, MAX_RSS_ROWS) + 4
BUFFER_MB = 96
# One of the crowd: maps the shared buffer and touches 5 MB/s of it, by the clock, then holds.
SHARER = """
import mmap, sys, time
with open(sys.argv[1], "r+b") as f:
    buf = mmap.mmap(f.fileno(), 0)
print("ready", flush=True)
sys.stdin.readline()  # the go: every one starts touching at once
touched, start = 0, time.monotonic()
while touched < len(buf):
    while touched < min(len(buf), 5e6 * (time.monotonic() - start)):
        buf[touched] = 1
        touched += mmap.PAGESIZE
    time.sleep(0.05)
while True:
    time.sleep(1)
"""
# The service: keeps 1 MB/s of its own, by the clock, up to 200 MB.
LEAKING = """
import time
print("ready", flush=True)
keep, start = [], time.monotonic()
while True:
    while len(keep) < min(200, time.monotonic() - start):
        keep.append(b"x" * MB)
    time.sleep(0.05)
""".replace("MB", str(MB))


@pytest.mark.timeout(180)
def test_pythons_of_another_user_touching_one_shared_buffer_crowd_out_no_growing_service(other_user, spawn_python,
                                                                                          tmp_path):
    folder = Path("/dev/shm") if os.path.isdir("/dev/shm") else other_user.home
    shared = folder / f"gpuscope-crowd-{os.getpid()}"
    with open(shared, "wb") as f:
        f.truncate(BUFFER_MB * MB)
    other_user.own(shared)
    agent = NodeAgent("node", interval=0.5)
    agent.start()
    try:
        crowd = [other_user.popen([SYSTEM_PYTHON, "-c", SHARER, str(shared)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for _ in range(CROWD)]
        for proc in crowd:
            assert privilege.read_until(proc.stdout, time.monotonic() + 30, line=True).strip() == "ready"
        for proc in crowd:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        leaking = spawn_python(LEAKING)
        source = agent.source

        def listed_below_the_crowd() -> bool:
            """Kept in detail in a pass after every one of the crowd held more RSS than it."""
            rss = {p.pid: psutil.Process(p.pid).memory_info().rss for p in (*crowd, leaking)}
            if not all(rss[p.pid] > rss[leaking.pid] + 16 * MB for p in crowd):
                return False
            passed = time.time()  # the frames' clock
            wait_until(lambda: (source.latest_frame()[1] or 0) > passed, timeout=10, interval=0.1, what="a pass")
            frame = source.latest_frame()[0]
            return frame is not None and any(r.pid == leaking.pid for r in frame.processes)

        # By RSS the crowd would take every row kept for Pythons, for RSS and for growth (it rises
        # faster than the service, and more).
        wait_until(listed_below_the_crowd, timeout=40, interval=0.2,
                   what="the growing service kept in detail while the crowd holds more RSS")
        ps = subprocess.run([*gpuscope_cmd(), "ps", "--json"], capture_output=True, text=True, timeout=60)
        assert ps.returncode == 0, ps.stderr
        assert leaking.pid in {row["pid"] for row in json.loads(ps.stdout)}
    finally:
        agent.stop()
        shared.unlink()
