"""The stack-sampling rung: py-spy dumps weighted by the memory growth in each interval."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil



from gpuscope.core.target import pyspy
from gpuscope.core.diagnosis.attribution import (
    suspects_from_stacks,
)
from gpuscope.core.target.stacks import StackDump, StackFrame, Suspect, ThreadStack

# -- the stack-sampling rung ------------------------------------------------------------------------


def rss_of(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        try:
            return float(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None


@dataclass(frozen=True, slots=True)
class SamplingCount:
    """How many py-spy dumps the sampling rung took, how many of them failed (torn), and in how
    many memory had grown while no thread was running (no stack to weigh)."""

    taken: int
    failed: int
    last_error: str = ""
    grew_idle: int = 0


def sample_growth(
    pid: int,
    duration: float,
    *,
    interval: float = 0.2,
    memory: Callable[[int], float | None] = rss_of,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float], None] = lambda fraction: None,
) -> tuple[tuple[Suspect, ...], SamplingCount]:
    """py-spy dumps, each working thread's stack weighted by the memory's change since the last
    look (a fall debits what a rise credited), ranked by function, and how many dumps failed.

    Low confidence by nature: a function that allocates quickly and returns is rarely caught on a
    stack, so this ranks where the process was *while* memory grew, not what allocated it (in a
    process of one thread, where that thread waits when no thread runs). A dump
    that fails (a torn stack: py-spy read a thread while it changed) is skipped and counted; the
    rung fails (PySpyError) only when the process is gone or refuses us, or when most dumps failed."""
    roots = pyspy.own_roots(pid)
    weighted: list[tuple[tuple[StackFrame, ...], float, int]] = []
    before = memory(pid)
    started = time.monotonic()
    taken = failed = grew_idle = 0
    last_error = ""
    while time.monotonic() - started < duration and not cancelled():
        tick = time.monotonic()
        taken += 1
        try:
            dump: StackDump = pyspy.dump(pid, nonblocking=True, roots=roots)
        except pyspy.PySpyError as exc:
            if pyspy.exited(pid) or "not permitted" in str(exc) or "not a Python" in str(exc):
                raise
            failed += 1
            last_error = str(exc)
            time.sleep(max(0.0, interval - (time.monotonic() - tick)))
            continue
        now = memory(pid)
        growth = (now - before) if now is not None and before is not None else 0.0
        before = now
        stacks = [t.frames for t in dump.threads if working(pid, t)]
        if not stacks and growth > 0 and len(dump.threads) == 1:
            # One thread: the growth since the last look is its own, made somewhere below where it
            # waits now (a loop that sleeps between requests is rarely caught inside one).
            stacks = [dump.threads[0].frames]
        if growth and stacks:
            # Falls debit what rises credited: a thread that builds and drops its buffers nets
            # nothing; one that keeps what it allocates nets its growth.
            for frames in stacks:
                weighted.append((frames, growth / len(stacks), 1))
        elif growth > 0:
            grew_idle += 1
        progress(min(1.0, (time.monotonic() - started) / duration))
        time.sleep(max(0.0, interval - (time.monotonic() - tick)))
    count = SamplingCount(taken, failed, last_error, grew_idle)
    if taken and failed * 2 > taken:
        raise pyspy.PySpyError(f"{failed} of {taken} stack dumps of process {pid} failed (last: {last_error})")
    return suspects_from_stacks(weighted, "stack-sampling", known_bytes=False, by_function=True), count


def working(pid: int, thread: ThreadStack) -> bool:
    """Whether a sampled thread was doing work: it holds the GIL, or py-spy saw it active and the
    kernel has it running (a thread asleep in time.sleep, or waiting on a lock or a socket, is
    in state S however py-spy read it)."""
    if thread.owns_gil:
        return True
    if not thread.active:
        return False
    return task_state(pid, thread.os_thread_id) not in ("S", "D", "I")


def task_state(pid: int, tid: object) -> str | None:
    """The kernel's state letter of thread `tid` of `pid` (None where it cannot be read)."""
    if not isinstance(tid, int) or isinstance(tid, bool) or tid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            raw = f.read(1024)
    except OSError:
        return None
    end = raw.rfind(b")")  # the name, in parentheses, may hold anything
    fields = raw[end + 2:].split(b" ", 1) if end > 0 else []
    return fields[0].decode("ascii", "replace") if fields else None
