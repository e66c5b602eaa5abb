"""The target process as gpuscope sees it before touching it: is it Python, which version, which
interpreter runs it with which environment and whose rights, and is calling into it safe.

Everything the target's owner chooses (its interpreter binary, the environment its imports
follow, its files) is run only with the owner's rights (`gpuscope.core.target.privilege`); only the
variables that decide imports are taken from the target's environment (it may hold secrets).

Nothing here attaches to the target: the attribution ladder (`allocations`), the probe injection
(`inject`) and the console's process panel (`host`) ask here first.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil

from gpuscope.core.target import privilege
from gpuscope.core.common.printable import printable_line

_PYTHON_NAME = re.compile(r"^(?:python|pypy)\d*(?:\.\d+)*[a-z]?$")
_PYTHON_IN_NAME = re.compile(r"(?:python|pypy)(\d+)\.(\d+)")
_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)")


# -- is it Python, which version --------------------------------------------------------------------


def is_python(name: str | None, exe: str | None) -> bool:
    """By the process's name (comm) or its executable's file name."""
    if name and _PYTHON_NAME.match(name):
        return True
    return bool(exe and _PYTHON_NAME.match(os.path.basename(exe)))


def libpython_version(pid: int) -> tuple[int, int] | None:
    """An embedded interpreter (or one linked to libpython) shows in the memory map."""
    try:
        with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as maps:
            for line in maps:
                m = _LIBPYTHON.search(line)
                if m:
                    return int(m.group(1)), int(m.group(2))
    except OSError:
        return None
    return None


def version_in_name(exe: str | None) -> tuple[int, int] | None:
    """python3.11, pypy3.10: the version an executable's file name says."""
    m = _PYTHON_IN_NAME.search(os.path.basename(exe)) if exe else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def python_version_of(pid: int) -> tuple[int, int] | None:
    """The Python major.minor a process runs, from its executable's name or its libpython; None if
    it is not a Python process, (0, 0) for a Python that says no version (python, python3 that is
    neither versioned nor shared: ask its interpreter, `python_version`). Nothing is run."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        try:
            exe = psutil.Process(pid).exe()
        except psutil.Error:
            exe = ""
    version = version_in_name(exe) or libpython_version(pid)
    if version is not None:
        return version
    if re.match(r"^python\d?$", os.path.basename(exe)):
        return (0, 0)
    return None


def interpreter_version(exe: str, pid: int) -> str | None:
    """The full version ("3.11.9") from the interpreter binary itself (a short timeout). The
    binary is the process owner's to choose (a copy beside a pyvenv.cfg runs that user's .pth
    files), so it runs only with that owner's rights, and only if its file name is a Python's (the
    process's name is the process's to set)."""
    if not is_python(None, exe):
        return None
    try:
        owner = privilege.owner_of(pid)
    except (OSError, ValueError, privilege.NotPermitted):
        return None
    out = privilege.run_as(owner, [exe, "-c", "import platform; print(platform.python_version())"],
                           env={"PATH": privilege.SAFE_PATH, "PYTHONNOUSERSITE": "1"}, timeout=3)
    if out is None:
        return None
    version = out.stdout.strip()
    return version if out.returncode == 0 and re.fullmatch(r"\d+\.\d+\.\d+\S*", version) else None


# -- the interpreter that runs it ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interpreter:
    """The interpreter that runs a process, the environment it imports with, and whose rights run it."""

    path: str
    env: dict[str, str]
    owner: privilege.Owner


def target_interpreter(pid: int) -> Interpreter:
    """The interpreter that runs `pid`, to be run only with the rights of the process's owner.

    argv[0] is preferred to /proc/PID/exe: a virtualenv's python resolves to the base interpreter,
    which would not see the venv's packages. argv[0] is whatever the process set, so it (and its
    environment) are run only as the process's owner (`gpuscope.core.target.privilege`), and only
    when its file name is a Python's. Only the variables that decide imports are taken from the
    target's environment (it may hold secrets). A process that is not Python, or runs with lent
    rights (setuid, setgid), is refused before anything of it runs.
    Raises psutil errors, privilege.NotPermitted.
    """
    proc = psutil.Process(pid)
    args = proc.cmdline()
    exe = proc.exe()
    if python_version_of(pid) is None:
        raise privilege.NotPermitted(
            f"process {pid} ({printable_line(proc.name())}) is not a Python interpreter: gpuscope runs none of its files"
        )
    try:
        owner = privilege.owner_of(pid)
    except (OSError, ValueError):
        raise psutil.NoSuchProcess(pid) from None
    privilege.require_can_act_as(owner, pid)
    named_python = bool(args) and os.path.isabs(args[0]) and is_python(None, args[0])
    python = args[0] if named_python and os.access(args[0], os.X_OK) else exe
    env = {"PATH": privilege.SAFE_PATH}
    try:
        theirs = proc.environ()
    except psutil.AccessDenied:
        theirs = {}
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONNOUSERSITE"):
        if name in theirs:
            env[name] = theirs[name]
    return Interpreter(python, env, owner)


def run_python(interpreter: Interpreter, code: str, timeout: float) -> subprocess.CompletedProcess | None:
    """`python -c code` with the target's interpreter and imports, as the target's owner."""
    return privilege.run_as(interpreter.owner, [interpreter.path, "-c", code], env=interpreter.env, timeout=timeout)


def python_version(interpreter: Interpreter) -> tuple[int, int] | None:
    out = run_python(interpreter, "import sys; print('%d %d' % sys.version_info[:2])", 20)
    if out is None or out.returncode != 0:
        return None
    try:
        major, minor = out.stdout.split()
        return int(major), int(minor)
    except ValueError:
        return None


# -- is calling into it safe? ------------------------------------------------------------------------

# gdb started by gpuscope reads no init file (-nx) and auto-loads nothing (no script, no
# libthread_db) from the files of the process it attaches to: those belong to the target's owner.
GDB_SAFE = ["-nx", "-iex", "set auto-load off"]
# lldb likewise: no init file, no script beside a symbol file.
LLDB_SAFE = ["--no-lldbinit", "-O", "settings set target.load-script-from-symbol-file false"]
# gdb first, as memray does on Linux; lldb where gdb cannot call into processes here (gdb 13 fails
# to restore the registers of CPUs with AMX tiles after a call: "Couldn't write extended state
# status").
DEBUGGERS = ("gdb", "lldb")

_SAFE_INJECTION: dict[tuple[str, int], tuple[str | None, str | None]] = {}  # (interpreter, owner) -> (debugger, why none)
_SAFE_LOCK = threading.Lock()


def injection_debugger(interpreter: Interpreter) -> tuple[str | None, str | None]:
    """The debugger that may call into a process of this interpreter here ("gdb" or "lldb", as
    found on PATH, tried in `DEBUGGERS` order), or (None, why none may).

    Each debugger attaches to a throwaway `python -c "sleep"` (run as the target's owner) and calls
    a function in it, as memray's injection does; if it reports an error, or the throwaway does not
    survive unharmed, the real target would not either.
    """
    key = (interpreter.path, interpreter.owner.uid)
    with _SAFE_LOCK:
        if key in _SAFE_INJECTION:
            return _SAFE_INJECTION[key]
        problems = []
        for name in DEBUGGERS:
            path = shutil.which(name)
            if path is None:
                problems.append(f"{name} is not installed")
                continue
            problem = _canary(name, path, interpreter)
            if problem is None:
                _SAFE_INJECTION[key] = (name, None)
                return name, None
            problems.append(problem)
        why = "; ".join(problems)
        if all(p.endswith("not installed") for p in problems):
            why = "neither gdb nor lldb is installed (one is needed to attach before Python 3.14): apt-get install gdb"
        _SAFE_INJECTION[key] = (None, why)
        return None, why


_CANARY = (
    "import sys, time\n"
    "print('ready', flush=True)\n"
    "for _ in range(600):\n"
    "    time.sleep(0.05)\n"  # an interruptible system call, like a service waiting for requests
    "print('survived', flush=True)\n"
)


def _debugger_call(name: str, path: str, pid: int, expression: str) -> list[str]:
    """The command that attaches `name` (gdb or lldb) to `pid`, evaluates one C `expression` in it
    and detaches."""
    if name == "gdb":
        return [path, "-batch", *GDB_SAFE, "-p", str(pid), "-ex", f"call {expression}"]
    return [path, "--batch", *LLDB_SAFE, "-p", str(pid), "-o", f"expr {expression}"]


def _canary(name: str, path: str, interpreter: Interpreter) -> str | None:
    shown = printable_line(interpreter.path)
    try:
        canary = privilege.popen_as(interpreter.owner, [interpreter.path, "-c", _CANARY], env=interpreter.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except (OSError, subprocess.SubprocessError, privilege.NotPermitted):
        return f"a test process of {shown} did not start"
    try:
        if privilege.read_until(canary.stdout, time.monotonic() + 20, line=True).strip() != "ready":
            return f"a test process of {shown} did not start"
        out = privilege.run_as(None, _debugger_call(name, path, canary.pid, "(int) getpid()"), timeout=30)
        wake(canary.pid)  # lldb may leave the process it detached from stopped
        time.sleep(0.3)  # long enough for a damaged sleep() to fail in the canary
        if canary.poll() is not None:
            said = privilege.read_until(canary.stderr, time.monotonic() + 1).strip().splitlines()[-1:] or ["it exited"]
            why = printable_line(said[0])
            return f"{name} harmed a test process when calling into it ({why}); attaching would likely crash the service"
        if out is None:
            return f"{name} did not finish calling into a test process within 30 s"
        said = out.stdout + out.stderr
        failure = re.search(r"^(Couldn't .*|Cannot .*|.*[Ee]rror.*)$", said, re.MULTILINE)
        # lldb without its Python module says so at every start (a ModuleNotFoundError): no failure of the call.
        if failure and "warning" not in failure.group(0).lower() and "embedded_interpreter" not in failure.group(0):
            return f"{name} cannot call into processes on this machine ({printable_line(failure.group(1).strip())})"
        if not re.search(rf"= {canary.pid}\s*$", said, re.MULTILINE):
            return f"{name} did not return a test process's own PID when calling into it"
        return None
    finally:
        canary.kill()
        canary.wait()
        for pipe in (canary.stdout, canary.stderr):
            if pipe is not None:
                pipe.close()


def wake(pid: int) -> None:
    """A process left stopped by a debugger that went away is continued (harmless otherwise: lldb
    sometimes leaves the process it detached from stopped, as memray notes)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass
