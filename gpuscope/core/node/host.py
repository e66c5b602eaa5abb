"""Host processes and memory, from /proc (through psutil where there is none).

One pass over /proc per read with cheap fields only, its files kept open from one pass to the
next, a process idle a while read every third pass only (not one on screen); command lines
(redacted) and cgroups (where the process runs) are read for the processes that will be shown
and cached by (pid, create_time), so PID reuse is never confused with the old process and a pass
reads them only for the processes it shows for the first time. A process that exits mid-read is
simply not in the result.

Every text read here is its owner's choice (a process can name itself, its arguments and its
folder anything, escape sequences included): names, users, command lines, folders enter the
model through `printable`, so nothing downstream can write a control character from them.
"""

from __future__ import annotations

import os
import pwd
import resource
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

import psutil

from gpuscope.core.node.cgroup import Cgroup, read_cgroup
from gpuscope.core.node.model import HostMemory, HostProcess, ProcessDetail
from gpuscope.core.common.printable import printable
from gpuscope.core.common.redact import redact_command
from gpuscope.core.target.interpreter import interpreter_version, is_python, libpython_version, version_in_name
from gpuscope.errors import Failure

_STAT_MAX = 4096  # /proc/PID/stat is one line of ~300 bytes (the name is at most 64)
_STATM_MAX = 256  # /proc/PID/statm: seven numbers on one line
_MEMINFO_MAX = 256  # /proc/meminfo's first three lines, about 90 bytes
_NAMES_KEPT = 4096
# A process whose /proc/PID/stat reads exactly as on the last pass has not run since (its CPU
# ticks, page faults, state and size are all there): its row is taken again as it was, without
# asking its owner again, for at most this many passes. Changing owner (setuid) takes running,
# which nearly always moves a counter; this bounds how long the rare one that does not could show
# its old owner.
_UNCHANGED_PASSES = 10
# A process whose stat line read the same CALM_READS times running is read only every
# CALM_EVERY-th pass until it changes (unless it is among those asked fresh: the ones on
# screen): a node's idle processes, most of them, then cost a third of a read a pass. One that
# wakes is seen at most CALM_EVERY - 1 passes late, which no growth judgement notices (and so is
# a new process that took the PID of one that exited meanwhile).
CALM_READS = 3
CALM_EVERY = 3
VERSION_ASK_DELAY_S = 2.0  # a Python's full version is asked this long after it is first wanted
_FIELDS = ["pid", "name", "exe", "username", "memory_info", "cpu_percent", "create_time", "num_threads", "status"]
_GONE = (b"Z", b"X", b"x")  # zombie or dead: exited, waiting to be collected
_PF_EXITING = 0x4  # the kernel's flag (stat's ninth field) for a process tearing itself down
# /proc/PID/stat's state letter in psutil's words, so that both ways of reading a process say the same
_STATUSES = {
    b"R": "running", b"S": "sleeping", b"D": "disk-sleep", b"T": "stopped", b"t": "tracing-stop",
    b"Z": "zombie", b"X": "dead", b"x": "dead", b"K": "wake-kill", b"W": "waking", b"I": "idle",
    b"P": "parked",
}


class ProcessGone(Failure):
    """The process does not exist (any more)."""


class ProcessForbidden(Failure):
    """The process exists but this user may not read it."""


@dataclass(frozen=True, slots=True)
class SeenProcess:
    """The cheap fields of one process from one pass over /proc."""

    pid: int
    create_time: float
    name: str
    exe: str | None
    user: str | None
    rss: int | None
    cpu: float | None
    threads: int | None = None
    status: str | None = None  # psutil's words ("sleeping", "running", ...)
    # Resident memory less its shared pages (files, shared memory): what this process alone holds,
    # so that processes touching one shared buffer do not each look as if they grew by it. None
    # where it cannot be read (then the RSS stands for it).
    private: int | None = None


