"""Starting gpuscope's probe inside a Python process that is already running (opt-in).

This runs code inside the target. Two ways, as memray's `attach` does it:

- Python 3.14 and newer: `sys.remote_exec(pid, script)` (PEP 768), called by an interpreter of the
  target's own major.minor version (the target's own executable). The target runs the script in
  its main thread at its next chance; nothing is paused.
- older Pythons: a debugger (gdb, else lldb) attaches and asks the interpreter for a pending call,
  which the main thread makes with the GIL held at its next chance: gdb's stops at a breakpoint
  set for it and calls `PyRun_SimpleString` there; lldb's pending call is `PyRun_SimpleString`
  itself, its text in a page mapped for it (4 KiB left in the process). The debugger stops the
  whole process while attached, and on some machines it kills the process it calls into — so
  `target.injection_debugger()` first tries each on a throwaway process of the same interpreter,
  and the injection is refused if none leaves it unharmed.

The script (with a copy of probe.py next to it, so the target needs nothing of gpuscope's) starts
the probe only if the target has already imported torch, or if asked to anyway (for memray
tracking), and writes what it did to a status file gpuscope waits for. Every refusal is an
`InjectRefused` with one plain sentence.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuscope.core.target import privilege

from gpuscope.core.target import probe_client

from gpuscope.core.target import pyspy

from gpuscope.core.target import interpreter as target
from gpuscope.core.common.printable import printable_line
from gpuscope.errors import Failure

STATUS_TIMEOUT_S = 15.0
DEBUGGER_TIMEOUT_S = 30.0
COMPILE_TIMEOUT_S = 20.0  # the target's interpreter compiling probe.py
WARNING = (
    "this runs code inside process {pid}: a debugger (or sys.remote_exec) makes it start gpuscope's probe, "
    "a thread that answers gpuscope on a private socket. Debuggers can crash or hang a process; use it on a "
    "service you may restart."
)

_BOOTSTRAP = '''\
# Written by gpuscope (gpuscope run --inject): starts gpuscope's probe in this process.
def _gpuscope_bootstrap(status_path, probe_path, anyway):
    import os, sys

    def report(text):
        try:
            with open(status_path + ".tmp", "w") as f:
                f.write(text)
            os.replace(status_path + ".tmp", status_path)
        except OSError:
            pass

    try:
        if "torch" not in sys.modules and not anyway:
            report("no-torch")
            return
        probe = sys.modules.get("gpuscope.probe") or sys.modules.get("gpuscope_probe")
        if probe is None:
            import importlib.util

            # Compiled first: compiling the source here would leave the process megabytes larger
            # for good (the compiler's memory, freed but not given back). A .pyc of another Python
            # than this one is refused ("bad magic number"): the source then.
            for path in (probe_path + "c", probe_path):
                if not os.path.exists(path):
                    continue
                spec = importlib.util.spec_from_file_location("gpuscope_probe", path)
                probe = importlib.util.module_from_spec(spec)
                sys.modules["gpuscope_probe"] = probe
                try:
                    spec.loader.exec_module(probe)
                    break
                except ImportError:
                    del sys.modules["gpuscope_probe"]
                    if path == probe_path:
                        raise
        path = probe.start(quiet=True)
        report("started " + path if path else "failed " + str(probe.last_error()))
    except BaseException as exc:
        report("failed %s: %s" % (type(exc).__name__, exc))


_gpuscope_bootstrap({status!r}, {probe!r}, {anyway!r})
del _gpuscope_bootstrap
'''

_GDB_SCRIPT = '''\
set pagination off
set confirm off
set unwindonsignal on
sharedlibrary libc
sharedlibrary libpython
call (int)Py_AddPendingCall(&PyCallable_Check, (void*)0)
break PyCallable_Check
commands 1
  delete breakpoints
  set $gpuscope_gil = (int)PyGILState_Ensure()
  call (int)PyRun_SimpleString("exec(compile(open({script!r}).read(), {script!r}, 'exec'), {{'__name__': '__gpuscope_bootstrap__'}})")
  call (void)PyGILState_Release($gpuscope_gil)
  print "GPUSCOPE: RAN"
end
continue
'''

# No breakpoint here: memray found lldb on Linux stopping at breakpoints already deleted. The
# pending call is PyRun_SimpleString itself (an int(const char *) called as int(void *)); its text
# goes into a page mapped for it, which no call of the target's frees (nothing is written or queued
# where the map failed). mmap and strcpy take no lock the stopped thread could hold (malloc would).
_LLDB_SCRIPT = '''\
expr void *$gpuscope_text = ((void *(*)(void *, unsigned long, int, int, int, long))mmap)(0, 4096, 3, 0x22, -1, 0)
expr int $gpuscope_mapped = $gpuscope_text != (void *)-1
expr (void)($gpuscope_mapped ? ((char *(*)(char *, const char *))strcpy)((char *)$gpuscope_text, "exec(compile(open({script!r}).read(), {script!r}, 'exec'), {{'__name__': '__gpuscope_bootstrap__'}})") : (char *)0)
expr void *$gpuscope_run = (void *)(int (*)(const char *))PyRun_SimpleString
expr int $gpuscope_queued = $gpuscope_mapped ? ((int (*)(void *, void *))Py_AddPendingCall)($gpuscope_run, $gpuscope_text) : -1
p $gpuscope_queued == 0 ? "GPUSCOPE: RAN" : "GPUSCOPE: REFUSED"
'''


# Ways that queue the script for the target's main thread, which runs it when it next runs Python
# code (not while it sleeps or waits in one long call); gdb's runs it before it detaches.
QUEUED = ("sys.remote_exec", "lldb")


class InjectRefused(Failure):
    """The probe was not injected; the message says why (and what to do instead)."""


@dataclass(frozen=True, slots=True)
class Injected:
    pid: int
    path: str  # the probe's socket
    method: str  # "already running" | "sys.remote_exec" | "gdb" | "lldb"


def _refuse(text: str) -> InjectRefused:
    return InjectRefused(text)


def inject_probe(pid: int, *, anyway: bool = False, timeout: float = STATUS_TIMEOUT_S,
                 warn: Callable[[], None] = lambda: None) -> Injected:
    """Start the probe inside running process `pid`; raises InjectRefused with the reason.

    `warn` is called once every check has passed, just before code is run inside the process.
    Whatever comes from the process (its interpreter, its environment, the status it writes) is
    run only as its owner, or read only as a regular file of its owner's (`privilege`)."""
    if pid == os.getpid():
        raise _refuse("gpuscope will not inject into itself")
    try:
        proc = psutil.Process(pid)
        name = printable_line(proc.name())
        proc.cmdline()
    except psutil.NoSuchProcess:
        raise _refuse(f"no process with PID {pid}; list running ones with 'gpuscope ps'") from None
    except psutil.AccessDenied:
        raise _refuse(f"not permitted to read process {pid}: {pyspy.PERMISSION_HELP}") from None
    existing = probe_client.probe_path(pid)
    if existing:
        return Injected(pid, existing, "already running")
    version = target.python_version_of(pid)
    if version is None:
        raise _refuse(f"process {pid} ({name}) is not a Python process")
    try:
        interpreter = target.target_interpreter(pid)
    except psutil.NoSuchProcess:
        raise _refuse(f"process {pid} exited") from None
    except psutil.AccessDenied:
        raise _refuse(f"not permitted to read process {pid}: {pyspy.PERMISSION_HELP}") from None
    except privilege.NotPermitted as exc:
        raise _refuse(str(exc)) from None
    if version == (0, 0):
        version = target.python_version(interpreter) or (0, 0)
    folder = _stage(interpreter, version, anyway)
    try:
        if version >= (3, 14):
            method = "sys.remote_exec"
            handed = _remote_exec(pid, proc, interpreter, version, os.path.join(folder.shared, "bootstrap.py"), warn)
        else:
            method = _debugger(pid, interpreter, folder, warn)
            handed = method in QUEUED
        try:
            return Injected(pid, _wait_status(pid, folder, timeout, method), method)
        except InjectRefused as exc:
            # A queued script cannot be taken back: the target may still read it later.
            if handed and "has not run" in str(exc):
                folder.keep()
            raise
    finally:
        folder.close()


