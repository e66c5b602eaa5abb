"""Shared plumbing for the benchmark scripts (not a benchmark itself).

- `Tmux`: a private tmux server (`tmux -L <unique socket> -f <own config>`) so nothing touches the
  user's tmux; the config turns the status line off (the pane is the whole 120x40 window) and keeps
  dead panes (`remain-on-exit`) so an early exit leaves its last words readable.
- `spawn_python`: a small Python child that prints "ready" and then idles or leaks.
- `Cleanup`: everything started is registered here and killed in a `finally`, on errors, on
  Ctrl-C (KeyboardInterrupt) and on SIGTERM/SIGHUP (turned into SystemExit so `finally` runs).

Standard library + psutil, and the tests' own helpers (tests/support: the child programs, the
fake NVML, polling with a deadline); nothing here imports gpuscope.
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from helpers import FAKE_NVML_DIR, IDLER, ROOT, free_port, gpuscope_cmd, wait_until  # noqa: E402,F401 - re-exported

# gpuscope is measured as installed: pip byte-compiles a package's modules when it installs it.
# A checkout's modules edited since their last import (or run with PYTHONDONTWRITEBYTECODE set)
# would otherwise be compiled again at every start, ~0.2 s of CPU that no user pays.
compileall.compile_dir(str(ROOT / "gpuscope"), quiet=1)

WIDTH, HEIGHT = 120, 40
PANE_TERM = "xterm-256color"  # set in the pane (tmux would otherwise set its default-terminal)

# ~1 MB/s (100 kB every 0.1 s, pages touched so RSS really grows), bounded at LEAK_MB then flat.
LEAKER = """
import sys, time
limit = int(sys.argv[1]) * 10
keep = []
print("ready", flush=True)
while True:
    if len(keep) < limit:
        keep.append(bytearray(b"x" * 100_000))
    time.sleep(0.1)
"""


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise SystemExit(f"benchmark needs '{name}' on PATH (e.g. apt-get install -y {name})")
    return path


def pane_env() -> dict[str, str]:
    """The environment the tmux server (hence each pane) starts with: the same for every tool.

    TERM=xterm-256color and no COLORTERM, so both Textual and ncurses use 256 colours (with
    COLORTERM=truecolor Textual would write 24-bit colour sequences, which are longer).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX") and k != "COLORTERM"}
    env["TERM"] = PANE_TERM
    return env


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def spread(values: Sequence[float], fmt: str = ".2f") -> str:
    """"median (min-max)", each number formatted with `fmt`: how every benchmark prints a figure
    from several runs. One run, or runs all alike, print the number alone; a range below zero reads
    "min to max" (a minus sign after a dash would be hard to read)."""
    s = summary(values)
    median, low, high = (format(s[k], fmt) for k in ("median", "min", "max"))
    if s["n"] == 1 or low == high:
        return median
    return f"{median} ({low} to {high})" if s["min"] < 0 else f"{median} ({low}-{high})"


def _raise_exit(signum, frame):  # noqa: ARG001 - signal handler signature
    raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
    """SIGTERM / SIGHUP unwind like Ctrl-C does, so every `finally` (and Cleanup) runs."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)


@contextlib.contextmanager
def signals_held():
    """Ctrl-C (or a TERM/HUP) during cleanup must not cut it short and leave processes behind:
    such a signal is noted, and acted on (KeyboardInterrupt / SystemExit) once the block is done,
    unless an exception is already unwinding the run."""
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    arrived: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if arrived:
        if arrived[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + arrived[0])


class Cleanup:
    """Everything a benchmark starts; `close()` kills it all (idempotent, never raises)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.tmuxes: list[Tmux] = []
        self.tmpdir = Path(tempfile.mkdtemp(prefix="gpuscope-bench-"))

    def __enter__(self) -> Cleanup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with signals_held():
            for t in self.tmuxes:
                t.close()
            for p in self.procs:
                kill_popen(p)
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def spawn_python(self, code: str, *args: str) -> subprocess.Popen:
        """A Python child (this interpreter) that prints "ready" and then does what `code` says."""
        script = self.tmpdir / f"child{len(self.procs)}.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL, text=True,
        )
        self.procs.append(proc)
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"child did not start (said {line!r})")
        return proc

    def popen(self, args: list[str]) -> subprocess.Popen:
        """Any other child (killed on close)."""
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def tmux(self, command: str, name: str = "t") -> Tmux:
        t = Tmux(self.tmpdir, name)
        self.tmuxes.append(t)
        t.start(command)
        return t


