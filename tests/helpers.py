"""Helpers the tests share: child programs, polling with a deadline, locating tools."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_NVML_DIR = Path(__file__).resolve().parent / "fake_nvml"

# Programs the tests watch. Each prints "ready" once it runs, then behaves as its name says.
LEAKER = """
import sys, time
keep = []
print("ready", flush=True)
while True:
    if len(keep) < 400:          # about 2 MB/s up to 400 MB, then it plateaus
        keep.append(bytearray(b"x" * 200_000))
    time.sleep(0.1)
"""
IDLER = """
import time
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def wait_until(condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Poll until `condition()` is truthy; fail (not hang) after `timeout`. Returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def fake_nvml_env(scenario_path: Path) -> dict[str, str]:
    """Environment for a gpuscope subprocess that should see the fake NVML scenario in a file."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML_DIR), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["GPUSCOPE_FAKE_NVML"] = str(scenario_path)
    return env


def gpuscope_cmd() -> list[str]:
    """How to run the installed command (the console script next to this interpreter if present)."""
    script = Path(sys.executable).parent / "gpuscope"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuscope"]


def require_tool(name: str) -> str:
    """A system tool a test needs. Missing: skip locally, but fail where CI demands every tool."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("GPUSCOPE_REQUIRE_TOOLS"):
        pytest.fail(f"{name} is not installed (CI must install it: see .ci/run)")
    pytest.skip(f"{name} is not installed")
