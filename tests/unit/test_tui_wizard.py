"""The guided diagnosis in the console (Pilot): alert bar, navigation, re-run, cancel, export."""

import os
import threading
import time
from dataclasses import replace

from textual.widgets import OptionList

from gpuscope.core.diagnosis.attribution import Attribution, Rung
from gpuscope.core.node.model import Alert
from gpuscope.core.target.stacks import OWN, StackFrame, Suspect
from gpuscope.tui.alerts import AlertBar
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.stacks import AttributionScreen, ConfirmAttach
from gpuscope.tui.textlines import TextLines
from gpuscope.tui.wizard import WizardScreen

from frames import FakeSource, frame, leaking_evidence, live
from pilot_wait import until

ALERT = Alert("rss", 4243, None, "PID 4243 python rag_worker.py (RSS)", 6.4e6, time.time() - 60, None, 0.8, "floor rose")
FOUND = Attribution(
    pid=4243,
    suspects=(Suspect("Retriever.search", "/srv/rag.py", 41, 250_000_000, 0.93, "memray",
                      stack=(StackFrame("Retriever.search", "/srv/rag.py", 41, OWN),)),),
    rungs=(Rung("torch-history", "skipped", "no probe"), Rung("memray", "used", "3 sites")),
    method="memray",
    confidence="high",
)


def step_text(app) -> str:
    return app.screen.query_one("#step", TextLines).text.plain


def never_wait_on_the_ui(*args, **kwargs):
    raise AssertionError("a worker waited on the UI (call_from_thread) instead of posting a message")


async def wait_for(pilot, condition, timeout=20.0):
    return await until(pilot, condition, timeout=timeout)


async def test_the_alert_bar_opens_the_wizard_on_its_process():
    source = FakeSource(frame(alerts=(ALERT,), focus=None))  # nothing attached
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        bar = app.query_one(AlertBar)
        assert "⚠ LEAK +6.40 MB/s · w: diagnose · PID 4243 python rag_worker.py (RSS)" in bar.text.plain
        assert "w: diagnose" in bar.text.plain
        await pilot.press("w")  # the alert's process, though the table's cursor is on 4242
        assert isinstance(app.screen, WizardScreen) and app.screen.pid == 4243
        await pilot.press("escape")
        await pilot.click(AlertBar)
        assert isinstance(app.screen, WizardScreen) and app.screen.pid == 4243
        assert source.evidence_asked == [4243, 4243]


async def test_steps_navigation_and_the_verdict():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")  # the selected process (4242)
        wizard = app.screen
        assert isinstance(wizard, WizardScreen)
        title = wizard.query_one("#wizard-title", TextLines).text.plain
        # The process by its name (what it runs first), not its PID alone.
        assert "Diagnosis of PID 4242 (serve.py --api-key *** · python): leak (steady-growth)" in title
        steps = wizard.query_one("#steps", OptionList)
        assert steps.highlighted == 1  # the first step with an alert: host memory
        assert "RSS grows" in step_text(app)
        await pilot.press("up")
        assert "1. Device memory trend" in step_text(app) and "skipped" in step_text(app)
        await pilot.press("n", "n")
        assert step_text(app).startswith("3. Throughput per request") and "no metrics source" in step_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, WizardScreen)


async def test_step_7_asks_then_finds_the_suspect_and_enter_shows_its_stack(monkeypatch):
    calls = []

    def attribute(pid, duration, *, use_memray, cancelled, progress, sites_seen=None):
        calls.append((pid, use_memray))
        return FOUND

    monkeypatch.setattr("gpuscope.core.diagnosis.ladder.attribute", attribute)
    monkeypatch.setattr(GpuScopeApp, "call_from_thread", never_wait_on_the_ui)
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await pilot.press("end")
        assert "7. Code path" in step_text(app) and "not looked for" in step_text(app)
        await pilot.press("a")
        assert isinstance(app.screen, ConfirmAttach)
        await pilot.press("y")
        await wait_for(pilot, lambda: "First suspect: Retriever.search" in step_text(app))
        assert calls == [(4242, True)]
        assert "memray's allocation tracking" in step_text(app)
        await pilot.press("enter")
        assert isinstance(app.screen, AttributionScreen)


async def test_rerun_reads_the_latest_data_and_esc_cancels_a_search(monkeypatch):
    started, cancel_seen = threading.Event(), []

    def attribute(pid, duration, *, use_memray, cancelled, progress, sites_seen=None):
        started.set()
        deadline = time.monotonic() + 20
        while not cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        cancel_seen.append(cancelled())
        return FOUND

    monkeypatch.setattr("gpuscope.core.diagnosis.ladder.attribute", attribute)
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w", "r")
        assert source.evidence_asked == [4242, 4242]
        await pilot.press("end", "r", "s")  # r on step 7 looks again: asks first
        await wait_for(pilot, started.is_set)
        await pilot.press("escape")
        await wait_for(pilot, lambda: cancel_seen == [True])
        assert not isinstance(app.screen, WizardScreen) and app.is_running


async def test_export_writes_private_files(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w", "e")
        await pilot.pause()
    files = sorted((tmp_path / "gpuscope" / "exports").iterdir())
    assert [f.suffix for f in files] == [".json", ".md"]
    assert all(os.stat(f).st_mode & 0o777 == 0o600 for f in files)
    assert '"schema": "gpuscope.diagnosis/1"' in files[0].read_text()
    assert "api-key ***" in files[1].read_text() and "api-key sk" not in files[1].read_text()


async def test_the_wizard_reopened_shows_the_culprit_found_earlier(monkeypatch):
    searches = []

    def attribute(pid, duration, *, use_memray, cancelled, progress, sites_seen=None):
        searches.append(pid)
        return replace(FOUND, pid=pid)

    monkeypatch.setattr("gpuscope.core.diagnosis.ladder.attribute", attribute)
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w", "end", "a", "y")
        await wait_for(pilot, lambda: "First suspect: Retriever.search" in step_text(app))
        await pilot.press("escape")
        await pilot.press("w", "end")  # a minute later: the search is not run again
        assert isinstance(app.screen, WizardScreen)
        assert "First suspect: Retriever.search" in step_text(app) and searches == [4242]
        await pilot.press("home", "r", "end")  # steps 1-6 re-run from the latest data keep it too
        assert "First suspect: Retriever.search" in step_text(app) and searches == [4242]
    diagnoses = app.session.findings.of("diagnosis", 4242)
    assert len(diagnoses) >= 3 and all(d.value.suspects for d in diagnoses[1:])


async def test_the_wizard_names_the_process_and_where_it_runs():
    evidence = replace(leaking_evidence(4242), runs_in="vllm.service")
    app = GpuScopeApp(live(FakeSource(frame(), evidence=evidence)))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        wizard = app.screen
        assert isinstance(wizard, WizardScreen)
        title = await wait_for(pilot, lambda: wizard.query_one("#wizard-title", TextLines).text.plain)
        assert "Diagnosis of PID 4242 (serve.py --api-key *** · vllm.service · python): leak" in title, title
