"""The code-path screens (d, S, a) in the console, with Pilot, against a real Python process."""

from dataclasses import replace

from textual.widgets import Tree

from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.stacks import ConfirmAttach, DumpScreen, SampleScreen, SuspectsScreen

from frames import FakeSource, frame, live, rows
from pilot_wait import until
from test_stacks import ASLEEP, BUSY


def frame_with(pid: int):
    first = replace(rows()[0], pid=pid)
    return frame(processes=(first,) + rows()[1:], selected_pid=pid, focus=None)


def tree_text(screen) -> str:
    tree = screen.query_one(Tree)

    def walk(node):
        yield str(node.label)
        for child in node.children:
            yield from walk(child)

    return "\n".join(walk(tree.root))


async def wait_for(pilot, condition, timeout=30.0):
    return await until(pilot, condition, timeout=timeout)


async def test_d_dumps_the_selected_process_and_esc_closes(spawn_python):
    child = spawn_python(BUSY)
    app = GpuScopeApp(live(FakeSource(frame_with(child.pid))))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("d")
        assert isinstance(app.screen, DumpScreen) and app.screen.pid == child.pid
        await wait_for(pilot, lambda: "worker-0" in tree_text(app.screen))
        text = tree_text(app.screen)
        assert "● crunch" in text or "● <module>" in text
        # The sleeping workers are idle: closed, and their line says how to open them.
        tree = app.screen.query_one(Tree)
        idle = next(n for n in tree.root.children if "worker-0" in str(n.label))
        assert "[idle]" in str(idle.label) and "Enter or a click opens" in str(idle.label)
        assert not idle.is_expanded and idle.children
        tree.move_cursor(idle)
        await pilot.press("enter")
        assert idle.is_expanded
        busy = next(n for n in tree.root.children if "[idle]" not in str(n.label))
        assert busy.is_expanded and "opens" not in str(busy.label)
        await pilot.press("escape")
        assert not isinstance(app.screen, DumpScreen)


async def test_capital_s_samples_into_a_tree_of_hot_paths(spawn_python, monkeypatch):
    child = spawn_python(BUSY)
    monkeypatch.setattr("gpuscope.tui.stacks.SAMPLE_SECONDS", 1.0)
    app = GpuScopeApp(live(FakeSource(frame_with(child.pid))))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("S")
        assert isinstance(app.screen, SampleScreen)
        await wait_for(pilot, lambda: "%" in tree_text(app.screen) and "crunch" in tree_text(app.screen))
        assert "dumps over" in str(app.screen.query_one("#status").render())


async def test_capital_s_on_an_idle_program_says_it_was_idle(spawn_python, monkeypatch):
    child = spawn_python(ASLEEP)
    monkeypatch.setattr("gpuscope.tui.stacks.SAMPLE_SECONDS", 0.5)
    app = GpuScopeApp(live(FakeSource(frame_with(child.pid))))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("S")
        await wait_for(pilot, lambda: "idle" in tree_text(app.screen))
        assert "no thread was active in any dump" in tree_text(app.screen)


async def test_a_asks_first_and_sampling_only_never_attaches(spawn_python, monkeypatch):
    child = spawn_python(BUSY)
    monkeypatch.setattr("gpuscope.tui.stacks.ATTRIBUTION_SECONDS", 1.0)
    attached = []
    monkeypatch.setattr("gpuscope.core.diagnosis.ladder.memray_suspects", lambda *a, **k: attached.append(a))
    app = GpuScopeApp(live(FakeSource(frame_with(child.pid))))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("a")
        assert isinstance(app.screen, ConfirmAttach)
        await pilot.press("s")
        assert isinstance(app.screen, SuspectsScreen) and not app.screen.use_memray
        await wait_for(pilot, lambda: "how the ladder was climbed" in tree_text(app.screen))
        assert "memray: skipped" in tree_text(app.screen) and attached == []
        await pilot.press("escape")
        await pilot.press("a", "escape")  # asked again, and cancelled: nothing starts
        assert not isinstance(app.screen, (ConfirmAttach, SuspectsScreen))
