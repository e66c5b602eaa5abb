"""Recording a session: every frame, serving snapshot and finding, to one SQLite file.

One format for the live journal, an exported snapshot and whatever replay and report read:

    meta(key, value)          format, schema, gpuscope's version, host, start, kind, ...
    frames(t, keyframe, data) a frame a row; zlib'd JSON (gpuscope.core.codec). A keyframe has
                              every process row; the others only the fields that changed
                              since the frame before (most of a node's processes are idle:
                              that is what keeps an hour of 200 processes small).
    serving(t, data)          the service's signals (zlib'd JSON, without the history the
                              reader rebuilds from these rows)
    events(t, kind, data)     stack dumps, allocation sites, diagnoses (zlib'd JSON)

Why SQLite: a transaction a second in WAL mode, so `kill -9`, a lost SSH connection or a full
disk loses at most the last second and the file stays readable (the next open recovers the WAL).
Writes happen on the journal's own thread from a bounded queue: the console never waits on the
disk, and if the disk cannot keep up, samples are dropped and counted, never queued without end.
Nothing here imports a UI library; py-spy locals are never recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import socket
import sqlite3
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from gpuscope import __version__
from gpuscope.core.atomic import check_target, private_folder, write_private
from gpuscope.core.codec import encode
from gpuscope.core.model import Frame
from gpuscope.core.serving_model import ServingSnapshot
from gpuscope.folders import state_dir

FORMAT = "gpuscope-session"
SCHEMA = 1
SUFFIX = ".gpuscope"
KEYFRAME_EVERY = 60  # frames: a reader decodes at most this many to rebuild any one frame
QUEUE_LIMIT = 600
MEMORY_KEEP_S = 3600.0  # an in-memory journal (--no-journal) keeps the last hour for `e`
COMMIT_EVERY_S = 1.0

DDL = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS frames(t REAL NOT NULL, keyframe INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS serving(t REAL NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events(t REAL NOT NULL, kind TEXT NOT NULL, data BLOB NOT NULL);
"""
EVENT_KINDS = ("stacks", "hot-paths", "allocations", "diagnosis")


def sessions_dir() -> Path:
    return state_dir() / "sessions"


def pack(value: Any) -> bytes:
    return zlib.compress(json.dumps(value, separators=(",", ":"), allow_nan=False).encode(), 6)


# A record inflates to at most this much: a keyframe of thousands of processes, or a stack dump
# of hundreds of threads, is far smaller; a crafted record that inflates to gigabytes is damage.
MAX_RECORD_BYTES = 16 * 2**20


def unpack(blob: bytes) -> Any:
    """A record back as JSON values. ValueError when it is not one: not zlib'd JSON, larger than
    MAX_RECORD_BYTES once inflated, nested past what a reader can follow, or holding NaN/Infinity."""
    if not isinstance(blob, bytes):
        raise ValueError(f"a record is {type(blob).__name__}, not bytes")
    inflate = zlib.decompressobj()
    try:
        text = inflate.decompress(blob, MAX_RECORD_BYTES)
    except zlib.error as exc:
        raise ValueError(f"not a compressed record ({exc})") from None
    if inflate.unconsumed_tail:
        raise ValueError(f"a record larger than {MAX_RECORD_BYTES // 2**20} MiB once inflated")
    if not inflate.eof:
        raise ValueError("a record cut short")
    try:
        return json.loads(text, parse_constant=reject_constant)
    except RecursionError:
        raise ValueError("a record nested too deeply") from None


def reject_constant(name: str) -> Any:
    """For json.loads: NaN and Infinity are not JSON, and gpuscope never writes them."""
    raise ValueError(f"{name} in a record (gpuscope never writes it)")


# -- frames as keyframes and deltas ------------------------------------------------------------


_ABSENT = object()  # a field an older row did not have


def row_key(row: dict) -> str:
    return f"{row['pid']}:{row.get('gpu')}"


