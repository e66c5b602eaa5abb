"""What a new frame costs the console: a layout only when a widget's size changes, no refresh
at all for what did not change (Pilot over injected frames, every widget's refresh recorded)."""

from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.processes import ProcessTable

from frames import FakeSource, frame, live, rows


def record_refreshes(app) -> list[tuple[str, bool]]:
    """(widget, layout) for every refresh asked from now on."""
    asked: list[tuple[str, bool]] = []
    for widget in app.screen.walk_children():
        original = widget.refresh

        def spy(*regions, _name=widget.id or type(widget).__name__, _original=original, **kw):
            asked.append((_name, bool(kw.get("layout"))))
            return _original(*regions, **kw)

        widget.refresh = spy
    return asked


async def settled(pilot, source) -> None:
    """Past the first frame, which is drawn before the panels know their widths."""
    await pilot.pause()
    source.send(frame())
    await pilot.pause()


async def test_the_same_frame_again_refreshes_nothing():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(pilot, source)
        asked = record_refreshes(app)
        source.send(frame())
        await pilot.pause()
        assert asked == []


async def test_a_process_that_exits_repaints_the_table_without_a_layout():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(pilot, source)
        asked = record_refreshes(app)
        source.send(frame(processes=rows()[:-1]))
        await pilot.pause()
        assert 9001 not in [r.pid for r in app.query_one(ProcessTable).order]
        columns = {name for name, _ in asked if name.startswith("col-")}
        assert {"col-pid", "col-command"} <= columns  # one line fewer in each column
        assert [name for name, layout in asked if layout] == []



async def test_an_unwrapped_line_that_only_changes_style_is_drawn_again():
    from rich.text import Text
    from textual.app import App

    from gpuscope.tui.textlines import TextLines

    class One(App):
        def compose(self):
            yield TextLines("", wrap=False, id="lines")

    app = One()
    async with app.run_test(size=(40, 6)) as pilot:
        lines = app.query_one(TextLines)
        lines.set_text(Text("first\n") + Text("second", style="bold") + Text("\nthird"))
        await pilot.pause()
        assert any(seg.style and seg.style.bold for seg in lines._strips[1])
        lines.set_text(Text("first\nsecond\nthird!"))  # the same characters, no longer bold
        await pilot.pause()
        assert lines.lines == ["first", "second", "third!"]
        assert not any(seg.style and seg.style.bold for seg in lines._strips[1])
