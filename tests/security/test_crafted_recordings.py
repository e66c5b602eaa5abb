"""Recordings anyone may have written: `report` and `replay` skip what is damaged and say how much.

A session file is SQLite with zlib'd JSON records (gpuscope.core.session.format). Each case below is a
hand-made bad file; a hypothesis test makes more. None may end in a traceback, a hang or unbounded
memory: a bad record is skipped and counted ("skipped 1 damaged record (frames 1)"), a file that
cannot be a recording is one line and exit status 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import sqlite3
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frames import T0, rows
from frames import frame as make_frame
from gpuscope.core.session import format as journal
from gpuscope.core.session.codec import encode
from gpuscope.core.session.recording import open_recording
from gpuscope.core.session.replay import ReplaySession
from gpuscope.core.session.report import build_report
from gpuscope.core.serving.model import ServingSnapshot, Signals
from gpuscope.core.target.stacks import StackDump, StackFrame, ThreadStack
from helpers import SUPPORT, gpuscope_cmd
from pilot_wait import until

FRAMES = 10
BAD = 5  # the record a case damages


def good_frames() -> list[dict]:
    """Ten encoded frames, each a keyframe (so a damaged one costs exactly one record)."""
    return [encode(dataclasses.replace(make_frame(time=T0 + i, processes=rows()), chart=None)) for i in range(FRAMES)]


def good_serving(i: int) -> dict:
    return encode(ServingSnapshot(time=T0 + i, source="scrape", target="http://127.0.0.1:8000/metrics", profile="rag",
                                  window_s=30.0, signals=Signals(e2e_latency_p95_s=0.2, tokens_per_s=500.0), as_of=T0 + i))


def good_dump() -> dict:
    return encode(StackDump(4242, T0 + 3, "blocking", False, (
        ThreadStack(1, "MainThread", 11, True, True, (StackFrame("remember", "/srv/retriever.py", 42),)),)))


def good_diagnosis() -> dict:
    from frames import leaking_evidence
    from gpuscope.core.diagnosis.steps import diagnose

    return encode(diagnose(leaking_evidence()))


def packed(value, *, allow_nan: bool = False) -> bytes:
    return zlib.compress(json.dumps(value, allow_nan=allow_nan).encode())


def write(path: Path, frames: list, *, serving=None, events=None, meta=None) -> Path:
    """A session file with these rows: a frame is an encoded dict (a keyframe), or a raw
    (t, keyframe, data) row; serving and events likewise."""
    conn = journal.connect(path, create=True)
    journal.initialise(conn, {**journal.session_meta("journal", pid=4242), **(meta or {})}, wal=False)
    conn.execute("BEGIN")
    for i, f in enumerate(frames):
        conn.execute("INSERT INTO frames VALUES (?, ?, ?)", f if isinstance(f, tuple) else (T0 + i, 1, journal.pack(f)))
    for i, s in enumerate(serving if serving is not None else [good_serving(i) for i in range(3)]):
        conn.execute("INSERT INTO serving VALUES (?, ?)", s if isinstance(s, tuple) else (T0 + i, journal.pack(s)))
    for e in events if events is not None else [(T0 + 3, "stacks", journal.pack(good_dump()))]:
        conn.execute("INSERT INTO events VALUES (?, ?, ?)", e)
    conn.execute("COMMIT")
    conn.close()
    return path


def with_bad_frame(path: Path, change) -> Path:
    """Record BAD changed by `change(data)` (which edits it, or returns a whole raw row)."""
    frames = good_frames()
    row = change(frames[BAD])
    frames[BAD] = row if isinstance(row, tuple) else frames[BAD]
    return write(path, frames)


def consume(rec) -> str:
    """Everything report and replay do with a recording: the report, every frame through the
    replay source, the evidence and the serving history at each."""
    report = build_report(rec)
    source = ReplaySession(rec, playing=False)
    seen = []
    source.start(seen.append)
    try:
        for i in range(len(rec)):
            source.seek(rec.times[i])
            source.select(4242)
            source.focus(4243)
            source.evidence(4242, 600.0)
            rec.serving_at(rec.times[i])
            source.recorded("stacks", 4242)
    finally:
        source.stop()
    assert len(seen) >= len(rec)
    return report


def nested(depth: int) -> dict:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return {"deep": value}


# Each case: (what it does to record BAD, the damage it must be reported as).
FRAME_CASES = {
    "device without index": lambda d: d["nvml"]["devices"][0].pop("index"),
    "string for a number": lambda d: d["processes"][0].update(rss_bytes="lots"),
    "numeric string for GPU memory": lambda d: d["processes"][1].update(gpu_memory_bytes="1e9"),
    "frame time 1e308": lambda d: d.update(time=1e308),
    "frame time as text": lambda d: d.update(time="now"),
    "frame time in the year 5000": lambda d: d.update(time=9.5e10),
    "PID as a string": lambda d: d["processes"][0].update(pid="4242"),
    "PID not whole": lambda d: d["processes"][0].update(pid=4242.5),
    "PID negative": lambda d: d["processes"][0].update(pid=-1),
    "PID zero": lambda d: d["processes"][2].update(pid=0),
    "PID past any kernel's": lambda d: d["processes"][0].update(pid=2**40),
    "torch PID a string": lambda d: d.update(torch=[{"pid": "x", "allocated_bytes": 1, "reserved_bytes": 2}]),
    "selected PID a list": lambda d: d.update(selected_pid=[1]),
    "GPU index negative": lambda d: d["nvml"]["devices"][0].update(index=-3),
    "memory past 64 bits": lambda d: d["nvml"]["devices"][0].update(memory_used=10**30),
    "GPU memory total negative": lambda d: d["nvml"]["devices"][1].update(memory_total=-(2**40)),
    "RSS negative": lambda d: d["processes"][0].update(rss_bytes=-1),
    "host memory negative": lambda d: d["host"].update(available=-5),
    "hostname a number": lambda d: d.update(hostname=7),
    "command an object": lambda d: d["processes"][0].update(command={"x": 1}),
    "focus create time 1e308": lambda d: d["focus"].update(create_time=1e308),
    "cpu percent 1e300": lambda d: d["processes"][0].update(cpu_percent=1e300),
    "CPU percent NaN (null)": lambda d: d["processes"][0].update(cpu_percent=None) or d.update(alerts=[{
        "kind": "rss", "pid": 4242, "device": None, "label": "x", "growth_bytes_per_s": None, "since": None,
        "time_to_full_s": None, "confidence": 0.9, "reason": "r"}]),
    "alert growth infinite": lambda d: d.update(alerts=[{
        "kind": "rss", "pid": 4242, "device": None, "label": "x", "growth_bytes_per_s": "inf", "since": None,
        "time_to_full_s": None, "confidence": 0.9, "reason": "r"}]),
    "processes an object": lambda d: d.update(processes={"a": 1}),
    "row t nan as text": lambda d: ("nan", 1, journal.pack(d)),
    "row t 1e308": lambda d: (1e308, 1, journal.pack(d)),
    "row t negative": lambda d: (-5.0, 1, journal.pack(d)),
    "keyframe flag 7": lambda d: (T0 + BAD, 7, journal.pack(d)),
    "NaN in the JSON": lambda d: (T0 + BAD, 1, packed({**d, "time": float("nan")}, allow_nan=True)),
    "Infinity in the JSON": lambda d: (T0 + BAD, 1, packed({**d, "time": float("inf")}, allow_nan=True)),
    "1e999 in the JSON": lambda d: (T0 + BAD, 1, zlib.compress(json.dumps({**d, "time": 0}).replace('"time": 0', '"time": 1e999').encode())),
    "JSON nested 100000 deep": lambda d: (T0 + BAD, 1, zlib.compress(b"[" * 100_000 + b"]" * 100_000)),
    "JSON a list": lambda d: (T0 + BAD, 1, journal.pack([d])),
    "not zlib": lambda d: (T0 + BAD, 1, b"\x00\xff"),
    "zlib cut short": lambda d: (T0 + BAD, 1, journal.pack(d)[:-8]),
    "data as text": lambda d: (T0 + BAD, 1, json.dumps(d)),
    "data as a number": lambda d: (T0 + BAD, 1, 12345),
    "not JSON": lambda d: (T0 + BAD, 1, zlib.compress(b"\xff\xfe not json")),
}


@pytest.mark.parametrize("case", list(FRAME_CASES))
def test_a_damaged_frame_is_skipped_and_counted(tmp_path, case):
    path = with_bad_frame(tmp_path / "bad.gpuscope", FRAME_CASES[case])
    rec = open_recording(path)
    assert len(rec) == FRAMES - 1 and BAD + T0 not in rec.times, case
    assert rec.damage == "skipped 1 damaged record (frames 1)", rec.damage
    report = consume(rec)
    assert "- note: skipped 1 damaged record (frames 1)" in report


def test_damaged_deltas_wait_for_the_next_keyframe(tmp_path):
    """A delta whose order or rows are not what FrameDeltas writes: it and the deltas after it
    (which need it) are skipped up to the next keyframe."""
    deltas = journal.FrameDeltas()
    records = []
    for i in range(FRAMES):
        f = make_frame(time=T0 + i, chart=None, processes=rows() if i % 2 else rows()[:-1])
        keyframe, data = deltas.record(f)
        records.append([T0 + i, int(keyframe), data])
    records[0][1] = 1
    records[3][2] = {**records[3][2], "order": ["no-such-row"]}
    records[6][1] = 1  # a keyframe of its own again
    records[6][2] = {**records[6][2], "processes": [encode(r) for r in rows()]}
    records[7][2] = {**records[7][2], "rows": ["not", "an", "object"]}
    path = write(tmp_path / "deltas.gpuscope", [(t, k, journal.pack(d)) for t, k, d in records])
    rec = open_recording(path)
    assert rec.times == [T0 + i for i in (0, 1, 2, 6)]
    assert rec.damage == "skipped 6 damaged records (frames 6)"
    consume(rec)


def test_damaged_serving_events_and_metadata_are_skipped_and_counted(tmp_path):
    deep = {**good_dump(), "threads": [{"thread_id": 1, "frames": [], "name": None, "os_thread_id": None,
                                        "active": True, "owns_gil": False}]}
    deeply_nested_evidence = good_diagnosis()
    deeply_nested_evidence["steps"][0]["evidence"] = nested(500)
    events = [
        (T0 + 3, "stacks", journal.pack(good_dump())),                       # good
        (T0 + 3, "stacks", journal.pack({**good_dump(), "threads": "many"})),
        (T0 + 3, "stacks", journal.pack({**good_dump(), "pid": "4242"})),
        (T0 + 3, "stacks", journal.pack({**good_dump(), "time": 1e308})),
        (T0 + 3, 5, journal.pack(good_dump())),                             # kind not text
        (T0 + 3, "rootkit", journal.pack(good_dump())),                     # no such kind
        ("soon", "stacks", journal.pack(good_dump())),                      # t not a time
        (T0 + 3, "stacks", journal.pack(deep)),                             # good too
        (T0 + 4, "diagnosis", journal.pack(good_diagnosis())),                # good
        (T0 + 4, "diagnosis", journal.pack(deeply_nested_evidence)),
    ]
    serving = [good_serving(0), {**good_serving(1), "time": 1e308}, {**good_serving(2), "signals": [1, 2]},
               (T0 + 3, b"garbage"), good_serving(4)]
    meta = {"pid": "abc", "hostname": 7, "kind": "rootkit", "started": "yesterday"}
    rec = open_recording(write(tmp_path / "s.gpuscope", good_frames(), serving=serving, events=events, meta=meta))
    assert len(rec) == FRAMES and len(rec.findings) == 3 and len(rec.serving) == 2
    assert rec.damage == "skipped 14 damaged records (meta 4, serving 3, events 7)", rec.damage
    assert "pid" not in rec.meta and rec.kind == "journal" and rec.hostname == "gpu-node-7"
    consume(rec)


# -- the command line: one line, never a traceback --------------------------------------------------


def gpuscope(*args: str, limit_memory: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    def limits() -> None:
        if limit_memory:
            resource.setrlimit(resource.RLIMIT_AS, (limit_memory, limit_memory))

    return subprocess.run([*gpuscope_cmd(), *args], capture_output=True, text=True, timeout=timeout, preexec_fn=limits)


@pytest.mark.parametrize("case", ["device without index", "PID as a string", "row t nan as text", "frame time 1e308"])
def test_report_says_what_it_skipped_in_one_line(tmp_path, case):
    path = with_bad_frame(tmp_path / "bad.gpuscope", FRAME_CASES[case])
    done = gpuscope("report", str(path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["note: skipped 1 damaged record (frames 1)"]
    assert done.stdout.startswith("# gpuscope incident report")


def zlib_bomb(chunk_size: int, chunks: int) -> bytes:
    """zlib of chunks * chunk_size spaces, made without compressing them all: after a full flush
    the compressor starts afresh, so every chunk compresses to the same bytes."""
    chunk = b" " * chunk_size
    first = zlib.compressobj(9)
    head = first.compress(chunk) + first.flush(zlib.Z_FULL_FLUSH)
    again = zlib.compressobj(9)
    body = (again.compress(chunk) + again.flush(zlib.Z_FULL_FLUSH))[2:]  # without the zlib header
    adler = 1
    for _ in range(chunks):
        adler = zlib.adler32(chunk, adler)
    return head + body * (chunks - 1) + b"\x03\x00" + struct.pack(">I", adler)  # an empty last block, the checksum


def test_a_zlib_bomb_is_skipped_in_bounded_time_and_memory(tmp_path):
    """1 MiB of zlib that inflates to 1 GiB: capped while inflating, so 512 MiB of address space
    (the interpreter, SQLite and the report included) is enough."""
    bomb = zlib_bomb(2**24, 64)
    assert len(bomb) < 2**21
    path = with_bad_frame(tmp_path / "bomb.gpuscope", lambda d: (T0 + BAD, 1, bomb))
    done = gpuscope("report", str(path), limit_memory=768 * 2**20, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == ["note: skipped 1 damaged record (frames 1)"]


SCHEMAS = {
    # Reading this view would never end.
    "a view": ("""
        DROP TABLE frames;
        CREATE VIEW frames AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
            SELECT 1767000000.0 AS t, 1 AS keyframe, x'00' AS data FROM n;
    """, "it has no frames table as gpuscope writes it"),
    # Reading a row of this table would compute 900 MB.
    "a generated column": ("""
        ALTER TABLE frames RENAME TO old;
        CREATE TABLE frames(t REAL, keyframe INTEGER, raw BLOB, data BLOB GENERATED ALWAYS AS (zeroblob(900000000)) VIRTUAL);
        INSERT INTO frames(t, keyframe, raw) SELECT t, keyframe, data FROM old;
        DROP TABLE old;
    """, "its frames table has generated columns"),
}


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_a_schema_gpuscope_never_writes_is_refused_not_read(tmp_path, schema):
    script, expected = SCHEMAS[schema]
    path = write(tmp_path / "schema.gpuscope", good_frames())
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.close()
    done = gpuscope("report", str(path), limit_memory=768 * 2**20, timeout=30)  # in a child: it could run away
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert expected in line, line


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_as_the_recording_is_one_line_at_once(tmp_path, kind):
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    for command in ("report", "replay"):
        done = gpuscope(command, str(path), timeout=20)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert ("FIFO" if kind == "fifo" else "character device") in line and "not a gpuscope snapshot" in line


# -- the console over a crafted recording -------------------------------------------------------------


async def test_the_replay_console_plays_a_crafted_recording_and_shows_the_damage(tmp_path):
    from gpuscope.tui.app import GpuScopeApp

    frames = good_frames()
    frames[2]["processes"][0]["pid"] = "x"
    frames[BAD]["nvml"]["devices"][0].pop("index")
    frames[7]["time"] = float("nan")
    frames[7] = (T0 + 7, 1, packed(frames[7], allow_nan=True))
    # An infinite latency is "not known" where a signal may be unknown: kept, and charted as a gap.
    serving = [{**good_serving(i), "signals": {"e2e_latency_p95_s": "inf" if i % 2 else 0.2 + i, "tokens_per_s": "-inf"}}
               for i in range(FRAMES)]
    rec = open_recording(write(tmp_path / "s.gpuscope", frames, serving=serving))
    assert len(rec.serving) == FRAMES and rec.serving[1].signals.e2e_latency_p95_s is None
    source = ReplaySession(rec, playing=False)
    app = GpuScopeApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frame is not None, "the first frame")
        for _ in range(FRAMES):
            await pilot.press("right_square_bracket")
        await pilot.press("w")
        await until(pilot, lambda: app.frame.replay.index == len(rec) - 1, "the replay's last frame")
        assert any("skipped 3 damaged records (frames 3)" in n for n in app.frame.notices)
    assert app.return_code in (None, 0)


async def test_the_replay_console_takes_extreme_values_that_are_still_valid(tmp_path):
    """Huge numbers, a GPU whose total is 0 or below what it uses, frames all at one time, very
    long strings: a recording may hold them, and the console shows them without crashing."""
    from gpuscope.tui.app import GpuScopeApp

    frames = good_frames()
    for i, f in enumerate(frames):
        f["time"] = T0  # every frame at the same time
        f["hostname"] = "h" * 5000
        f["processes"][0].update(cpu_percent=1e18, rss_bytes=2**62, gpu_memory_bytes=0, gpu_growth_bytes_per_s=-1e18)
        f["processes"][1].update(command="x" * 20000, user="u" * 500)
        f["nvml"]["devices"][0].update(memory_used=2**62 if i % 2 else 0, memory_total=0, utilization=10**9, temperature=-300)
        f["nvml"]["devices"][1].update(memory_total=1, memory_used=2**62)
        f["torch"] = [{"pid": 4242, "allocated_bytes": 2**62, "reserved_bytes": 0, "devices": 0}]
        f["alerts"] = [{"kind": "gpu", "pid": 4242, "device": 0, "label": "L" * 3000, "growth_bytes_per_s": 1e18,
                        "since": 0.0, "time_to_full_s": 1e18, "confidence": 1e18, "reason": "r"}]
    serving = [{**good_serving(i), "window_s": 1e18, "malformed_lines": 2**62,
                "signals": {"e2e_latency_p95_s": 1e18 if i % 2 else 0.0, "tokens_per_s": 1e-300, "kv_cache_usage": 1e18}}
               for i in range(FRAMES)]
    rec = open_recording(write(tmp_path / "extreme.gpuscope", frames, serving=serving))
    assert len(rec) == FRAMES and rec.damage is None
    consume(rec)
    source = ReplaySession(rec, playing=False)
    app = GpuScopeApp(source)
    async with app.run_test(size=(100, 35)) as pilot:
        for key in ["right_square_bracket"] * 3 + ["down", "enter", "d", "escape", "w", "escape", "space"]:
            await pilot.press(key)
            await pilot.pause()
        await until(pilot, lambda: app.frame.replay.index >= 3, "three frames forward")


def test_a_console_crash_shows_no_local_variables(tmp_path):
    """Textual's own crash report lists every frame's locals; gpuscope's must not (they can hold
    what other users' processes and files said)."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(SUPPORT)!r}]\n"
        "from frames import FakeSource, frame, live\n"
        "from gpuscope.tui.app import GpuScopeApp\n"
        "class Crashing(FakeSource):\n"
        "    def start(self, on_frame, on_sample=None):\n"
        "        hostile = '-'.join(['HOSTILE', 'LOCAL'])\n"
        "        raise RuntimeError('the source broke')\n"
        "GpuScopeApp(live(Crashing(frame()))).run(headless=True)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert "the source broke" in done.stderr and "HOSTILE-LOCAL" not in done.stderr, done.stderr


