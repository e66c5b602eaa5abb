"""Finding and talking to gpuscope probes (`gpuscope.probe`) inside services.

A probe serves `probe-<pid>.sock` in its user's runtime folder (`$XDG_RUNTIME_DIR/gpuscope/`, or
`<tmp>/gpuscope-<uid>/`, or a private `<that folder>-XXXXXXXX` beside it when another user took
the name first). gpuscope may run as another user (root) or outside the service's
container, so the client looks where the *target* would have put it: its XDG_RUNTIME_DIR and
TMPDIR (from /proc/PID/environ when readable), /run/user/<uid>, the temp folder, each also through
/proc/PID/root when the target lives in another mount namespace, and with the PID the target sees
(its namespace PID). A socket is trusted only if it and its folder belong to the target's user
(or root), nobody else may write in the folder, and the target process itself listens on it
(SO_PEERCRED): another user's planted names are passed over, and nothing is sent to them.
Sockets of processes that are gone (or that nobody answers on) are stale: the client removes them,
never through a link.

Every connect and every reply has a timeout; every failure is a `ProbeError` with one plain
sentence.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from gpuscope import probe as _probe
from gpuscope.core.common.json_depth import too_large
from gpuscope.core.common.printable import printable_line
from gpuscope.errors import GpuscopeError

CONNECT_TIMEOUT_S = 2.0
REPLY_TIMEOUT_S = 10.0
MAX_REPLY = 16 * 1024 * 1024
MAX_REPLY_DEPTH = 16  # a probe's replies nest 5 deep (records, their frames, a frame)
_NAME = re.compile(r"^probe-(\d+)\.sock$")


class ProbeError(GpuscopeError):
    """The probe could not be reached or could not answer; the message says why, in one sentence."""


@dataclass(frozen=True, slots=True)
class ProbeInfo:
    pid: int  # the PID the socket is named after (as its process sees itself)
    path: str


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What PyTorch's caching allocator holds on one device of one process."""

    index: int
    allocated: int | None  # bytes in live tensors
    reserved: int | None  # bytes the allocator holds from CUDA (allocated + its cache)
    allocated_peak: int | None = None
    reserved_peak: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None


# -- where probes are --------------------------------------------------------------------------------

MAX_FOLDERS = 256  # probe folders one listing looks in
MAX_NAMES = 1024  # entries of one folder looked at
MAX_BESIDE = 4  # private folders `<folder>-XXXXXXXX` of one user looked in (a probe's second choice)
_FOLDER_NAME = re.compile(r"^gpuscope-(\d+)(-[A-Za-z0-9_]+)?$")


def _namespace_pid(pid: int) -> int:
    """The PID the process sees itself as (innermost of /proc/PID/status NSpid), else `pid`."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    fields = line.split()[1:]
                    return int(fields[-1]) if fields else pid
    except (OSError, ValueError):
        pass
    return pid


def _other_root(pid: int) -> str | None:
    """/proc/PID/root when the process sees another filesystem root (a container), else None."""
    root = f"/proc/{pid}/root"
    try:
        theirs, ours = os.stat(root), os.stat("/")
    except OSError:
        return None
    return None if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino) else root


def _uids(pid: int) -> set[int] | None:
    try:
        ids = psutil.Process(pid).uids()
    except psutil.Error:
        return None
    return {ids.real, ids.effective}


def _open_folder(path: str, owners: set[int]) -> int | None:
    """An open descriptor of `path` if it is a real folder (not a link) of one of `owners` that
    nobody else may write in; None otherwise. Everything after is done relative to it, so the
    folder cannot be swapped for another one meanwhile."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid in owners and not st.st_mode & 0o022:
        return fd
    os.close(fd)
    return None


def _socket_owner(folder_fd: int, name: str) -> int | None:
    """The owner of socket `name` in the folder (None if it is not a socket, or a link)."""
    try:
        st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return None
    return st.st_uid if stat.S_ISSOCK(st.st_mode) else None


