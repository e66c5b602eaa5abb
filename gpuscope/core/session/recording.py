"""Reading a session file (a journal or a snapshot) back: frames, series, serving, findings.

What replay and report share. A file that is not a recording, is empty, comes from a newer
gpuscope or cannot be read at all is one `RecordingError` line; a file that was cut short (a
journal whose recording was killed, a truncated copy) gives what could be read, and says how
much was lost in `damage`.

Anyone may have written the file, so every record is checked on the way in, field by field
(gpuscope.core.session.codec's types, and FIELD_CHECKS by name): a record that does not hold what gpuscope writes
(a device without its index, a string where a number belongs, a time that is not a time, a PID
that is not a positive whole number, a record that inflates past its limit) is skipped and
counted in `damage` ("skipped 3 damaged records (...)"). What replay and report are given has
passed those checks, so they never meet a value that crashes them.
"""

from __future__ import annotations

import bisect
import errno
import json
import math
import os
import sqlite3
import stat
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuscope.core.diagnosis.attribution import Attribution
from gpuscope.core.common.atomic import kind_of
from gpuscope.core.common.units import format_size
from gpuscope.core.diagnosis.evidence import ServiceNumbers
from gpuscope.core.diagnosis.steps import Diagnosis
from gpuscope.core.node.model import Frame, MemorySeries, ProcessRow
from gpuscope.core.serving.model import ServingSnapshot, SignalPoint
from gpuscope.core.session.codec import DecodeError, Decoder
from gpuscope.core.session.findings import Findings
from gpuscope.core.session.format import FORMAT, KEYFRAME_EVERY, SCHEMA, TABLES, FrameRebuilder, reject_constant, unpack
from gpuscope.core.target.stacks import StackDump, StackSample
from gpuscope.errors import Failure

EVENT_TYPES: dict[str, type] = {
    "stacks": StackDump,
    "hot-paths": StackSample,
    "allocations": Attribution,
    "diagnosis": Diagnosis,
}


class RecordingError(Failure):
    """The file cannot be replayed; the message is one line for a person."""


# -- what a value may be ---------------------------------------------------------------------------

MAX_TIME = 1e10  # seconds since the epoch, the year 2286: a later "time" is damage, not a recording
PID_LIMIT = 2**31  # Linux PIDs stay below 2**22; a larger one is not a PID
INDEX_LIMIT = 2**16  # GPU indexes


def is_time(t: Any) -> bool:
    """A wall-clock time: a finite number of seconds from 1970 to MAX_TIME."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and 0 <= t <= MAX_TIME


def _numbers_in(low: float, high: float) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True  # the name means something else in this class (Evidence.gpu is a series)
        return low <= value < high

    return check


def _not_negative(value: Any) -> bool:
    """Counts, sizes, shares and durations: a number, or numbers, from 0 up."""
    if isinstance(value, tuple):
        return all(_not_negative(v) for v in value)
    return isinstance(value, bool) or not isinstance(value, (int, float)) or value >= 0


def _any(value: Any) -> bool:
    return True


# Fields whose names say what they hold, in whatever recorded class they are: checked on reading.
# Every other number is a count, a size, a share or a duration, never below 0 (a negative total
# would turn the console's memory bars inside out).
FIELD_CHECKS: dict[str, Callable[[Any], bool]] = {
    **dict.fromkeys(("time", "as_of", "create_time"), is_time),  # wall-clock times
    **dict.fromkeys(("pid", "selected_pid"), _numbers_in(1, PID_LIMIT)),
    **dict.fromkeys(("index", "device", "gpu"), _numbers_in(0, INDEX_LIMIT)),  # GPU indexes
    # What may be below 0: growth (memory can shrink), times relative to a moment, temperatures.
    **dict.fromkeys(("growth_bytes_per_s", "gpu_growth_bytes_per_s", "rss_growth_bytes_per_s", "growth_mib_per_s",
                     "since", "times", "temperature", "bytes"), _any),
}
# A ServiceNumbers was recorded as start/end pairs of fields of its own before it held two Signals.
_SERVICE_PAIRS = {"p95_start_s": ("start", "e2e_latency_p95_s"), "p95_end_s": ("end", "e2e_latency_p95_s"),
                  "ttft_p95_start_s": ("start", "ttft_p95_s"), "ttft_p95_end_s": ("end", "ttft_p95_s"),
                  "tokens_per_s_start": ("start", "tokens_per_s"), "tokens_per_s_end": ("end", "tokens_per_s"),
                  "kv_cache_usage": ("end", "kv_cache_usage")}


def _paired_service_numbers(data: dict) -> dict:
    """A ServiceNumbers recorded as pairs of fields, in its present form: the pairs make the start's
    and the end's Signals, and its tokens per request (now worked out from the end's rates) gives
    back the end's request rate. Any other object is returned as it is."""
    old = [key for key in (*_SERVICE_PAIRS, "tokens_per_request") if key in data]
    if not old or "start" in data or "end" in data:
        return data
    out = {key: value for key, value in data.items() if key not in old}
    sides: dict[str, dict] = {"start": {}, "end": {}}
    for key, (side, name) in _SERVICE_PAIRS.items():
        if key in data:
            sides[side][name] = data[key]
    tokens: Any = sides["end"].get("tokens_per_s")
    per_request: Any = data.get("tokens_per_request")
    if _positive(tokens) and _positive(per_request) and math.isfinite(tokens / per_request):
        sides["end"]["requests_per_s"] = tokens / per_request
    return {**out, **sides}


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


