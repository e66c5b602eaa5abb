"""Reading a session file (a journal or a snapshot) back: frames, series, serving, findings.

What replay and report share. A file that is not a recording, is empty, comes from a newer
gpuscope or cannot be read at all is one `RecordingError` line; a file that was cut short (a
journal whose recording was killed, a truncated copy) gives what could be read, and says how
much was lost in `damage`.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuscope.core import journal
from gpuscope.core.allocations import Attribution
from gpuscope.core.codec import DecodeError, decode
from gpuscope.core.diagnosis import Diagnosis
from gpuscope.core.model import Frame, MemorySeries
from gpuscope.core.serving_model import ServingSnapshot, SignalPoint
from gpuscope.core.stacks import StackDump, StackSample

EVENT_TYPES: dict[str, type] = {
    "stacks": StackDump,
    "hot-paths": StackSample,
    "allocations": Attribution,
    "diagnosis": Diagnosis,
}


class RecordingError(Exception):
    """The file cannot be replayed; the message is one line for a person."""


@dataclass
class ProcessSeries:
    times: list[float] = field(default_factory=list)
    rss: list[float | None] = field(default_factory=list)
    gpu: list[float | None] = field(default_factory=list)
    allocated: list[float | None] = field(default_factory=list)  # PyTorch's allocator, through a probe
    reserved: list[float | None] = field(default_factory=list)


@dataclass(frozen=True)
class Event:
    time: float
    kind: str
    value: Any


class Recording:
    """A session file, loaded: frame times, every process's memory series, serving, events."""

    def __init__(self, path: Path, meta: dict, records: list[tuple[float, bool, bytes]], serving: list[ServingSnapshot],
                 events: list[Event], damage: str | None) -> None:
        self.path = path
        self.meta = meta
        self.kind = meta.get("kind", "journal")
        self.hostname = meta.get("hostname", "?")
        self.damage = damage
        self.serving = serving
        self.events = events
        self.times: list[float] = []
        self._records: list[tuple[bool, bytes]] = []
        self._keyframes: list[int] = []
        self.processes: dict[int, ProcessSeries] = {}
        self.devices: dict[int, tuple[list[float], list[float | None]]] = {}
        self._cursor: tuple[int, journal.FrameRebuilder, dict] | None = None  # the last frame rebuilt
        self._load(records)
        self._serving_times = [s.time for s in serving]

    # -- loading ---------------------------------------------------------------------------------

    def _load(self, records: list[tuple[float, bool, bytes]]) -> None:
        rebuild = journal.FrameRebuilder()
        started = False
        lost = 0
        for t, keyframe, blob in records:
            if not started and not keyframe:
                lost += 1  # deltas with no keyframe before them (the start was cut off)
                continue
            try:
                data = rebuild.apply(keyframe, journal.unpack(blob))
            except (zlib.error, ValueError, KeyError, TypeError):
                lost += 1
                started = False  # wait for the next keyframe
                continue
            started = True
            self.times.append(t)
            self._records.append((keyframe, blob))
            if keyframe:
                self._keyframes.append(len(self.times) - 1)
            self._index(t, data)
        if lost and self.damage is None:
            self.damage = f"{lost} damaged frame record{'s' if lost != 1 else ''} skipped"

    def _index(self, t: float, data: dict) -> None:
        self.hostname = data.get("hostname", self.hostname)  # the node's own name, as its frames say
        gpu_by_pid: dict[int, float] = {}
        seen: set[int] = set()
        for row in data["processes"]:
            pid = row["pid"]
            if row.get("gpu") is not None and row.get("gpu_memory_bytes") is not None:
                gpu_by_pid[pid] = gpu_by_pid.get(pid, 0.0) + row["gpu_memory_bytes"]
            seen.add(pid)
        torch = {entry["pid"]: entry for entry in data.get("torch", [])}
        for row in data["processes"]:
            pid = row["pid"]
            if pid not in seen:
                continue
            seen.discard(pid)
            s = self.processes.setdefault(pid, ProcessSeries())
            s.times.append(t)
            s.rss.append(row.get("rss_bytes"))
            s.gpu.append(gpu_by_pid.get(pid))
            s.allocated.append(torch.get(pid, {}).get("allocated_bytes"))
            s.reserved.append(torch.get(pid, {}).get("reserved_bytes"))
        for device in data.get("nvml", {}).get("devices", []):
            times, used = self.devices.setdefault(device["index"], ([], []))
            times.append(t)
            used.append(device.get("memory_used"))

    # -- frames ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.times)

    @property
    def start(self) -> float:
        return self.times[0]

    @property
    def end(self) -> float:
        return self.times[-1]

    def index_at(self, t: float) -> int:
        """The last frame at or before `t` (the first one before the recording starts)."""
        return max(0, bisect.bisect_right(self.times, t) - 1)

    def frame(self, i: int) -> Frame:
        """Frame `i` as it was recorded (its chart is left to the reader: see `history`)."""
        data = self._rebuild(i)
        try:
            return decode(Frame, data)
        except DecodeError as exc:
            raise RecordingError(f"{self.path}: frame {i} cannot be read ({exc})") from None

    def _rebuild(self, i: int) -> dict:
        # Playing forward reuses the last rebuilt frame; a jump starts from the keyframe before.
        if self._cursor is not None and self._cursor[0] <= i <= self._cursor[0] + journal.KEYFRAME_EVERY:
            at, rebuild, data = self._cursor
        else:
            at = self._keyframes[bisect.bisect_right(self._keyframes, i) - 1] - 1
            rebuild, data = journal.FrameRebuilder(), {}
        while at < i:
            at += 1
            keyframe, blob = self._records[at]
            data = rebuild.apply(keyframe, journal.unpack(blob))
        self._cursor = (i, rebuild, data)
        return data

    # -- series ----------------------------------------------------------------------------------

    def history(self, pid: int, seconds: float, now: float) -> MemorySeries | None:
        """`pid`'s memory over the `seconds` before `now`, as NodeSource.history gives it live."""
        s = self.processes.get(pid)
        if s is None:
            return None
        lo = bisect.bisect_left(s.times, now - seconds)
        hi = bisect.bisect_right(s.times, now)
        allocated = tuple(s.allocated[lo:hi])
        return MemorySeries(
            pid=pid,
            ages=tuple(now - t for t in s.times[lo:hi]),
            gpu_bytes=tuple(s.gpu[lo:hi]),
            rss_bytes=tuple(s.rss[lo:hi]),
            # Empty when the process had no probe then, as the live source gives it.
            allocated_bytes=allocated if any(v is not None for v in allocated) else (),
            reserved_bytes=tuple(s.reserved[lo:hi]) if any(v is not None for v in allocated) else (),
        )

    def device_history(self, index: int, seconds: float, now: float) -> tuple[list[float], list[float | None]]:
        times, used = self.devices.get(index, ([], []))
        lo = bisect.bisect_left(times, now - seconds)
        hi = bisect.bisect_right(times, now)
        return times[lo:hi], used[lo:hi]

    def serving_at(self, t: float, history_s: float = 300.0) -> ServingSnapshot | None:
        """The service's last snapshot at or before `t`, with its history rebuilt from the ones before."""
        i = bisect.bisect_right(self._serving_times, t) - 1
        if i < 0:
            return None
        lo = bisect.bisect_left(self._serving_times, t - history_s)
        points = tuple(SignalPoint(time=s.time, signals=s.signals) for s in self.serving[lo : i + 1] if s.ok)
        return replace(self.serving[i], history=points)

    def events_of(self, kind: str, pid: int | None = None, until: float | None = None) -> list[Event]:
        return [
            e for e in self.events
            if e.kind == kind and (until is None or e.time <= until) and (pid is None or getattr(e.value, "pid", None) == pid)
        ]


