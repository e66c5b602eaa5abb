"""gpuscope killed with SIGKILL in the middle of a diagnosis leaves nothing running in the service
and no capture of the service's allocations lying about."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuscope.core.target import privilege

from gpuscope.core.target import probe_client

from helpers import ROOT, gpuscope_cmd, wait_until

LEAKING_SERVICE = """
import time
from gpuscope import probe
assert probe.start()
keep = []
def remember():
    keep.append(bytearray(50_000))
print("ready", flush=True)
while True:
    remember()
    time.sleep(0.02)
"""


def tracking(client) -> bool:
    return bool(client.hello()["memray_capture"])


def captures_in(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.startswith("gpuscope-memray-") or p.name == "capture.bin"]


def test_sigkill_of_gpuscope_stops_the_probes_memray_tracking_and_leaves_no_capture():
    service_tmp = Path(tempfile.mkdtemp(prefix="gpuscope-test-service-tmp-"))  # the service's own TMPDIR
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "TMPDIR": str(service_tmp)}
    service = subprocess.Popen([sys.executable, "-c", LEAKING_SERVICE], env=env, stdout=subprocess.PIPE, text=True)
    diagnosis = None
    try:
        assert privilege.read_until(service.stdout, time.monotonic() + 20, line=True).strip() == "ready"
        watcher = wait_until(lambda: probe_client.probe_for(service.pid), timeout=10, what="the service's probe")
        diagnosis = subprocess.Popen(gpuscope_cmd() + ["diagnose", "--pid", str(service.pid), "--duration", "60"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: tracking(watcher), timeout=30, what="memray tracking in the service")
        capture_folders = [p for p in service_tmp.iterdir() if p.name.startswith("gpuscope-memray-")]
        assert capture_folders and all(stat.S_IMODE(p.lstat().st_mode) == 0o700 for p in capture_folders)
        diagnosis.send_signal(signal.SIGKILL)
        diagnosis.wait(10)
        killed = time.monotonic()
        wait_until(lambda: not tracking(watcher), timeout=10, what="memray tracking to stop")
        assert time.monotonic() - killed < 3, "memray tracking went on after gpuscope was killed"
        wait_until(lambda: not captures_in(service_tmp), timeout=5, what="the capture to be removed")
        assert service.poll() is None
        watcher.close()
    finally:
        for proc in (diagnosis, service):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        subprocess.run(["rm", "-rf", str(service_tmp)], timeout=30)