class _Passed:
    """What a pass over /proc kept of one process for the next pass (updated in place while its
    line stays the same: most processes, idle, cost one comparison a pass)."""

    __slots__ = ("line", "row", "exe_key", "used", "when", "passes", "same", "rest")

    def __init__(self, line: bytes, row: SeenProcess, exe_key: tuple[int, float, bytes], used: int,
                 when: float) -> None:
        self.line = line  # its /proc/PID/stat line
        self.row = row
        self.exe_key = exe_key  # PID, start time and name: the executable is read again when one changes
        self.used = used  # CPU ticks (utime + stime)
        self.when = when  # monotonic time of the pass
        self.passes = 0  # passes since its owner was read
        self.same = 0  # reads in a row that found its line unchanged
        self.rest = 0  # passes still to take its row as it was without reading it (see CALM_EVERY)


class _Identity(NamedTuple):
    """What a process is, read once in its life: its command line (redacted) and its cgroup."""

    command: str
    cgroup: Cgroup


class HostCollector:
    def __init__(self) -> None:
        self._identities: dict[tuple[int, float], _Identity] = {}
        self._versions: dict[str, str | None] = {}  # interpreter path -> version
        self._versions_asked: set[str] = set()  # interpreters being asked in the background
        self._versions_lock = threading.Lock()
        self._users: dict[int, str] = {}
        self._last_pass: dict[int, _Passed] = {}  # processes gone are forgotten: as big as /proc
        self._names: dict[bytes, str] = {}  # a name as /proc gives it -> printable
        self._stat_files: dict[int, int] = {}  # pid -> its /proc/PID/stat, open between passes
        self._stat_files_kept = _stat_files_to_keep()
        self._meminfo_fd: int | None = None
        self._proc_ok = os.path.exists("/proc/self/stat")
        if self._proc_ok:
            self._ticks = os.sysconf("SC_CLK_TCK")
            self._page = os.sysconf("SC_PAGE_SIZE")
            self._boot = psutil.boot_time()  # the same base psutil uses for create_time

    def memory(self) -> HostMemory:
        total_available = self._meminfo() if self._proc_ok else None
        if total_available is None:
            vm = psutil.virtual_memory()
            total_available = vm.total, vm.available
        total, available = total_available
        return HostMemory(total=total, used=total - available, available=available)

    def _meminfo(self) -> tuple[int, int] | None:
        """MemTotal and MemAvailable from /proc/meminfo (kept open and read again, as the stat
        files are; psutil parses all of its fifty lines); None where the kernel does not give
        MemAvailable (before 3.14), for psutil's estimate."""
        try:
            if self._meminfo_fd is None:
                self._meminfo_fd = os.open("/proc/meminfo", os.O_RDONLY)
            data = os.pread(self._meminfo_fd, _MEMINFO_MAX, 0)
        except OSError:
            return None
        found = {}
        for line in data.split(b"\n", 3)[:3]:  # MemTotal, MemFree, MemAvailable: the first lines
            key, _, value = line.partition(b":")
            found[key] = value
        try:
            return int(found[b"MemTotal"].split()[0]) * 1024, int(found[b"MemAvailable"].split()[0]) * 1024
        except (KeyError, IndexError, ValueError):
            return None

    def scan(self, fresh: frozenset[int] | set[int] = frozenset()) -> list[SeenProcess]:
        """Every visible process with the fields needed to choose rows (no command lines yet).
        Those in `fresh` (the ones on screen) are read on every pass, others idle a while every
        CALM_EVERY-th."""
        if self._proc_ok:
            return self._scan_proc(fresh)
        return self._scan_psutil()

    def close(self) -> None:
        """Close the /proc files kept open between passes (a later scan opens them again); not
        while a scan runs."""
        files, self._stat_files = list(self._stat_files.values()), {}
        if self._meminfo_fd is not None:
            files.append(self._meminfo_fd)
            self._meminfo_fd = None
        for fd in files:
            os.close(fd)

    def _read_stat(self, pid: int, name: str, kept: dict[int, int]) -> bytes | None:
        """/proc/PID/stat, None when the process is gone. The file stays open for the next pass:
        reading it again from the start costs less than opening it by its path again. An open file
        belongs to its process, not to the PID: once that process has gone it reads as an error,
        never as a process that took its PID, which is then opened afresh."""
        fd = self._stat_files.pop(pid, None)
        if fd is not None:
            try:
                data = os.pread(fd, _STAT_MAX, 0)
            except OSError:
                os.close(fd)
            else:
                kept[pid] = fd
                return data
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
        except OSError:
            return None  # exited while being read
        try:
            data = os.read(fd, _STAT_MAX)
        except OSError:
            os.close(fd)
            return None
        if len(kept) < self._stat_files_kept:
            kept[pid] = fd
        else:
            os.close(fd)
        return data

    def _scan_proc(self, fresh: frozenset[int] | set[int]) -> list[SeenProcess]:
        # One read of /proc/PID/stat per process: the whole table costs a few ms even with
        # hundreds of processes (psutil's per-field reads cost several times more), and one stat()
        # for its owner, none for a process whose line has not changed (most of them, idle).
        # The executable is read once per program: known by PID, start time and name, so that a
        # reused PID or an exec is read afresh.
        now = time.monotonic()
        ticks = self._ticks
        last = self._last_pass
        this_pass: dict[int, _Passed] = {}
        seen: list[SeenProcess] = []
        kept: dict[int, int] = {}
        try:
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                pid = int(name)
                before = last.get(pid)
                if before is not None and before.rest > 0 and pid not in fresh and before.passes < _UNCHANGED_PASSES:
                    # Calm: taken as it was this pass (its file stays open; its CPU figure is the
                    # last read's, and the next read's covers the passes between).
                    before.rest -= 1
                    before.passes += 1
                    fd = self._stat_files.pop(pid, None)
                    if fd is not None:
                        kept[pid] = fd
                    this_pass[pid] = before
                    seen.append(before.row)
                    continue
                data = self._read_stat(pid, name, kept)
                if data is None:
                    continue  # exited while being read
                if before is not None and before.line == data and before.passes < _UNCHANGED_PASSES:
                    row = before.row
                    cpu = 0.0 if now > before.when else None  # no tick used since the last pass
                    if row.cpu != cpu:
                        row = before.row = replace(row, cpu=cpu)
                    before.when = now
                    before.passes += 1
                    before.same += 1
                    if before.same >= CALM_READS:
                        before.rest = CALM_EVERY - 1
                    this_pass[pid] = before
                    seen.append(row)
                    continue
                close = data.rfind(b")")
                fields = data[close + 2 :].split()
                if len(fields) < 22:
                    continue
                if fields[0] in _GONE or int(fields[6]) & _PF_EXITING:
                    # Exiting: its memory is being torn down, a read now is no sample of what it
                    # used (a series ending at 0 would read as a fall, not as the process's end).
                    continue
                used = int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
                create_time = self._boot + int(fields[19]) / ticks
                try:
                    uid = os.stat(f"/proc/{name}").st_uid  # may change while it lives (setuid): read each pass
                except OSError:
                    continue  # exited while being read
                raw_name = data[data.find(b"(") + 1 : close]
                key = (pid, create_time, raw_name)  # an exec keeps PID and start time, not the name
                if before is not None and before.exe_key == key:
                    exe = before.row.exe
                else:
                    try:
                        exe = os.readlink(f"/proc/{name}/exe")
                    except OSError:
                        exe = None
                cpu = None
                if before is not None and before.row.create_time == create_time and now > before.when:
                    cpu = round(100.0 * (used - before.used) / ticks / (now - before.when), 1)
                rss = int(fields[21]) * self._page
                private = self._private(name) if rss else 0  # kernel threads hold none
                if private is None and before is not None and before.row.create_time == create_time:
                    private = before.row.private
                row = SeenProcess(
                    pid=pid,
                    create_time=create_time,
                    name=self._name(raw_name),
                    exe=exe,
                    user=self._user(uid),
                    rss=rss,
                    cpu=cpu,
                    threads=int(fields[17]),
                    status=_STATUSES.get(fields[0]),
                    private=private,
                )
                this_pass[pid] = _Passed(data, row, key, used, now)
                seen.append(row)
        finally:
            for fd in self._stat_files.values():  # processes gone since the last pass
                os.close(fd)
            self._stat_files = kept
        self._last_pass = this_pass
        return seen

    def _private(self, name: str) -> int | None:
        """Resident less shared pages, from /proc/PID/statm (resident and shared are its second and
        third numbers). Read only for a process whose stat line changed: any change of its memory
        changes its page-fault counters there."""
        try:
            fd = os.open(f"/proc/{name}/statm", os.O_RDONLY)
        except OSError:
            return None
        try:
            fields = os.read(fd, _STATM_MAX).split()
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return max(0, int(fields[1]) - int(fields[2])) * self._page
        except (IndexError, ValueError):
            return None

    def _name(self, raw: bytes) -> str:
        """The process's name (it may rename itself at any time: read each pass, made printable once)."""
        name = self._names.get(raw)
        if name is None:
            if len(self._names) >= _NAMES_KEPT:
                self._names.clear()
            name = self._names[raw] = printable(raw.decode("utf-8", "replace"))
        return name

    def _user(self, uid: int) -> str:
        user = self._users.get(uid)
        if user is None:
            try:
                user = pwd.getpwuid(uid).pw_name
            except KeyError:
                user = str(uid)
            user = self._users[uid] = printable(user)
        return user

    def _scan_psutil(self) -> list[SeenProcess]:
        """Where there is no Linux /proc: the same fields through psutil."""
        seen: list[SeenProcess] = []
        for proc in psutil.process_iter(_FIELDS, ad_value=None):
            info = proc.info
            if info.get("create_time") is None:
                continue  # vanished while being read
            mem = info.get("memory_info")
            seen.append(
                SeenProcess(
                    pid=info["pid"],
                    create_time=info["create_time"],
                    name=printable(info.get("name") or ""),
                    exe=info.get("exe") or None,
                    user=_printable_or_none(info.get("username")),
                    rss=mem.rss if mem is not None else None,
                    cpu=info.get("cpu_percent"),
                    threads=info.get("num_threads"),
                    status=info.get("status"),
                    private=_private_of(mem),
                )
            )
        return seen

    def complete(self, seen: Iterable[SeenProcess]) -> list[HostProcess]:
        """Full rows (with redacted command lines) for the chosen processes."""
        out: list[HostProcess] = []
        live: set[tuple[int, float]] = set()
        for s in seen:
            live.add((s.pid, s.create_time))
            identity = self._identity(s)
            out.append(
                HostProcess(
                    pid=s.pid,
                    create_time=s.create_time,
                    user=s.user,
                    name=s.name,
                    command=identity.command,
                    rss_bytes=s.rss,
                    cpu_percent=s.cpu,
                    is_python=is_python(s.name, s.exe),
                    private_bytes=s.private,
                    cgroup=identity.cgroup,
                )
            )
        # Forget the processes no longer shown: the cache stays as big as the table.
        for key in [k for k in self._identities if k not in live]:
            del self._identities[key]
        return out

    def _identity(self, seen: SeenProcess) -> _Identity:
        """The process's redacted command line and its cgroup, read once per process (pid and
        start time): neither changes while it lives (an exec keeps the cgroup; the command line
        shown is the one it started with)."""
        key = (seen.pid, seen.create_time)
        identity = self._identities.get(key)
        if identity is None:
            identity = self._identities[key] = _Identity(self._command(seen.pid, seen.name), read_cgroup(seen.pid))
        return identity

    @staticmethod
    def _command(pid: int, name: str) -> str:
        try:
            args = psutil.Process(pid).cmdline()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return f"[{name}] (exited)"
        except psutil.AccessDenied:
            return f"[{name}]"
        return redact_command(args) if args else f"[{name}]"

    # -- the attached process -------------------------------------------------------------------

    def detail(self, pid: int, python_version: bool = True, wait_for_version: bool = True,
               seen: SeenProcess | None = None) -> ProcessDetail:
        """Everything shown about an attached process. Raises ProcessGone / ProcessForbidden.
        `wait_for_version=False`: a Python's full version is learnt in the background (its
        interpreter runs once, tens of milliseconds or more); until then the version is the one
        its executable's name or libpython says ("3.11"), or None.

        `seen`: the process's row from the scan just made. Its user, threads and state are then
        taken from there and its command line from the table's (read once per process), so that
        following a process costs one more read (its folder) a pass, not five."""
        if seen is not None:
            assert seen.pid == pid
            identity = self._identity(seen)
            try:
                cwd = _printable_or_none(os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                cwd = None
            return ProcessDetail(
                pid=pid,
                user=seen.user,
                command=identity.command,
                exe=_printable_or_none(seen.exe),
                cwd=cwd,
                threads=seen.threads,
                python_version=self.python_version(pid, seen.name, seen.exe, wait_for_version) if python_version else None,
                status=seen.status,
                create_time=seen.create_time,
                runs_in=identity.cgroup.name,
            )
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                create_time = proc.create_time()
                name = printable(proc.name())
                args = proc.cmdline()
                user = _printable_or_none(_optional(proc.username))
                exe = _optional(proc.exe) or None
                cwd = _printable_or_none(_optional(proc.cwd) or None)
                threads = _optional(proc.num_threads)
                status = _optional(proc.status)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise ProcessGone(pid) from None
        except psutil.AccessDenied:
            raise ProcessForbidden(pid) from None
        return ProcessDetail(
            pid=pid,
            user=user,
            command=redact_command(args) if args else f"[{name}]",
            exe=_printable_or_none(exe),
            cwd=cwd,
            threads=threads,
            python_version=self.python_version(pid, name, exe, wait_for_version) if python_version else None,
            status=status,
            create_time=create_time,
            runs_in=read_cgroup(pid).name,
        )

    def python_version(self, pid: int, name: str, exe: str | None, wait: bool = True) -> str | None:
        """The interpreter version of a Python process, or None if it is not Python. `wait=False`:
        the interpreter is asked in the background and the quick answer is returned meanwhile."""
        if exe and exe in self._versions:
            return self._versions[exe]
        python = is_python(name, exe)
        if python and exe and not wait:
            self._ask_interpreter_later(exe, pid, name)
            return _short_version(pid, name, exe)
        version = interpreter_version(exe, pid) if python and exe else None
        if version is None:
            version = _short_version(pid, name, exe)
        if exe:
            self._versions[exe] = version
        return version

    def _ask_interpreter_later(self, exe: str, pid: int, name: str) -> None:
        with self._versions_lock:
            if exe in self._versions_asked:
                return
            self._versions_asked.add(exe)

        def ask() -> None:
            self._versions[exe] = interpreter_version(exe, pid) or _short_version(pid, name, exe)

        # Later, not only elsewhere: a Python starting beside the console's own start slows it.
        timer = threading.Timer(VERSION_ASK_DELAY_S, ask)
        timer.name, timer.daemon = "gpuscope-python-version", True
        timer.start()


def _stat_files_to_keep() -> int:
    """How many /proc/PID/stat files a collector keeps open: a quarter of the files this process
    may open, at most 512 (the rest are opened afresh each pass), so that the descriptors of
    everything else stay below 1024, where code that still uses select() can wait on them."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 512 if soft == resource.RLIM_INFINITY else max(0, min(512, soft // 4))


def _short_version(pid: int, name: str, exe: str | None) -> str | None:
    """"3.11" from libpython in the process's maps or from its executable's name; nothing is run."""
    short = libpython_version(pid) or (version_in_name(exe) if is_python(name, exe) else None)
    return "%d.%d" % short if short else None


def _private_of(mem) -> int | None:
    """psutil's resident less shared memory, where its platform gives the shared part."""
    shared = getattr(mem, "shared", None)
    return None if mem is None or shared is None else max(0, mem.rss - shared)


def _printable_or_none(text: str | None) -> str | None:
    return None if text is None else printable(text)


def _optional(getter):
    try:
        return getter()
    except psutil.AccessDenied:
        return None


def check_attachable(pid: int) -> ProcessDetail:
    """Validate `--pid` before any console starts. Raises ProcessGone / ProcessForbidden."""
    if pid <= 0:
        raise ProcessGone(pid)
    return HostCollector().detail(pid, python_version=False)
