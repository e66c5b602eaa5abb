"""Sending only the cells that changed must leave the terminal showing exactly what sending every
update whole would: both byte streams are fed to a terminal emulator (pyte) and the screens are
compared cell by cell (character, colours, attributes) after every update."""

import random
import re
from dataclasses import replace

import pyte
from rich.color import ColorSystem
from rich.segment import Segment
from rich.style import Style
from textual._compositor import ChopsUpdate, LayoutUpdate
from textual.geometry import Region
from textual.strip import Strip

from gpuscope.core.node.model import ProcessRow
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.terminal_cells import TerminalCells

from frames import GIB, FakeSource, frame, live, rows

NO_AUTOWRAP = "\x1b[?7l"  # as Textual sets the terminal up


class TwoTerminals:
    """One terminal fed every update whole (as Textual writes it), one fed the changed cells."""

    def __init__(self, width: int, height: int, cells: TerminalCells | None = None) -> None:
        self.whole, self.diffed = pyte.Screen(width, height), pyte.Screen(width, height)
        self.streams = pyte.Stream(self.whole), pyte.Stream(self.diffed)
        for stream in self.streams:
            stream.feed(NO_AUTOWRAP)
        self.cells = cells or TerminalCells()
        self.bytes_whole = self.bytes_diffed = 0
        self.updates = 0

    def feed(self, update, console) -> None:
        whole = update.render_segments(console)
        diffed = self.cells.update(update).render_segments(console)
        self.streams[0].feed(whole)
        self.streams[1].feed(diffed)
        self.diffed_output = diffed
        self.bytes_whole += len(whole.encode())
        self.bytes_diffed += len(diffed.encode())
        self.updates += 1
        assert self.screen(self.diffed) == self.screen(self.whole), f"screens differ after update {self.updates}"

    def resize(self, width: int, height: int) -> None:
        """The terminal changes size and, as some do, clears itself: what it shows is not known."""
        for screen in (self.whole, self.diffed):
            screen.resize(height, width)
        self.clear()

    def clear(self) -> None:
        for screen in (self.whole, self.diffed):
            screen.erase_in_display(2)

    @staticmethod
    def screen(screen: pyte.Screen) -> list[list[object]]:
        return [[screen.buffer[y][x] for x in range(screen.columns)] for y in range(screen.lines)]


class Console:
    """What render_segments reads of a console: its colour system (256 colours, as over SSH)."""

    _color_system = ColorSystem.EIGHT_BIT


TEXTS = ["a", "b", " ", "xyz", "中", "文字", "🚀", "e\u0301", "\u0301", "—", "▲+1", "░█", "⢀⡠"]
STYLES = [None, Style(color="red"), Style(bgcolor="blue"), Style(bold=True, color="color(188)", bgcolor="color(16)"),
          Style(reverse=True), Style(color="red", bgcolor="blue", underline=True), Style(bold=True, dim=True),
          Style(dim=True, italic=True, strike=True), Style(color="default", bgcolor="#ff8800"), Style(color="bright_green")]


def test_a_wide_character_half_overwritten_is_sent_whole_again():
    terminals = TwoTerminals(6, 1)
    wide, narrow = Strip([Segment("中")]), Strip([Segment("a")])
    terminals.feed(LayoutUpdate([[wide]], Region(0, 0, 2, 1)), Console())
    # A widget's chop covers only the second half: the terminal may blank the first.
    terminals.feed(ChopsUpdate([{1: narrow}], [(0, 1, 2)], [[2]]), Console())
    terminals.feed(LayoutUpdate([[wide]], Region(0, 0, 2, 1)), Console())


