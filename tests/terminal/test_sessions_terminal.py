"""Sessions in a real terminal: the journal survives kill -9 and a lost terminal, and a session
goes live -> snapshot -> replay -> report with the same processes, the same numbers, no secrets."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from gpuscope.core.session.recording import open_recording
from gpuscope.core.common.units import format_bytes
from frames import recording_text
from helpers import LEAKER, gpuscope_cmd, wait_until

pytestmark = pytest.mark.terminal

SECRETS = ["sk-live-4b1d", "tok-5e7a-9c", "hunter2-pw", "pg-pass-77"]
SECRET_ARGS = ["--api-key", SECRETS[0], f"--token={SECRETS[1]}", f"password={SECRETS[2]}",
               f"postgres://rag:{SECRETS[3]}@db:5432/docs"]


def console(tmux_session, tmp_path: Path, *args: str):
    state = tmp_path / "state"
    env = {"XDG_STATE_HOME": str(state), "XDG_CONFIG_HOME": str(tmp_path / "config"), "TERM": "xterm-256color"}
    tmux = tmux_session([*gpuscope_cmd(), "--refresh", "0.5", *args], env=env)
    return tmux, state


def gpuscope_process(tmux) -> psutil.Process:
    """The console's own process: the pane's, or its child when a shell runs it."""
    pane = psutil.Process(tmux.pid())

    def console_process():
        # Looked for again each time: the pane's shell may exec the console only after a first look.
        return next((p for p in (pane, *pane.children()) if any("gpuscope" in part for part in p.cmdline()[:2])), None)

    return wait_until(console_process, timeout=30, what="the console's process")


def journal_of(state: Path) -> Path:
    return wait_until(lambda: next(iter((state / "gpuscope" / "sessions").glob("*.gpuscope")), None), timeout=30,
                      what="the session's journal")


def frames_in(path: Path) -> int:
    try:
        return len(open_recording(path))
    except Exception:  # not yet written
        return 0


def newest_frame_time(path: Path) -> float | None:
    try:
        rec = open_recording(path)
        return rec.end if len(rec) else None
    except Exception:  # not yet written
        return None


def committed_since(path: Path, mark: float) -> bool:
    """Whether the journal holds a sample taken at or after `mark` (what a kill must not lose)."""
    end = newest_frame_time(path)
    return end is not None and end >= mark


def row_of(screen: str, pid: int) -> str:
    return next((ln for ln in screen.splitlines() if ln.strip().startswith(f"{pid} ")), "")


def test_live_session_to_snapshot_to_replay_to_report_without_secrets(tmux_session, spawn_python, tmp_path):
    child = spawn_python(LEAKER, *SECRET_ARGS)
    tmux, state = console(tmux_session, tmp_path, "--pid", str(child.pid))
    screen = wait_until(lambda: row_of(tmux.screen(), child.pid) and tmux.screen(), timeout=60, what="the child's row")
    assert "--api-key ***" in screen or "--api-key" not in screen  # cut or redacted, never shown
    assert not any(s in screen for s in SECRETS)
    frames_before = wait_until(lambda: frames_in(journal_of(state)) >= 6 and frames_in(journal_of(state)),
                               timeout=60, what="six samples in the journal")

    tmux.keys("e")
    wait_until(lambda: "Export a snapshot" in tmux.screen(), timeout=10, what="the export's choices")
    tmux.keys("a")  # the whole session
    exports = state / "gpuscope" / "exports"
    snapshot = wait_until(lambda: next(iter(exports.glob("*.gpuscope")), None), timeout=30, what="the exported snapshot")
    wait_until(lambda: "snapshot exported" in tmux.screen(), timeout=30, what="the export's notification")
    tmux.keys("q")
    wait_until(tmux.dead, timeout=30, what="the console to end")

    assert snapshot.stat().st_mode & 0o777 == 0o600
    journal = journal_of(state)
    rec = open_recording(snapshot)
    assert rec.kind == "snapshot" and len(rec) >= frames_before and rec.meta["pid"] == child.pid
    last = rec.frame(len(rec) - 1)
    mine = next(r for r in last.processes if r.pid == child.pid)
    assert "--api-key ***" in mine.command and "rag:***@db" in mine.command
    assert rec.history(child.pid, 600, rec.end).rss_bytes[-1] > rec.history(child.pid, 600, rec.end).rss_bytes[0]
    for path in (snapshot, journal):
        text = recording_text(path)
        assert str(child.pid) in text and not any(s in text for s in SECRETS), path

    # The report: the process, its numbers, nothing secret.
    done = subprocess.run([*gpuscope_cmd(), "report", str(snapshot)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The console was started for the child (--pid): the report is about it, whatever else runs.
    row = next((ln for ln in done.stdout.splitlines() if f"| {child.pid} |" in ln), "")
    assert row and format_bytes(mine.rss_bytes) in row, done.stdout
    assert not any(s in done.stdout for s in SECRETS)

    # The replay: paused at the end of the snapshot, the same row with the same numbers.
    replay = tmux_session([*gpuscope_cmd(), "replay", str(snapshot)], env={"TERM": "xterm-256color"})
    wait_until(lambda: "replay" in replay.screen(), timeout=60, what="the replay")
    replay.keys("J")
    wait_until(lambda: "jump to" in replay.screen(), timeout=10, what="the jump box")
    replay.keys("end", "Enter")  # "end" typed as text, then Enter
    wait_until(lambda: "⏸ paused" in replay.screen(), timeout=30, what="the replay to stop at the end")
    # Filtered to the child: on a busy machine larger processes would push its row off the screen.
    replay.keys("/")
    replay.keys(str(child.pid), "Enter")
    row = wait_until(lambda: row_of(replay.screen(), child.pid), timeout=30, what="the child's row in the replay")
    assert format_bytes(mine.rss_bytes) in row
    assert not any(s in replay.screen() for s in SECRETS)


def test_kill_9_loses_at_most_the_last_second(tmux_session, spawn_python, tmp_path):
    child = spawn_python(LEAKER)
    tmux, state = console(tmux_session, tmp_path, "--pid", str(child.pid))
    process = gpuscope_process(tmux)
    journal = journal_of(state)
    seen = wait_until(lambda: frames_in(journal) >= 6 and frames_in(journal), timeout=60, what="six samples")
    # A sample taken after this moment committed: then kill at once. (That a sample is committed
    # without waiting for the next ones: tests/integration/test_guarantees_journal.py.)
    mark = time.time()
    wait_until(lambda: committed_since(journal, mark), timeout=60, what="a sample taken after the mark, committed")
    process.send_signal(signal.SIGKILL)
    wait_until(tmux.dead, timeout=30, what="the killed console's pane to end")
    assert os.path.exists(f"{journal}-wal")  # killed: the WAL was never folded back in
    rec = open_recording(journal)  # SQLite recovers the WAL on opening
    assert len(rec) >= seen and rec.damage is None
    assert rec.end >= mark, (mark, rec.end)
    done = subprocess.run([*gpuscope_cmd(), "report", str(journal)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"| {child.pid} |" in done.stdout, done.stdout


def test_a_lost_terminal_closes_the_journal(tmux_session, spawn_python, tmp_path):
    child = spawn_python(LEAKER)
    tmux, state = console(tmux_session, tmp_path, "--pid", str(child.pid))
    process = gpuscope_process(tmux)
    journal = journal_of(state)
    wait_until(lambda: frames_in(journal) >= 4, timeout=60, what="four samples")
    mark = time.time()
    wait_until(lambda: committed_since(journal, mark), timeout=60, what="a sample taken after the mark, committed")
    tmux.close()  # the terminal goes away: SIGHUP
    wait_until(lambda: not process.is_running() or process.status() == psutil.STATUS_ZOMBIE, timeout=30,
               what="the console to end")
    assert not os.path.exists(f"{journal}-wal") or os.path.getsize(f"{journal}-wal") == 0  # closed properly
    rec = open_recording(journal)
    assert rec.end >= mark, (mark, rec.end)