READER = Decoder(FIELD_CHECKS, default_check=_not_negative, finite=True,
                 upgrades={ServiceNumbers: _paired_service_numbers})


def checked(cls: type, data: Any):
    """`data` decoded into `cls`, every field checked by its type (floats finite) and FIELD_CHECKS
    (DecodeError if not)."""
    return READER.decode(cls, data)


@dataclass
class ProcessSeries:
    times: list[float] = field(default_factory=list)
    rss: list[float | None] = field(default_factory=list)
    gpu: list[float | None] = field(default_factory=list)
    allocated: list[float | None] = field(default_factory=list)  # PyTorch's allocator, through a probe
    reserved: list[float | None] = field(default_factory=list)


class Recording:
    """A session file, loaded: frame times, every process's memory series, serving, events."""

    def __init__(self, path: Path, meta: dict, records: list[tuple], serving: list[ServingSnapshot],
                 findings: Findings, *, cut_short: str | None = None, skipped: Counter | None = None) -> None:
        self.path = path
        self.meta = meta
        self.kind = meta.get("kind", "journal")
        self.hostname = meta.get("hostname", "?")
        self.skipped: Counter = Counter(skipped or {})  # damaged records left out, by table
        self.serving = serving
        self.findings = findings  # every stack dump, hot-path sample, allocation-site search and diagnosis
        self.times: list[float] = []
        self._records: list[tuple[bool, bytes]] = []
        self._keyframes: list[int] = []
        self.processes: dict[int, ProcessSeries] = {}
        self.devices: dict[int, tuple[list[float], list[float | None]]] = {}
        self._cursor: tuple[int, FrameRebuilder, dict] | None = None  # the last frame rebuilt
        self._load(records)
        self._serving_times = [s.time for s in serving]
        self.damage = describe_damage(cut_short, self.skipped)

    # -- loading ---------------------------------------------------------------------------------

    def _load(self, records: list[tuple]) -> None:
        rebuild = FrameRebuilder()
        started = False
        for t, keyframe, blob in records:
            if not started and keyframe != 1:
                self.skipped["frames"] += 1  # deltas with no keyframe before them (the start was cut off, or damaged)
                continue
            try:
                if not is_time(t) or keyframe not in (0, 1):
                    raise ValueError("not a frame row")
                record = unpack(blob)
                data = rebuild.apply(keyframe == 1, record)
                _check_frame(data, record, rebuild, keyframe == 1)
            except ValueError:  # DecodeError among them
                self.skipped["frames"] += 1
                started = False  # deltas need what came before them: wait for the next keyframe
                rebuild = FrameRebuilder()
                continue
            started = True
            self.times.append(t)
            self._records.append((keyframe == 1, blob))
            if keyframe == 1:
                self._keyframes.append(len(self.times) - 1)
            self._index(t, data)

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
            return checked(Frame, data)
        except DecodeError as exc:
            raise RecordingError(f"{self.path}: frame {i} cannot be read ({exc})") from None

    def _rebuild(self, i: int) -> dict:
        # Playing forward reuses the last rebuilt frame; a jump starts from the keyframe before.
        if self._cursor is not None and self._cursor[0] <= i <= self._cursor[0] + KEYFRAME_EVERY:
            at, rebuild, data = self._cursor
        else:
            at = self._keyframes[bisect.bisect_right(self._keyframes, i) - 1] - 1
            rebuild, data = FrameRebuilder(), {}
        while at < i:
            at += 1
            keyframe, blob = self._records[at]
            data = rebuild.apply(keyframe, unpack(blob))  # checked when the file was opened
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

    @property
    def subject(self) -> int | None:
        """The process the session was recorded for (`snapshot --pid`, `gpuscope --pid`), if any."""
        return self.meta.get("pid")