def test_a_zero_width_character_first_in_a_strip_leaves_the_cell_before_unknown():
    terminals = TwoTerminals(6, 1)
    ab = Strip([Segment("ab")])
    terminals.feed(LayoutUpdate([[ab]], Region(0, 0, 2, 1)), Console())
    # An accent with no character before it in its strip joins the cell before on the terminal.
    terminals.feed(LayoutUpdate([[Strip([Segment("\u0301c")])]], Region(1, 0, 1, 1)), Console())
    terminals.feed(LayoutUpdate([[ab]], Region(0, 0, 2, 1)), Console())


def test_unknown_cells_between_two_changes_are_jumped_over():
    terminals = TwoTerminals(6, 1)
    terminals.feed(LayoutUpdate([[Strip([Segment("abcdef")])]], Region(0, 0, 6, 1)), Console())
    terminals.cells.forget()
    a, d = Strip([Segment("a")]), Strip([Segment("d")])
    terminals.feed(ChopsUpdate([{0: a, 3: d}], [(0, 0, 4)], [[1, 4]]), Console())


def test_after_a_wide_character_the_cursor_is_placed_again():
    terminals = TwoTerminals(6, 2)
    before = [[Strip([Segment("中")])], [Strip([Segment(" a")])]]
    after = [[Strip([Segment("文")])], [Strip([Segment(" b")])]]
    terminals.feed(LayoutUpdate(before, Region(0, 0, 2, 2)), Console())
    terminals.feed(LayoutUpdate(after, Region(0, 0, 2, 2)), Console())


def random_strip(rng: random.Random, room: int) -> Strip:
    segments = []
    length = 0
    while True:
        text = rng.choice(TEXTS)
        seg = Segment(text, rng.choice(STYLES))
        if length + seg.cell_length > room:
            break
        segments.append(seg)
        length += seg.cell_length
    return Strip(segments)


def test_random_updates_with_wide_and_combining_characters_leave_the_same_screen():
    width, height = 24, 6
    rng = random.Random(7)
    terminals = TwoTerminals(width, height)
    for n in range(600):
        if n % 150 == 149:
            width -= n // 150
            terminals.resize(width, height)
            terminals.cells.forget()
            # Textual lays the screen out again after a resize: every cell is sent (a terminal
            # that cleared itself did so with whatever style was in effect).
            whole_screen = [[random_strip(rng, width).extend_cell_length(width)] for _ in range(height)]
            terminals.feed(LayoutUpdate(whole_screen, Region(0, 0, width, height)), Console())
        y = rng.randrange(height)
        x = rng.randrange(width)
        if rng.random() < 0.5:  # a whole region, as a screen's layout is sent
            lines = rng.randint(1, height - y)
            strips = [[random_strip(rng, width - x)] for _ in range(lines)]
            region = Region(x, y, max(1, max(s[0].cell_length for s in strips)), lines)
            update = LayoutUpdate(strips, region)
        else:  # chops: widgets' strips side by side on one line, the span cropping them
            chops, ends, at = {}, [], x
            while at < width and len(chops) < 3:
                strip = random_strip(rng, min(width - at, rng.randint(1, 8)))
                if not strip.cell_length:
                    break
                chops[at] = strip
                at += strip.cell_length
                ends.append(at)
            if not chops:
                continue
            x2 = rng.randint(x + 1, at)
            all_chops = [{} for _ in range(height)]
            all_ends = [[] for _ in range(height)]
            all_chops[y], all_ends[y] = chops, ends
            update = ChopsUpdate(all_chops, [(y, x, x2)], all_ends)
        terminals.feed(update, Console())
    assert terminals.bytes_diffed < terminals.bytes_whole


