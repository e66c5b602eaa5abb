"""The files gpuscope writes and reads at a person's word: regular files only, private, never half-written.

gpuscope runs as root on nodes shared with other users, so a name it is given may lead anywhere:
a device (/dev/null), a FIFO, a socket, a folder, or a symbolic link another user planted.

Writing (`write_private`): only where a regular file is, or nothing is; anything else is refused
(`RefusedPath`), a symbolic link included (it is never followed), and an existing file is replaced
only when the caller says so. The data goes to a temporary file in the same folder, created 0600,
flushed and fsynced, then moved into place: a reader sees the old file or the new one, never a torn
one, and a failure (a full disk) leaves what was there before. When nothing may be replaced the
move is a hard link, which fails if the name was taken meanwhile. A replaced file's other hard
links keep the old contents: the new file is a new inode, never written through a link.

Folders (`private_folder`): gpuscope's own (sessions, exports) are made 0700, and every folder and
link on the way to them must belong to root or to the user gpuscope runs as, and no other user may
write to a folder on the way (a sticky one like /tmp aside): otherwise another user could point it,
or what is in it, elsewhere.

Reading (`read_regular`): a settings or theme file is read only if it is a regular file, and only up
to a size: a FIFO, /dev/zero or a huge file is refused at once instead of blocking or filling memory.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO
from gpuscope.errors import UsageError


class RefusedPath(UsageError, OSError):
    """A path gpuscope will not write to or read; the message is one line for a person.

    `exists`: refused only because a regular file is there (the caller may offer to replace it)."""

    def __init__(self, message: str, *, exists: bool = False) -> None:
        super().__init__(message)
        self.exists = exists


def kind_of(mode: int) -> str:
    """What a file of this st_mode is, for a person ("a FIFO (named pipe)", ...)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_target(path: str | os.PathLike, *, replace: bool) -> None:
    """Raise RefusedPath unless `path` is free, or a regular file that may be replaced."""
    try:
        st = os.lstat(path)  # lstat: a link is judged as a link, never by what it points at
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        if not replace:
            raise RefusedPath(f"will not write to {path}: the file exists", exists=True)
        return
    raise RefusedPath(f"will not write to {path}: it is {kind_of(st.st_mode)}, not a regular file")


def write_private(path: str | os.PathLike, data: bytes | str | BinaryIO, *, replace: bool = False) -> Path:
    """Write `data` (bytes, text, or a binary file to copy) to the regular file `path`, 0600, atomically.

    Raises RefusedPath when `path` is not a regular file, or exists and `replace` is false; OSError
    when the write fails (then nothing at `path` changed)."""
    target = Path(path)
    check_target(target, replace=replace)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)  # mkstemp: 0600
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, str)):
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            else:
                shutil.copyfileobj(data, f)
            f.flush()
            os.fsync(f.fileno())
        _move_into_place(tmp, target, replace)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def _move_into_place(tmp: str, target: Path, replace: bool) -> None:
    check_target(target, replace=replace)  # again: the name may have changed while the data was written
    if replace:
        os.replace(tmp, target)  # replaces the name itself: never writes through what was there
        return
    try:
        os.link(tmp, target)  # fails if anything took the name meanwhile
    except FileExistsError:
        raise RefusedPath(f"will not write to {target}: the file exists", exists=True) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        os.rename(tmp, target)  # a filesystem without hard links: the check above is the guard
        return
    os.unlink(tmp)


def private_folder(path: str | os.PathLike) -> Path:
    """The folder `path`, made 0700 where it (or a folder above it) is missing, when no other user
    controls where it leads or what is in it. Raises RefusedPath (or OSError) otherwise.

    The path is walked as the kernel would, a step at a time, links resolved by hand: every folder
    must belong to root or to us and be writable by no other user (a sticky one like /tmp aside),
    every link must be root's or ours, and a missing folder is made only once the one above it
    passed, so nothing is created by following another user's link."""
    folder = Path(os.path.abspath(path))
    me, my_group = os.geteuid(), os.getegid()
    trusted_owners = {0, me}

    def judge(where: str, st: os.stat_result) -> None:
        if not stat.S_ISDIR(st.st_mode):
            raise RefusedPath(f"will not use {folder}: {where} is {kind_of(st.st_mode)}, not a folder")
        if st.st_uid not in trusted_owners:
            raise RefusedPath(f"will not use {folder}: {where} belongs to another user (uid {st.st_uid})")
        others_write = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != my_group)
        if others_write and not st.st_mode & stat.S_ISVTX:
            raise RefusedPath(f"will not use {folder}: other users may write to {where}")

    current = "/"
    judge(current, os.lstat(current))
    pending = list(folder.parts[1:])
    links = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            try:
                os.mkdir(step, 0o700)  # never follows a link: a name taken meanwhile is EEXIST
            except FileExistsError:
                pass
            st = os.lstat(step)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted_owners:
                raise RefusedPath(f"will not use {folder}: {step} is a link another user (uid {st.st_uid}) made")
            links += 1
            if links > 40:
                raise RefusedPath(f"will not use {folder}: too many links on the way")
            target = Path(os.readlink(step))
            if target.is_absolute():
                current = "/"
            pending[:0] = target.parts[1:] if target.is_absolute() else target.parts
            continue
        judge(step, st)
        current = step
    return folder


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The contents of the regular file `path` (a link to one is fine), at most `limit` bytes.

    Raises FileNotFoundError, RefusedPath (not a regular file, or larger than `limit`) or OSError."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):  # judged before opening: opening a device can do things
        raise RefusedPath(f"{path} is {kind_of(st.st_mode)}, not a regular file")
    # O_NONBLOCK: if a FIFO took the name since, opening it does not wait for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise RefusedPath(f"{path} is {kind_of(st.st_mode)}, not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RefusedPath(f"{path} is larger than {limit // 1024} KiB, more than gpuscope reads of such a file")
    return data