# -- opening -------------------------------------------------------------------------------------


def open_recording(path: str | Path) -> Recording:
    """Load a journal or a snapshot; RecordingError (one line) when it cannot be replayed."""
    path = Path(path)
    try:
        if path.is_symlink() and path.lstat().st_uid != os.geteuid():
            raise RecordingError(f"{path}: is a link of another user's; give the file it points to")
        st = path.stat()
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise RecordingError(f"{path}: is a folder, not a gpuscope snapshot or journal")
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read; a device is never a recording
        raise RecordingError(f"{path}: is {kind_of(st.st_mode)}, not a gpuscope snapshot or journal")
    if st.st_size == 0:
        raise RecordingError(f"{path}: the file is empty; it is not a gpuscope snapshot or journal")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            header = f.read(16)
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if header != b"SQLite format 3\x00":
        raise RecordingError(f"{path}: not a gpuscope snapshot or journal")
    skipped: Counter = Counter()
    with tempfile.TemporaryDirectory(prefix="gpuscope-read-") as private:  # 0700
        conn = _connect(path, Path(private))
        try:
            _check_tables(conn, path)
            meta = _meta(conn, path, skipped)
            records, cut_short = _rows(conn, "SELECT t, keyframe, data FROM frames ORDER BY rowid")
            serving_rows, problem = _rows(conn, "SELECT t, data FROM serving ORDER BY rowid")
            cut_short = cut_short or problem
            event_rows, problem = _rows(conn, "SELECT t, kind, data FROM events ORDER BY rowid")
            cut_short = cut_short or problem
        finally:
            conn.close()
    serving = []
    for _, blob in serving_rows:
        snapshot = _decoded(ServingSnapshot, blob)
        if snapshot is None:
            skipped["serving"] += 1
        else:
            serving.append(snapshot)
    findings = Findings()
    for t, kind, blob in event_rows:
        cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
        value = _decoded(cls, blob) if cls and is_time(t) else None
        if value is None:
            skipped["events"] += 1
        else:
            findings.add(kind, value, t)
    recording = Recording(path, meta, records, serving, findings, cut_short=cut_short, skipped=skipped)
    if not len(recording):
        reason = f" ({recording.damage})" if recording.damage else ""
        raise RecordingError(f"{path}: nothing was recorded in it that can be replayed{reason}")
    return recording


def describe_damage(cut_short: str | None, skipped: Counter) -> str | None:
    """What could not be read, in one line (None: nothing was lost)."""
    parts = [cut_short] if cut_short else []
    total = sum(skipped.values())
    if total:
        detail = ", ".join(f"{table} {n}" for table, n in skipped.items() if n)
        parts.append(f"skipped {total} damaged record{'s' if total != 1 else ''} ({detail})")
    return "; ".join(parts) or None


MAX_CELL_BYTES = 32 * 2**20  # a stored record is zlib'd and inflates to at most 16 MiB


def _connect(path: Path, private: Path) -> sqlite3.Connection:
    # Read-write when allowed, so SQLite can recover a journal whose recording was killed (its
    # WAL is replayed into the file); read-only otherwise. A file that is not ours in a folder
    # only we can write is read from a copy in `private`: SQLite writes beside the file it opens
    # (-wal, -shm), and would do so with gpuscope's rights through any link planted there.
    if not _ours_alone(path):
        path = _private_copy(path, private)
    try:
        conn = _hardened(sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=5.0))
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.Error:
        pass
    try:
        conn = _hardened(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0))
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.Error as exc:
        if "malformed" in str(exc):
            raise RecordingError(f"{path}: the file is damaged or cut short ({exc}); nothing in it can be read") from None
        raise RecordingError(f"{path}: cannot be read as a gpuscope snapshot or journal ({exc})") from None


