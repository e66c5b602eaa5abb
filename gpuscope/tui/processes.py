"""The process table, updated in place: only cells whose text changed are redrawn.

Clearing and refilling a DataTable every second repaints every row (flicker, and ~10x the
terminal traffic over SSH). Here each frame is diffed against what is on screen: changed cells
are updated, new rows added, vanished rows removed, and the table is re-sorted only when the
order actually changes.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.widgets import DataTable

from gpuscope.core.model import ProcessRow
from gpuscope.core.units import format_bytes, format_rate

COLUMNS = (  # key, label, width
    ("pid", "PID", 7),
    ("user", "USER", 8),
    ("gpu", "GPU", 3),
    ("gpu_mem", "GPU MEM", 8),
    ("rss", "RSS", 8),
    ("growth", "GROW MB/s", 9),
    ("cpu", "CPU%", 5),
    ("command", "COMMAND", 200),
)
SORTS = {
    # name: (label, key over a ProcessRow; larger first)
    "default": ("GPU first", lambda r: (r.gpu is not None, r.gpu_memory_bytes or 0, r.rss_bytes or 0)),
    "memory": ("memory", lambda r: ((r.gpu_memory_bytes or 0) + (r.rss_bytes or 0),)),
    "growth": ("growth", lambda r: (r.growth_bytes_per_s or 0.0,)),
    "cpu": ("CPU", lambda r: (r.cpu_percent or 0.0,)),
}
GROWTH_SHOWN = 50_000  # bytes/s below which growth reads as noise, not a trend (0.05 MB/s)


def matches(row: ProcessRow, text: str) -> bool:
    needle = text.lower()
    return not needle or needle in row.command.lower() or needle in (row.user or "").lower() or needle == str(row.pid)


def row_cells(row: ProcessRow, growth_style: str) -> tuple[Text, ...]:
    growth = row.growth_bytes_per_s
    if growth is not None and growth >= GROWTH_SHOWN:
        grow = Text(f"▲{format_rate(growth)}", style=growth_style, justify="right")
    elif growth is not None and growth <= -GROWTH_SHOWN:
        grow = Text(f"▼{format_rate(growth)}", justify="right")
    else:
        grow = Text(format_rate(growth), style="dim", justify="right")
    cpu = "" if row.cpu_percent is None else f"{row.cpu_percent:.0f}"
    return (
        Text(str(row.pid), justify="right"),
        Text((row.user or "?")[:8]),
        Text("-" if row.gpu is None else str(row.gpu), justify="right"),
        Text("-" if row.gpu is None else format_bytes(row.gpu_memory_bytes), justify="right"),
        Text(format_bytes(row.rss_bytes), justify="right"),
        grow,
        Text(cpu, justify="right"),
        Text(row.command, no_wrap=True, overflow="ellipsis"),
    )


class ProcessTable(DataTable):
    DEFAULT_CSS = """
    ProcessTable { height: 1fr; overflow-x: hidden; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.sort_name = "default"
        self.filter_text = ""
        self.growth_style = "bold yellow"
        self._shown: dict[str, tuple[str, ...]] = {}  # row key -> plain text of each cell
        self._rows: dict[str, ProcessRow] = {}
        self._order: list[str] = []

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            numeric = key not in ("user", "command")
            self.add_column(Text(label, justify="right" if numeric else "left"), key=key, width=width)

    @property
    def selected_row(self) -> ProcessRow | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return self._rows.get(key)

    def select_pid(self, pid: int) -> None:
        for index, key in enumerate(self._order):
            if self._rows[key].pid == pid:
                self.move_cursor(row=index)
                return

    def show(self, rows: Iterable[ProcessRow]) -> None:
        """Bring the table in line with these rows, touching only what changed."""
        rows = [r for r in rows if matches(r, self.filter_text)]
        wanted = {r.key: r for r in rows}
        selected = self.selected_row
        for key in [k for k in self._shown if k not in wanted]:
            self.remove_row(key)
            del self._shown[key]
        for key, row in wanted.items():
            cells = row_cells(row, self.growth_style)
            plain = tuple(c.plain for c in cells)
            prior = self._shown.get(key)
            if prior is None:
                self.add_row(*cells, key=key)
            elif prior != plain:
                for (column, _, _), cell, old, new in zip(COLUMNS, cells, prior, plain):
                    if old != new:
                        self.update_cell(key, column, cell)
            self._shown[key] = plain
        self._rows = wanted
        self._reorder(selected)

    def set_sort(self, name: str) -> None:
        self.sort_name = name
        self._reorder(self.selected_row)

    def _reorder(self, selected: ProcessRow | None) -> None:
        sort_key = SORTS[self.sort_name][1]
        order = sorted(self._rows, key=lambda k: (sort_key(self._rows[k]), -self._rows[k].pid), reverse=True)
        if order != [r.key.value for r in self.ordered_rows]:
            rank = {(self._shown[k][0], self._shown[k][2]): i for i, k in enumerate(order)}
            self.sort(key=lambda cells: rank[(cells[0].plain, cells[2].plain)])
        self._order = order
        # The cursor follows the process, not the row number, when rows move.
        if selected is not None and selected.key in self._rows:
            index = order.index(selected.key)
            if index != self.cursor_row:
                self.move_cursor(row=index, animate=False)
