"""The fleet view (`f`, with --prometheus): every node's processes from the gpuscope exporters,
fastest growth first; Enter opens gpuscope on the selected process's node.

The rows come from gpuscope.core.fleet.collector's FleetSource, on its own thread at the pace Prometheus
scrapes the exporters (not every frame), as FleetReady messages. Enter suspends the console
(`App.suspend()`), runs the settings' `[fleet] attach` command in the terminal, and resumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from gpuscope.core.fleet.attach import AttachRefused, attach_argv, run_attach
from gpuscope.core.fleet.collector import FleetProcess, FleetSnapshot, FleetSource
from gpuscope.core.common.units import format_bytes, format_rate
from gpuscope.tui.palette import DEFAULT_PALETTE, Palette, follow_theme
from gpuscope.tui.processes import shown_command

COLUMNS = (("node", "NODE"), ("pod", "POD"), ("pid", "PID"), ("gpu", "GPU"), ("gpu_mem", "GPU MEM"),
           ("rss", "RSS"), ("growth", "GROW MB/s"), ("verdict", "VERDICT"), ("command", "COMMAND"))


@dataclass(frozen=True)
class FleetView:
    """What the console needs for the fleet view: the source, the attach command, how to run it."""

    source: FleetSource
    attach: str
    runner: Callable[[Sequence[str]], int] = run_attach


class FleetReady(Message):
    """A new read of the fleet (newer replaces a queued one)."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FleetReady)


def cells(p: FleetProcess, palette: Palette) -> dict[str, Text]:
    """One row's cells: every text is a label value already made printable and bounded."""
    growth = format_rate(p.growth_bytes_per_s)
    if p.growth_memory:
        growth += f" {p.growth_memory}"
    grows = (p.growth_bytes_per_s or 0) > 0
    verdict = p.verdict or "…"
    if p.alerting:
        verdict = f"▲ {verdict}"
    return {
        "node": Text(p.node),
        "pod": Text(p.pod or p.pod_uid[:8] or "-"),
        "pid": Text(str(p.pid), justify="right"),
        "gpu": Text(",".join(map(str, p.gpus)) or "-"),
        "gpu_mem": Text(format_bytes(p.gpu_bytes, na="-"), justify="right"),
        "rss": Text(format_bytes(p.rss_bytes, na="-"), justify="right"),
        "growth": Text(growth, justify="right", style=f"bold {palette.growth}" if grows else ""),
        "verdict": Text(verdict, style=f"bold {palette.error}" if p.alerting or p.verdict == "leak" else ""),
        "command": Text(shown_command(p.command, p.runs_in)),
    }


class FleetScreen(Screen[None]):
    """The fleet's processes; Enter attaches to one through the configured command."""

    DEFAULT_CSS = """
    FleetScreen > #fleet-status { height: 1; padding: 0 1; background: $panel; }
    FleetScreen > DataTable { height: 1fr; }
    """
    BINDINGS = [
        Binding("escape,f", "app.pop_screen", "Back"),
        Binding("enter", "attach", "Attach (on its node)", priority=True),
        Binding("r", "refresh", "Refresh"),
    ]

    def __init__(self, view: FleetView) -> None:
        super().__init__()
        self.view = view
        self.snapshot: FleetSnapshot | None = None
        self.rows: dict[str, FleetProcess] = {}
        self._palette = DEFAULT_PALETTE
        self._shown: dict[str, dict[str, Text]] = {}

    def compose(self) -> ComposeResult:
        yield Static(f"fleet · reading {self.view.source.target} …", id="fleet-status", markup=False)
        table: DataTable = DataTable(cursor_type="row", zebra_stripes=False)
        for key, title in COLUMNS:
            table.add_column(title, key=key)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        follow_theme(self, self._use_palette)
        latest = self.view.source.latest
        if latest is not None:
            self.show(latest)
        self.view.source.start(lambda snapshot: self.post_message(FleetReady(snapshot)))
        self.query_one(DataTable).focus()

    def on_unmount(self) -> None:
        self.view.source.pause()

    def _use_palette(self, palette: Palette) -> None:
        self._palette = palette
        self._shown.clear()  # every cell drawn again in the new colours
        if self.snapshot is not None:
            self.show(self.snapshot)

    def on_fleet_ready(self, message: FleetReady) -> None:
        self.show(message.snapshot)

    def show(self, snapshot: FleetSnapshot) -> None:
        """Render a read: rows in the snapshot's order; only the cells that changed are sent."""
        self.snapshot = snapshot
        table = self.query_one(DataTable)
        rows = {p.key: p for p in snapshot.processes}
        new = {key: cells(p, self._palette) for key, p in rows.items()}
        if list(rows) != list(self.rows):  # another set or order: rebuild, keeping the cursor's row
            selected = self.selected
            table.clear()
            for key, row in new.items():
                table.add_row(*(row[c] for c, _ in COLUMNS), key=key)
            if selected is not None and selected.key in rows:
                table.move_cursor(row=list(rows).index(selected.key))
        else:
            for key, row in new.items():
                before = self._shown.get(key, {})
                for column, text in row.items():
                    if before.get(column) != text:
                        table.update_cell(key, column, text)
        self.rows, self._shown = rows, new
        self._status(snapshot)

    def _status(self, snapshot: FleetSnapshot) -> None:
        at = time.strftime("%H:%M:%S", time.localtime(snapshot.time))
        pace = f"every {self.view.source.interval_s:g} s"
        nodes = len({p.node for p in snapshot.processes})
        text = f"fleet · {len(snapshot.processes)} processes on {nodes} nodes · {snapshot.target} · {pace} · {at}"
        if not snapshot.ok:
            text += f" · {snapshot.state}"
        elif not snapshot.processes:
            text += " · no gpuscope exporter series (is `gpuscope exporter` scraped by this Prometheus?)"
        self.query_one("#fleet-status", Static).update(Text(text))

    @property
    def selected(self) -> FleetProcess | None:
        table = self.query_one(DataTable)
        if not self.rows or table.cursor_row < 0 or table.cursor_row >= len(self.rows):
            return None
        return list(self.rows.values())[table.cursor_row]

    def action_refresh(self) -> None:
        self.view.source.refresh()

    def action_attach(self) -> None:
        """Enter: suspend the console, run the attach command for the selected row, resume."""
        process = self.selected
        if process is None:
            self.app.notify("no process selected", severity="warning")
            return
        try:
            argv = attach_argv(self.view.attach, process)
        except AttachRefused as exc:
            self.app.notify(str(exc), severity="error", timeout=8)
            return
        try:
            with self.app.suspend():
                status = self.view.runner(argv)
        except SuspendNotSupported:
            self.app.notify("this terminal cannot be handed to another command", severity="error")
            return
        self.app.notify(f"back from {process.node} (exit status {status})", timeout=4)