def _stage(interpreter: target.Interpreter, version: tuple[int, int], anyway: bool) -> privilege.SharedFolder:
    """A folder of the target owner's with the bootstrap script, a copy of probe.py and, where it
    can be made, probe.pyc compiled for the target's Python (by gpuscope when its Python is the
    same version, else by the target's interpreter, run as its owner)."""
    folder = privilege.SharedFolder("inject", interpreter.owner)
    try:
        here = Path(__file__).resolve().parents[2] / "probe.py"  # gpuscope/probe.py
        probe = os.path.join(folder.shared, "probe.py")
        shutil.copyfile(here, probe)
        same = version == sys.version_info[:2]
        if same:
            py_compile.compile(probe, cfile=probe + "c", dfile=probe, doraise=True)
        status = os.path.join(folder.shared, "status")
        with open(os.path.join(folder.shared, "bootstrap.py"), "w", encoding="utf-8") as f:
            f.write(_BOOTSTRAP.format(status=status, probe=probe, anyway=anyway))
        folder.hand_over()
        if not same:  # a failure leaves no .pyc: the target compiles the source itself
            target.run_python(interpreter, "import py_compile; py_compile.compile(%r, cfile=%r, dfile=%r, doraise=True)"
                              % (probe, probe + "c", probe), COMPILE_TIMEOUT_S)
    except BaseException:
        folder.close()
        raise
    return folder