def test_rows_that_move_up_or_down_are_scrolled_and_leave_the_same_screen():
    """A table whose rows come and go: the lines below move, and are scrolled on the terminal;
    cells of those lines that the update does not cover (a panel beside it) are put back."""
    width, height = 30, 12
    rng = random.Random(3)
    terminals = TwoTerminals(width, height)
    names = ["".join(rng.choice("abcdefghij 中") for _ in range(14)) for _ in range(40)]
    shown = names[:10]
    panel = [[Strip([Segment("│ panel  │" if y != 5 else "│ 中 5   │", STYLES[3])])] for y in range(height)]
    terminals.feed(LayoutUpdate(panel, Region(width - 10, 0, 10, height)), Console())
    scrolls = 0
    for step in range(80):
        change = rng.choice(["insert", "delete", "edit"])
        if change == "insert":
            shown.insert(rng.randrange(len(shown)), rng.choice(names))
        elif change == "delete":
            del shown[rng.randrange(len(shown))]
        else:
            y = rng.randrange(len(shown))
            shown[y] = shown[y][:-1] + str(step % 10)
        shown = (shown + names)[:10]
        lines = [[Strip([Segment(name, STYLES[2])]).adjust_cell_length(20, STYLES[2])] for name in shown]
        update = LayoutUpdate(lines, Region(0, 1, 20, 10))
        terminals.feed(update, Console())
        scrolls += "r\x1b[" in terminals.diffed_output
    assert scrolls > 10


SGR = re.compile(r"\x1b\[[0-9;]*m")


def test_the_style_in_effect_is_carried_to_the_next_update_but_not_into_a_scroll():
    blue = Style(bgcolor="blue")
    names = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]

    def rows(shown: list[str]) -> LayoutUpdate:
        return LayoutUpdate([[Strip([Segment(n, blue)]).adjust_cell_length(10, blue)] for n in shown],
                            Region(0, 0, 10, len(shown)))

    terminals = TwoTerminals(10, 8)
    terminals.feed(rows(names[:8]), Console())
    assert terminals.diffed_output.endswith("hotel     ")  # no reset: the blue stays in effect
    terminals.feed(rows(names[:3] + ["deltX"] + names[4:8]), Console())
    assert terminals.diffed_output == "\x1b[4;5HX"  # the cell, in the style already in effect
    terminals.feed(rows(names[1:3] + ["deltX"] + names[4:9]), Console())
    scroll = terminals.diffed_output.index("\x1b[1;8r")
    # The lines a scroll brings in take the background in effect on many terminals: none is.
    assert SGR.findall(terminals.diffed_output[:scroll]) == ["\x1b[0m"], terminals.diffed_output
    terminals.cells.forget()  # the terminal's style is not known: the first one is set whole
    terminals.feed(rows(names[:8]), Console())
    assert terminals.diffed_output.startswith("\x1b[1;1H\x1b[0;44m"), terminals.diffed_output

    reset = TwoTerminals(10, 8, TerminalCells(carry_style=False))
    reset.feed(rows(names[:8]), Console())
    reset.feed(rows(names[:3] + ["deltX"] + names[4:8]), Console())
    assert reset.diffed_output == "\x1b[4;5H\x1b[44mX\x1b[0m"


def test_an_update_it_does_not_diff_is_written_after_a_reset_of_the_style_left_in_effect():
    from textual._compositor import CompositorUpdate

    class Other(CompositorUpdate):  # e.g. Textual's inline updates: not followed cell by cell
        def render_segments(self, console) -> str:
            return "plain text"

    cells = TerminalCells()
    cells.update(LayoutUpdate([[Strip([Segment("blue", Style(bgcolor="blue"))])]], Region(0, 0, 4, 1))) \
        .render_segments(Console())
    assert cells.update(Other()).render_segments(Console()) == "\x1b[0mplain text"
    assert cells.update(Other()).render_segments(Console()) == "\x1b[0mplain text"  # not known: reset again


