"""Replay: a recording behind the console's Source interface, its time cursor, and the report."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from frames import T0, frame, live, session_frames
from pilot_wait import until
from gpuscope.core.node.model import ProcessRow
from gpuscope.core.diagnosis.steps import diagnose
from gpuscope.core.session.format import session_meta
from gpuscope.core.session.journal import Journal
from gpuscope.core.session.recording import open_recording
from gpuscope.core.session.replay import ReplaySession, parse_time
from gpuscope.core.session.report import build_report
from gpuscope.core.serving.model import ServingSnapshot, Signals, StageStats
from gpuscope.core.target.stacks import StackDump, StackFrame, ThreadStack
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.textlines import TextLines
from textual.widgets import Footer, OptionList
from gpuscope.tui.service import ServicePanel
from gpuscope.tui.stacks import DumpScreen
from gpuscope.tui.timeline import JumpScreen, Timeline
from gpuscope.tui.wizard import WizardScreen

MIB = 2**20


def leaking_session(tmp_path, n=120, runs_in=""):
    """A recorded session: process 4242 gains 5 MiB a second (GPU and RSS), the service slows, a dump was taken."""
    frames = []
    for f in session_frames(n):
        i = int(f.time - T0)
        procs = tuple(replace(r, rss_bytes=2**30 + i * 5 * MIB, gpu_memory_bytes=60 * 2**30 + i * 5 * MIB, runs_in=runs_in)
                      if r.pid == 4242 else r for r in f.processes)
        frames.append(replace(f, processes=procs))
    path = tmp_path / "session.gpuscope"
    j = Journal(path, meta=session_meta("journal", pid=4242))
    for k, f in enumerate(frames):
        j.frame(f)
        if k % 5 == 0:
            j.serving(ServingSnapshot(
                time=f.time, source="scrape", target="http://127.0.0.1:8000/metrics", profile="rag", window_s=30.0,
                signals=Signals(e2e_latency_p95_s=0.2 + k / 100, tokens_per_s=500.0 - k),
                stages=(StageStats("retriever", 0.01, 0.05 + k / 200, 0.09, 0.6),), as_of=f.time,
            ))
    dump = StackDump(4242, T0 + 50, "blocking", False, (
        ThreadStack(1, "MainThread", 11, True, True, (StackFrame("remember", "/srv/retriever.py", 42),
                                                     StackFrame("search", "/srv/retriever.py", 30))),
    ))
    j.event("stacks", dump, t=T0 + 50)
    j.close()
    return path, frames


def test_the_cursor_plays_pauses_steps_jumps_and_changes_speed(tmp_path):
    path, frames = leaking_session(tmp_path)
    source = ReplaySession(open_recording(path), playing=False)
    seen = []
    got = threading.Event()

    def on_frame(f):
        seen.append(f)
        got.set()

    source.start(on_frame)
    try:
        first = seen[-1]
        assert first.source == "replay" and first.replay.index == 0 and not first.replay.playing
        assert first.processes == frames[0].processes and first.time == T0
        source.step(5)
        assert seen[-1].replay.index == 5 and seen[-1].processes == frames[5].processes
        source.step(-2)
        assert seen[-1].replay.index == 3
        source.jump(60)
        assert seen[-1].time == T0 + 63
        source.seek(T0 + 10_000)
        assert seen[-1].replay.index == len(frames) - 1
        source.select(4242)
        chart = seen[-1].chart
        assert chart.pid == 4242 and chart.rss_bytes[-1] == frames[-1].processes[0].rss_bytes
        source.faster(2)
        assert seen[-1].replay.speed == 4.0
        source.faster(-10)
        assert seen[-1].replay.speed == 0.25
        # Playing from the end starts again at the beginning, and the cursor moves by itself.
        source.faster(10)
        source.toggle()
        assert seen[-1].replay.playing and seen[-1].replay.index == 0
        count = len(seen)
        deadline = time.monotonic() + 10
        while len(seen) < count + 3:
            assert time.monotonic() < deadline, "the replay did not move on"
            got.wait(1)
            got.clear()
        assert seen[-1].replay.index > 0
    finally:
        source.stop()


def test_jump_targets():
    class Rec:
        start = T0
        end = T0 + 3600

    now = T0 + 100
    assert parse_time("+90", Rec, now) == now + 90
    assert parse_time("-5m", Rec, now) == now - 300
    assert parse_time("+1h", Rec, now) == now + 3600
    assert parse_time("start", Rec, now) == T0 and parse_time("end", Rec, now) == T0 + 3600
    clock = time.strftime("%H:%M:%S", time.localtime(T0 + 1800))
    assert parse_time(clock, Rec, now) == T0 + 1800
    for bad in ("soon", "25:00", "+x", ""):
        with pytest.raises(ValueError):
            parse_time(bad, Rec, now)


def test_evidence_from_a_replay_diagnoses_the_recorded_leak(tmp_path):
    path, _ = leaking_session(tmp_path)
    source = ReplaySession(open_recording(path), playing=False)
    source.start(lambda f: None)
    try:
        source.seek(T0 + 10_000)
        evidence = source.evidence(4242, 600)
        assert evidence.rss.times[-1] == 0 and len(evidence.rss.times) == 115
        assert evidence.serving_end is not None and evidence.serving_end.profile == "rag"
        assert diagnose(evidence).verdict == "leak"
        assert source.recorded("stacks", 4242).threads[0].frames[0].function == "remember"
        source.seek(T0 + 10)
        assert source.recorded("stacks", 4242) is None  # not yet taken at that point of the session
    finally:
        source.stop()


def test_the_report_has_the_verdict_steps_chart_stacks_and_numbers(tmp_path):
    path, frames = leaking_session(tmp_path)
    report = build_report(open_recording(path))
    assert report.startswith("# gpuscope incident report: gpu-node-7")
    assert "**leak**" in report and "in PID 4242" in report and "(computed from the recording)" in report
    for number in range(1, 8):
        assert f"### {number}. " in report
    assert "## Memory of PID 4242" in report and "GPU memory (MiB):" in report and "RSS (MiB):" in report and "⠀" not in report.split("```")[0]
    assert "remember  /srv/retriever.py:42" in report  # the recorded stack dump
    # No allocation search was made: step 7 gives the code path the dump found, said for what it is.
    step7 = report.split("### 7. ")[1].split("\n## ")[0]
    assert "Code path recorded: `remember` (`/srv/retriever.py:42`) in thread MainThread (gil)" in step7, step7
    assert "not what allocated" in step7
    assert "| 4242 | svc | 0 |" in report and "api-key ***" in report  # the process table, redacted as recorded
    assert "| e2e_latency_p95_s | 0.2 |" in report and "| retriever |" in report
    assert "\x1b[" not in report


async def test_the_console_over_a_replay(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path, frames = leaking_session(tmp_path)
    source = ReplaySession(open_recording(path), playing=False)
    app = GpuScopeApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        timeline = app.query_one(Timeline)
        await until(pilot, lambda: timeline.display and "⏸ paused" in timeline.text.plain, "the paused timeline")
        assert "0:00:00 / 0:01:59" in timeline.text.plain
        assert "replay" in app.query_one("#title").text.plain
        await pilot.press("right_square_bracket", "right_square_bracket")
        await until(pilot, lambda: app.frame.replay.index == 2, "two steps forward")
        assert app.frame.time == T0 + 2
        await pilot.press("right_curly_bracket")
        await until(pilot, lambda: app.frame.time == T0 + 62, "a minute forward")
        await pilot.press("greater_than_sign")
        await until(pilot, lambda: app.frame.replay.speed == 2.0, "twice the speed")
        assert app.query_one(ServicePanel).display
        # `d` shows the dump recorded with the session (nothing is read from a process).
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DumpScreen), "the recorded dump")
        assert app.screen.recorded is not None
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DumpScreen), "the dump to close")
        # The jump box: to the end.
        await pilot.press("J")
        await until(pilot, lambda: isinstance(app.screen, JumpScreen), "the jump box")
        await pilot.press(*"end", "enter")
        await until(pilot, lambda: app.frame.replay.index == len(frames) - 1, "the end of the replay")
        # A snapshot of the recording up to the cursor, from the replay itself.
        await pilot.press("J")
        await until(pilot, lambda: isinstance(app.screen, JumpScreen), "the jump box")
        await pilot.press(*"-30", "enter")
        await until(pilot, lambda: not isinstance(app.screen, JumpScreen) and app.frame.replay.index < len(frames) - 1,
                    "the jump back")
        cursor = app.frame.time
        await pilot.press("e", "c")
        exports = tmp_path / "state" / "gpuscope" / "exports"
        [snapshot] = await until(pilot, lambda: list(exports.glob("*.gpuscope")), "the exported snapshot")
        part = open_recording(snapshot)  # written whole, then renamed into place
        assert part.start == T0 and part.end == cursor and len(part) == int(cursor - T0) + 1
        # The wizard diagnoses what was recorded.
        await pilot.press("w")
        await until(pilot, lambda: isinstance(app.screen, WizardScreen) and app.screen.diagnosis, "the wizard's diagnosis")
        assert app.screen.diagnosis.verdict == "leak"
        # Its moments are dated from the replay's position (the growth began with the recording),
        # not from today; and its footer offers no search, which a replay cannot run.
        wizard = app.screen
        wizard.query_one(OptionList).highlighted = 1
        since = f"since {time.strftime('%H:%M:%S', time.localtime(T0))} ({cursor - T0:.0f} s ago)"
        await until(pilot, lambda: since in wizard.query_one("#step", TextLines).text.plain, "the step's moments")
        panel = wizard.query_one("#step", TextLines).text.plain
        assert since in panel, panel
        footer = " ".join(str(key.render()) for key in wizard.query_one(Footer).query("FooterKey"))
        assert "Find the code" not in footer and "Re-run" in footer, footer


async def test_the_replay_keys_are_only_in_a_replay():
    from frames import FakeSource, frame

    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frame is not None, "the first frame")
        assert not app.query_one(Timeline).display
        assert app.check_action("replay_toggle", ()) is False
        assert app.check_action("export", ()) is False  # no journal given to this console


async def test_an_export_that_fails_says_why(tmp_path, monkeypatch):
    from frames import FakeSource, frame

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    journal = Journal(None)
    journal.close()  # the journal cannot take the export any more
    app = GpuScopeApp(live(FakeSource(frame()), journal=journal))
    monkeypatch.setattr(GpuScopeApp, "call_from_thread", lambda *a, **k: (_ for _ in ()).throw(AssertionError("waited on the UI")))
    said = []
    async with app.run_test(size=(120, 40)) as pilot:
        monkeypatch.setattr(app, "notify", lambda message, **kw: said.append(message))
        await until(pilot, lambda: app.frame is not None, "the first frame")
        await pilot.press("e", "a")
        await until(pilot, lambda: any("export failed" in m for m in said), "the export's failure")
    assert any("export failed: the session's journal is already closed" in m for m in said)


def test_the_report_lists_its_subject_among_the_processes_however_small(tmp_path):
    small = ProcessRow(31337, "svc", None, None, 1 * MIB, 1.0, "python tiny_leaker.py", "python", True, None, 0.0)
    big = tuple(ProcessRow(20000 + i, "other", None, None, (2 + i) * 2**30, 1.0, f"python big{i}.py", "python", True, None, 0.0)
                for i in range(12))
    path = tmp_path / "small.gpuscope"
    j = Journal(path, meta=session_meta("journal", pid=31337))
    for i in range(5):
        j.frame(frame(time=T0 + i, processes=(*big, replace(small, rss_bytes=MIB * (1 + i))), focus=None, chart=None,
                      selected_pid=None))
    j.close()
    table = build_report(open_recording(path)).split("## Processes at the end")[1]
    assert "| 31337 |" in table and table.count("`python big") == 10  # the ten largest, and the subject


async def test_a_replay_judges_by_the_same_settings_as_the_live_console(tmp_path):
    from gpuscope.commands.replay import replay_app
    from gpuscope.config import Settings

    config = tmp_path / "config.toml"
    config.write_text("[slo]\ne2e_latency_p95_s = 0.25\n\n[alerts]\nmin_rate = 3.5e6\n")
    settings = Settings.load(env={"GPUSCOPE_CONFIG": str(config)})
    path, _ = leaking_session(tmp_path)
    app = replay_app(open_recording(path), settings)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frame is not None, "the first frame")
        assert app.query_one(ServicePanel).slo.e2e_latency_p95_s == 0.25
        assert app.thresholds == settings.thresholds and app.thresholds.min_rate == 3.5e6


def test_the_report_names_where_the_process_ran(tmp_path):
    path, _ = leaking_session(tmp_path, runs_in="vllm.service")
    report = build_report(open_recording(path))
    verdict = report.split("## Verdict")[1].split("## The seven steps")[0]
    # What it runs first, then where (cut with an ellipsis, as in the console's findings)
    assert "in PID 4242 (`-m vllm.entrypoints.openai.api_server --api-key *** · vllm.…`)" in verdict, verdict
    assert "Runs in: `vllm.service`" in verdict
    table = report.split("## Processes at the end")[1]
    assert "| runs in | command |" in table and "| `vllm.service` | `python -m vllm" in table, table
    assert "| - | `python rag_worker.py" in table  # a process that ran nowhere named
