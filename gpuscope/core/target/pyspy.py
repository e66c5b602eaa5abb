"""Stack dumps of a running Python process through py-spy (a subprocess; the wheel ships a binary).

A blocking dump stops every thread of the target while it is read (about 0.2 ms per OS thread),
so targets with many threads are read without pausing them (`--nonblocking`, which may tear a
stack now and then). Every run has a timeout; if py-spy has to be killed, the target gets a
SIGCONT so it is never left stopped. Failures are one plain sentence (PySpyError).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from gpuscope.core.common.printable import printable
from gpuscope.core.common.redact import MASK, is_secret_name, redact_text
from gpuscope.core.target.stacks import StackDump, StackFrame, StackSample, ThreadStack, aggregate, classify
from gpuscope.errors import Failure

NONBLOCKING_FROM_THREADS = 64  # more OS threads than this: do not pause the target
DUMP_TIMEOUT_S = 10.0

PERMISSION_HELP = (
    "run gpuscope as root, or give it CAP_SYS_PTRACE (setcap cap_sys_ptrace+ep on py-spy), or set "
    "kernel.yama.ptrace_scope=0; in Docker start the container with --cap-add SYS_PTRACE, in Kubernetes "
    "add SYS_PTRACE to the container's securityContext.capabilities"
)


class PySpyError(Failure):
    """py-spy could not read the process; the message says why and what to do."""


def find_pyspy() -> str:
    """py-spy next to the running interpreter (a venv's bin/), else on PATH."""
    names = ("py-spy.exe", "py-spy") if os.name == "nt" else ("py-spy",)
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        for name in names:
            candidate = folder / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    found = shutil.which("py-spy")
    if found:
        return found
    raise PySpyError("py-spy is not installed: pip install py-spy (it comes with gpuscope) or put it on PATH")


def own_roots(pid: int) -> tuple[str, ...]:
    """Path fragments that mark the target's own code even where libraries live.

    `python -m pkg.mod` runs pkg's code, which may be installed in site-packages (a vLLM server is
    `python -m vllm...`: vLLM is the program); `python /srv/app/x.py` runs /srv/app.
    """
    try:
        proc = psutil.Process(pid)
        args, cwd = proc.cmdline(), proc.cwd()
    except psutil.Error:
        return ()
    for i, arg in enumerate(args[1:], start=1):
        if arg == "-m" and i + 1 < len(args):
            return (f"{os.sep}{args[i + 1].split('.')[0]}{os.sep}",)
        if arg.endswith(".py"):
            path = arg if os.path.isabs(arg) else os.path.join(cwd, arg)
            return (os.path.dirname(os.path.abspath(path)) + os.sep,)
    return ()


def thread_count(pid: int) -> int | None:
    try:
        return psutil.Process(pid).num_threads()
    except psutil.Error:
        return None


def exited(pid: int) -> bool:
    """Gone, or a zombie (it has exited; its parent has not collected it yet): nothing to read."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _explain(stderr: str, pid: int) -> str:
    """One sentence from py-spy's error output (which may quote the target: made printable)."""
    text = printable(stderr.strip(), newlines=True)
    lower = text.lower()
    if exited(pid) or "no such file or directory" in lower or "no such process" in lower:
        return f"process {pid} exited"
    if "permission denied" in lower or "operation not permitted" in lower:
        return f"not permitted to read process {pid}: {PERMISSION_HELP}"
    if "unsupported version of python" in lower:
        first = next((ln for ln in text.splitlines() if "nsupported" in ln), "unsupported Python version")
        return f"this py-spy cannot read process {pid}: {first.strip()} (upgrade py-spy: pip install -U py-spy)"
    if "failed to find python version" in lower or "failed to find a python interpreter" in lower:
        return f"process {pid} is not a Python process (or its interpreter is stripped of symbols)"
    first = next((ln for ln in text.splitlines() if ln.strip()), "no output")
    return f"py-spy failed on process {pid}: {first.strip()}"


def _local(variable: dict) -> tuple[str, str]:
    """(name, repr) of a local variable: one named like a secret is masked, secrets inside the
    value (a URL's password, a header in a dict) too."""
    name = str(variable.get("name", "?"))
    return name, MASK if is_secret_name(name) else redact_text(str(variable.get("repr")))


def _parse(raw: list, pid: int, mode: str, native: bool, took: float, roots: Sequence[str]) -> StackDump:
    threads = []
    for t in raw:
        frames = tuple(
            StackFrame(
                function=f.get("name") or "?",
                file=f.get("filename") or "?",
                line=int(f.get("line") or 0),
                kind=classify(f.get("filename") or "", native_module=f.get("module"), own_roots=roots),
                locals=tuple(_local(v) for v in f.get("locals") or ()),
            )
            for f in t.get("frames", [])
        )
        threads.append(
            ThreadStack(
                thread_id=int(t.get("thread_id") or 0),
                name=t.get("thread_name"),
                os_thread_id=t.get("os_thread_id"),
                active=bool(t.get("active")),
                owns_gil=bool(t.get("owns_gil")),
                frames=frames,
            )
        )
    return StackDump(pid=pid, time=time.time(), mode=mode, native=native, threads=tuple(threads), took_s=took)


def dump(
    pid: int,
    *,
    native: bool = False,
    locals_: bool = False,
    nonblocking: bool | None = None,
    timeout: float = DUMP_TIMEOUT_S,
    roots: Sequence[str] | None = None,
) -> StackDump:
    """One dump of every thread of `pid`. Raises PySpyError with a one-sentence reason."""
    if exited(pid):
        raise PySpyError(f"process {pid} exited")
    if nonblocking is None:
        threads = thread_count(pid)
        # --native needs the target paused; otherwise many threads means: do not pause it.
        nonblocking = not native and threads is not None and threads > NONBLOCKING_FROM_THREADS
    if native and nonblocking:
        raise PySpyError("native frames need a blocking dump (py-spy cannot unwind a running thread)")
    cmd = [find_pyspy(), "dump", "--pid", str(pid), "--json"]
    if nonblocking:
        cmd.append("--nonblocking")
    if native:
        cmd.append("--native")
    if locals_:
        cmd.append("--locals")
    env = dict(os.environ, RUST_BACKTRACE="0")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        _resume(pid)
        raise PySpyError(f"py-spy did not finish reading process {pid} within {timeout:g} s (it was stopped)") from None
    took = time.monotonic() - started
    if proc.returncode != 0:
        _resume(pid)  # a py-spy that failed mid-read must not leave the target stopped
        raise PySpyError(_explain(err.decode("utf-8", "replace"), pid))
    try:
        raw = json.loads(out)
    except ValueError:
        raise PySpyError(f"py-spy gave unreadable output for process {pid}") from None
    mode = "nonblocking" if nonblocking else "blocking"
    return _parse(raw, pid, mode, native, took, own_roots(pid) if roots is None else roots)


def _resume(pid: int) -> None:
    """SIGCONT, in case a killed or failed py-spy left the target stopped (py-spy #390, #416)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass


def sample(
    pid: int,
    samples: int,
    interval: float,
    *,
    native: bool = False,
    nonblocking: bool | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[int, int], object] = lambda done, total: None,
    stop: threading.Event | None = None,
) -> StackSample:
    """`samples` dumps `interval` seconds apart, aggregated into hot paths.

    A dump that fails while others succeed (a torn stack in nonblocking mode) is counted, not
    fatal; the process exiting or refusing us ends the sampling with PySpyError.
    """
    roots = own_roots(pid)
    if nonblocking is None:
        threads = thread_count(pid)
        nonblocking = not native and threads is not None and threads > NONBLOCKING_FROM_THREADS
    wait = stop or threading.Event()
    dumps: list[StackDump] = []
    errors: list[str] = []
    started = time.monotonic()
    for i in range(samples):
        if cancelled() or wait.is_set():
            break
        tick = time.monotonic()
        try:
            dumps.append(dump(pid, native=native, nonblocking=nonblocking, roots=roots))
        except PySpyError as exc:
            if exited(pid) or "not permitted" in str(exc) or "not a Python" in str(exc):
                if not dumps:
                    raise
                errors.append(str(exc))
                break
            errors.append(str(exc))
        progress(i + 1, samples)
        if i + 1 < samples and wait.wait(max(0.0, interval - (time.monotonic() - tick))):
            break
    if not dumps:
        raise PySpyError(errors[-1] if errors else f"no stack dump of process {pid} was taken")
    return StackSample(
        pid=pid,
        mode="nonblocking" if nonblocking else "blocking",
        native=native,
        samples=len(dumps),
        interval_s=interval,
        duration_s=time.monotonic() - started,
        paths=aggregate(dumps),
        last=dumps[-1],
        errors=tuple(errors),
    )
