"""`gpuscope demo`: start the leaking sample RAG service under load and watch it.

Interactive, the console attaches to the service. Headless, it samples the service's memory
once a second and prints what the console would tell (text or `gpuscope.demo/1` JSON).
Everything started here is stopped here, whatever ends the demo; the children also watch
their parent PID, so even a SIGKILL of gpuscope leaves nothing running.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from gpuscope.cli import serving_source, terminal_check
from gpuscope.errors import Failure, UsageError
from gpuscope.core.model import Frame, MemorySeries
from gpuscope.demo.lifecycle import child_env

SCHEMA = "gpuscope.demo/1"
STARTUP_TIMEOUT_S = 20.0
CUDA_STARTUP_TIMEOUT_S = 90.0  # importing torch and creating a CUDA context can take a while
CUDA_PROBE_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 3.0
_LISTENING = re.compile(r"listening on (http://\S+)")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxies


class DemoError(Exception):
    """The demo could not run: one plain line for the user."""


class _Signalled(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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
        cmd = [sys.executable, "-m", "gpuscope.demo.service", "--port", "0"] + (["--cuda"] if self.cuda else [])
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


# -- headless ------------------------------------------------------------------------------------


def _watch(pid: int, duration: float, stop: threading.Event) -> MemorySeries:
    """The service's memory (RSS, and GPU memory where NVML sees it) once a second for
    `duration` seconds, through the same live source the console uses."""
    from gpuscope.core.node import NodeSource

    frames: list[Frame] = []
    source = NodeSource(interval=1.0, focus_pid=pid)
    source.start(frames.append)
    try:
        stop.wait(duration + 0.5)  # half a tick more, so the last sample lands at `duration`
    finally:
        source.stop()
    if frames and frames[-1].focus is not None and frames[-1].focus.exited:
        raise DemoError(f"the demo service (PID {pid}) exited while being watched")
    series = source.history(pid, duration + 60.0)
    if series is None or not series.ages:
        raise DemoError(f"the demo service (PID {pid}) could not be read")
    return series


def _summary(series: MemorySeries) -> tuple[dict, float]:
    """The contract's `memory` object, and the seconds the samples span."""
    from gpuscope.core.growth import floor_growth

    times = [-age for age in series.ages]
    gpu = [(t, g) for t, g in zip(times, series.gpu_bytes) if g is not None]
    if gpu:
        source, ts, values = "gpu", [t for t, _ in gpu], [g for _, g in gpu]
    else:
        source, ts, values = "rss", times, [float("nan") if v is None else v for v in series.rss_bytes]
    growth = floor_growth(ts, values)
    memory = {
        "source": source,
        "start_bytes": int(values[0]),
        "end_bytes": int(values[-1]),
        "growth_bytes_per_s": None if growth is None else round(growth, 1),
        "samples": len(values),
    }
    return memory, ts[-1] - ts[0]


def _headless(demo: Demo, args: argparse.Namespace, stop: threading.Event) -> int:
    from gpuscope.core.units import format_bytes

    assert demo.service is not None
    pid = demo.service.pid
    duration = float(getattr(args, "duration", 20.0) or 20.0)
    memory, span = _summary(_watch(pid, duration, stop))
    state = demo.state() or {}
    if getattr(args, "json", False):
        out = {
            "schema": SCHEMA,
            "pid": pid,
            "service_url": demo.url,
            "duration_s": round(span, 1),
            "memory": memory,
            "requests_served": state.get("requests_served"),
            "leak_enabled": state.get("leak_enabled"),
        }
        print(json.dumps(out))
        return 0
    label = "GPU memory" if memory["source"] == "gpu" else "RSS"
    growth = memory["growth_bytes_per_s"]
    trend = "too few samples for a trend" if growth is None else f"growing {growth / 1e6:+.2f} MB/s (floor trend)"
    if growth is not None and growth <= 0:
        trend = f"not growing ({growth / 1e6:+.2f} MB/s, floor trend)"
    print(
        f"demo service PID {pid}: {label} {format_bytes(memory['start_bytes'])} -> "
        f"{format_bytes(memory['end_bytes'])} over {span:.0f} s, {trend}"
    )
    print(f"  service   {demo.url}")
    print(
        f"  memory    source {memory['source']}, start {memory['start_bytes']} B, end {memory['end_bytes']} B, "
        f"growth {'n/a' if growth is None else f'{growth:+.0f}'} B/s, {memory['samples']} samples"
    )
    if state:
        print(
            f"  requests  {state.get('requests_served')} served; retriever cache {state.get('cache_entries')} "
            f"entries (~{format_bytes(state.get('cache_bytes'))} held); leak "
            f"{'enabled' if state.get('leak_enabled') else 'disabled'}"
        )
    return 0


# -- entry ---------------------------------------------------------------------------------------


def run_demo(args: argparse.Namespace) -> int:
    headless = bool(getattr(args, "headless", False) or getattr(args, "json", False))  # JSON is for scripts
    if not headless:
        terminal_check()  # before anything starts: no terminal, nothing to clean up, one line to read

    stop = threading.Event()
    previous: dict[int, Any] = {}

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        raise _Signalled(signum)  # unwinds through the finally below, which stops the children

    demo: Demo | None = None
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if headless:
                previous[signum] = signal.signal(signum, on_signal)
        demo = Demo(cuda=cuda_usable())
        demo.start()
        if headless:
            return _headless(demo, args, stop)
        return _console(demo, args)
    except _Signalled as sig:
        return 128 + sig.signum
    except DemoError as exc:
        print(f"gpuscope: {exc}", file=sys.stderr)
        return 1
    except (Failure, UsageError):
        raise  # the command line's own one-line errors (say, from the console): it prints them
    except Exception as exc:  # anything else is still one line, never a traceback
        print(f"gpuscope: demo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        # Signals during cleanup must not interrupt it: the handlers are removed first.
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if demo is not None:
            demo.stop()


def _console(demo: Demo, args: argparse.Namespace) -> int:
    from gpuscope.core.node import NodeSource
    from gpuscope.tui.app import GpuScopeApp

    assert demo.service is not None
    source = NodeSource(interval=getattr(args, "refresh", None) or 1.0, focus_pid=demo.service.pid)
    serving, slo = serving_source(args, [f"{demo.url}/metrics"])
    # The console ends itself cleanly on SIGTERM / SIGHUP; run_demo's finally then stops the
    # children. If the terminal is lost and that exit cannot finish, the app runs demo.stop itself.
    app = GpuScopeApp(source, theme=getattr(args, "theme", None), serving=serving, slo=slo)
    app.add_cleanup(demo.stop)
    app.run()
    return app.return_code or 0
