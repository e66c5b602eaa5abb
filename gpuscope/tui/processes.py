"""The process table, drawn one widget per column.

A terminal update from Textual covers a widget's whole width on each line it repaints, so a
table that is one widget resends a whole row when one number in it changes (a DataTable even
repaints every row). Here each column is its own TextLines: when a process's RSS moves, only the
RSS column's few cells on that line go out — over SSH that is the difference between a few
dozen bytes a second and a few kilobytes. Rows keep their place unless the order really changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widget import Widget

from gpuscope.core.node.command_display import display_command
from gpuscope.core.node.model import ProcessRow
from gpuscope.core.common.printable import printable
from gpuscope.core.common.units import format_bytes, format_rate
from gpuscope.tui.palette import DEFAULT_PALETTE, Palette, follow_theme
from gpuscope.tui.textlines import TextLines

SORT_MARK = "▼"
COLUMNS = (  # key, label, width (None: the rest of the line), right-aligned
    ("pid", "PID", 7, True),
    ("user", "USER", 8, False),
    ("gpu", "GPU", 3, True),
    # A column the table can be sorted by is one wider than its label: the sort mark fits.
    ("gpu_mem", "GPU MEM", 8, True),
    ("rss", "RSS", 7, True),
    ("growth", "GROW MB/s", 10, True),
    ("cpu", "CPU%", 5, True),
    ("command", "COMMAND", None, False),
)
SORTS = {
    # name: (label, key over a ProcessRow; larger first)
    "default": ("GPU first", lambda r: (r.gpu is not None, r.gpu_memory_bytes or 0, r.rss_bytes or 0)),
    "memory": ("memory", lambda r: ((r.gpu_memory_bytes or 0) + (r.rss_bytes or 0),)),
    "growth": ("growth", lambda r: (r.growth_bytes_per_s or 0.0,)),
    "cpu": ("CPU", lambda r: (r.cpu_percent or 0.0,)),
}
SORT_COLUMN = {"memory": "gpu_mem", "growth": "growth", "cpu": "cpu"}
# A command line is taken apart (shlex) to be shown; the same few dozen come back every tick.
shown_command = lru_cache(maxsize=1024)(display_command)
GROWTH_SHOWN = 50_000  # bytes/s below which growth reads as noise, not a trend (0.05 MB/s)


def matches(row: ProcessRow, text: str) -> bool:
    needle = text.lower()
    return (not needle or needle in row.command.lower() or needle in (row.user or "").lower()
            or needle in row.runs_in.lower() or needle == str(row.pid))


def row_cells(row: ProcessRow, growth_style: str) -> dict[str, tuple[str, str]]:
    """Each column's (text, style) for one row."""
    growth = row.growth_bytes_per_s
    if growth is not None and growth >= GROWTH_SHOWN:
        grow = (f"▲{format_rate(growth)}", growth_style)
    elif growth is not None and growth <= -GROWTH_SHOWN:
        grow = (f"▼{format_rate(growth)}", "")
    else:
        grow = (format_rate(growth), "dim")
    return {
        "pid": (str(row.pid), ""),
        "user": (printable(row.user or "?")[:8], ""),
        "gpu": ("-" if row.gpu is None else str(row.gpu), ""),
        "gpu_mem": ("-" if row.gpu is None else format_bytes(row.gpu_memory_bytes), ""),
        "rss": (format_bytes(row.rss_bytes), ""),
        "growth": grow,
        "cpu": ("" if row.cpu_percent is None else f"{row.cpu_percent:.0f}", ""),
        "command": (shown_command(row.command, row.runs_in), ""),
    }


