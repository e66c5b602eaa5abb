"""The demo's processes: the leaking sample RAG service and its load generator (`Demo`).

`gpuscope demo` (gpuscope.commands.demo) starts them and watches the service. Everything started
here is stopped by `Demo.stop`, whatever ends the demo; the children also watch their parent PID,
so even a SIGKILL of gpuscope leaves nothing running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
import urllib.request

from gpuscope.demo.lifecycle import child_env
from gpuscope.errors import Failure

# Per query kept by the retriever: at the load generator's ~10 requests/s, ~6 MB/s — above the
# detector's 5 MB/s-for-10-s alert, so a 20 s headless demo ends with a verdict of "leak".
DEMO_LEAK_KB = 640
STARTUP_TIMEOUT_S = 20.0
CUDA_STARTUP_TIMEOUT_S = 90.0  # importing torch and creating a CUDA context can take a while
CUDA_PROBE_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 3.0
_LISTENING = re.compile(r"listening on (http://\S+)")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxies


class DemoError(Failure):
    """The demo could not run: one plain line for the user."""


def cuda_usable(timeout: float = CUDA_PROBE_TIMEOUT_S) -> bool:
    """Can the service put tensors on a GPU? Asked of a throwaway interpreter, so gpuscope itself
    never pays for (or is destabilised by) importing torch."""
    if importlib.util.find_spec("torch") is None:
        return False
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=timeout, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _stop_process(proc: subprocess.Popen | None) -> None:
    """terminate, wait, then kill: the process is gone (and reaped) when this returns."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass  # unkillable (D state); nothing more a parent can do
    except OSError:
        pass


class Demo:
    """The two child processes: the service and its load generator."""

    def __init__(self, *, cuda: bool = False) -> None:
        self.cuda = cuda
        self.service: subprocess.Popen | None = None
        self.load: subprocess.Popen | None = None
        self.url: str | None = None
        self._service_log = tempfile.TemporaryFile()  # its stderr, shown if it fails to start

    def start(self) -> None:
        cmd = [sys.executable, "-m", "gpuscope.demo.service", "--port", "0", "--leak-kb", str(DEMO_LEAK_KB)]
        cmd += ["--cuda"] if self.cuda else []
        self.service = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._service_log, bufsize=0, env=child_env()
        )
        line = self._first_line(CUDA_STARTUP_TIMEOUT_S if self.cuda else STARTUP_TIMEOUT_S)
        match = _LISTENING.search(line)
        if not match:
            why = self._service_failure() or (f"it printed {line.strip()!r}" if line else "it did not answer in time")
            raise DemoError(f"the demo service did not start: {why}")
        self.url = match.group(1)
        # Only the announcement comes on stdout; the pipe is no longer needed.
        assert self.service.stdout is not None
        self.service.stdout.close()
        # Its one-line tally at exit would land after the demo's own output: the service's
        # request count says the same.
        self.load = subprocess.Popen(
            [sys.executable, "-m", "gpuscope.demo.load", "--url", self.url],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
        )

    def _first_line(self, timeout: float) -> str:
        """The service's first stdout line, or what came before the deadline / its exit."""
        assert self.service is not None and self.service.stdout is not None
        fd = self.service.stdout.fileno()
        data = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in data:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if not sel.select(min(left, 0.5)):
                    if self.service.poll() is not None:
                        break
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:  # EOF: it exited
                    break
                data += chunk
        return data.split(b"\n", 1)[0].decode("utf-8", "replace")

    def _service_failure(self) -> str | None:
        """The last line the service wrote to stderr (why it died), if it wrote one."""
        try:
            self._service_log.seek(0)
            lines = [ln.strip() for ln in self._service_log.read().decode("utf-8", "replace").splitlines()]
        except OSError:
            return None
        lines = [ln for ln in lines if ln]
        return lines[-1] if lines else None

    def state(self) -> dict | None:
        """The service's /admin/state, or None if it does not answer."""
        if not self.url:
            return None
        try:
            with _OPENER.open(f"{self.url}/admin/state", timeout=3.0) as resp:
                return json.load(resp)
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        # Load first, so the service is not stopped under requests that then count as errors.
        _stop_process(self.load)
        _stop_process(self.service)
        if self.service is not None and self.service.stdout is not None:
            self.service.stdout.close()
        self._service_log.close()
