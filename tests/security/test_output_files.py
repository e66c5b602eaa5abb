"""`-o FILE`, exports and gpuscope's own folders, as root on a node shared with other users.

gpuscope writes only regular files: `-o /dev/null` (or a FIFO, a socket, a folder, a link another
user planted) is refused with one line and leaves the node as it was; an existing file is
replaced only with --force, by a new 0600 file (hard links to the old one keep its contents).
The sessions and exports folders are never another user's, nor reached through another user's link.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from frames import T0, rows
from frames import frame as make_frame
from gpuscope.core.common.atomic import RefusedPath, _move_into_place, open_folder, private_folder
from gpuscope.core.session.format import session_meta
from gpuscope.core.session.journal import Journal, open_session_journal
from helpers import gpuscope_cmd

TIMEOUT_S = 60


@pytest.fixture
def recording(tmp_path) -> Path:
    """A small session file to make reports of."""
    path = tmp_path / "rec.gpuscope"
    j = Journal(path, meta=session_meta("journal", pid=4242))
    for i in range(5):
        j.frame(make_frame(time=T0 + i, chart=None, processes=rows()))
    j.close()
    return path


def gpuscope(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*gpuscope_cmd(), *args], capture_output=True, text=True, timeout=TIMEOUT_S, **kwargs)


def one_line(done: subprocess.CompletedProcess, code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuscope: ") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


# -- what -o refuses ------------------------------------------------------------------------------


def test_a_device_node_like_dev_null_is_refused_and_stays_a_device(tmp_path, recording):
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    os.chmod(null, 0o666)  # mknod's mode went through the umask
    before = os.lstat(null)
    line = one_line(gpuscope("report", str(recording), "-o", str(null)), 2)
    assert "it is a character device, not a regular file" in line and "-o - writes to standard output" in line
    after = os.lstat(null)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and stat.S_IMODE(after.st_mode) == 0o666
    assert after.st_ino == before.st_ino and not leftovers(tmp_path)
    # --force is for regular files only: the device stays.
    one_line(gpuscope("report", str(recording), "-o", str(null), "--force"), 2)
    assert os.lstat(null).st_ino == before.st_ino and stat.S_ISCHR(os.lstat(null).st_mode)


def test_a_fifo_is_refused_at_once(tmp_path, recording):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    line = one_line(gpuscope("report", str(recording), "-o", str(fifo), "--force"), 2)
    assert "it is a FIFO (named pipe), not a regular file" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_socket_is_refused(tmp_path, recording):
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        line = one_line(gpuscope("report", str(recording), "-o", str(path)), 2)
        assert "it is a socket" in line and stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        server.close()


def test_a_folder_is_refused_and_nothing_is_left_in_it(tmp_path, recording):
    folder = tmp_path / "out"
    folder.mkdir()
    line = one_line(gpuscope("report", str(recording), "-o", str(folder), "--force"), 2)
    assert "it is a folder" in line and folder.is_dir() and list(folder.iterdir()) == []


def test_another_users_link_to_a_root_file_is_never_followed(other_user, recording):
    """The other user plants a link where root will write: the root-owned file behind it stays."""
    precious = Path(other_user.home).parent / f"gpuscope-precious-{os.getpid()}"
    precious.write_text("root's own data\n")
    os.chmod(precious, 0o644)
    try:
        link = other_user.home / "report.md"
        dangling = other_user.home / "new.md"
        made = other_user.popen(["/bin/sh", "-c", f"ln -s {precious} {link} && ln -s /nonexistent-gpuscope-{os.getpid()} {dangling}"])
        assert made.wait(timeout=10) == 0
        assert os.lstat(link).st_uid == other_user.uid
        for args in ([], ["--force"]):
            line = one_line(gpuscope("report", str(recording), "-o", str(link), *args), 2)
            assert "it is a symbolic link, not a regular file" in line
            assert precious.read_text() == "root's own data\n" and stat.S_IMODE(precious.stat().st_mode) == 0o644
            assert os.path.islink(link) and os.readlink(link) == str(precious)
        line = one_line(gpuscope("report", str(recording), "-o", str(dangling)), 2)
        assert "symbolic link" in line and not os.path.lexists(f"/nonexistent-gpuscope-{os.getpid()}")
        assert not leftovers(other_user.home)
    finally:
        precious.unlink()


def test_snapshot_and_diagnose_refuse_before_they_start_work(tmp_path):
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    started = time.monotonic()
    line = one_line(gpuscope("snapshot", "--duration", "60", "-o", str(null)), 2)  # not after 60 s of recording
    assert "character device" in line and time.monotonic() - started < 30
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    line = one_line(gpuscope("diagnose", "--pid", str(os.getpid()), "--duration", "60", "-o", str(fifo)), 2)
    assert "FIFO" in line and time.monotonic() - started < 45
    line = one_line(gpuscope("report", str(tmp_path / "missing.gpuscope"), "-o", ""), 2)
    assert "-o needs a file name" in line


# -- an existing file -----------------------------------------------------------------------------


def test_an_existing_file_is_kept_without_force_and_replaced_by_a_new_private_file_with_it(tmp_path, recording):
    out = tmp_path / "report.md"
    out.write_text("the old report\n")
    os.chmod(out, 0o644)
    twin = tmp_path / "twin.md"
    os.link(out, twin)
    line = one_line(gpuscope("report", str(recording), "-o", str(out)), 2)
    assert "the file exists (--force replaces it)" in line
    assert out.read_text() == "the old report\n" and stat.S_IMODE(out.stat().st_mode) == 0o644 and out.stat().st_nlink == 2

    done = gpuscope("report", str(recording), "-o", str(out), "--force")
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("# gpuscope incident report")
    st = out.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1  # a new file, private
    assert twin.read_text() == "the old report\n" and stat.S_IMODE(twin.stat().st_mode) == 0o644  # never written through
    assert not leftovers(tmp_path)


def test_a_new_file_is_private_and_dash_is_standard_output(tmp_path, recording):
    out = tmp_path / "new.md"
    done = gpuscope("report", str(recording), "-o", str(out))
    assert done.returncode == 0 and stat.S_IMODE(out.stat().st_mode) == 0o600 and f"wrote {out}" in done.stderr
    done = gpuscope("report", str(recording), "-o", "-")
    assert done.returncode == 0 and done.stdout.startswith("# gpuscope incident report")


def test_a_name_taken_while_writing_is_not_replaced(tmp_path):
    """Between the check and the move another writer takes the name: without replace, it stays."""
    target = tmp_path / "out.md"
    tmp = tmp_path / ".out.md.x.tmp"
    tmp.write_text("ours\n")
    target.write_text("theirs\n")
    folder = open_folder(tmp_path)
    try:
        with pytest.raises(RefusedPath, match="exists"):
            _move_into_place(folder, tmp.name, target.name, replace=False, shown=target)
    finally:
        os.close(folder)
    assert target.read_text() == "theirs\n"


@pytest.fixture
def root_only(other_user):
    """A folder only root may enter, beside the other user's, holding a file of root's."""
    folder = Path(tempfile.mkdtemp(prefix="gpuscope-root-only-"))
    folder.chmod(0o700)
    (folder / "sub").mkdir()
    for where in (folder / "report.md", folder / "sub" / "report.md"):
        where.write_text("root's own data\n")
        where.chmod(0o600)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("option", ["report -o", "check --junit", "check --markdown"])
@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("where", ["last folder", "folder on the way"])
def test_another_users_link_to_a_root_only_folder_on_the_way_is_never_followed(other_user, root_only, recording,
                                                                                where, force, option):
    """The other user links a folder of its own to root's: `-o ITS_LINK/report.md` (or deeper, or
    check's --junit and --markdown) must not land in root's folder, with or without --force."""
    link = other_user.home / "out"
    made = other_user.popen(["/bin/ln", "-s", str(root_only), str(link)])
    assert made.wait(timeout=10) == 0
    output = link / "report.md" if where == "last folder" else link / "sub" / "report.md"
    command, flag = option.split()
    writes = [str(recording)] if command == "report" else ["--rounds", "1", "--round-seconds", "1"]
    under_test = [] if command == "report" else ["--", sys.executable, "-c", "pass"]
    done = gpuscope(command, *writes, flag, str(output), *(["--force"] if force else []), *under_test)
    line = one_line(done, 2)
    assert "is a symbolic link another user" in line and "not followed" in line
    for kept in (root_only / "report.md", root_only / "sub" / "report.md"):
        assert kept.read_text() == "root's own data\n"
    assert sorted(p.name for p in root_only.iterdir()) == ["report.md", "sub"]
    assert sorted(p.name for p in (root_only / "sub").iterdir()) == ["report.md"]


def test_root_own_links_in_folders_nobody_else_changes_are_followed(tmp_path, recording):
    """/var/run -> /run: a link of root's, in a folder only root may change, leads where it says."""
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "alias")
    done = gpuscope("report", str(recording), "-o", str(tmp_path / "alias" / "report.md"))
    assert done.returncode == 0, done.stderr
    assert (real / "report.md").read_text().startswith("# gpuscope incident report")