def _ours_alone(path: Path) -> bool:
    me = os.geteuid()
    file, folder = path.stat(), path.absolute().parent.stat()
    return file.st_uid == me and folder.st_uid == me and not folder.st_mode & 0o022


MAX_FOREIGN_BYTES = 4 << 30  # another user's recording copied to be read (a day's journal is far less)
FREE_MARGIN_BYTES = 256 << 20  # left free where the copy goes (an eighth of a smaller disk)


def _private_copy(path: Path, folder: Path) -> Path:
    """`path` and its write-ahead log (if it has one of the same owner) copied into `folder`,
    opened without following links; what is not a regular file is not copied. What is copied is
    bounded before the copy starts: the data it holds (holes stay holes) must fit in
    MAX_FOREIGN_BYTES and in the free space of `folder`, less a margin; and no more
    than the size it had then is read."""
    owner = path.stat().st_uid
    copy = folder / "recording"
    budget = MAX_FOREIGN_BYTES
    try:
        fs = os.statvfs(folder)
        reserve = min(FREE_MARGIN_BYTES, fs.f_blocks * fs.f_frsize // 8)
        budget = min(budget, fs.f_bavail * fs.f_frsize - reserve)
    except OSError:
        pass
    for source, target in ((path, copy), (Path(f"{path}-wal"), Path(f"{copy}-wal"))):
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if source == path:
                raise RecordingError(f"{path}: cannot read it: {exc.strerror or exc}") from None
            continue
        with os.fdopen(fd, "rb") as src:
            st = os.fstat(src.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
                if source == path:
                    raise RecordingError(f"{path}: is not a regular file")
                continue
            held = min(st.st_size, st.st_blocks * 512)  # a sparse file holds less than its size
            if held > budget:
                raise RecordingError(
                    f"{path}: is another user's recording holding {format_size(held)}; gpuscope reads such a "
                    f"file from a private copy, and has room for {format_size(max(budget, 0))} in "
                    f"{folder.parent}: copy it to a folder of yours and open that copy")
            try:
                with open(target, "xb") as dst:
                    budget -= _copy_data(src.fileno(), dst.fileno(), st.st_size, budget)
            except OSError as exc:
                raise RecordingError(f"{path}: cannot copy it to read it: {exc.strerror or exc}") from None
    return copy


def _copy_data(src: int, dst: int, size: int, allowed: int) -> int:
    """The first `size` bytes of `src` into `dst`, holes left as holes (SEEK_DATA/SEEK_HOLE), and
    how many were written; OSError(EFBIG) past `allowed` (holes filled in meanwhile)."""
    offset = written = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
            stop = min(os.lseek(src, start, os.SEEK_HOLE), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after `offset`: the rest is a hole
                break
            start, stop = offset, size  # no hole support: copy it all
        if start >= size:
            break
        os.lseek(src, start, os.SEEK_SET)
        os.lseek(dst, start, os.SEEK_SET)
        while start < stop:
            chunk = os.read(src, min(1 << 20, stop - start))
            if not chunk:  # cut short meanwhile
                size = start
                break
            written += len(chunk)
            if written > allowed:
                raise OSError(errno.EFBIG, "it grew past the room there is for its copy")
            os.write(dst, chunk)
            start += len(chunk)
        offset = stop
    os.ftruncate(dst, size)
    return written


def _hardened(conn: sqlite3.Connection) -> sqlite3.Connection:
    """A connection for a file anyone may have written: its schema's functions are not trusted,
    every page's cells are checked as they are read, nothing is memory-mapped, and no value it
    yields is larger than MAX_CELL_BYTES (SQLite refuses to make one).

    These are SQLite's own settings for reading a database from an attacker; unlike memray's
    capture reader, SQLite is fuzzed against crafted files upstream, so a recording is read in
    gpuscope's process (from its private, bounded copy) rather than in a child as its owner."""
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.execute("PRAGMA cell_size_check = ON")
    conn.execute("PRAGMA mmap_size = 0")
    if hasattr(conn, "setlimit"):  # Python 3.11+; on 3.10 the column checks below still hold
        conn.setlimit(getattr(sqlite3, "SQLITE_LIMIT_LENGTH", 0), MAX_CELL_BYTES)  # 0: SQLite's own number for it
    return conn




def _check_tables(conn: sqlite3.Connection, path: Path) -> None:
    """The four tables are plain tables: a view (which could yield rows without end) or a generated
    column (which could compute a gigabyte for every row read) is not a recording."""
    try:
        found = {name: sql for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?, ?)", TABLES)}
    except sqlite3.Error as exc:
        raise RecordingError(f"{path}: damaged beyond reading ({exc})") from None
    if "meta" not in found:
        raise RecordingError(f"{path}: an SQLite file, but not a gpuscope snapshot or journal")
    for name in TABLES:
        if not isinstance(found.get(name), str) or not found[name].upper().startswith("CREATE TABLE"):
            raise RecordingError(f"{path}: damaged: it has no {name} table as gpuscope writes it")
        try:
            hidden = [column for column in conn.execute(f"PRAGMA table_xinfo({name})") if column[6]]
        except sqlite3.Error as exc:
            raise RecordingError(f"{path}: damaged beyond reading ({exc})") from None
        if hidden:
            raise RecordingError(f"{path}: damaged: its {name} table has generated columns, which gpuscope never writes")


# What the metadata may hold, key by key; a value that is not that is left out (and counted).
META_CHECKS = {
    "format": lambda v: isinstance(v, str),
    "schema": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "kind": lambda v: v in ("journal", "snapshot"),
    "hostname": lambda v: isinstance(v, str),
    "gpuscope_version": lambda v: isinstance(v, str),
    "exported_by": lambda v: isinstance(v, str),
    "pid": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v < PID_LIMIT,
    "started": is_time,
    "exported": is_time,
    "interval_s": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e6,
    "range": lambda v: isinstance(v, list) and len(v) == 2 and all(t is None or is_time(t) for t in v),
}


def _meta(conn: sqlite3.Connection, path: Path, skipped: Counter) -> dict:
    meta = {}
    try:
        rows = conn.execute("SELECT key, value FROM meta").fetchall()
    except sqlite3.Error as exc:
        raise RecordingError(f"{path}: damaged beyond reading ({exc})") from None
    for key, text in rows:
        try:
            if not isinstance(key, str) or not isinstance(text, str):
                raise ValueError("not text")
            value = json.loads(text, parse_constant=reject_constant)
        except (ValueError, RecursionError):
            skipped["meta"] += 1
            continue
        check = META_CHECKS.get(key)
        if check is not None and not check(value):
            skipped["meta"] += 1
            continue
        meta[key] = value
    if meta.get("format") != FORMAT:
        raise RecordingError(f"{path}: an SQLite file, but not a gpuscope snapshot or journal")
    schema = meta.get("schema")
    if not isinstance(schema, int):
        raise RecordingError(f"{path}: damaged: its schema version is missing")
    if schema > SCHEMA:
        raise RecordingError(
            f"{path}: written by a newer gpuscope ({meta.get('gpuscope_version', '?')}, schema {schema}; "
            f"this one reads schema {SCHEMA}): upgrade gpuscope to replay it"
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
    """The record `blob` as a checked `cls`, or None when it is damaged."""
    try:
        return checked(cls, unpack(blob))
    except ValueError:  # DecodeError among them
        return None


def _check_frame(data: dict, record: dict, rebuild: FrameRebuilder, keyframe: bool) -> None:
    """ValueError unless the rebuilt frame `data` decodes into a Frame that passes the checks.

    Only the rows this record changed are decoded (the others passed when they last changed),
    so opening an hour of a busy node costs little more than reading it."""
    checked(Frame, {**data, "processes": []})
    changed = rebuild.rows if keyframe else {k: rebuild.rows[k] for k in record.get("rows", {}) if k in rebuild.rows}
    for row in changed.values():
        checked(ProcessRow, row)
