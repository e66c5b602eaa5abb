"""The session file: the journal that records, the snapshot it exports, and what reads them back."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from frames import T0, recording_text, rows, session_frames
from gpuscope.core.session import format as journal_mod
from gpuscope.core.diagnosis.attribution import Attribution, Rung
from gpuscope.core.session.format import KEYFRAME_EVERY, session_meta
from gpuscope.core.session.journal import Journal
from gpuscope.core.session.retention import prune
from gpuscope.core.session.recording import RecordingError, open_recording
from gpuscope.core.target.stacks import StackDump, StackFrame, Suspect, ThreadStack
from helpers import ROOT, SUPPORT, gpuscope_cmd


def test_frames_come_back_as_they_were_recorded(tmp_path):
    frames = session_frames(130)
    path = tmp_path / "sessions" / "s.gpuscope"
    j = Journal(path)
    for f in frames:
        j.frame(f)
    j.close()
    assert j.problem is None and j.dropped == 0
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700

    rec = open_recording(path)
    assert len(rec) == len(frames) and rec.kind == "journal" and rec.damage is None
    # In order, out of order (a jump back), and across keyframes.
    for i in [*range(len(frames)), 3, 129, 64, 61, 60, 0]:
        assert rec.frame(i) == frames[i], i
    conn = sqlite3.connect(path)
    keyframes = [t for (t,) in conn.execute("SELECT t FROM frames WHERE keyframe = 1")]
    assert keyframes == [T0, T0 + KEYFRAME_EVERY, T0 + 2 * KEYFRAME_EVERY]
    # Deltas are small: idle processes cost nothing, a changed one only its changed fields.
    delta = json.loads(zlib.decompress(conn.execute("SELECT data FROM frames WHERE t = ?", (T0 + 5,)).fetchone()[0]))
    assert delta["rows"] == {"4242:0": {"rss_bytes": frames[5].processes[0].rss_bytes}} and delta["gone"] == []
    # The series replay charts from: every sample of the process, its GPU memory summed over GPUs.
    history = rec.history(4242, 1000, T0 + 129)
    assert len(history.ages) == 130 - 5 and history.rss_bytes[-1] == frames[-1].processes[0].rss_bytes


def test_an_export_is_a_private_snapshot_of_the_range(tmp_path):
    frames = session_frames(130)
    j = Journal(None, meta=session_meta("journal", pid=4242))
    for f in frames:
        j.frame(f)
    dump = StackDump(4242, T0 + 80, "blocking", False, (
        ThreadStack(1, "MainThread", 11, True, True, (StackFrame("handle", "/srv/app.py", 12, locals=(("api_key", "sk-SECRET"),)),)),
    ))
    j.event("stacks", dump, t=T0 + 80)
    j.event("stacks", replace(dump, time=T0 + 10), t=T0 + 10)  # outside the range: left out
    target = tmp_path / "cut.gpuscope"
    assert j.export(target, since=T0 + 65, until=T0 + 110).result(30) == target
    j.close()

    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["cut.gpuscope"]  # no temporary file left behind
    rec = open_recording(target)
    assert rec.kind == "snapshot" and rec.meta["range"] == [T0 + 65, T0 + 110] and rec.meta["pid"] == 4242
    assert [rec.frame(i) for i in range(len(rec))] == frames[65:111]
    first = sqlite3.connect(target).execute("SELECT keyframe FROM frames ORDER BY rowid LIMIT 1").fetchone()
    assert first == (1,)  # the snapshot starts on a keyframe even though the range did not
    [event] = rec.findings.of("stacks", 4242)
    assert event.time == T0 + 80 and event.value.threads[0].frames[0].function == "handle"
    # Local variables can hold secrets: never recorded, so never exported.
    assert event.value.threads[0].frames[0].locals == ()
    assert "sk-SECRET" not in recording_text(target)


def test_findings_are_recorded_with_their_types(tmp_path):
    path = tmp_path / "s.gpuscope"
    j = Journal(path)
    j.frame(session_frames(1)[0])
    found = Attribution(4242, (Suspect("leak", "/srv/app.py", 3, 10 * 2**20, 0.9, "memray"),),
                        (Rung("memray", "used", "tracked 10 s"),), "memray", "high", 10.0)
    j.event("allocations", found, t=T0)
    with pytest.raises(ValueError):
        j.event("not-a-kind", found)
    j.close()
    [event] = open_recording(path).findings.of("allocations", 4242)
    assert event.value == found


def test_retention_drops_old_sessions_then_the_oldest_past_the_budget(tmp_path):
    now = time.time()
    ages_days = {"a": 10, "b": 3, "c": 2, "d": 1, "live": 0}
    for name, age in ages_days.items():
        path = tmp_path / f"{name}.gpuscope"
        path.write_bytes(b"x" * 1000)
        mtime = now - age * 86400 if name != "live" else now - 5
        os.utime(path, (mtime, mtime))
    (tmp_path / "b.gpuscope-wal").write_bytes(b"x" * 500)
    (tmp_path / "notes.txt").write_text("not a session")
    deleted = prune(tmp_path, keep_days=7, max_bytes=3000, now=now)
    # "a" is too old; then b (with its WAL) goes to get down to 3000 bytes; the live one is never touched.
    assert sorted(p.name for p in deleted) == ["a.gpuscope", "b.gpuscope"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.gpuscope", "d.gpuscope", "live.gpuscope", "notes.txt"]


def test_old_sessions_are_let_go_on_the_writer_thread_not_while_the_console_starts(tmp_path, monkeypatch):
    import threading

    from gpuscope.core.session import journal as journal_module

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    folder = tmp_path / "gpuscope" / "sessions"
    folder.mkdir(parents=True, mode=0o700)
    old = folder / "old.gpuscope"
    old.write_bytes(b"x" * 1000)
    os.utime(old, (time.time() - 10 * 86400,) * 2)
    threads = []

    def prune_and_say_where(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return prune(*args, **kwargs)

    monkeypatch.setattr(journal_module, "prune", prune_and_say_where)
    j = journal_module.open_session_journal(enabled=True, keep_days=7, max_mb=512, meta=session_meta("journal"))
    j.close()
    assert threads == ["gpuscope-journal"]
    assert not old.exists() and j.path is not None and j.path.exists()


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys, time
    sys.path.insert(0, sys.argv[2])
    from dataclasses import replace
    from pathlib import Path
    from frames import frame, rows
    from gpuscope.core.session.journal import Journal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
    j = Journal(Path(sys.argv[1]))
    base = replace(frame(), chart=None)
    for i in range(5000):
        # Every process changes every time, with a long unique command: about 1 kB a frame on disk.
        procs = tuple(replace(r, pid=r.pid + k * 10000, command=f"{r.command} --n {i} {k} " + str(i * 7919 % 10007) * 20,
                              rss_bytes=i * 4096 + k) for k in range(4) for r in rows())
        j.frame(replace(base, time=1.0 + i, processes=procs))
        if j.problem:
            break
        time.sleep(0.002)
    j.close()
    print(j.problem)
""")