def _beside(folder: str, owners: set[int]) -> list[str]:
    """`<folder>-XXXXXXXX` folders of `owners`, where a probe goes when another user took `folder`
    first (folders of that name made by anyone else are passed over: they cannot crowd it out)."""
    parent, base = os.path.split(folder)
    found: list[str] = []
    try:
        with os.scandir(parent) as entries:
            for seen, entry in enumerate(entries):
                if seen >= _probe.MAX_NAMES or len(found) >= MAX_BESIDE:
                    break
                if entry.name.startswith(base + "-"):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode) and st.st_uid in owners:
                        found.append(entry.path)
    except OSError:
        pass
    return sorted(found)


def _candidate_dirs(pid: int) -> tuple[list[str], int | None]:
    """Folders where the probe of `pid` may be, most likely first, and the target's uid."""
    uid: int | None = None
    theirs: dict[str, str] = {}
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
        try:
            theirs = proc.environ()
        except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
            theirs = {}
    except psutil.Error:
        pass
    owner = os.getuid() if uid is None else uid
    dirs: list[str] = []
    xdg = theirs.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        dirs.append(os.path.join(xdg, "gpuscope"))
    dirs.append(f"/run/user/{owner}/gpuscope")
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = theirs.get(name)
        if value and os.path.isabs(value):
            dirs.append(os.path.join(value, f"gpuscope-{owner}"))
            break
    dirs.append(os.path.join("/tmp", f"gpuscope-{owner}"))
    if owner == os.getuid():
        dirs.append(_probe.runtime_dir())
    dirs.append(os.path.join(tempfile.gettempdir(), f"gpuscope-{owner}"))
    unique = list(dict.fromkeys(os.path.normpath(d) for d in dirs))
    root = _other_root(pid)
    if root:
        unique = [root + d for d in unique] + unique
    return unique, uid


def probe_path(pid: int) -> str | None:
    """The socket of the probe inside process `pid`, if one is there (stale ones are removed).

    Only a socket of the process's own user (or root), in a folder of that user's (or root's)
    that nobody else may write in, is looked at, and only one that process `pid` itself listens
    on (SO_PEERCRED) is answered: a name planted by another user is never taken for the probe."""
    if not psutil.pid_exists(pid):
        return None
    dirs, uid = _candidate_dirs(pid)
    owners = ((_uids(pid) or set()) | {0}) if uid is not None else {os.getuid(), 0}
    name = f"probe-{_namespace_pid(pid)}.sock"
    for group in (dirs, [b for d in dirs for b in _beside(d, owners)]):
        for folder in group:
            fd = _open_folder(folder, owners)
            if fd is None:
                continue
            try:
                if _socket_owner(fd, name) in owners and _check(fd, name, pid) == "live":
                    return os.path.join(folder, name)
            finally:
                os.close(fd)
    return None


