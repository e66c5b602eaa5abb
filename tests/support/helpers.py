"""Helpers the tests share: child programs, polling with a deadline, locating tools."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import threading
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

# tests/support/: imported by the tests (pytest puts it on sys.path) and by benchmarks/.
SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parent.parent
FAKE_NVML_DIR = SUPPORT / "fake_nvml"
FIXTURES = SUPPORT / "fixtures" / "metrics"

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


def canary_says(monkeypatch, problem: str | None) -> None:
    """Play the verdict of gpuscope's debugger canary (is injecting safe here?) for every debugger,
    instead of this machine's."""
    from gpuscope.core.target import interpreter as target  # noqa: PLC0415 - benchmarks import this module without gpuscope

    monkeypatch.setattr(target, "_SAFE_INJECTION", {})
    monkeypatch.setattr(target, "_canary", lambda name, path, interpreter: problem)
    if problem is not None:
        # A refusal is the canary's, also where no debugger is installed (the verdict would be
        # "neither is installed" before any canary ran); none is then run, so none need be there.
        which = shutil.which
        monkeypatch.setattr(target.shutil, "which",
                            lambda name, *a, **k: f"/usr/bin/{name}" if name in target.DEBUGGERS else which(name, *a, **k))


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether `url` answers 200 right now (a server under test coming up)."""
    try:
        with _DIRECT.open(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def require_gpu(missing: str) -> None:
    """A GPU test cannot run (`missing` says why): skip on machines without a GPU, but fail under
    scripts/gpu-check, which is run where there is one and must not pass with its tests skipped."""
    if os.environ.get("GPUSCOPE_REQUIRE_GPU"):
        pytest.fail(f"{missing} (GPUSCOPE_REQUIRE_GPU is set: the GPU checks must run)")
    pytest.skip(missing)


class Tmux:
    """gpuscope in a real terminal: tmux runs it, send-keys types, capture-pane reads the screen."""

    def __init__(self, command: list[str], env: dict[str, str] | None, size, config: Path, options: tuple[str, ...] = ()):
        """`options`: more lines of tmux configuration (e.g. "set -g alternate-screen off")."""
        self.tmux = require_tool("tmux")
        self.socket = f"gpuscope-test-{uuid.uuid4().hex[:8]}"
        # remain-on-exit from the config, so a command that exits at once still leaves its output.
        config.write_text("".join(f"{line}\n" for line in ["set -g remain-on-exit on", "set -g status off", *options]))
        self.config = config
        env_args = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
        self._run("new-session", "-d", "-s", "t", "-x", str(size[0]), "-y", str(size[1]), *env_args,
                  "-c", str(ROOT), shlex.join(command))

    def _run(self, *args: str) -> str:
        cmd = [self.tmux, "-L", self.socket, "-f", str(self.config), *args]
        # COLUMNS and LINES (pytest sets them) would size the console instead of the pane.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def screen(self, escapes: bool = False) -> str:
        """What the pane shows; with `escapes`, with the escape sequences of its text styles."""
        return self._run("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "t")

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", "t", *keys)

    def pid(self) -> int:
        """The process the pane runs (a shell, or the command itself when the shell exec'd it)."""
        return int(self._run("display-message", "-p", "-t", "t", "#{pane_pid}").strip())

    def dead(self) -> bool:
        return self._run("display-message", "-p", "-t", "t", "#{pane_dead}").strip() == "1"

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def run_together(jobs: dict, timeout: float = 120.0) -> dict:
    """Call each of `jobs` (key -> function of no argument) in a thread of its own, all at once;
    their results by key (a job still running after `timeout` is left out)."""
    results: dict = {}
    threads = [threading.Thread(target=lambda k=key, job=job: results.__setitem__(k, job())) for key, job in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


def python_without(folder: Path, *missing: str) -> Path:
    """An interpreter environment made in `folder` (a venv without pip) with this one's installed
    packages except `missing` (distribution and import names, e.g. "memray") and gpuscope itself:
    a service's environment as deployed, where only its own libraries are. Each package is a link
    in the new environment's site-packages (so that its frames read as a library's). Its python."""
    import sysconfig
    import venv

    venv.create(folder, with_pip=False)
    python = folder / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=30, check=True)
    theirs = Path(out.stdout.strip())
    hidden = tuple(name.lower().replace("-", "_") for name in (*missing, "gpuscope", "_editable_impl_gpuscope"))
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if entry.suffix == ".pth" or name.startswith(hidden) or name == "__pycache__" or (theirs / entry.name).exists():
            continue
        (theirs / entry.name).symlink_to(entry)
    for name in missing:
        probe = subprocess.run([str(python), "-c", f"import {name.replace('-', '_')}"], capture_output=True, timeout=30)
        assert probe.returncode != 0, f"{name} is still importable in {folder}"
    return python


class NoNvml:
    """A node source's NVML reader on a machine without a driver."""

    def read(self):
        from gpuscope.core.node.model import NvmlReading

        return NvmlReading(status="no NVIDIA driver")

    def close(self) -> None:
        pass


class NoAllocator:
    """A node source's PyTorch allocator reader that finds no process with one."""

    def read(self):
        return ()

    def close(self) -> None:
        pass


class OneProcessHost:
    """A node source's host reader that sees one Python process, PID 1000, started at 1.0, with
    the command line `command` (and cgroup `cgroup`)."""

    def __init__(self, command: str, cgroup=None) -> None:
        self.command = command
        self.cgroup = cgroup

    def memory(self):
        from gpuscope.core.node.model import HostMemory

        return HostMemory(64 * 2**30, 16 * 2**30, 48 * 2**30)

    def scan(self, fresh=frozenset()):
        from gpuscope.core.node.host import SeenProcess

        return [SeenProcess(1000, 1.0, "python", "/usr/bin/python3", "svc", 100 * 2**20, 1.0)]

    def complete(self, seen):
        from gpuscope.core.node.model import HostProcess

        where = {"cgroup": self.cgroup} if self.cgroup is not None else {}
        return [HostProcess(s.pid, s.create_time, s.user, s.name, self.command, s.rss, s.cpu, True, **where)
                for s in seen]

    def close(self) -> None:
        pass