# -- opening -------------------------------------------------------------------------------------


def open_recording(path: str | Path) -> Recording:
    """Load a journal or a snapshot; RecordingError (one line) when it cannot be replayed."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if path.is_dir():
        raise RecordingError(f"{path}: is a folder, not a gpuscope snapshot or journal")
    if size == 0:
        raise RecordingError(f"{path}: the file is empty; it is not a gpuscope snapshot or journal")
    with open(path, "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise RecordingError(f"{path}: not a gpuscope snapshot or journal")
    conn = _connect(path)
    try:
        meta = _meta(conn, path)
        damage = None
        records, problem = _rows(conn, "SELECT t, keyframe, data FROM frames ORDER BY rowid")
        damage = problem
        serving_rows, problem = _rows(conn, "SELECT t, data FROM serving ORDER BY rowid")
        damage = damage or problem
        event_rows, problem = _rows(conn, "SELECT t, kind, data FROM events ORDER BY rowid")
        damage = damage or problem
    finally:
        conn.close()
    serving = [s for s in (_decoded(ServingSnapshot, blob) for _, blob in serving_rows) if s is not None]
    events = []
    for t, kind, blob in event_rows:
        cls = EVENT_TYPES.get(kind)
        value = _decoded(cls, blob) if cls else None
        if value is not None:
            events.append(Event(t, kind, value))
    recording = Recording(path, meta, [(t, bool(k), bytes(d)) for t, k, d in records], serving, events, damage)
    if not len(recording):
        reason = f" ({recording.damage})" if recording.damage else ""
        raise RecordingError(f"{path}: nothing was recorded in it that can be replayed{reason}")
    return recording


def _connect(path: Path) -> sqlite3.Connection:
    # Read-write when allowed, so SQLite can recover a journal whose recording was killed (its
    # WAL is replayed into the file); read-only otherwise.
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=5.0)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.Error:
        pass
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.Error as exc:
        if "malformed" in str(exc):
            raise RecordingError(f"{path}: the file is damaged or cut short ({exc}); nothing in it can be read") from None
        raise RecordingError(f"{path}: cannot be read as a gpuscope snapshot or journal ({exc})") from None


def _meta(conn: sqlite3.Connection, path: Path) -> dict:
    try:
        meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    except (sqlite3.Error, ValueError) as exc:
        if "no such table" in str(exc):
            raise RecordingError(f"{path}: an SQLite file, but not a gpuscope snapshot or journal") from None
        raise RecordingError(f"{path}: damaged beyond reading ({exc})") from None
    if meta.get("format") != journal.FORMAT:
        raise RecordingError(f"{path}: an SQLite file, but not a gpuscope snapshot or journal")
    schema = meta.get("schema")
    if not isinstance(schema, int):
        raise RecordingError(f"{path}: damaged: its schema version is missing")
    if schema > journal.SCHEMA:
        raise RecordingError(
            f"{path}: written by a newer gpuscope ({meta.get('gpuscope_version', '?')}, schema {schema}; "
            f"this one reads schema {journal.SCHEMA}): upgrade gpuscope to replay it"
        )
    return meta


def _rows(conn: sqlite3.Connection, query: str) -> tuple[list[tuple], str | None]:
    """The rows that can be read; a damaged file stops the read where the damage starts."""
    rows: list[tuple] = []
    try:
        for row in conn.execute(query):
            rows.append(row)
    except sqlite3.Error as exc:
        return rows, f"the file is damaged or cut short ({exc}); what came before is shown"
    return rows, None


def _decoded(cls: type, blob: bytes):
    try:
        return decode(cls, journal.unpack(blob))
    except (zlib.error, ValueError, DecodeError, TypeError):
        return None