def _check(folder_fd: int, name: str, pid: int | None) -> str:
    """"live" (process `pid`, or anyone if None, listens there), "stale" (nobody listens: the socket
    is removed), "other" (someone else listens: left alone) or "unknown" (busy, or forbidden).

    Never waits: a local socket's connect completes at once or fails at once (EAGAIN when its
    queue is full), so a listener that never accepts cannot slow a listing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(f"/proc/self/fd/{folder_fd}/{name}")
        if pid is None:
            return "live"
        return "live" if _peer_pid(sock) in (pid, None) else "other"
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            _remove(folder_fd, name)
            return "stale"
        return "unknown"  # a timeout or a permission problem: not proof that it is stale
    finally:
        sock.close()


def _peer_pid(sock: socket.socket) -> int | None:
    creds = _probe.peer_credentials(sock)
    return None if creds is None else creds[0]


def _remove(folder_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except OSError:
        pass


def _probe_folders() -> list[tuple[str, int]]:
    """Folders that may hold probes, each with the user it must belong to: this user's runtime
    folder, every user's /run/user/<uid>/gpuscope, and <tmp>/gpuscope-<uid> (and the private
    folders beside it). A folder whose owner is not the uid in its name is not one."""
    folders = {os.path.normpath(_probe.runtime_dir()): os.getuid()}
    # The temporary folder is usually /tmp itself: list each folder once (the console does this every refresh).
    for parent in dict.fromkeys((os.path.normpath(tempfile.gettempdir()), "/tmp")):
        try:
            entries = os.scandir(parent)
        except OSError:
            continue
        with entries:
            for seen, entry in enumerate(entries):
                if seen >= _probe.MAX_NAMES * 10:
                    break
                match = _FOLDER_NAME.match(entry.name)
                if match:
                    folders.setdefault(entry.path, int(match.group(1)))
    try:
        users = [n for n in os.listdir("/run/user") if n.isdigit()][:MAX_FOLDERS]
    except OSError:
        users = []
    for user in users:
        for folder in [f"/run/user/{user}/gpuscope", *_beside(f"/run/user/{user}/gpuscope", {int(user), 0})]:
            folders.setdefault(folder, int(user))
    return sorted(folders.items())


def list_probes(*, clean: bool = True) -> list[ProbeInfo]:
    """Every probe gpuscope can see (this user's folders, and every user's when readable), by PID.

    A socket counts only where it, its folder and process <pid> belong to the same user (or the
    socket and folder to root), so nobody can plant names for other users' processes; a bounded
    number of folders and names is looked at. Sockets of dead processes are removed when `clean`
    (and permitted)."""
    return _list_in(_probe_folders(), clean=clean)


def _list_in(folders: list[tuple[str, int]], *, clean: bool) -> list[ProbeInfo]:
    found: dict[int, ProbeInfo] = {}
    looked = 0
    for folder, uid in folders:
        fd = _open_folder(folder, {uid, 0})
        if fd is None:
            continue
        looked += 1
        try:
            with os.scandir(fd) as entries:
                names = [e.name for _, e in zip(range(MAX_NAMES), entries)]
            for name in names:
                match = _NAME.match(name)
                if not match:
                    continue
                pid = int(match.group(1))
                owner = _socket_owner(fd, name)
                if owner not in (uid, 0) or pid in found:
                    continue
                if not psutil.pid_exists(pid):
                    if clean:
                        # Removed only if nobody listens: a process of another PID namespace
                        # sharing this folder names its socket after a PID this side may not have.
                        _check(fd, name, None)
                    continue
                if owner != 0 and owner not in (_uids(pid) or ()):
                    continue  # not a socket of that process's user
                if clean and _check(fd, name, None) == "stale":
                    continue
                found[pid] = ProbeInfo(pid, os.path.join(folder, name))
        except OSError:
            pass
        finally:
            os.close(fd)
        if looked >= MAX_FOLDERS:
            break
    return [found[p] for p in sorted(found)]


# -- talking to one ----------------------------------------------------------------------------------


class ProbeClient:
    """A connection to one probe. One request at a time; every reply has a deadline."""

    def __init__(self, path: str, *, pid: int | None = None, connect_timeout: float = CONNECT_TIMEOUT_S,
                 timeout: float = REPLY_TIMEOUT_S) -> None:
        self.path = path
        self.pid = pid
        self.timeout = timeout
        self._buffer = bytearray()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(connect_timeout)
        try:
            self._sock.connect(path)
        except TimeoutError:
            self._sock.close()
            raise ProbeError(f"the probe at {path} did not accept a connection within {connect_timeout:g} s") from None
        except OSError as exc:
            self._sock.close()
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                raise ProbeError(f"no probe answers at {path} (its process has probably exited)") from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise ProbeError(f"not permitted to connect to {path}: run gpuscope as the service's user or as root") from None
            raise ProbeError(f"cannot connect to the probe at {path}: {exc.strerror or exc}") from None
        if pid is not None and _peer_pid(self._sock) not in (pid, None):
            # A socket of that name that another process listens on (planted, or left for a reused
            # PID): nothing is said to it.
            self._sock.close()
            raise ProbeError(f"the socket at {path} is not served by process {pid}: not its probe")

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> ProbeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, op: str, *, timeout: float | None = None,
                cancelled: Callable[[], bool] = lambda: False, **args: object) -> dict:
        """Send one request and return its result; ProbeError on an error reply, a timeout, a
        hang-up or a cancel (a cancel closes the connection, which tells the probe to stop)."""
        who = f"process {self.pid}'s probe" if self.pid is not None else f"the probe at {self.path}"
        line = json.dumps({"op": op, **args}, separators=(",", ":")).encode() + b"\n"
        try:
            self._sock.settimeout(timeout or self.timeout)
            self._sock.sendall(line)
        except OSError:
            self.close()
            raise ProbeError(f"{who} has gone away (the process exited or stopped its probe)") from None
        deadline = time.monotonic() + (timeout or self.timeout)
        # Only what arrived is searched for the end of the line, and appended in place: a reply
        # near MAX_REPLY costs one pass over it, not one per chunk.
        end = self._buffer.find(b"\n")
        while end < 0:
            if cancelled():
                self.close()
                raise ProbeError(f"cancelled: {op} in {who} was stopped")
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise ProbeError(f"{who} did not answer {op} within {timeout or self.timeout:g} s")
            try:
                if not _probe.readable(self._sock, min(0.2, left)):
                    continue
                chunk = self._sock.recv(65536)
            except (OSError, ValueError):
                chunk = b""
            if not chunk:
                self.close()
                raise ProbeError(f"{who} closed the connection before answering {op} (the process may have exited)")
            newline = chunk.find(b"\n")
            if newline >= 0:
                end = len(self._buffer) + newline
            self._buffer += chunk
            if (len(self._buffer) if end < 0 else end) > MAX_REPLY:
                self.close()
                raise ProbeError(f"{who} sent a reply over {MAX_REPLY} bytes to {op}")
        raw = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        if (problem := too_large(raw, MAX_REPLY_DEPTH)) is not None:
            raise ProbeError(f"{who} sent a reply to {op} {problem}")
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError):
            raise ProbeError(f"{who} sent something that is not JSON in reply to {op}") from None
        if not isinstance(reply, dict):
            raise ProbeError(f"{who} sent an unexpected reply to {op}")
        if not reply.get("ok"):
            error = reply.get("error")
            raise ProbeError(printable_line(error, 300) if isinstance(error, str) and error else f"{op} failed in {who}")
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    def hello(self) -> dict:
        return self.request("hello")

    def stats(self) -> dict:
        return self.request("stats")

    def history_start(self, max_entries: int | None = None) -> dict:
        args: dict[str, Any] = {} if max_entries is None else {"max_entries": max_entries}
        return self.request("history_start", **args)

    def history_stop(self) -> dict:
        return self.request("history_stop")

    def snapshot(self, limit: int | None = None, timeout: float = 120.0) -> dict:
        args: dict[str, Any] = {} if limit is None else {"limit": limit}
        return self.request("snapshot", timeout=timeout, **args)

    def diff(self, before: int | None = None, after: int | None = None, limit: int | None = None) -> dict:
        args: dict[str, Any] = {k: v for k, v in (("before", before), ("after", after), ("limit", limit)) if v is not None}
        return self.request("diff", timeout=60.0, **args)

    def memray_track(self, seconds: float, *, limit: int | None = None, interval: float | None = None,
                     memray_path: str | None = None, cancelled: Callable[[], bool] = lambda: False) -> dict:
        args: dict[str, object] = {"seconds": seconds}
        for name, value in (("limit", limit), ("interval", interval), ("memray_path", memray_path)):
            if value is not None:
                args[name] = value
        return self.request("memray_track", timeout=seconds + 60.0, cancelled=cancelled, **args)

    def tracemalloc_track(self, seconds: float, *, interval: float = 1.0, limit: int | None = None,
                          cancelled: Callable[[], bool] = lambda: False) -> dict:
        args: dict[str, object] = {"seconds": seconds, "interval": interval}
        if limit is not None:
            args["limit"] = limit
        return self.request("tracemalloc_track", timeout=seconds + 60.0, cancelled=cancelled, **args)


    def track_progress(self) -> dict:
        """What the capture running in the process (asked on another connection) has seen so far."""
        return self.request("track_progress", timeout=5.0)

    def track_stop(self) -> bool:
        """Ask the capture running in the process to stop now and reply with what it has."""
        return bool(self.request("track_stop", timeout=5.0).get("stopping"))


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


class ProbeWatch:
    """The probes `list_probes` finds, listed again only when that may have changed.

    A probe makes or removes its socket in a probe folder: each listing notes the modification
    time of the probe folders it found and of this user's own (made or not yet), and the next
    asks again only when one of them moved, a listed probe's process is gone, or `RELIST_S`
    passed (which is how a probe folder made elsewhere, by another user, is found). The folders
    above them (the temporary folder, /run/user) are not watched: on a busy machine the
    temporary folder changes all the time, for reasons that are not probes. Asked every
    refresh, this is a few stat() calls while nothing changes. Listings clean up: sockets whose
    process is gone and that nobody listens on are removed."""

    RELIST_S = 30.0
    RACY_S = 1.0  # a folder modified this recently may change again within its clock tick: look again

    def __init__(self) -> None:
        self._probes: list[ProbeInfo] | None = None
        self._stamps: dict[str, tuple[int, int, int] | None] = {}
        self._listed_at = 0.0
        self._racy = False

    def _changed(self) -> bool:
        if self._probes is None or self._racy or time.monotonic() - self._listed_at > self.RELIST_S:
            return True
        if any(not psutil.pid_exists(p.pid) for p in self._probes):
            return True
        return any(_stamp(path) != stamp for path, stamp in self._stamps.items())

    def probes(self) -> list[ProbeInfo]:
        if self._changed():
            folders = _probe_folders()
            uid = os.getuid()
            watched = {folder for folder, _ in folders}
            own = (_probe.runtime_dir(), f"/run/user/{uid}/gpuscope", f"/tmp/gpuscope-{uid}",
                   os.path.join(tempfile.gettempdir(), f"gpuscope-{uid}"))
            watched.update(os.path.normpath(d) for d in own)
            # Noted before listing: a change made while listing shows as a change next time.
            self._stamps = {path: _stamp(path) for path in sorted(watched)}
            self._listed_at = time.monotonic()
            self._probes = _list_in(folders, clean=True)
            now_ns = time.time_ns()
            self._racy = any(s is not None and now_ns - s[2] < self.RACY_S * 1e9 for s in self._stamps.values())
        return self._probes or []


def probe_for(pid: int, *, connect_timeout: float = CONNECT_TIMEOUT_S, timeout: float = REPLY_TIMEOUT_S) -> ProbeClient | None:
    """A connected client for the probe in process `pid`, or None if it has none."""
    path = probe_path(pid)
    if path is None:
        return None
    try:
        return ProbeClient(path, pid=pid, connect_timeout=connect_timeout, timeout=timeout)
    except ProbeError:
        if probe_path(pid) is None:  # it went away meanwhile
            return None
        raise


def torch_memory(pid: int, *, timeout: float = 2.0, path: str | None = None) -> tuple[DeviceMemory, ...] | None:
    """What PyTorch's allocator holds per device in process `pid`, through its probe.

    `path`: the probe's socket as `list_probes` found it (checked there), else it is looked up.
    None when the process has no probe or has not initialised CUDA (never an exception): a number
    to show beside NVML's per-process figure (which also counts the CUDA context and memory
    outside PyTorch)."""
    connect_timeout = min(timeout, CONNECT_TIMEOUT_S)
    try:
        if path is None:
            client = probe_for(pid, connect_timeout=connect_timeout, timeout=timeout)
        else:  # still only if process `pid` itself listens there
            client = ProbeClient(path, pid=pid, connect_timeout=connect_timeout, timeout=timeout)
    except ProbeError:
        return None
    if client is None:
        return None
    with client:
        try:
            devices = client.stats().get("devices") or []
        except ProbeError:
            return None
    out = []
    for d in devices:
        if not isinstance(d, dict) or not isinstance(d.get("index"), int):
            continue
        out.append(DeviceMemory(
            index=d["index"], allocated=d.get("allocated"), reserved=d.get("reserved"),
            allocated_peak=d.get("allocated_peak"), reserved_peak=d.get("reserved_peak"),
            num_alloc_retries=d.get("num_alloc_retries"), num_ooms=d.get("num_ooms"),
        ))
    return tuple(out)