class FrameDeltas:
    """Turns consecutive frames into records: a keyframe every KEYFRAME_EVERY, else the changes."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.count = 0

    def record(self, frame: Frame) -> tuple[bool, dict]:
        # The chart is derived from the rows (replay rebuilds it); it would only repeat them.
        return self.record_encoded(encode(dataclasses.replace(frame, chart=None)))

    def record_encoded(self, data: dict) -> tuple[bool, dict]:
        data = dict(data)
        rows = {row_key(r): r for r in data.pop("processes", [])}
        keyframe = self.count % KEYFRAME_EVERY == 0
        if keyframe:
            data["processes"] = list(rows.values())
        else:
            changed = {}
            for key, row in rows.items():
                old = self.rows.get(key)
                if old is None:
                    changed[key] = row
                elif old != row:
                    delta = {f: v for f, v in row.items() if old.get(f, _ABSENT) != v}
                    unset = [f for f in old if f not in row]  # back to its default
                    if unset:
                        delta["~"] = unset
                    changed[key] = delta
            data["rows"] = changed
            data["gone"] = [k for k in self.rows if k not in rows]
            # The rebuilt order is the old one, less what went, plus what is new at the end;
            # when the frame's own order differs (a process came back), say it.
            expected = [k for k in self.rows if k in rows] + [k for k in rows if k not in self.rows]
            if expected != list(rows):
                data["order"] = list(rows)
        self.rows = rows
        self.count += 1
        return keyframe, data


class FrameRebuilder:
    """The reader's side of FrameDeltas: records in order in, whole encoded frames out."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def apply(self, keyframe: bool, data: dict) -> dict:
        """The whole frame after this record. ValueError when the record is not one FrameDeltas
        writes (then this rebuilder is unchanged: wait for the next keyframe)."""
        _check_record(keyframe, data)
        data = dict(data)
        if keyframe:
            self.rows = {row_key(r): r for r in data.pop("processes", [])}
        else:
            rows = dict(self.rows)
            for key in data.pop("gone", []):
                rows.pop(key, None)
            for key, delta in data.pop("rows", {}).items():
                old = rows.get(key)
                if old is None:
                    rows[key] = delta
                else:
                    merged = {**old, **{f: v for f, v in delta.items() if f != "~"}}
                    for f in delta.get("~", ()):
                        merged.pop(f, None)
                    rows[key] = merged
            order = data.pop("order", None)
            if order and set(order) != set(rows):
                raise ValueError("not a frame record: its order names other rows than it has")
            self.rows = {k: rows[k] for k in order} if order else rows
        data["processes"] = list(self.rows.values())
        return data


