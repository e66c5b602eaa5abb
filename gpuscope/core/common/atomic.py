"""The files gpuscope writes and reads at a person's word: regular files only, private, never half-written.

gpuscope runs as root on nodes shared with other users, so a name it is given may lead anywhere:
a device (/dev/null), a FIFO, a socket, a folder, or a symbolic link another user planted.

Writing (`write_private`): only where a regular file is, or nothing is; anything else is refused
(`RefusedPath`), a symbolic link included (it is never followed), and an existing file is replaced
only when the caller says so. The folder is reached a component at a time, each opened without
following a link, and the write happens through that folder's descriptor: a link on the way is
followed only when it is root's (or gpuscope's user's) in a folder no other user may change, so
another user's link to a root-only folder is refused, not written through. The data goes to a temporary file in the same folder, created 0600,
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
import secrets
import shutil
import stat
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


_FOLDER_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # as the kernel's own limit on a path


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def _unchangeable_by_others(st: os.stat_result) -> bool:
    """A folder of root's or ours that no other user may rename things in (a sticky one like /tmp:
    others may add names, but not move or remove ours or root's)."""
    if not _trusted(st):
        return False
    others_write = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != os.getegid())
    return not others_write or bool(st.st_mode & stat.S_ISVTX)


def open_folder(folder: str | os.PathLike, *, shown: str | os.PathLike | None = None) -> int:
    """A descriptor (O_PATH) of `folder`, reached a component at a time from "/" with each one opened
    without following a link, so that what is written there through the descriptor stays there.

    A symbolic link on the way is followed only when it is root's (or the user's gpuscope runs as)
    and sits in a folder no other user may change (`/var/run` -> `/run`): another user's link, or
    one in a folder another user may write to, is refused (RefusedPath). FileNotFoundError when a
    folder on the way is missing."""
    shown = shown if shown is not None else folder
    pending = list(Path(os.path.abspath(folder)).parts[1:])
    current = os.open("/", _FOLDER_FLAGS)
    links = 0
    try:
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            try:
                step = os.open(part, _FOLDER_FLAGS, dir_fd=current)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(part, dir_fd=current, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise RefusedPath(f"will not write to {shown}: {part} on the way is {kind_of(st.st_mode)}, "
                                      "not a folder") from None
                if not (_trusted(st) and _unchangeable_by_others(os.fstat(current))):
                    raise RefusedPath(f"will not write to {shown}: {part} on the way is a symbolic link another "
                                      f"user (uid {st.st_uid}) made or may change: not followed") from None
                links += 1
                if links > MAX_LINKS:
                    raise RefusedPath(f"will not write to {shown}: too many links on the way") from None
                target = Path(os.readlink(part, dir_fd=current))
                if target.is_absolute():
                    os.close(current)
                    current = os.open("/", _FOLDER_FLAGS)
                    pending[:0] = target.parts[1:]
                else:
                    pending[:0] = target.parts
                continue
            os.close(current)
            current = step
    except BaseException:
        os.close(current)
        raise
    return current


def _check_at(folder: int, name: str, shown: str | os.PathLike, replace: bool) -> None:
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)  # a link is judged as a link
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        if not replace:
            raise RefusedPath(f"will not write to {shown}: the file exists", exists=True)
        return
    raise RefusedPath(f"will not write to {shown}: it is {kind_of(st.st_mode)}, not a regular file")


def check_target(path: str | os.PathLike, *, replace: bool) -> None:
    """Raise RefusedPath unless `path` is free, or a regular file that may be replaced, in a folder
    reached without following another user's link (`open_folder`). A missing folder is left to the
    write to report."""
    name = os.path.basename(os.path.abspath(path))
    try:
        folder = open_folder(os.path.dirname(os.path.abspath(path)), shown=path)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        _check_at(folder, name, path, replace)
    finally:
        os.close(folder)


def write_private(path: str | os.PathLike, data: bytes | str | BinaryIO, *, replace: bool = False) -> Path:
    """Write `data` (bytes, text, or a binary file to copy) to the regular file `path`, 0600, atomically.

    The folder is opened once (`open_folder`: no link of another user's followed on the way) and
    everything after happens inside that descriptor, so nothing can move the write elsewhere.
    Raises RefusedPath when `path` is not a regular file, or exists and `replace` is false; OSError
    when the write fails (then nothing at `path` changed)."""
    target = Path(path)
    name = os.path.basename(os.path.abspath(target))
    folder = open_folder(os.path.dirname(os.path.abspath(target)), shown=target)
    try:
        _check_at(folder, name, target, replace)
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                if isinstance(data, (bytes, str)):
                    f.write(data.encode("utf-8") if isinstance(data, str) else data)
                else:
                    shutil.copyfileobj(data, f)
                f.flush()
                os.fsync(f.fileno())
            _move_into_place(folder, tmp, name, replace, shown=target)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=folder)
            except OSError:
                pass
            raise
    finally:
        os.close(folder)
    return target


def _move_into_place(folder: int, tmp: str, name: str, replace: bool, *, shown: str | os.PathLike) -> None:
    _check_at(folder, name, shown, replace)  # again: the name may have changed while the data was written
    if replace:
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)  # replaces the name: never writes through it
        return
    try:
        os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)  # fails if the name is taken
    except FileExistsError:
        raise RefusedPath(f"will not write to {shown}: the file exists", exists=True) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)  # no hard links here: the check above guards
        return
    os.unlink(tmp, dir_fd=folder)


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
