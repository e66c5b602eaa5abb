"""The operator's keys (Pilot): which process a key means, the alert list, exited alerts, the keys
users of htop, vi and k9s reach for, and from an alert to the culprit in two keys."""

import re
import threading
import time
from dataclasses import replace

import pytest
from textual.widgets import OptionList, Static

from gpuscope.core.diagnosis.attribution import Attribution, Rung
from gpuscope.core.node.model import Alert
from gpuscope.core.target.stacks import OWN, StackFrame, Suspect
from gpuscope.tui.alerts import AlertBar, AlertListScreen
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.detail import CommandLineScreen
from gpuscope.tui.help import HelpScreen
from gpuscope.tui.processes import ProcessTable
from gpuscope.tui.stacks import ConfirmAttach
from gpuscope.tui.textlines import TextLines
from gpuscope.tui.wizard import WizardScreen

from frames import FakeSource, frame, live
from pilot_wait import until

NOW = time.time()
LIVE = Alert("rss", 4243, None, "PID 4243 python rag_worker.py (RSS)", 6.4e6, NOW - 60, None, 0.8, "floor rose")
EXITED = Alert("gpu", 5100, 1, "PID 5100 (GPU memory)", 9.9e6, NOW - 90, None, 0.9, "floor rose", ended=True)
CULPRIT = Attribution(
    pid=4243,
    suspects=(Suspect("_remember", "/srv/retriever.py", 88, 120_000_000, 0.91, "memray",
                      stack=(StackFrame("_remember", "/srv/retriever.py", 88, OWN),)),),
    rungs=(Rung("memray", "used", "1 site"),),
    method="memray",
    confidence="high",
)


def screen_text(app) -> str:
    """What the screen shows, as plain text (every TextLines and Static of the active screen)."""
    parts = [w.text.plain for w in app.screen.query(TextLines)]
    parts += [str(w.render()) for w in app.screen.query(Static)]
    return "\n".join(parts)


async def wait_for(pilot, condition, timeout=20.0):
    return await until(pilot, condition, timeout=timeout)


