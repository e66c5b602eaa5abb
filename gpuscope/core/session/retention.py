"""Retention: where the console's journals live, and which old ones are let go."""

from __future__ import annotations

import time
from pathlib import Path

from gpuscope.core.session.format import SUFFIX
from gpuscope.folders import state_dir


def sessions_dir() -> Path:
    return state_dir() / "sessions"


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


