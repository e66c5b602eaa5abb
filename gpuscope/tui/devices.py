"""The devices panel: one line per GPU, one for host memory, and any notices.

Names, bars and numbers are separate columns (widgets): a terminal update covers a whole widget's
width on a line, so when only a number moves, only the numbers column is resent.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from gpuscope.core.node.model import Frame
from gpuscope.core.common.printable import printable
from gpuscope.core.common.units import format_bytes
from gpuscope.tui.palette import DEFAULT_PALETTE, Palette, ThemedPanel
from gpuscope.tui.textlines import TextLines


# How full memory is, by share used: (at least, the palette's colour of the bar, mark after the
# percentage). The mark says it without colour (NO_COLOR, 16 colours, colour-blind readers).
LEVELS = ((0.9, "error", "⚠"), (0.75, "warning", "!"), (0.0, "success", " "))


def level(used: int | None, total: int | None) -> tuple[str, str]:
    """(the palette's colour for this fill, the mark)."""
    share = used / total if used is not None and total else 0.0
    return next((colour, mark) for at_least, colour, mark in LEVELS if share >= at_least)


def fill(used: int | None, total: int | None, width: int) -> tuple[int, str] | None:
    """A bar's cells filled and the palette's colour for them; None for an empty bar (nothing known)."""
    if not used or not total or width <= 0:
        return None
    return max(0, min(width, round(width * used / total))), level(used, total)[0]


def bar(filled: tuple[int, str] | None, width: int, palette: Palette = DEFAULT_PALETTE) -> Text:
    if filled is None:
        return Text("░" * width, style="dim")
    cells, colour = filled
    return Text.assemble(("█" * cells, getattr(palette, colour)), ("░" * (width - cells), "dim"))


def percent(used: int | None, total: int | None) -> str:
    return f"{100 * used / total:3.0f}%{level(used, total)[1]}" if used is not None and total else "  -  "


def lines(parts: list[Text]) -> Text:
    return Text("\n").join(parts)


class DevicesPanel(ThemedPanel, Vertical):
    DEFAULT_CSS = """
    DevicesPanel { height: auto; padding: 0 1; }
    DevicesPanel > Horizontal { height: auto; }
    DevicesPanel #dev-names { width: auto; padding-right: 1; }
    DevicesPanel #dev-bars { width: 1fr; max-width: 40; }
    DevicesPanel #dev-numbers { width: auto; padding-left: 1; }
    DevicesPanel .empty { display: none; }
    """

    def compose(self) -> ComposeResult:
        # Notices take one line each, cut with an ellipsis, never wrapped: the process table
        # needs the lines more (the whole text is the line's tooltip).
        yield TextLines(wrap=False, id="nvml-status", classes="empty")
        with Horizontal():
            yield TextLines(wrap=False, id="dev-names")
            yield TextLines(wrap=False, id="dev-bars")
            yield TextLines(wrap=False, id="dev-numbers")
        yield TextLines(wrap=False, id="notices", classes="empty")

    _frame: Frame | None = None
    _view: tuple | None = None  # what the panel shows now, as plain values

    def on_mount(self) -> None:
        # Looked up once: the panel is redrawn every tick.
        self._names, self._bars, self._numbers, self._status, self._notices = (
            self.query_one(f"#{i}", TextLines) for i in ("dev-names", "dev-bars", "dev-numbers", "nvml-status", "notices"))
        self.follow_theme()

    def redraw(self) -> None:
        if self._frame is not None:
            self.show(self._frame)

    @property
    def plain(self) -> str:
        """The panel as a reader sees it, line by line (for tests and reports)."""
        names, bars, numbers = (column.text.plain.split("\n") for column in (self._names, self._bars, self._numbers))
        rows = [f"{n} {b} {v}" for n, b, v in zip(names, bars, numbers)]
        return "\n".join([self._status.text.plain, *rows, self._notices.text.plain]).strip("\n")

    def show(self, frame: Frame) -> None:
        self._frame = frame
        p = self.palette
        wide = self.size.width >= 110
        name_width = 22 if wide else 12
        bar_width = max(1, self._bars.size.width or 20)
        # What the lines say, as plain values first: most ticks change no cell of this panel (the
        # numbers move by less than they are rounded to), and then nothing more is built.
        lines_shown: list[tuple[str, str | None, tuple[int, str] | None, str]] = []  # name, error, bar, numbers
        for d in frame.nvml.devices:
            # Three columns joined line by line: a newline inside a name would shift the others.
            name = f"GPU{d.index:<2} {printable(d.name)[:name_width]:<{name_width}}"
            if d.error:
                lines_shown.append((name, printable(d.error), None, ""))
                continue
            util = "N/A" if d.utilization is None else f"{d.utilization}%"
            temp = "" if d.temperature is None else f" {d.temperature}°C"
            numbers = (f"{format_bytes(d.memory_used):>6}/{format_bytes(d.memory_total):<6}"
                       f" {percent(d.memory_used, d.memory_total)} util {util:>4}{temp}")
            lines_shown.append((name, None, fill(d.memory_used, d.memory_total, bar_width), numbers))
        host = frame.host
        if host is not None:
            lines_shown.append((f"HOST  {printable(frame.hostname)[:name_width]:<{name_width}}", None,
                                fill(host.used, host.total, bar_width),
                                f"{format_bytes(host.used):>6}/{format_bytes(host.total):<6} {percent(host.used, host.total)}"))
        status = printable(frame.nvml.status) if frame.nvml.status else ""
        notices = tuple(printable(n) for n in frame.notices)
        view = (tuple(lines_shown), status, notices, bar_width, p)
        if view == self._view:
            return
        self._view = view

        names = [Text(name) for name, *_ in lines_shown]
        bars = [Text(f"✖ {error}", style=f"bold {p.error}", no_wrap=True, overflow="ellipsis") if error is not None
                else bar(filled, bar_width, p) for _, error, filled, _ in lines_shown]
        self._names.set_text(lines(names))
        self._bars.set_text(lines(bars))
        self._numbers.set_text(lines([Text(numbers) for *_, numbers in lines_shown]))

        status_text = Text()
        if status:
            status_text.append("⚠ ", style=f"bold {p.warning}")
            status_text.append(f"{status} — showing host memory only", style=p.warning)
        notices_text = lines([Text.assemble(("! ", f"bold {p.warning}"), (n, p.warning)) for n in notices])
        for widget, text in ((self._status, status_text), (self._notices, notices_text)):
            widget.set_class(not text.plain, "empty")
            widget.set_text(text)
            tooltip = widget.text if text.plain else None  # a Text: never read as markup
            if widget.tooltip != tooltip:  # setting it asks the screen about the mouse: only on a change
                widget.tooltip = tooltip
