"""The journal: writes a session (samples, serving snapshots, findings) to its file as it happens.

Writes happen on the journal's own thread from a bounded queue: the console never waits on the
disk, and if the disk cannot keep up, samples are dropped and counted, never queued without end.
What goes in comes from one place, the live session (gpuscope.core.session.live), which tees
each sample where it is taken; the file's layout is gpuscope.core.session.format's.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import socket
import sqlite3
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from gpuscope.core.common.atomic import private_folder
from gpuscope.core.node.model import Frame
from gpuscope.core.serving.model import ServingSnapshot
from gpuscope.core.session.codec import encode
from gpuscope.core.session.export import export
from gpuscope.core.session.format import (
    EVENT_KINDS, SUFFIX, FrameDeltas, connect, describe, initialise, pack, session_meta, trim, without_locals,
)
from gpuscope.core.session.retention import prune, sessions_dir

QUEUE_LIMIT = 600
MEMORY_KEEP_S = 3600.0  # an in-memory journal (--no-journal) keeps the last hour for `e`
WRITER_CACHE_KIB = 256  # SQLite page cache of the journal's writer


class Journal:
    """Records a session. `path=None` keeps it in memory (the last hour), for `--no-journal`.

    `frame`, `serving` and `event` return at once (the writer thread does the I/O). `problem` is
    None while recording works, else one line on why it stopped (what was written stays).
    """

    def __init__(self, path: Path | None, *, meta: dict[str, Any] | None = None, keep_bytes: float | None = None,
                 housekeeping: Callable[[], object] | None = None) -> None:
        """`housekeeping` runs on the writer thread before anything is written (work that would
        otherwise hold up whoever opens the journal; an OSError from it is ignored)."""
        self.path = path
        self.problem: str | None = None
        self.note: str | None = None  # why a console's journal is in memory although it was asked for
        self.dropped = 0
        self._keep_bytes = keep_bytes
        self._deltas = FrameDeltas()
        self._queue: queue.Queue = queue.Queue(QUEUE_LIMIT)
        self._conn = connect(path if path else ":memory:", create=True)
        initialise(self._conn, meta or session_meta("journal"), wal=path is not None)
        if path is not None:
            # The journal appends (only an export reads it back, once): a small page cache is
            # enough, and SQLite's default (2 MiB) would grow the console's memory for minutes.
            self._conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
        self._last_trim = time.monotonic()
        self._housekeeping = housekeeping
        self._thread = threading.Thread(target=self._write_loop, name="gpuscope-journal", daemon=True)
        self._closed = False
        self._thread.start()

    # -- what the sources call (any thread) --------------------------------------------------

    def frame(self, frame: Frame) -> None:
        self._put(("frame", frame))

    def serving(self, snapshot: ServingSnapshot) -> None:
        self._put(("serving", snapshot))

    def event(self, kind: str, value: Any, t: float | None = None) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        self._put(("event", (kind, value, time.time() if t is None else t)))

    def export(self, target: Path, since: float | None = None, until: float | None = None, *,
               replace: bool = False) -> Future:
        """Write the recording (or the part between `since` and `until`) as a snapshot file (see
        `export`: a regular file only, replaced only if `replace`).

        Runs on the writer thread, after everything queued before it; the Future gives the path
        or raises OSError (RefusedPath among them) / sqlite3.Error with the reason."""
        done: Future = Future()
        if self._closed:
            done.set_exception(OSError("the session's journal is already closed"))
            return done
        try:
            self._queue.put(("export", (Path(target), since, until, replace, done)), timeout=5.0)
        except queue.Full:
            done.set_exception(OSError("the journal is behind (the disk is slow); try again in a moment"))
        return done

    def close(self, timeout: float = 2.0) -> None:
        """Write what is queued and close the file (waits at most `timeout` seconds)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(("close", None), timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)

    def _put(self, item: tuple) -> None:
        if self._closed:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:  # the disk cannot keep up: drop the sample rather than hold up the console
            self.dropped += 1

    # -- the writer thread ---------------------------------------------------------------------

    def _write_loop(self) -> None:
        if self._housekeeping is not None:
            try:
                self._housekeeping()
            except OSError:
                pass
            self._housekeeping = None
        conn = self._conn
        closing = False
        while not closing:
            batch = [self._queue.get()]
            # What is queued already goes into the same transaction; nothing is waited for (a
            # timed wait for company would wake the thread a second time for each sample).
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            writes: list[tuple[str, Any]] = []
            for what, value in batch:
                if what == "close":
                    closing = True
                elif what == "export":
                    self._commit(writes)
                    writes = []
                    self._export(*value)
                else:
                    writes.append((what, value))
            self._commit(writes)
            self._maybe_trim()
        try:
            if self.path is not None and self.problem is None:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
        except sqlite3.Error:
            pass

    def _commit(self, writes: list[tuple[str, Any]]) -> None:
        if not writes or self.problem is not None:
            return
        conn = self._conn
        try:
            conn.execute("BEGIN")
            for what, value in writes:
                if what == "frame":
                    keyframe, data = self._deltas.record(value)
                    conn.execute("INSERT INTO frames VALUES (?, ?, ?)", (value.time, int(keyframe), pack(data)))
                elif what == "serving":
                    snap = dataclasses.replace(value, history=())
                    conn.execute("INSERT INTO serving VALUES (?, ?)", (value.time, pack(encode(snap))))
                else:
                    kind, obj, t = value
                    conn.execute("INSERT INTO events VALUES (?, ?, ?)", (t, kind, pack(encode(without_locals(obj)))))
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError, ValueError) as exc:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            where = f" (what was recorded before is kept in {self.path})" if self.path else ""
            self.problem = f"recording stopped: {describe(exc)}{where}"

    def _maybe_trim(self) -> None:
        if self.problem is not None or time.monotonic() - self._last_trim < 60:
            return
        self._last_trim = time.monotonic()
        try:
            if self.path is None:
                trim(self._conn, time.time() - MEMORY_KEEP_S)
            elif self._keep_bytes and self.path.stat().st_size > self._keep_bytes:
                # One session alone is over the budget: let its oldest tenth go.
                first, last = self._conn.execute("SELECT min(t), max(t) FROM frames").fetchone()
                if first is not None:
                    trim(self._conn, first + (last - first) / 10)
        except (sqlite3.Error, OSError):
            pass

    def _export(self, target: Path, since: float | None, until: float | None, replace: bool, done: Future) -> None:
        if not done.set_running_or_notify_cancel():
            return
        try:
            done.set_result(export(self._conn, target, since, until, replace=replace))
        except BaseException as exc:  # handed to whoever waits on the Future
            done.set_exception(exc)


def open_session_journal(*, enabled: bool, keep_days: float, max_mb: float, meta: dict[str, Any]) -> Journal:
    """The console's journal: a new file in the sessions folder, or memory when it is turned off
    or the folder cannot be written (then its `note` says why)."""
    if not enabled:
        return Journal(None, meta=meta)
    folder = sessions_dir()
    max_bytes = max_mb * 1024 * 1024
    try:
        private_folder(folder)  # never another user's folder, nor through another user's link
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = folder / f"{stamp}-{socket.gethostname()}-{os.getpid()}{SUFFIX}"
        # Old sessions are let go on the writer's thread: listing a folder of hundreds of them
        # takes milliseconds the console's first frame need not wait for.
        return Journal(path, meta=meta, keep_bytes=max_bytes, housekeeping=lambda: prune(folder, keep_days, max_bytes))
    except (OSError, sqlite3.Error) as exc:
        journal = Journal(None, meta=meta)
        journal.note = f"not recording to {folder}: {describe(exc)}; this session is kept in memory only"
        return journal


