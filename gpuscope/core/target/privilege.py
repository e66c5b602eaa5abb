"""Never lending gpuscope's rights to a process it looks at.

gpuscope usually runs as root on a node shared by many users. A few checks must run a target's own
interpreter in the target's environment (is memray importable there, which Python is it, does a
debugger harm a process of it), and everything in such a command belongs to the target's owner:
the interpreter path (argv[0] is whatever the process set, `exec -a` makes it any file), the
PYTHONPATH with its `sitecustomize.py`, the `.pth` files of its site-packages. So these commands
run as that owner — its uid, gid and supplementary groups — with a clean environment, in "/", in a
session of their own (no controlling terminal to type into), with bounded time and output, and
with no new privileges (a setuid or setgid file they execute gains nothing). The owner is the
process's real uid and gid; a process running a setuid or setgid program (its real, effective and
saved ids differ) holds rights it was lent, and nothing is run on its behalf. A
gpuscope that is not root cannot become another user: it refuses instead (`NotPermitted`).

Folders shared with a target (a capture it writes, a script it reads) are two levels: a private
folder of gpuscope's (0711: others may pass through, not list; files only gpuscope reads go
here, 0600) holding one folder that belongs to the target's owner (0700). Nobody else can plant
anything in either, and gpuscope never follows a link in the target's folder: a file it reads
there must be a regular file of the owner's, with one link, opened without following symlinks.
The folders are named after gpuscope's PID, so those left by a gpuscope that was killed are
removed by the next one (`sweep_stale_folders`), without following links.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import selectors
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass

import psutil
from gpuscope.errors import Failure


SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OUTPUT_LIMIT = 64 * 1024  # bytes kept of each stream of a command run for a target
MAX_SWEEP_NAMES = 100_000  # entries of the temporary folder looked at by one sweep
_PR_SET_NO_NEW_PRIVS = 38  # <linux/prctl.h>
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child between fork and exec only calls it
_FOLDER = re.compile(r"^gpuscope-(memray|inject)-(\d+)-")


class NotPermitted(Failure):
    """gpuscope cannot act with (only) the target owner's rights; the message says why."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose rights a process has: the uid, gid and supplementary groups commands run with."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    def is_me(self) -> bool:
        return self.uid == os.geteuid()


def owner_of(pid: int) -> Owner:
    """The owner of process `pid`, from /proc/PID/status: its real uid and gid, and its groups.

    A process whose real, effective, saved and filesystem ids are not all the same runs a setuid or
    setgid program: it holds rights its user was lent (a setgid program's group may read files the
    user may not), so nothing is run on its behalf at all (NotPermitted). Raises ProcessLookupError
    when the process is gone."""
    fields: dict[str, list[int]] = {}
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
        for line in f.read(64 * 1024).splitlines():
            name, _, rest = line.partition(":")
            if name in ("Uid", "Gid", "Groups"):
                try:
                    fields[name] = [int(v) for v in rest.split()]
                except ValueError:
                    raise ProcessLookupError(pid) from None
    if len(fields.get("Uid", ())) != 4 or len(fields.get("Gid", ())) != 4:
        raise ProcessLookupError(pid)
    for kind in ("Uid", "Gid"):
        if len(set(fields[kind])) != 1:
            real, effective, saved, _ = fields[kind]
            raise NotPermitted(
                f"process {pid} runs with lent rights (real {kind.lower()} {real}, effective {effective}, saved "
                f"{saved}: a setuid or setgid program): gpuscope runs nothing on its behalf"
            )
    return Owner(fields["Uid"][0], fields["Gid"][0], tuple(fields.get("Groups", ())))


def require_can_act_as(owner: Owner, pid: int) -> None:
    """NotPermitted unless gpuscope can run commands with exactly `owner`'s rights."""
    if owner.is_me() or os.geteuid() == 0:
        return
    raise NotPermitted(
        f"process {pid} belongs to uid {owner.uid} and gpuscope runs as uid {os.geteuid()}: running that "
        "process's interpreter here would lend it gpuscope's rights; run gpuscope as that user or as root"
    )


def popen_as(owner: Owner | None, cmd: list[str], *, env: dict[str, str], **kwargs) -> subprocess.Popen:
    """Start `cmd` with `owner`'s rights (None: gpuscope's own, for gpuscope's own programs), in "/",
    in a new session, with exactly `env`. Raises NotPermitted, OSError."""
    kwargs.update(env=env, cwd="/", start_new_session=True, close_fds=True)
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    if owner is not None:
        kwargs["preexec_fn"] = _no_new_privileges
    if owner is not None and not owner.is_me():
        if os.geteuid() != 0:
            raise NotPermitted(f"gpuscope runs as uid {os.geteuid()} and cannot run a command as uid {owner.uid}")
        kwargs.update(user=owner.uid, group=owner.gid, extra_groups=list(owner.groups))
    return subprocess.Popen(cmd, **kwargs)