def _check_record(keyframe: bool, data: Any) -> None:
    """The shape of a frame record (what its fields hold is for the codec to judge)."""
    def fail(what: str):
        raise ValueError(f"not a frame record: {what}")

    if not isinstance(data, dict):
        fail("not an object")
    if keyframe:
        rows = data.get("processes", [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "pid" in r for r in rows):
            fail("processes is not a list of rows")
        return
    rows = data.get("rows", {})
    if not isinstance(rows, dict) or not all(isinstance(d, dict) for d in rows.values()):
        fail("rows is not an object of rows")
    if not all(isinstance(d.get("~", []), list) and all(isinstance(f, str) for f in d.get("~", [])) for d in rows.values()):
        fail("a row's unset fields are not a list of names")
    for name in ("gone", "order"):
        keys = data.get(name, [])
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            fail(f"{name} is not a list of row keys")


def without_locals(value: Any) -> Any:
    """A stack dump (or anything holding frames) with every frame's local variables dropped."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "locals" and v:
                changes[f.name] = ()
            elif isinstance(v, tuple) or dataclasses.is_dataclass(v):
                nv = without_locals(v)
                if nv is not v:
                    changes[f.name] = nv
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, tuple):
        items = tuple(without_locals(v) for v in value)
        return items if any(a is not b for a, b in zip(items, value)) else value
    return value


# -- the database ------------------------------------------------------------------------------


def connect(path: Path | str, *, create: bool = False) -> sqlite3.Connection:
    """Open a session file (a journal, a snapshot). New files are created 0600 in a 0700 folder."""
    if create and str(path) != ":memory:":
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)  # before SQLite creates it with the umask
        os.close(fd)
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=5.0)
    return conn


def initialise(conn: sqlite3.Connection, meta: dict[str, Any], *, wal: bool) -> None:
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # durable against a crash of gpuscope itself
    conn.executescript(DDL)
    conn.execute("BEGIN")
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])
    conn.execute("COMMIT")


def session_meta(kind: str, **extra: Any) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "schema": SCHEMA,
        "kind": kind,
        "gpuscope_version": __version__,
        "hostname": socket.gethostname(),
        "started": time.time(),
        **{k: v for k, v in extra.items() if v is not None},
    }


class Journal:
    """Records a session. `path=None` keeps it in memory (the last hour), for `--no-journal`.

    `frame`, `serving` and `event` return at once (the writer thread does the I/O). `problem` is
    None while recording works, else one line on why it stopped (what was written stays).
    """

    def __init__(self, path: Path | None, *, meta: dict[str, Any] | None = None, keep_bytes: float | None = None) -> None:
        self.path = path
        self.problem: str | None = None
        self.note: str | None = None  # why a console's journal is in memory although it was asked for
        self.dropped = 0
        self._keep_bytes = keep_bytes
        self._deltas = FrameDeltas()
        self._queue: queue.Queue = queue.Queue(QUEUE_LIMIT)
        self._conn = connect(path if path else ":memory:", create=True)
        initialise(self._conn, meta or session_meta("journal"), wal=path is not None)
        self._last_trim = time.monotonic()
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
        conn = self._conn
        closing = False
        while not closing:
            item = self._queue.get()
            batch = [item]
            deadline = time.monotonic() + 0.05  # gather what arrived together into one transaction
            while True:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            writes = []
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


def describe(exc: BaseException) -> str:
    """One line for a storage failure, for a person."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    if "full" in text.lower() or "no space" in text.lower():
        return "the disk is full"
    if "i/o error" in text.lower():
        return f"{text} (is the disk full, or the file over a size limit?)"
    return text


def trim(conn: sqlite3.Connection, before: float) -> None:
    """Forget frames before `before`, starting again at a keyframe (deltas need theirs)."""
    row = conn.execute("SELECT min(rowid) FROM frames WHERE keyframe = 1 AND t >= ?", (before,)).fetchone()
    if row is None or row[0] is None:
        return
    conn.execute("BEGIN")
    conn.execute("DELETE FROM frames WHERE rowid < ?", (row[0],))
    first = conn.execute("SELECT min(t) FROM frames").fetchone()[0]
    if first is not None:
        conn.execute("DELETE FROM serving WHERE t < ?", (first,))
        conn.execute("DELETE FROM events WHERE t < ?", (first,))
    conn.execute("COMMIT")


def frame_records(conn: sqlite3.Connection, since: float | None = None, until: float | None = None) -> Iterable[tuple[float, dict]]:
    """The whole encoded frames between `since` and `until`, in order (decoding from a keyframe)."""
    start = 0
    if since is not None:
        row = conn.execute("SELECT max(rowid) FROM frames WHERE keyframe = 1 AND t <= ?", (since,)).fetchone()
        start = row[0] or 0
    rebuild = FrameRebuilder()
    for t, keyframe, blob in conn.execute("SELECT t, keyframe, data FROM frames WHERE rowid >= ? ORDER BY rowid", (start,)):
        if until is not None and t > until:
            break
        data = rebuild.apply(bool(keyframe), unpack(blob))
        if since is None or t >= since:
            yield t, data


def export_file(source: Path, target: Path, since: float | None = None, until: float | None = None, *,
                replace: bool = False) -> Path:
    """`export` from a session file (a replay's): read-only, so a snapshot on read-only media works."""
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=5.0)
    try:
        return export(conn, target, since, until, replace=replace)
    finally:
        conn.close()


