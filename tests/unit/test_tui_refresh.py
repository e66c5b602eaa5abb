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


async def test_a_wrapped_panel_draws_again_only_the_lines_that_changed_and_reads_as_text_wrap():
    """The attached process's panel changes one line a tick (its RSS) and wraps the rest (a long
    command line): each line is wrapped on its own and kept while it reads the same, and what is
    shown is what Text.wrap makes of the whole text."""
    import random

    from rich.text import Text
    from textual.app import App

    from gpuscope.tui.textlines import TextLines, printable_text

    class One(App):
        def compose(self):
            yield TextLines("", id="lines")

    words = ["a", "tenletters", "x" * 37, "--flag=value", "   ", "ünï", "", "/opt/some/long/path/to/a/model"]
    rng = random.Random(7)

    def text() -> Text:
        out = Text()
        for n in range(rng.randint(1, 8)):
            line = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
            out.append(line + "\n", style=rng.choice(["", "bold", "dim red"]))
        return out

    app = One()
    async with app.run_test(size=(33, 40)) as pilot:
        lines = app.query_one(TextLines)
        for _ in range(60):
            shown = text()
            lines.set_text(shown)
            await pilot.pause()
            expected = printable_text(shown).wrap(app.console, lines.size.width, no_wrap=False)
            assert lines.lines == [line.plain.rstrip("\n") for line in expected]

        rendered = []
        real_render = Text.render

        def render(self, *args, **kwargs):
            rendered.append(self.plain)
            return real_render(self, *args, **kwargs)

        base = Text("PID 1234  x: detach\nRSS     1.0 GiB\ncmd     " + "python -m serve --model " * 4)
        lines.set_text(base)
        await pilot.pause()
        Text.render = render
        try:
            lines.set_text(Text("PID 1234  x: detach\nRSS     1.1 GiB\ncmd     " + "python -m serve --model " * 4))
            await pilot.pause()
        finally:
            Text.render = real_render
        assert [plain for plain in rendered if "RSS" in plain] == ["RSS     1.1 GiB"]
        assert not [plain for plain in rendered if "serve" in plain]  # the long command line is kept
        assert lines.lines[1] == "RSS     1.1 GiB"


async def test_what_waits_for_the_first_frame_runs_once_it_is_shown():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    rows_when_shown = []
    app.when_shown(lambda: rows_when_shown.append(len(app.query_one(ProcessTable).order)))
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(pilot, source)
        source.send(frame())
        await pilot.pause()
    assert rows_when_shown == [len(rows())]  # once, with the node's rows on screen