def kill_popen(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            p.kill()
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    if p.stdout:
        p.stdout.close()


def kill_tree(procs: Sequence[psutil.Process], timeout: float = 3.0) -> None:
    """Terminate these processes (collected while their tree was whole), then kill what is left.

    psutil.Process objects, not bare PIDs: psutil checks each one's start time, so a PID reused
    meanwhile by an unrelated process is never signalled."""
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)


class Tmux:
    """One private tmux server with one WIDTHxHEIGHT window; `close()` kills it and its panes' trees."""

    def __init__(self, tmpdir: Path, name: str) -> None:
        self.bin = require_tool("tmux")
        self.socket = f"gpuscope-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.config = tmpdir / f"{name}-{uuid.uuid4().hex[:6]}.tmux.conf"
        self.config.write_text("set -g status off\nset -g remain-on-exit on\n")
        # The tools' state (gpuscope's session journals, its last theme) is the benchmark's own and
        # goes with it: the user's sessions folder neither fills up nor changes what a start reads.
        self.state = tmpdir / "state"
        self.server_pid: int | None = None
        self.started = False
        self.closed = False

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run([self.bin, "-L", self.socket, "-f", str(self.config), *args],
                             capture_output=True, text=True, timeout=30, env=pane_env(), stdin=subprocess.DEVNULL)
        if check and out.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args[:1])} failed: {out.stderr.strip()}")
        return out.stdout

    def start(self, command: str) -> None:
        self.started = True
        self.run("new-session", "-d", "-s", "t", "-x", str(WIDTH), "-y", str(HEIGHT), "-c", str(ROOT),
                 "-e", f"TERM={PANE_TERM}", "-e", f"XDG_STATE_HOME={self.state}", command)
        self.server_pid = int(self.run("display-message", "-p", "-t", "t", "#{pid}").strip())

    def respawn(self, command: str) -> None:
        """Replace the pane's program (kills the placeholder): the server is already up."""
        self.run("respawn-pane", "-k", "-t", "t", "-c", str(ROOT), "-e", f"TERM={PANE_TERM}",
                 "-e", f"XDG_STATE_HOME={self.state}", command)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "t", *keys)

    def pane_pid(self) -> int:
        return int(self.run("display-message", "-p", "-t", "t", "#{pane_pid}").strip())

    def dead(self) -> bool:
        return self.run("display-message", "-p", "-t", "t", "#{pane_dead}", check=False).strip() == "1"

    def tree(self) -> list[psutil.Process]:
        """The server and everything under it (panes, their children)."""
        if self.server_pid is None:
            return []
        try:
            root = psutil.Process(self.server_pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def quit(self, key: str = "q", timeout: float = 10.0) -> float | None:
        """Type `key` and wait for the pane's program to exit; seconds it took, None if it did not."""
        t0 = time.perf_counter()
        try:
            self.keys(key)
            deadline = t0 + timeout
            while time.perf_counter() < deadline:
                if self.dead():
                    return time.perf_counter() - t0
                time.sleep(0.01)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        return None

    def close(self) -> None:
        if self.closed or not self.started:
            return
        with signals_held():
            self._close()
        self.closed = True

    def _close(self) -> None:
        procs = self.tree()  # read before the server goes: its panes' programs may outlive it
        try:
            subprocess.run([self.bin, "-L", self.socket, "kill-server"], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
        try:
            kill_tree(procs)
        except psutil.Error:
            pass
        # the server's socket file, in tmux's private directory
        sock = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / self.socket
        try:
            sock.unlink()
        except OSError:
            pass


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(title)
    for n, r in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))


def dump_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def quote(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    info: dict[str, object] = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "platform": sys.platform,
    }
    try:
        from importlib.metadata import version

        info["textual"] = version("textual")
    except Exception:  # noqa: BLE001 - informative only
        info["textual"] = None
    try:
        info["kernel"] = os.uname().release
    except AttributeError:
        pass
    return info


def run_script(main: Callable[[], int]) -> None:
    """Run a benchmark's main(): Ctrl-C and a closed pipe end it quietly (cleanup has run)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # `... | head`: the reader left (everything was already stopped)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