def _no_new_privileges() -> None:
    """In the child, before exec: a setuid or setgid file it executes gains nothing (the owner's
    interpreter may be such a copy), and neither does anything that runs after it."""
    if _PRCTL(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        os._exit(126)  # never run the owner's file without it


def run_as(owner: Owner | None, cmd: list[str], *, env: dict[str, str] | None = None, timeout: float,
           limit: int = OUTPUT_LIMIT, pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess | None:
    """Run `cmd` as `popen_as` does and wait at most `timeout` seconds; at most `limit` bytes of
    each stream are kept. None if it could not start or did not finish in time (it is killed).
    Without `env`, gpuscope's own environment (for gpuscope's own programs only). `pass_fds`: open
    descriptors the command gets."""
    if env is None:
        if owner is not None and not owner.is_me():
            raise ValueError("a command run for another user needs an environment of its own")
        env = dict(os.environ)
    try:
        proc = popen_as(owner, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=pass_fds)
    except (OSError, subprocess.SubprocessError, NotPermitted):
        return None
    deadline = time.monotonic() + timeout
    try:
        streams = _drain(proc, deadline, limit)
        if streams is None:
            return None
        try:
            code = proc.wait(max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        return subprocess.CompletedProcess(cmd, code, *streams)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _drain(proc: subprocess.Popen, deadline: float, limit: int) -> tuple[str, str] | None:
    """(stdout, stderr) read until both close, `limit` bytes of each kept; None when the deadline
    passes first."""
    assert proc.stdout is not None and proc.stderr is not None  # started with both piped
    pipes = (proc.stdout, proc.stderr)
    kept = {pipe.fileno(): bytearray() for pipe in pipes}
    with selectors.DefaultSelector() as selector:
        for pipe in pipes:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for key, _ in selector.select(min(left, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = kept[key.fd]
                buffer += chunk[: max(0, limit - len(buffer))]
    out, err = (bytes(kept[p.fileno()]).decode("utf-8", "replace") for p in pipes)
    return out, err


def read_until(pipe, deadline: float, *, limit: int = 4096, line: bool = False) -> str:
    """What `pipe` says before `deadline` (up to `limit` bytes; with `line`, up to its first newline)."""
    data = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(pipe, selectors.EVENT_READ)
        while len(data) < limit and not (line and b"\n" in data):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                break
            chunk = os.read(pipe.fileno(), limit - len(data) if not line else 1)
            if not chunk:
                break
            data += chunk
    return bytes(data).decode("utf-8", "replace")


# -- folders shared with a target --------------------------------------------------------------------


class SharedFolder:
    """`private`: gpuscope's folder (0711), for files only gpuscope reads; `shared`: the target
    owner's folder inside it (0700), where the target reads and writes. Removed by `close()`
    unless `keep()` was called (then the next gpuscope's sweep removes it)."""

    def __init__(self, kind: str, owner: Owner) -> None:
        sweep_stale_folders()
        self.owner = owner
        self.private = tempfile.mkdtemp(prefix=f"gpuscope-{kind}-{os.getpid()}-")
        self._kept = False
        try:
            os.chmod(self.private, 0o711)
            self.shared = os.path.join(self.private, "shared")
            os.mkdir(self.shared, 0o700)
        except BaseException:
            shutil.rmtree(self.private, ignore_errors=True)
            raise

    def hand_over(self) -> None:
        """Give the shared folder (and what gpuscope wrote in it) to the target's owner."""
        if self.owner.is_me() or os.geteuid() != 0:
            return
        folder = os.open(self.shared, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for name in os.listdir(folder):
                os.chown(name, self.owner.uid, self.owner.gid, dir_fd=folder, follow_symlinks=False)
            os.fchown(folder, self.owner.uid, self.owner.gid)
        finally:
            os.close(folder)

    def keep(self) -> None:
        self._kept = True

    def close(self) -> None:
        if not self._kept:
            shutil.rmtree(self.private, ignore_errors=True)  # never follows links (Linux: fd-based)

    def __enter__(self) -> SharedFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_owned(self, name: str, limit: int) -> tuple[int, int] | None:
        """Open `name` in the shared folder for reading, if it is a regular file of the target's
        owner with one link, under `limit` bytes, reached without following any link: (fd, size),
        or None if it is not there yet. Raises OSError (with the reason) for anything else."""
        folder = os.open(self.shared, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                raise OSError(f"{name} in the folder shared with the process is a symbolic link: not followed") from None
        finally:
            os.close(folder)
        st = os.fstat(fd)
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "not a regular file"
        elif st.st_uid != self.owner.uid:
            why = f"owned by uid {st.st_uid}, not by the process's owner"
        elif st.st_nlink != 1:
            why = "a file with other names (a hard link)"
        elif st.st_size > limit:
            why = f"larger than {limit} bytes"
        if why:
            os.close(fd)
            raise OSError(f"{name} in the folder shared with the process is {why}: not read")
        return fd, st.st_size


def sweep_stale_folders(tmp: str | None = None) -> list[str]:
    """Remove the shared folders of gpuscope processes that are gone (killed before cleaning up):
    only folders of gpuscope's name pattern, owned by this user, that are real folders (not
    links). Returns what was removed."""
    tmp = tmp or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = os.scandir(tmp)
    except OSError:
        return removed
    with entries:
        for seen, entry in enumerate(entries):
            if seen >= MAX_SWEEP_NAMES:
                break
            match = _FOLDER.match(entry.name)
            if not match or int(match.group(2)) == os.getpid():
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or psutil.pid_exists(int(match.group(2))):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed
