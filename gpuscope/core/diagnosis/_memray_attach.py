"""The `memray attach` rung: is attaching safe here, attach for a bounded time, read the capture as
its owner."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence

import psutil

from gpuscope.core.target import privilege


from gpuscope.core.target import pyspy
from gpuscope.core.common.json_depth import too_large
from gpuscope.core.common.printable import printable_line
from gpuscope.core.diagnosis.attribution import suspects_from_records
from gpuscope.core.target.stacks import Suspect
from gpuscope.core.target.interpreter import Interpreter, injection_debugger, python_version, run_python, target_interpreter
from gpuscope.core.diagnosis._probe_trackers import _while_waiting
from gpuscope.core.diagnosis._shared import AttachRefused


MEMRAY_MIN_PYTHON_FOR_REMOTE_EXEC = (3, 14)
ATTACH_TIMEOUT_S = 60.0


# -- can memray be attached to this process, safely? -----------------------------------------------


def memray_importable(interpreter: Interpreter) -> bool:
    out = run_python(interpreter, "import memray", 30)
    return out is not None and out.returncode == 0


def check_attach(pid: int) -> tuple[Interpreter, str | None]:
    """Everything that must hold before memray touches `pid`: its interpreter, and the debugger
    memray must attach with (None: sys.remote_exec, Python 3.14 and newer). Raises AttachRefused."""
    try:
        interpreter = target_interpreter(pid)
    except psutil.NoSuchProcess:
        raise AttachRefused(f"process {pid} exited") from None
    except psutil.AccessDenied:
        raise AttachRefused(f"not permitted to read process {pid}: {pyspy.PERMISSION_HELP}") from None
    except privilege.NotPermitted as exc:
        raise AttachRefused(str(exc)) from None
    if not memray_importable(interpreter):
        raise AttachRefused(
            f"memray is not importable by the service's interpreter ({printable_line(interpreter.path)}): "
            "install it into the service's environment (pip install memray, or install gpuscope there), then try again"
        )
    version = python_version(interpreter)
    if version is not None and version >= MEMRAY_MIN_PYTHON_FOR_REMOTE_EXEC:
        return interpreter, None
    debugger, problem = injection_debugger(interpreter)
    if debugger is None:
        raise AttachRefused(f"memray will not be attached: {problem}")
    return interpreter, debugger


# -- the memray rung ---------------------------------------------------------------------------------

MEMRAY_WINDOW_MAX_S = 30  # memray attach tracks at most this long: it stops by itself even if gpuscope is killed
CAPTURE_LIMIT = 1 << 30  # bytes: a larger capture is not read
READER_MEMORY = 4 << 30  # address space of the child that parses a capture
READER_CPU_S = 60
READER_TIMEOUT_S = 90.0
READER_OUTPUT_LIMIT = 32 << 20  # its answer: at most 2,000 stacks of 32 frames
READER_OUTPUT_DEPTH = 8  # its answer nests 5 deep (answer, records, record, frames, frame)


def memray_cli() -> list[str]:
    """gpuscope's own memray (run in "/", so that nothing in the caller's folder is imported)."""
    return [sys.executable, "-m", "memray"]


def memray_suspects(
    pid: int, duration: float, *, cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float, int | None], None] = lambda fraction, sites: None,
) -> tuple[Suspect, ...]:
    """Attach memray for `duration` seconds (at most MEMRAY_WINDOW_MAX_S); the allocations still
    alive at the end, by owning frame. `progress(fraction, sites)` as `probe_memray_suspects`'s.

    Tracking is always detached: memray stops by itself after the window (also when gpuscope is
    killed meanwhile); on a timeout, an error or a cancel, `memray detach` is run before returning.
    The process writes its capture into a folder of its owner's inside a private one of
    gpuscope's (`privilege.SharedFolder`), removed afterwards.
    """
    interpreter, debugger = check_attach(pid)
    window = min(MEMRAY_WINDOW_MAX_S, max(1, round(duration)))
    roots = pyspy.own_roots(pid)
    with privilege.SharedFolder("memray", interpreter.owner) as folder:
        folder.hand_over()
        capture = os.path.join(folder.shared, "capture.bin")
        attached = False
        try:
            attach = ["attach", *(["--method", debugger] if debugger else []), "--aggregate", "-f", "-o", capture,
                      "--duration", str(window), str(pid)]
            out = privilege.run_as(None, memray_cli() + attach, timeout=ATTACH_TIMEOUT_S)
            if out is None or out.returncode != 0:
                last = ((out.stderr or out.stdout).strip().splitlines()[-1:] if out else []) or ["no answer"]
                raise AttachRefused(f"memray could not attach to process {pid}: {printable_line(last[0])}")
            attached = True
            waiting = _while_waiting(window, cancelled, progress)
            deadline = time.monotonic() + window + 30.0
            while time.monotonic() < deadline:
                if waiting():
                    raise AttachRefused("cancelled")
                if not psutil.pid_exists(pid):
                    raise AttachRefused(f"process {pid} exited while memray was attached")
                if time.monotonic() > deadline - 30.0:
                    read = _read_capture_counted(folder, roots)
                    if read is not None:
                        attached = False  # memray stopped itself after the window
                        found, seen = read
                        progress(1.0, seen)
                        return found
                time.sleep(0.2)
            raise AttachRefused(f"memray's capture of process {pid} did not complete in time")
        finally:
            if attached and psutil.pid_exists(pid):
                privilege.run_as(None, memray_cli() + ["detach", *(["--method", debugger] if debugger else []), str(pid)], timeout=30)


def _read_capture(folder: privilege.SharedFolder, roots: Sequence[str]) -> tuple[Suspect, ...] | None:
    """The suspects of the capture the process wrote, or None while it is not complete."""
    read = _read_capture_counted(folder, roots)
    return None if read is None else read[0]


def _read_capture_counted(folder: privilege.SharedFolder, roots: Sequence[str]) -> tuple[tuple[Suspect, ...], int] | None:
    """The suspects of the capture the process wrote and how many allocation stacks still alive it
    holds, or None while it is not complete (an aggregated capture is written when tracking stops;
    until then it does not open). Read only as a regular file of the process's owner, never
    through a link, and parsed by memray in a child process with the owner's rights and bounded
    memory and time (`_capture_child`): AttachRefused otherwise, or when the reader fails."""
    try:
        opened = folder.read_owned("capture.bin", CAPTURE_LIMIT)
    except OSError as exc:
        raise AttachRefused(str(exc)) from None
    if opened is None:
        return None
    fd, _ = opened
    try:
        owner = folder.owner
        out = privilege.run_as(
            None,
            [sys.executable, "-I", "-m", "gpuscope.core.diagnosis._capture_child", str(fd), str(owner.uid),
             str(owner.gid), ",".join(map(str, owner.groups)), str(READER_MEMORY), str(READER_CPU_S)],
            timeout=READER_TIMEOUT_S, limit=READER_OUTPUT_LIMIT, pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    if out is None:
        raise AttachRefused(f"memray's reader did not finish with the capture within {READER_TIMEOUT_S:g} s")
    if out.returncode != 0:
        said = out.stderr.strip().splitlines()[-1:] or [f"exit status {out.returncode}"]
        how = f"killed by signal {-out.returncode}" if out.returncode < 0 else printable_line(said[0])
        raise AttachRefused(f"memray's reader failed on the capture ({how}): the capture is damaged or crafted")
    return _records_read(out.stdout, roots)


def _records_read(text: str, roots: Sequence[str]) -> tuple[tuple[Suspect, ...], int] | None:
    """What the reader said, checked field by field, and its depth before it is parsed: it ran as
    the capture's owner, who may have made it say anything."""
    try:
        raw = text.encode("utf-8", "replace")
        if (problem := too_large(raw, READER_OUTPUT_DEPTH)) is not None:
            raise ValueError(problem)
        said = json.loads(text)
        if not said["complete"]:
            return None
        stacks = int(said["stacks"])
        records = [
            (tuple((str(fn), str(file), int(line)) for fn, file, line in frames), int(size), int(count))
            for frames, size, count in said["records"]
        ]
    except (ValueError, TypeError, KeyError):
        raise AttachRefused("memray's reader gave no usable answer for the capture") from None
    return suspects_from_records(records, roots), stacks