def recorded(app: GpuScopeApp, width: int, height: int) -> GpuScopeApp:
    """The console, each of its terminal updates rendered both ways (Pilot writes no bytes); after
    each, the terminal shows what a full render of the screen would."""
    terminals = TwoTerminals(width, height, app.terminal_cells)

    def display(screen, renderable) -> None:
        if isinstance(renderable, (ChopsUpdate, LayoutUpdate)):
            terminals.feed(renderable, app.console)
            size = screen._compositor.size
            full = pyte.Screen(size.width, size.height)
            stream = pyte.Stream(full)
            stream.feed(NO_AUTOWRAP)
            stream.feed(LayoutUpdate([[strip] for strip in screen._compositor.render_strips()], size.region)
                        .render_segments(app.console))
            assert TwoTerminals.screen(full) == TwoTerminals.screen(terminals.whole), \
                f"the terminal is not what a full render shows after update {terminals.updates}"

    app._display = display
    app.terminals = terminals
    return app


def node(i: int):
    """A node that moves: RSS and CPU change every second, a process comes and goes, and some
    command lines are CJK and emoji."""
    procs: list[ProcessRow] = [replace(r, rss_bytes=r.rss_bytes + i * 3 * 2**20, cpu_percent=(i * 7 + r.pid) % 100)
                               for r in rows()]
    procs.append(ProcessRow(6000, "陈", None, None, 1 * GIB + i * 4096, 2.0, "python 训练模型.py --名字 🚀🚀",
                            "python", True, None, 0.0))
    if i % 3:
        procs.append(ProcessRow(6100 + i, "bob", 1, GIB, GIB, 1.0, f"python job{i}.py ✨", "python", True, None, 0.0))
    return frame(time=frame().time + i, processes=tuple(procs))


async def test_the_console_sends_fewer_bytes_for_the_same_screen():
    source = FakeSource(node(0))
    app = recorded(GpuScopeApp(live(source)), 120, 40)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        start = (app.terminals.bytes_whole, app.terminals.bytes_diffed)
        for i in range(1, 6):
            source.send(node(i))
            await pilot.pause()
        steady = (app.terminals.bytes_whole - start[0], app.terminals.bytes_diffed - start[1])
        await pilot.press("t")  # another theme: the same characters in other colours
        await pilot.pause()
        await pilot.press("question_mark")  # another screen, and back
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("down", "down", "c")  # the cursor moves, the order changes
        source.send(node(6))
        await pilot.pause()
        app.terminals.resize(100, 30)
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        source.send(node(7))
        await pilot.pause()
        app.terminals.resize(120, 40)
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        source.send(node(8))
        await pilot.pause()
        app.terminals.clear()  # suspended, the terminal was another program's; then back
        app.app_suspend_signal.publish(app)
        app.app_resume_signal.publish(app)
        await pilot.pause()
        source.send(node(9))
        await pilot.pause()
    assert app.terminals.updates > 10
    shown = ["".join(c.data for c in line) for line in TwoTerminals.screen(app.terminals.diffed)]
    assert any("训练模型.py --名字 🚀🚀" in line for line in shown)
    whole, diffed = steady
    # Steady updates (new frames on the same screen) rewrite few cells: most of the bytes go.
    assert diffed < whole / 2, (whole, diffed)


async def test_changes_far_apart_render_only_their_own_rows():
    """A change at the top of the screen and one near the bottom: the widgets between them do
    not render the rows between them."""
    from textual.widget import Widget

    from gpuscope.tui.terminal_cells import RowBandCompositor

    source = FakeSource(node(0))
    app = GpuScopeApp(live(source))  # (what reaches the terminal is checked above)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        source.send(node(1))
        await pilot.pause()
        assert isinstance(app.screen._compositor, RowBandCompositor)
        rendered: list[int] = []
        real = Widget.render_lines

        def render_lines(self, crop):
            rendered.append(crop.height)
            return real(self, crop)

        Widget.render_lines = render_lines
        try:
            for name in ("#title", "#detail"):  # one character of each, the same size
                text = app.query_one(name).text.copy()
                text.plain = text.plain[:-1] + ("#" if text.plain[-1] != "#" else "%")
                app.query_one(name).set_text(text)
            await pilot.pause()
        finally:
            Widget.render_lines = real
    assert 0 < sum(rendered) <= 40, rendered  # a few rows of a few widgets, not every row between