def export(conn: sqlite3.Connection, target: Path, since: float | None = None, until: float | None = None, *,
           replace: bool = False) -> Path:
    """Copy a session (or a time range of it) into a new snapshot file, atomically and 0600.

    `target` must be free, or a regular file and `replace` true (RefusedPath otherwise, before any
    work). SQLite opens files by name, and the target's folder may be one another user can change,
    so the snapshot is built in a private temporary folder and then copied into place."""
    target = Path(target)
    check_target(target, replace=replace)
    meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    meta.update(kind="snapshot", exported=time.time(), exported_by=__version__)
    if since is not None or until is not None:
        meta["range"] = [since, until]
    with tempfile.TemporaryDirectory(prefix="gpuscope-export-") as work:
        built = Path(work) / f"snapshot{SUFFIX}"
        out = connect(built, create=True)
        try:
            out.execute("PRAGMA journal_mode=OFF")  # a file copied into place once done: no journal needed
            initialise(out, meta, wal=False)
            out.execute("BEGIN")
            deltas = FrameDeltas()
            for t, data in frame_records(conn, since, until):
                keyframe, record = deltas.record_encoded(data)
                out.execute("INSERT INTO frames VALUES (?, ?, ?)", (t, int(keyframe), pack(record)))
            low = since if since is not None else float("-inf")
            high = until if until is not None else float("inf")
            out.executemany("INSERT INTO serving VALUES (?, ?)",
                            conn.execute("SELECT t, data FROM serving WHERE t >= ? AND t <= ? ORDER BY rowid", (low, high)))
            out.executemany("INSERT INTO events VALUES (?, ?, ?)",
                            conn.execute("SELECT t, kind, data FROM events WHERE t >= ? AND t <= ? ORDER BY rowid", (low, high)))
            out.execute("COMMIT")
            out.execute("VACUUM")
        finally:
            out.close()
        with open(built, "rb") as snapshot:
            return write_private(target, snapshot, replace=replace)


# -- the console's session journal ---------------------------------------------------------------


def prune(folder: Path, keep_days: float, max_bytes: float, now: float | None = None) -> list[Path]:
    """Delete session files older than `keep_days`, then the oldest past `max_bytes` in all.

    A file written in the last minute is another console's live journal: never deleted."""
    now = time.time() if now is None else now
    sessions = []
    for path in folder.glob(f"*{SUFFIX}"):
        try:
            st = path.stat()
        except OSError:
            continue
        size = st.st_size + sum(_size(Path(f"{path}{s}")) for s in ("-wal", "-shm"))
        sessions.append((st.st_mtime, size, path))
    sessions.sort()
    total = sum(size for _, size, _ in sessions)
    deleted = []
    for mtime, size, path in sessions:
        if now - mtime < 60:
            continue
        if mtime < now - keep_days * 86400 or total > max_bytes:
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                try:
                    p.unlink()
                except OSError:
                    pass
            total -= size
            deleted.append(path)
    return deleted


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def open_session_journal(*, enabled: bool, keep_days: float, max_mb: float, meta: dict[str, Any]) -> Journal:
    """The console's journal: a new file in the sessions folder, or memory when it is turned off
    or the folder cannot be written (then its `note` says why)."""
    if not enabled:
        return Journal(None, meta=meta)
    folder = sessions_dir()
    max_bytes = max_mb * 1024 * 1024
    try:
        private_folder(folder)  # never another user's folder, nor through another user's link
        prune(folder, keep_days, max_bytes)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = folder / f"{stamp}-{socket.gethostname()}-{os.getpid()}{SUFFIX}"
        return Journal(path, meta=meta, keep_bytes=max_bytes)
    except (OSError, sqlite3.Error) as exc:
        journal = Journal(None, meta=meta)
        journal.note = f"not recording to {folder}: {describe(exc)}; this session is kept in memory only"
        return journal


class Recorded:
    """A source (frames, or serving snapshots) whose output also goes to a journal.

    Everything else is the inner source's; a frame carries the journal's trouble as a notice."""

    def __init__(self, inner: Any, record: Callable[[Any], None], journal: Journal) -> None:
        self._inner = inner
        self._record = record
        self._journal = journal

    def start(self, on_output: Callable[[Any], None]) -> None:
        def output(value: Any) -> None:
            self._record(value)
            problem = self._journal.problem or self._journal.note
            if problem and isinstance(value, Frame):
                value = dataclasses.replace(value, notices=(*value.notices, problem))
            on_output(value)

        self._inner.start(output)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