class ProcessTable(Widget, can_focus=True):
    DEFAULT_CSS = """
    ProcessTable { height: 1fr; }
    ProcessTable > Horizontal { height: 1fr; }
    ProcessTable TextLines { height: 1fr; }
    ProcessTable #col-command { width: 1fr; }
    ProcessTable > .process-table--header { text-style: bold; background: $panel; }
    ProcessTable > .process-table--cursor { background: $primary 40%; text-style: bold; }
    ProcessTable:focus > .process-table--cursor { background: $primary; color: $text; }
    ProcessTable:nocolor > .process-table--cursor { text-style: bold reverse; }
    """
    COMPONENT_CLASSES = {"process-table--header", "process-table--cursor"}
    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "top", "First", show=False),
        Binding("end", "move(1000000)", "Last", show=False),
        Binding("enter", "attach", "Attach"),
    ]

    class Highlighted(Message):
        """The cursor is on another process."""

        def __init__(self, row: ProcessRow) -> None:
            super().__init__()
            self.row = row

    class Chosen(Message):
        """The operator moved the cursor (keys or a click): this row is what they look at."""

        def __init__(self, row: ProcessRow) -> None:
            super().__init__()
            self.row = row

    class Selected(Message):
        """Enter (or a click on the selected row): attach to this process."""

        def __init__(self, row: ProcessRow) -> None:
            super().__init__()
            self.row = row

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sort_name = "default"
        self.filter_text = ""
        self.growth_style = f"bold {DEFAULT_PALETTE.growth}"  # the theme's gpuscope-growth, once mounted
        self._all: tuple[ProcessRow, ...] = ()
        self._order: list[ProcessRow] = []
        self._cursor_key: str | None = None
        self._cursor = 0
        # Until the operator moves the cursor it stays on the first row, whatever comes first as
        # frames arrive (NVML's processes come after the host's at start): the view opens on the
        # processes that use the most, not on one that was first before they were known.
        self._at_top = True
        # Whether the operator has moved the cursor (keys or mouse): the row is then what they
        # look at, and `w` diagnoses it rather than the alert bar's process.
        self.chosen = False
        self._top = 0
        self._drawn: dict[str, tuple[tuple, list[Text]]] = {}  # column -> what it shows now, its lines

    def on_mount(self) -> None:
        follow_theme(self, self._use_palette)

    def _use_palette(self, palette: Palette) -> None:
        self.growth_style = f"bold {palette.growth}"
        self._render_columns()

    def compose(self) -> ComposeResult:
        with Horizontal():
            for key, _, width, _ in COLUMNS:
                column = TextLines(wrap=False, id=f"col-{key}")
                if width is not None:
                    column.styles.width = width + 1  # one cell of gap before each column
                yield column

    # -- what the app reads -----------------------------------------------------------------------

    @property
    def order(self) -> list[ProcessRow]:
        """The rows as displayed (filtered and sorted), all of them, not only the visible ones."""
        return list(self._order)

    @property
    def selected_row(self) -> ProcessRow | None:
        return self._order[self._cursor] if self._order else None

    def cell(self, key: str, column: str) -> str:
        """The text shown for a row (by ProcessRow.key) in a column."""
        row = next(r for r in self._order if r.key == key)
        return row_cells(row, self.growth_style)[column][0]

    # -- updates ----------------------------------------------------------------------------------

    def show(self, rows: Iterable[ProcessRow]) -> None:
        self._all = tuple(rows)
        self._reorder()

    def set_sort(self, name: str) -> None:
        self.sort_name = name
        self._reorder()

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self._reorder()

    def redraw(self) -> None:
        """Draw again with the current styles (after a change of theme)."""
        self._render_columns()

    def select_pid(self, pid: int) -> None:
        index = next((i for i, r in enumerate(self._order) if r.pid == pid), None)
        if index is not None:
            self._at_top = False
            self._move_to(index)

    def _reorder(self) -> None:
        sort_key = SORTS[self.sort_name][1]
        rows = [r for r in self._all if matches(r, self.filter_text)]
        # Larger first; ties keep a stable order (by PID) so equal rows never swap places.
        self._order = sorted(rows, key=lambda r: (sort_key(r), -r.pid, -(r.gpu or 0)), reverse=True)
        index = 0 if self._at_top else next((i for i, r in enumerate(self._order) if r.key == self._cursor_key), None)
        if index is None:
            index = min(self._cursor, max(0, len(self._order) - 1))
        self._place(index)
        self._render_columns()
        if self._order and self._order[self._cursor].key != self._cursor_key:
            self._cursor_key = self._order[self._cursor].key
            self.post_message(self.Highlighted(self._order[self._cursor]))

    # -- the cursor -------------------------------------------------------------------------------

    @property
    def _visible_rows(self) -> int:
        return max(1, self.size.height - 1)  # one line of header

    def _place(self, index: int) -> None:
        self._cursor = max(0, min(index, len(self._order) - 1)) if self._order else 0
        height = self._visible_rows
        if self._cursor < self._top:
            self._top = self._cursor
        elif self._cursor >= self._top + height:
            self._top = self._cursor - height + 1
        self._top = max(0, min(self._top, max(0, len(self._order) - height)))

    def _move_to(self, index: int) -> None:
        if not self._order:
            return
        self._place(index)
        self._render_columns()
        row = self._order[self._cursor]
        if row.key != self._cursor_key:
            self._cursor_key = row.key
            self.post_message(self.Highlighted(row))

    def action_move(self, delta: int) -> None:
        self._at_top = False
        self._choose(self._cursor + delta)

    def action_page(self, direction: int) -> None:
        self._at_top = False
        self._choose(self._cursor + direction * self._visible_rows)

    def action_top(self) -> None:
        """Home: the first row, and the cursor stays on the first row as the order changes."""
        self._at_top = True
        self._choose(0)

    def _choose(self, index: int) -> None:
        """The operator moves the cursor (the app hears of it even if the row stays the same)."""
        self.chosen = True
        self._move_to(index)
        if self._order:
            self.post_message(self.Chosen(self._order[self._cursor]))

    def action_attach(self) -> None:
        if self._order:
            self.post_message(self.Selected(self._order[self._cursor]))

    def on_click(self, event: events.Click) -> None:
        index = self._top + event.y - 1
        if 0 <= index < len(self._order):
            if index == self._cursor and event.chain >= 2:
                self.action_attach()
            self._at_top = False
            self._choose(index)

    def on_resize(self) -> None:
        self._place(self._cursor)
        self._render_columns()

    # -- drawing ----------------------------------------------------------------------------------

    def _render_columns(self) -> None:
        if not self.is_mounted:
            return
        header_style = self.get_component_rich_style("process-table--header")
        cursor_style = self.get_component_rich_style("process-table--cursor")
        visible = self._order[self._top : self._top + self._visible_rows]
        cells = [row_cells(r, self.growth_style) for r in visible]
        sorted_column = SORT_COLUMN.get(self.sort_name)
        cursor_at = self._cursor - self._top
        for key, label, width, right in COLUMNS:
            if key == "command" and len(self._order) > len(visible):
                label = f"{label}  (rows {self._top + 1}-{self._top + len(visible)} of {len(self._order)})"
            if key == sorted_column:
                label += SORT_MARK
            content = (label, cursor_at, header_style, cursor_style, tuple(row[key] for row in cells))
            drawn = self._drawn.get(key)
            if drawn is not None and drawn[0] == content:
                continue  # most columns do not change from one tick to the next: skip building them
            # A cell that reads as before, with the same styles, keeps its Text.
            same_styles = drawn is not None and drawn[0][1:4] == content[1:4]
            before_cells, before_lines = (drawn[0][-1], drawn[1]) if same_styles and drawn else ((), [])
            lines = [_cell(label, width, right, None, header_style)]
            for i, (text, style) in enumerate(content[-1]):
                if i < len(before_cells) and before_cells[i] == (text, style):
                    lines.append(before_lines[i + 1])
                    continue
                lines.append(_cell(text, width, right, Style.parse(style) if style else None,
                                   cursor_style if i == cursor_at else None))
            self._drawn[key] = (content, lines)
            self.query_one(f"#col-{key}", TextLines).set_lines(lines)


def _cell(text: str, width: int | None, right: bool, style: Style | None, under: Style | None = None) -> Text:
    """One cell: a cell of gap, then the text aligned in its width (the cursor's style under it)."""
    body = (text.rjust(width) if right else text.ljust(width))[:width] if width is not None else text
    cell = Text(" " + body, style=under or "", no_wrap=True, overflow="ellipsis")
    if style is not None:
        cell.stylize(style, 1, 1 + len(body))
    if width is None and under is not None:
        cell.append(" " * 300, style=under)  # the cursor bar runs to the edge; cropped to the width
    return cell