def _wait_status(pid: int, folder: privilege.SharedFolder, timeout: float, method: str) -> str:
    """The socket of the started probe (as gpuscope finds it, not as the status says), or the refusal."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid):
            raise _refuse(f"process {pid} exited during the injection")
        try:
            opened = folder.read_owned("status", 4096)
        except OSError as exc:
            raise _refuse(f"the probe's status in process {pid} cannot be trusted: {exc}") from None
        if opened is None:
            time.sleep(0.05)
            continue
        fd, size = opened
        with os.fdopen(fd, "rb") as f:
            text = f.read(size).decode("utf-8", "replace").strip()
        if text.startswith("started "):
            return _probe_found(pid, deadline)
        if text == "no-torch":
            raise _refuse(
                f"process {pid} has not imported torch, so no probe was started (add --memray to start it anyway, "
                "for memray tracking)"
            )
        raise _refuse(f"the probe did not start in process {pid}: {printable_line(text.removeprefix('failed '))}")
    if method in QUEUED:
        raise _refuse(
            f"process {pid} has not run the script within {timeout:g} s (it runs it when its main thread next runs "
            "Python code; a main thread blocked in a long call delays it)"
        )
    raise _refuse(f"process {pid} did not start the probe within {timeout:g} s")


def _probe_found(pid: int, deadline: float) -> str:
    while True:
        path = probe_client.probe_path(pid)
        if path:
            return path
        if time.monotonic() > deadline:
            raise _refuse(f"process {pid} said its probe started, but gpuscope finds no probe of it")
        time.sleep(0.05)


def _remote_exec(pid: int, proc: psutil.Process, interpreter: target.Interpreter,
                 version: tuple[int, int], script: str, warn: Callable[[], None]) -> bool:
    """Hand the script to the target through sys.remote_exec (Python 3.14+). True once handed.

    The caller must run the target's major.minor: gpuscope's own interpreter when it does, else
    the target's own, run as the target's owner (it belongs to that user)."""
    try:
        theirs = proc.environ()
    except (psutil.Error, OSError):
        theirs = {}
    args = proc.cmdline()
    if "PYTHON_DISABLE_REMOTE_DEBUG" in theirs or any(
        a == "disable_remote_debug" or a.endswith("-Xdisable_remote_debug") for a in args
    ) or any(a == "-X" and b == "disable_remote_debug" for a, b in zip(args, args[1:])):
        raise _refuse(
            f"remote debugging is disabled in process {pid} (PYTHON_DISABLE_REMOTE_DEBUG or -X disable_remote_debug): "
            "start the service under 'gpuscope run', or call gpuscope.probe.start() in it"
        )
    if sys.version_info[:2] == version:
        caller, owner, env = sys.executable, None, None  # gpuscope's own interpreter: trusted
        flags = ["-I"]
    else:
        caller, owner, env = interpreter.path, interpreter.owner, interpreter.env
        flags = []
        if target.python_version(interpreter) != version:
            raise _refuse(
                f"version mismatch: process {pid} runs Python {version[0]}.{version[1]} but its interpreter "
                f"({printable_line(caller)}) cannot be run here as Python {version[0]}.{version[1]}; "
                "sys.remote_exec needs the same major.minor"
            )
    check = privilege.run_as(owner, [caller, *flags, "-c", "import sys; print(sys.is_remote_debug_enabled())"],
                             env=env, timeout=20)
    if check is None or check.returncode != 0 or check.stdout.strip() != "True":
        raise _refuse(
            f"remote debugging is disabled in this Python build ({printable_line(caller)}): "
            "sys.remote_exec is not available"
        )
    warn()
    out = privilege.run_as(owner, [caller, *flags, "-c", "import sys; sys.remote_exec(int(sys.argv[1]), sys.argv[2])",
                                   str(pid), script], env=env, timeout=30)
    if out is None:
        raise _refuse(f"sys.remote_exec did not return within 30 s for process {pid}")
    if out.returncode != 0:
        text = (out.stderr or out.stdout).strip()
        last = text.splitlines()[-1] if text else "no output"
        if "ermission" in last or "not permitted" in last.lower():
            raise _refuse(f"not permitted to inject into process {pid}: {pyspy.PERMISSION_HELP}")
        raise _refuse(f"sys.remote_exec failed for process {pid}: {printable_line(last)}")
    return True


def _debugger(pid: int, interpreter: target.Interpreter, folder: privilege.SharedFolder,
              warn: Callable[[], None]) -> str:
    """Run the script in the target through gdb or lldb (before Python 3.14), whichever is safe
    here; its name.

    The debugger's commands are in gpuscope's private folder (the target's folder is the target's
    to change); it reads no init file and loads nothing from the target's files."""
    name, problem = target.injection_debugger(interpreter)
    if name is None:
        raise _refuse(
            f"injection is unsafe on this machine: {problem}. Start the service under 'gpuscope run', or call "
            "gpuscope.probe.start() in it"
        )
    path = shutil.which(name)
    if path is None:
        raise _refuse(f"{name} is no longer installed")
    script = os.path.join(folder.shared, "bootstrap.py")
    if len(script) > 1000 or any(c in script for c in "'\"\\\n"):
        raise _refuse("the folder for the probe's script has a name the debugger cannot be given")
    commands = os.path.join(folder.private, f"inject.{name}")
    with open(os.open(commands, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
        f.write((_GDB_SCRIPT if name == "gdb" else _LLDB_SCRIPT).format(script=script))
    if name == "gdb":
        cmd = [path, "-batch", *target.GDB_SAFE, "-nw", "-p", str(pid), "-iex", "set auto-solib-add off", "-x", commands]
    else:
        cmd = [path, "--batch", *target.LLDB_SAFE, "-p", str(pid), "--source", commands]
    warn()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd="/")
    try:
        output, _ = proc.communicate(timeout=DEBUGGER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Interrupt rather than kill: the debugger then stops the script, removes its breakpoints and detaches.
        proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        target.wake(pid)
        raise _refuse(f"{name} could not run the script in process {pid} within {DEBUGGER_TIMEOUT_S:g} s") from None
    target.wake(pid)
    if "GPUSCOPE: RAN" in output:
        return name
    if "GPUSCOPE: REFUSED" in output:
        raise _refuse(f"process {pid} did not take the script (no page could be mapped in it, or its queue of "
                      "pending calls is full): nothing was queued")
    lower = output.lower()
    if "ptrace" in lower or "operation not permitted" in lower:
        if not psutil.pid_exists(pid):
            raise _refuse(f"no process with PID {pid}")
        raise _refuse(f"not permitted to attach {name} to process {pid}: {pyspy.PERMISSION_HELP}")
    if "no symbol" in lower or "undeclared identifier" in lower:
        raise _refuse(f"{name} found no Python symbols in process {pid} (a stripped interpreter?)")
    last = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "no output")
    raise _refuse(f"{name} could not run the script in process {pid}: {printable_line(last.strip())}")