def test_a_write_through_a_folder_descriptor_stays_in_the_folder_it_opened(other_user, root_only):
    """The folder is opened once: swapping it for a link to root's folder afterwards moves nothing."""
    theirs = other_user.home / "out"
    theirs.mkdir()
    other_user.own(theirs)
    folder = open_folder(theirs)
    try:
        swapped = other_user.popen(["/bin/sh", "-c", f"mv {theirs} {theirs}.old && ln -s {root_only} {theirs}"])
        assert swapped.wait(timeout=10) == 0
        tmp = ".report.md.x.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=folder)
        os.write(fd, b"new\n")
        os.close(fd)
        _move_into_place(folder, tmp, "report.md", replace=True, shown=theirs / "report.md")
    finally:
        os.close(folder)
    assert (root_only / "report.md").read_text() == "root's own data\n"
    assert (other_user.home / "out.old" / "report.md").read_text() == "new\n"


def test_the_journal_export_obeys_the_same_rule(tmp_path):
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    existing = tmp_path / "old.gpuscope"
    existing.write_text("keep me")
    j = Journal(None)
    j.frame(make_frame(time=T0, chart=None))
    try:
        with pytest.raises(RefusedPath, match="character device"):
            j.export(null).result(30)
        with pytest.raises(RefusedPath, match="exists"):
            j.export(existing).result(30)
        assert existing.read_text() == "keep me" and stat.S_ISCHR(os.lstat(null).st_mode)
        assert j.export(existing, replace=True).result(30) == existing
        assert stat.S_IMODE(existing.stat().st_mode) == 0o600 and existing.read_bytes().startswith(b"SQLite format 3")
    finally:
        j.close()