async def test_the_live_alert_leads_and_the_exited_one_is_marked():
    # The core lists live alerts first; the exited one grows faster yet never leads.
    app = GpuScopeApp(live(FakeSource(frame(alerts=(LIVE, EXITED)))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        bar = app.query_one(AlertBar).text.plain
        assert bar.startswith("⚠ LEAK +") and "PID 4243" in bar and "(exited)" not in bar
        assert "1 of 2 alerts, A: all" in bar
        await pilot.press("A")
        assert isinstance(app.screen, AlertListScreen)
        listed = app.screen.query_one(OptionList)
        first, second = (listed.get_option_at_index(i).prompt.plain for i in range(2))
        assert "PID 4243" in first and "(exited)" not in first
        assert "PID 5100 (GPU memory) (exited)" in second


async def test_an_exited_alert_alone_is_shown_dim_and_marked():
    app = GpuScopeApp(live(FakeSource(frame(alerts=(EXITED,)))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        bar = app.query_one(AlertBar)
        assert "PID 5100 (GPU memory) (exited)" in bar.text.plain and bar.has_class("ended")
        whole = len(bar.text.plain)
        assert any("dim" in str(span.style) and span.start == 0 and span.end >= whole for span in bar.text.spans)


async def test_the_alert_list_picks_the_alert_w_diagnoses():
    app = GpuScopeApp(live(FakeSource(frame(alerts=(LIVE, EXITED), focus=None))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("A", "j", "enter")  # the second alert
        assert isinstance(app.screen, WizardScreen) and app.screen.pid == 5100
        await pilot.press("escape")
        assert "PID 5100" in app.query_one(AlertBar).text.plain  # it stays the bar's alert
        await pilot.press("w")
        assert isinstance(app.screen, WizardScreen) and app.screen.pid == 5100


async def test_w_means_the_attached_process_then_a_row_moved_to_then_the_alert(monkeypatch):
    pushed = []
    app = GpuScopeApp(live(FakeSource(frame(alerts=(LIVE,)))))  # attached to 4242, the alert is 4243's
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        bar = app.query_one(AlertBar).text.plain
        assert "click: diagnose · w: PID 4242" in bar and "w: diagnose" not in bar  # the bar says what `w` means
        await pilot.press("w")
        assert app.screen.pid == 4242  # the attached process, not the alert's
        await pilot.press("escape")
        monkeypatch.setattr(app, "push_screen", lambda screen, *a, **k: pushed.append(screen))
        await pilot.press("d", "a")
        assert [s.pid for s in pushed] == [4242, 4242]
    app = GpuScopeApp(live(FakeSource(frame(alerts=(LIVE,), focus=None))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.query_one(ProcessTable).selected_row.pid == 4242 and "w: diagnose" in app.query_one(AlertBar).text.plain
        await pilot.press("w")
        assert app.screen.pid == 4243  # nothing attached, no row moved to: the alert's
        await pilot.press("escape", "j", "j")  # the operator moves to a row: `w` means it now
        assert app.query_one(ProcessTable).selected_row.pid == 5100
        assert "click: diagnose · w: PID 5100" in app.query_one(AlertBar).text.plain
        await pilot.press("w")
        assert app.screen.pid == 5100
    app = GpuScopeApp(live(FakeSource(frame(focus=None))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")  # no alert, nothing attached: the selected row
        assert app.screen.pid == 4242


async def test_a_click_on_the_bar_diagnoses_its_alert_whatever_w_means():
    app = GpuScopeApp(live(FakeSource(frame(alerts=(LIVE,)))))  # attached to 4242
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.click(AlertBar)
        assert isinstance(app.screen, WizardScreen) and app.screen.pid == 4243


FASTER = Alert("rss", 9001, None, "PID 9001 train_tokenizer.py · python (RSS)", 22e6, NOW - 10, None, 0.7, "floor rose")


async def test_the_bar_holds_its_alert_when_another_grows_faster_and_says_which_of_how_many():
    source = FakeSource(frame(alerts=(LIVE,), focus=None))
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        assert isinstance(app.screen, WizardScreen) and app.screen.pid == 4243
        source.send(frame(alerts=(FASTER, LIVE), focus=None))  # mid-diagnosis, a faster grower
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        bar = app.query_one(AlertBar).text.plain
        assert "PID 4243" in bar and "2 of 2 alerts, A: all" in bar, bar
        await pilot.press("w")
        assert app.screen.pid == 4243  # the alert the operator saw, not the faster newcomer


async def test_the_attached_process_s_alert_takes_the_bar_when_it_comes():
    source = FakeSource(frame(alerts=(FASTER,), focus=replace(frame().focus, pid=4243), selected_pid=4243))
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "PID 9001" in app.query_one(AlertBar).text.plain
        source.send(frame(alerts=(FASTER, LIVE), focus=replace(frame().focus, pid=4243), selected_pid=4243))
        await pilot.pause()
        bar = app.query_one(AlertBar).text.plain
        assert "PID 4243" in bar and "w: diagnose" in bar, bar


async def test_the_bar_shows_the_attached_process_s_alert_first():
    attached = frame(alerts=(FASTER, LIVE), focus=replace(frame().focus, pid=4243), selected_pid=4243)
    app = GpuScopeApp(live(FakeSource(attached)))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        bar = app.query_one(AlertBar).text.plain
        assert "PID 4243" in bar and "w: diagnose" in bar and "2 of 2 alerts" in bar, bar
        await pilot.press("w")
        assert app.screen.pid == 4243


async def test_j_and_k_move_the_table():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        table = app.query_one(ProcessTable)
        await pilot.press("j", "j")
        assert table.selected_row.pid == 5100 and source.selected[-1] == 5100
        await pilot.press("k")
        assert table.selected_row.pid == 4243


async def test_f1_helps_and_f10_quits():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        assert not isinstance(app.screen, HelpScreen) and app.is_running
        await pilot.press("f10")
    assert source.stopped and app.return_code == 0


async def test_esc_pressed_once_too_often_never_detaches():
    source = FakeSource(frame(alerts=(LIVE,)))  # attached to 4242
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        assert isinstance(app.screen, WizardScreen)
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, WizardScreen)
        assert source.focused == []  # still attached
        await pilot.press("x")
        assert source.focused == [None]


async def test_i_shows_the_whole_command_line():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("i")
        assert isinstance(app.screen, CommandLineScreen)
        shown = app.screen.query_one("#command-line", TextLines).text.plain
        assert app.query_one(ProcessTable).selected_row.command in shown
        await pilot.press("escape")
        assert not isinstance(app.screen, CommandLineScreen)


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_from_the_alert_to_the_culprit_in_two_keys_each_announced(monkeypatch, size):
    asked = []
    clock_seen = threading.Event()

    def attribute(pid, duration, *, use_memray, cancelled, progress, sites_seen):
        asked.append((pid, use_memray))
        progress("memray", 0.0)
        sites_seen("memray", 7)
        # Until the test has seen the clock tick on screen (a loaded machine can take seconds).
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and not cancelled() and not clock_seen.is_set():
            time.sleep(0.02)
        return CULPRIT

    monkeypatch.setattr("gpuscope.core.diagnosis.ladder.attribute", attribute)
    app = GpuScopeApp(live(FakeSource(frame(alerts=(LIVE,), focus=None))))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        bar = app.query_one(AlertBar)
        shown = "".join(bar.render_line(y).text for y in range(bar.size.height))
        assert "w: diagnose" in shown  # the first key, on screen where the operator looks, at 80 columns too
        await pilot.press("w")
        wizard = app.screen
        assert isinstance(wizard, WizardScreen) and wizard.pid == 4243
        keys = "".join(wizard.query_one("#wizard-keys", TextLines).lines)
        assert "j k: steps" in keys and "y: find the code that keeps memory (memray inside the service" in keys  # the second
        assert "memray memray" not in keys
        await pilot.press("y")
        # Alive, with its clock past 0 (a loaded machine may skip a second between redraws).
        await wait_for(pilot, lambda: re.search(r"memray running · [1-9]\d* s", screen_text(app)))
        assert "s left" in screen_text(app) and "7 allocation sites seen" in screen_text(app)
        clock_seen.set()
        await wait_for(pilot, lambda: "First suspect: _remember (/srv/retriever.py:88)" in screen_text(app))
        assert asked == [(4243, True)]
        assert not isinstance(app.screen, ConfirmAttach)


async def test_the_confirmation_speaks_of_gdb_only_without_the_probe():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        app.push_screen(ConfirmAttach(4242, probe=True))
        await pilot.pause()
        with_probe = screen_text(app)
        assert "through the probe" in with_probe and "gdb" not in with_probe
        app.pop_screen()
        app.push_screen(ConfirmAttach(4242, probe=False))
        await pilot.pause()
        assert "gdb" in screen_text(app)


async def test_a_suspect_s_share_and_size_stay_on_an_80_column_line():
    from textual.widgets import Tree

    from gpuscope.tui.stacks import AttributionScreen

    deep = "/srv/envs/rag-service/lib/python3.11/site-packages/company_retrieval/indexes/long_module_name.py"
    found = replace(CULPRIT, suspects=(replace(CULPRIT.suspects[0], file=deep),))
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.push_screen(AttributionScreen(found))
        await pilot.pause()
        tree = app.screen.query_one(Tree)
        lines = ["".join(seg.text for seg in tree.render_line(y)) for y in range(tree.size.height)]
        first = next(line for line in lines if "1. " in line)
        assert "91% · 114 MiB  _remember" in first, first