# -- generated damage ---------------------------------------------------------------------------------

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.text(max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["inf", "-inf"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)


def leaves(value, path=()):
    """Every place in a JSON value: (path to it, its parent, its key)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield path + (k,)
            yield from leaves(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield path + (i,)
            yield from leaves(v, path + (i,))


def damaged(value, place, replacement, delete: bool):
    value = json.loads(json.dumps(value))
    *parent_path, key = place
    parent = value
    for p in parent_path:
        parent = parent[p]
    if delete and isinstance(parent, dict):
        del parent[key]
    else:
        parent[key] = replacement
    return value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_damage_never_crashes_report_or_replay(tmp_path, data):
    frames = good_frames()
    which = data.draw(st.sampled_from(["frame", "serving", "event"]))
    original = {"frame": frames[BAD], "serving": good_serving(1), "event": good_dump()}[which]
    place = data.draw(st.sampled_from(list(leaves(original))))
    bad = damaged(original, place, data.draw(HOSTILE), data.draw(st.booleans()))
    blob = packed(bad, allow_nan=True)
    path = tmp_path / f"gen-{os.getpid()}-{data.draw(st.integers(0, 2**32))}.gpuscope"
    if which == "frame":
        frames[BAD] = (T0 + BAD, 1, blob)
        write(path, frames)
    elif which == "serving":
        write(path, frames, serving=[good_serving(0), (T0 + 1, blob), good_serving(2)])
    else:
        write(path, frames, events=[(T0 + 3, "stacks", blob)])
    rec = open_recording(path)
    table = {"frame": "frames", "serving": "serving", "event": "events"}[which]
    assert rec.damage in (None, f"skipped 1 damaged record ({table} 1)")
    consume(rec)
    path.unlink()


def test_a_recording_is_read_with_sqlites_settings_for_a_file_from_an_attacker(tmp_path):
    """SQLite's own defences for a database anyone may have written: the schema's functions not
    trusted, every page's cells checked as read, no memory map of the file."""
    from gpuscope.core.session.recording import _connect  # noqa: PLC0415 - the connection itself is what is checked

    path = with_bad_frame(tmp_path / "any.gpuscope", FRAME_CASES["not zlib"])
    conn = _connect(path, tmp_path)
    try:
        assert conn.execute("PRAGMA trusted_schema").fetchone()[0] == 0
        assert conn.execute("PRAGMA cell_size_check").fetchone()[0] == 1
        assert conn.execute("PRAGMA mmap_size").fetchone()[0] == 0
    finally:
        conn.close()


def test_pages_overwritten_anywhere_end_in_one_line_or_skipped_records(tmp_path):
    """Bytes of a good recording overwritten at places spread over every page: each copy is read
    to its end or refused in one line (RecordingError), never another exception."""
    from gpuscope.core.session.recording import RecordingError  # noqa: PLC0415

    good = with_bad_frame(tmp_path / "good.gpuscope", FRAME_CASES["not zlib"])
    data = good.read_bytes()
    page = struct.unpack(">H", data[16:18])[0] or 65536
    for place in range(100, len(data), max(1, len(data) // 40)):
        if place % page < 100 and place >= page:
            continue  # a page's header: SQLite refuses the file at once, covered by the cases above
        bad = tmp_path / f"bad-{place}.gpuscope"
        bad.write_bytes(data[:place] + bytes(range(7, 7 + 32)) + data[place + 32:])
        try:
            consume(open_recording(bad))
        except RecordingError:
            pass
