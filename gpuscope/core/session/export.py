"""Export: a session (or a time range of it) copied into a new snapshot file."""

from __future__ import annotations

import json
import sqlite3
import tempfile
import time
from pathlib import Path

from gpuscope import __version__
from gpuscope.core.common.atomic import check_target, write_private
from gpuscope.core.session.format import SUFFIX, FrameDeltas, connect, frame_records, initialise, pack


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


