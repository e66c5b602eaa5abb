"""A recording in another user's folder is read without writing anything there as root.

SQLite writes beside the database it opens (the -wal and -shm files of a journal in WAL mode, a
rollback journal when it recovers one). Opened as root in another user's folder, those writes
go through whatever that user planted under those names: a link to a file of root's is written
to. gpuscope reads such a recording from a private copy instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from test_crafted_recordings import good_frames, write

from gpuscope.core.session import format as journal
from gpuscope.core.session.recording import open_recording


def test_a_journal_in_another_users_folder_is_read_without_writing_through_its_links(tmp_path, other_user):
    source = write(tmp_path / "session.sqlite", good_frames())
    conn = journal.connect(source)
    conn.execute("PRAGMA journal_mode=WAL")  # as a live journal is
    conn.close()
    theirs = other_user.own(Path(shutil.copy(source, other_user.home / "session.sqlite")))
    victim = tmp_path / "root-owned.conf"
    victim.write_text("root's own contents\n")
    before = victim.stat()
    for suffix in ("-shm", "-wal", "-journal"):
        os.symlink(victim, f"{theirs}{suffix}")
        os.lchown(f"{theirs}{suffix}", other_user.uid, other_user.gid)
    listing = sorted(os.listdir(other_user.home))

    recording = open_recording(theirs)

    assert len(recording.times) == len(good_frames()) and recording.damage is None
    assert victim.read_text() == "root's own contents\n"
    after = victim.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert sorted(os.listdir(other_user.home)) == listing  # nothing made there either
    assert all(os.lstat(other_user.home / name).st_uid == other_user.uid for name in listing)


def test_a_recording_that_is_a_link_in_another_users_folder_is_refused(tmp_path, other_user):
    secret = write(tmp_path / "root-only.sqlite", good_frames())
    link = other_user.home / "looks-like-a-snapshot.sqlite"
    os.symlink(secret, link)
    os.lchown(link, other_user.uid, other_user.gid)
    try:
        open_recording(link)
    except Exception as exc:  # noqa: BLE001 - any refusal will do, as long as it is one
        assert "regular file" in str(exc) or "link" in str(exc), exc
    else:
        raise AssertionError("a link planted by another user was followed as root")