def test_a_full_disk_stops_the_recording_and_keeps_what_was_written(tmp_path):
    path = tmp_path / "s.gpuscope"
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), str(path), str(SUPPORT)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    problem = done.stdout.strip()
    assert problem.startswith("recording stopped: ") and str(path) in problem, problem
    rec = open_recording(path)
    assert len(rec) > 10  # what was committed before the disk filled up is all there
    rec.frame(len(rec) - 1)


def make_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.gpuscope"
    if kind == "empty":
        path.touch()
    elif kind == "random":
        path.write_bytes(os.urandom(8192))
    elif kind == "text":
        path.write_text("# gpuscope incident report\n")
    elif kind == "other-sqlite":
        sqlite3.connect(path).execute("CREATE TABLE t(x)").connection.close()
    elif kind in ("future-schema", "truncated"):
        j = Journal(None)
        for f in session_frames(400):
            j.frame(f)
        j.export(path).result(30)
        j.close()
        if kind == "future-schema":
            conn = sqlite3.connect(path)
            conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
            conn.commit()
            conn.close()
        else:
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 3])
    elif kind == "folder":
        path.mkdir()
    return path


EXPECTED = {
    "missing": "no such file",
    "empty": "the file is empty",
    "random": "not a gpuscope snapshot or journal",
    "text": "not a gpuscope snapshot or journal",
    "other-sqlite": "not a gpuscope snapshot or journal",
    "future-schema": "written by a newer gpuscope",
    "truncated": "damaged or cut short",
    "folder": "is a folder",
}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_files_that_cannot_be_replayed_get_one_line(tmp_path, kind):
    path = make_file(tmp_path, kind)
    with pytest.raises(RecordingError, match=EXPECTED[kind]):
        open_recording(path)
    for command in ("replay", "report"):
        done = subprocess.run([*gpuscope_cmd(), command, str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and EXPECTED[kind] in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_a_damaged_record_is_skipped_until_the_next_keyframe(tmp_path):
    path = tmp_path / "s.gpuscope"
    j = Journal(path)
    for f in session_frames(130):
        j.frame(f)
    j.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE frames SET data = x'00ff' WHERE t = ?", (T0 + 30,))
    conn.commit()
    conn.close()
    rec = open_recording(path)
    assert len(rec) == 130 - 30 and rec.damage == "skipped 30 damaged records (frames 30)"
    assert rec.times[29] == T0 + 29 and rec.times[30] == T0 + 60


def test_the_session_file_format_is_what_the_module_says(tmp_path):
    """A reader in another language needs only SQLite, zlib and JSON (see gpuscope.core.session.format)."""
    path = tmp_path / "s.gpuscope"
    j = Journal(path, meta=session_meta("journal", pid=7))
    j.frame(session_frames(1)[0])
    j.close()
    conn = sqlite3.connect(path)
    meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    assert meta["format"] == journal_mod.FORMAT and meta["schema"] == journal_mod.SCHEMA and meta["pid"] == 7
    (blob,) = conn.execute("SELECT data FROM frames").fetchone()
    first = json.loads(zlib.decompress(blob))
    assert first["hostname"] == "gpu-node-7" and len(first["processes"]) == len(rows())


def test_report_and_snapshot_never_import_the_tui_or_torch(tmp_path):
    path = tmp_path / "s.gpuscope"
    j = Journal(path)
    for f in session_frames(3):
        j.frame(f)
    j.close()
    forbidden = ("textual", "rich", "torch", "gpuscope.tui")
    for argv in (["report", str(path)], ["snapshot", "--duration", "1", "-o", str(tmp_path / "out.gpuscope")]):
        code = (
            "import contextlib, io, sys\nfrom gpuscope.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    status = main({argv!r})\n"
            f"print(status, [m for m in {forbidden!r} if m in sys.modules])\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.stdout.strip().splitlines()[-1] == "0 []", (argv, done.stdout, done.stderr)


def test_an_export_after_close_says_so_instead_of_waiting(tmp_path):
    j = Journal(None)
    j.close()
    with pytest.raises(OSError, match="already closed"):
        j.export(tmp_path / "late.gpuscope").result(5)


def test_the_writer_wakes_once_for_what_arrives_together_and_never_on_a_timer(tmp_path):
    """Each timed wake-up of an idle thread costs CPU on a quiet node: the writer waits for the
    next record without a timeout, and takes what is queued with it into one transaction."""
    j = Journal(tmp_path / "s.gpuscope")
    waits: list[tuple[bool, float | None]] = []
    commits: list[int] = []
    real_get, real_commit = j._queue.get, j._commit

    def get(block=True, timeout=None):
        waits.append((block, timeout))
        return real_get(block, timeout)

    def commit(writes):
        if writes:
            commits.append(len(writes))
        real_commit(writes)

    j._queue.get, j._commit = get, commit  # the writer looks both up each time
    frames = session_frames(6)
    for f in frames[:3]:
        j.frame(f)
        time.sleep(0.1)
    with j._queue.mutex:  # three arriving together
        j._queue.queue.extend(("frame", f) for f in frames[3:])
        j._queue.unfinished_tasks += 3
        j._queue.not_empty.notify()
    time.sleep(0.2)
    j.close()
    assert [timeout for block, timeout in waits if block and timeout is not None] == []
    assert sum(commits) == 6 and commits[-1] >= 3  # the three queued together in one transaction
    conn = sqlite3.connect(tmp_path / "s.gpuscope")
    assert conn.execute("SELECT count(*) FROM frames").fetchone()[0] == 6
    conn.close()
