"""One session for live and replay: each sample recorded once, every finding kept, the subject kept."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace

from gpuscope.commands import snapshot
from gpuscope.core.diagnosis.attribution import Attribution, Rung
from gpuscope.core.node.host import SeenProcess
from gpuscope.core.leak import LeakThresholds
from gpuscope.core.node.model import Alert, HostMemory, HostProcess
from gpuscope.core.node.live import NodeSource
from gpuscope.core.session.format import session_meta
from gpuscope.core.session.journal import Journal
from gpuscope.core.session.recording import open_recording
from gpuscope.core.session.replay import ReplaySession
from gpuscope.core.session.report import build_report
from gpuscope.core.target.stacks import OWN, StackDump, StackFrame, Suspect, ThreadStack
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.processes import ProcessTable

from frames import T0, FakeSource, frame, live
from helpers import NoAllocator, NoNvml, gpuscope_cmd
from pilot_wait import until

FOUND = Attribution(
    pid=4242,
    suspects=(Suspect("Retriever.search", "/srv/rag.py", 41, 250_000_000, 0.93, "memray",
                      stack=(StackFrame("Retriever.search", "/srv/rag.py", 41, OWN),)),),
    rungs=(Rung("memray", "used", "3 sites"),),
    method="memray",
    confidence="high",
)
NOTHING = Attribution(pid=4242, suspects=(), rungs=(Rung("memray", "refused", "no"),), method=None, confidence="none")


def recorded_session(tmp_path, meta=None, frames=None):
    """A live session over hand-made frames, recorded to a journal file (closed by the caller)."""
    path = tmp_path / "session.gpuscope"
    journal = Journal(path, meta=meta or session_meta("journal"))
    source = FakeSource(*(frames or [frame(time=T0 + i) for i in range(5)]))
    session = live(source, journal=journal)
    session.start(lambda f: None, lambda s: None)
    return session, journal, path


# -- every diagnosis and allocation-site search is kept; the most informative is shown -------------


def test_a_report_after_two_diagnoses_keeps_the_culprit(tmp_path):
    session, journal, path = recorded_session(tmp_path)
    session.record("allocations", FOUND)
    culprit, _ = session.diagnose(4242, session.evidence(4242, 3600), thresholds=LeakThresholds())
    assert culprit.suspects  # the search named the code
    # A later diagnosis in which step 7 was not run (the wizard of an older gpuscope reopened).
    later = replace(session.evidence(4242, 3600), attribution=None)
    skipped, _ = session.diagnose(4242, later, thresholds=LeakThresholds())
    assert not skipped.suspects
    journal.close()
    rec = open_recording(path)
    assert len(rec.findings.of("diagnosis", 4242)) == 2  # both are remembered
    report = build_report(rec)
    assert "### 7. Code path — – skipped" not in report
    assert "Retriever.search" in report and "(as diagnosed during the session)" in report


def test_a_search_that_found_nothing_does_not_hide_the_one_that_did(tmp_path):
    session, journal, _ = recorded_session(tmp_path)
    session.record("allocations", FOUND)
    session.record("allocations", NOTHING)
    assert session.best_attribution(4242) is FOUND
    assert session.evidence(4242, 60).attribution is FOUND  # what the wizard reopened starts from
    journal.close()


def test_an_empty_command_prints_no_empty_code_span(tmp_path):
    session, journal, path = recorded_session(tmp_path)
    diagnosis, _ = session.diagnose(4242, replace(session.evidence(4242, 3600), command="  "), thresholds=LeakThresholds())
    journal.close()
    report = build_report(open_recording(path))
    assert "Command: *not known*" in report and "``" not in report.split("## The seven steps")[0]


# -- snapshot --pid P: the recording is about P ------------------------------------------------------


def test_snapshot_pid_is_the_subject_of_report_and_replay_whatever_alerts(tmp_path):
    alert = Alert("rss", 4243, None, "PID 4243 python rag_worker.py (RSS)", 6.4e6, T0, None, 0.8, "floor rose")
    frames = [frame(time=T0 + i, alerts=(alert,), focus=None, selected_pid=None) for i in range(5)]
    session, journal, path = recorded_session(tmp_path, session_meta("journal", pid=5100), frames)
    journal.close()
    rec = open_recording(path)
    assert rec.subject == 5100
    report = build_report(rec)
    assert "in PID 5100" in report and "in PID 4243" not in report
    replay = ReplaySession(rec, playing=False)
    shown = []
    replay.start(shown.append)
    replay.stop()
    assert shown[0].selected_pid == 5100 and shown[0].focus is not None and shown[0].focus.pid == 5100


def test_snapshot_stamps_the_stack_dump_within_the_recorded_frames(tmp_path, monkeypatch):
    session, journal, path = recorded_session(tmp_path)
    dump = StackDump(4242, T0 + 60, "blocking", False, (
        ThreadStack(1, "MainThread", 11, True, True, (StackFrame("remember", "/srv/retriever.py", 42),)),))
    monkeypatch.setattr(snapshot.pyspy, "dump", lambda pid: dump)
    snapshot._record_stacks(session, 4242)  # taken after the last sample (T0 + 4)
    journal.close()
    rec = open_recording(path)
    replay = ReplaySession(rec, playing=False)
    replay.start(lambda f: None)
    replay.seek(rec.end)  # the last frame: the dump shows there
    assert replay.recorded("stacks", 4242) == dump
    replay.stop()


# -- the journal tees at the sampling point ------------------------------------------------------------


class Host:
    """A host of twelve processes whose every scan is one sample."""

    def __init__(self) -> None:
        self.scans = 0

    def memory(self) -> HostMemory:
        return HostMemory(64 * 2**30, 16 * 2**30, 48 * 2**30)

    def scan(self, fresh=frozenset()) -> list[SeenProcess]:
        self.scans += 1
        return [SeenProcess(1000 + i, T0, "python", "/usr/bin/python3", "svc", (100 + i) * 2**20, 1.0) for i in range(12)]

    def complete(self, seen) -> list[HostProcess]:
        return [HostProcess(s.pid, s.create_time, s.user, s.name, f"python worker{s.pid}.py", s.rss, s.cpu, True)
                for s in seen]

    def detail(self, pid: int):
        raise AssertionError("nothing is attached in this test")

    def close(self) -> None:
        pass



async def test_holding_down_over_the_table_records_no_extra_frames(tmp_path):
    host = Host()
    node = NodeSource(interval=3600.0, nvml=NoNvml(), host=host, allocator=NoAllocator())  # one sample, at start
    journal = Journal(None)
    app = GpuScopeApp(live(node, journal=journal))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frame is not None and len(app.frame.processes) >= 12, "the first frame")
        table = app.query_one(ProcessTable)
        first = table.selected_row.pid
        for _ in range(11):
            await pilot.press("down")
        # every row was shown again, charted: the frame follows the selection to the last row pressed to
        last = await until(pilot, lambda: table.selected_row.pid != first and app.frame.selected_pid == table.selected_row.pid
                           and table.selected_row.pid, "the frame to follow the selection")
        assert app.frame.selected_pid == last
    exported = journal.export(tmp_path / "s.gpuscope").result(timeout=10)
    journal.close()
    assert len(open_recording(exported)) == host.scans  # one frame a sample, however often it was shown


def test_snapshot_pid_end_to_end(tmp_path, spawn_python):
    """`gpuscope snapshot --pid P`: P is the subject, and its stack dump is within the frames."""
    child = spawn_python("""
        import time
        def waiting():
            print("ready", flush=True)
            time.sleep(120)
        waiting()
    """)
    out = tmp_path / "p.gpuscope"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = subprocess.run([*gpuscope_cmd(), "snapshot", "--pid", str(child.pid), "--duration", "2", "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    rec = open_recording(out)
    assert rec.subject == child.pid
    dumps = rec.findings.of("stacks", child.pid)
    if "no stack dump" not in done.stderr:  # py-spy may be refused where ptrace is
        assert dumps and dumps[-1].time <= rec.end
    report = build_report(rec)
    assert f"in PID {child.pid}" in report
