"""Files gpuscope writes for people to keep (reports, snapshots): private and never half-written.

The data goes to a temporary file in the same folder, created 0600, flushed and fsynced, then
renamed over the target: a reader sees the old file or the new one, never a torn one, and a
failure (a full disk) leaves what was there before.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_private(path: str | os.PathLike, data: bytes | str) -> Path:
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    folder = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