# -- gpuscope's own folders -----------------------------------------------------------------------


def test_a_folder_reached_through_another_users_link_is_refused_and_nothing_is_made_there(other_user, tmp_path):
    """sudo -E keeps XDG_STATE_HOME: in a shared sticky folder (as /tmp) or in their own, the other
    user points gpuscope/ at a folder of root's."""
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    shared = Path(tempfile.mkdtemp(prefix="gpuscope-shared-"))  # where the other user can reach it
    try:
        os.chmod(shared, 0o1777)
        theirs = other_user.home / "state"
        made = other_user.popen(["/bin/sh", "-c", f"ln -s {victim} {shared}/gpuscope && mkdir {theirs} && ln -s {victim} {theirs}/gpuscope"])
        assert made.wait(timeout=10) == 0
        with pytest.raises(RefusedPath, match="is a link another user .* made"):
            private_folder(shared / "gpuscope" / "sessions")
        with pytest.raises(RefusedPath, match="belongs to another user"):
            private_folder(theirs / "gpuscope" / "sessions")
        assert list(victim.iterdir()) == []  # nothing was created through either link
    finally:
        shutil.rmtree(shared)


def test_sessions_in_another_users_folder_stay_in_memory_and_say_why(other_user, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(other_user.home))  # the folder belongs to the other user
    j = open_session_journal(enabled=True, keep_days=7, max_mb=512, meta=session_meta("journal"))
    try:
        assert j.path is None and "belongs to another user" in j.note
        assert not (other_user.home / "gpuscope").exists()
    finally:
        j.close()


def test_the_console_export_folder_is_checked_the_same_way(other_user, monkeypatch, tmp_path):
    from gpuscope.tui.export import export_target

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    first = export_target()
    assert first.parent == tmp_path / "state" / "gpuscope" / "exports"
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    first.write_text("taken")
    assert export_target() != first  # a second export in the same second gets its own name
    monkeypatch.setenv("XDG_STATE_HOME", str(other_user.home))
    with pytest.raises(RefusedPath, match="another user"):
        export_target()


def test_private_folder_rules(tmp_path, other_user):
    mine = private_folder(tmp_path / "a" / "b")
    assert mine.is_dir() and stat.S_IMODE(mine.stat().st_mode) == 0o700
    os.symlink(mine, tmp_path / "link")  # root's own link: fine
    assert private_folder(tmp_path / "link") == tmp_path / "link"
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    with pytest.raises(RefusedPath, match="other users may write"):
        private_folder(open_to_all / "gpuscope")
    os.chmod(open_to_all, 0o1777)  # sticky, as /tmp: others cannot replace what is ours
    assert private_folder(open_to_all / "gpuscope").is_dir()
    with pytest.raises(RefusedPath, match="belongs to another user"):
        private_folder(other_user.home / "gpuscope")


def test_remember_never_follows_a_planted_link(monkeypatch, tmp_path):
    """The remembered theme is written with the same rules: no link at the name is followed."""
    from gpuscope import theme_files

    precious = tmp_path / "precious"
    precious.write_text("keep")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    folder = private_folder(tmp_path / "state" / "gpuscope")
    os.symlink(precious, folder / "theme")
    with pytest.raises(RefusedPath, match="symbolic link"):
        theme_files.remember("gpuscope-light")
    assert precious.read_text() == "keep"
    os.unlink(folder / "theme")
    theme_files.remember("gpuscope-light")
    theme_files.remember("gpuscope-ansi")  # a choice replaces the last one
    assert theme_files.remembered() == "gpuscope-ansi" and stat.S_IMODE((folder / "theme").stat().st_mode) == 0o600
