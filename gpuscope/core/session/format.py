"""The session file format, shared by the journal (writer), export and the reader (recording).

One SQLite file for the live journal, an exported snapshot and whatever replay and report read:

    meta(key, value)          format, schema, gpuscope's version, host, start, kind, subject, ...
    frames(t, keyframe, data) a sample a row; zlib'd JSON (gpuscope.core.session.codec). A
                              keyframe has every process row; the others only the fields that
                              changed since the frame before (most of a node's processes are idle:
                              that is what keeps an hour of 200 processes small).
    serving(t, data)          the service's signals (zlib'd JSON, without the history the
                              reader rebuilds from these rows)
    events(t, kind, data)     stack dumps, hot paths, allocation sites, diagnoses (zlib'd JSON)

Why SQLite: a transaction a second in WAL mode, so `kill -9`, a lost SSH connection or a full
disk loses at most the last second and the file stays readable (the next open recovers the WAL).
Nothing here imports a UI library; py-spy locals are never recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sqlite3
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuscope import __version__
from gpuscope.core.node.model import Frame
from gpuscope.core.session.codec import encode

FORMAT = "gpuscope-session"
SCHEMA = 1
SUFFIX = ".gpuscope"
KEYFRAME_EVERY = 60  # frames: a reader decodes at most this many to rebuild any one frame

DDL = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS frames(t REAL NOT NULL, keyframe INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS serving(t REAL NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events(t REAL NOT NULL, kind TEXT NOT NULL, data BLOB NOT NULL);
"""
EVENT_KINDS = ("stacks", "hot-paths", "allocations", "diagnosis")
TABLES = ("meta", "frames", "serving", "events")


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
        check_record(keyframe, data)
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


def check_record(keyframe: bool, data: Any) -> None:
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

