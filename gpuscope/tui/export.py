"""`e`: which part of the session goes into the snapshot file, and where that file goes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from gpuscope.core.common.atomic import private_folder
from gpuscope.folders import exports_dir

LAST_S = 600.0  # "the last ten minutes"


def export_target() -> Path:
    """A new file name in the exports folder, which is made 0700 and must be ours alone (no other
    user's folder or link on the way: see gpuscope.core.common.atomic.private_folder). OSError if not."""
    folder = private_folder(exports_dir())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = folder / f"snapshot-{stamp}.gpuscope", 1
    while os.path.lexists(target):  # two exports in one second; the write itself never replaces a file
        n += 1
        target = folder / f"snapshot-{stamp}-{n}.gpuscope"
    return target


class ExportScreen(ModalScreen[tuple[float | None, float | None] | None]):
    """Asks for the range; dismisses with (since, until) wall-clock times (None: open end)."""

    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 64; max-width: 100%; height: auto; border: round $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS = [
        Binding("a", "choose('all')", "Everything"),
        Binding("t", "choose('last')", "Last 10 min"),
        Binding("c", "choose('cursor')", "Up to the cursor", show=False),
        Binding("escape,n", "choose(None)", "Cancel"),
    ]

    def __init__(self, now: float, *, cursor: bool) -> None:
        """`now`: the time cursor's in a session that has one (`cursor`), else the latest frame's."""
        super().__init__()
        self.now = now
        self.cursor = cursor

    def compose(self) -> ComposeResult:
        lines = ["[b]Export a snapshot[/b] (one file, mode 0600: replay it, or make a report of it)", ""]
        lines.append("  a    the whole " + ("recording" if self.cursor else "session so far"))
        lines.append("  t    the 10 minutes before " + ("the cursor" if self.cursor else "now"))
        if self.cursor:
            lines.append("  c    from the start of the recording to the cursor")
        lines.append("  Esc  cancel")
        with Vertical():
            yield Static("\n".join(lines))

    def action_choose(self, choice: str | None) -> None:
        if choice == "all":
            self.dismiss((None, None))
        elif choice == "last":
            self.dismiss((self.now - LAST_S, self.now))
        elif choice == "cursor" and self.cursor:
            self.dismiss((None, self.now))
        elif choice is None:
            self.dismiss(None)
