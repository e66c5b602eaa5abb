"""The replay's time cursor: where in the recording the console stands, and how it moves.

One line, shown only when frames come from a replay: play state (symbol and word, so it reads
without colour), the time, how far into the recording, the speed, a position bar and the keys.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Input

from gpuscope.core.node.model import ReplayPosition
from gpuscope.tui.textlines import TextLines

KEYS = "space play/pause · [ ] step · { } ±1 min · < > speed · J jump"


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def span(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


def timeline_text(position: ReplayPosition, now: float, width: int) -> Text:
    state = "▶ playing" if position.playing else "⏸ paused"
    speed = f"×{position.speed:g}"
    head = f" {state} {clock(now)}  {span(now - position.start)} / {span(position.end - position.start)}  {speed} "
    tail = f" {KEYS}"
    bar_width = max(0, width - len(head) - len(tail) - 2)
    if bar_width < 10:  # narrow terminal: the keys are in the help and the footer
        tail = ""
        bar_width = max(0, width - len(head) - 2)
    text = Text(head, style="bold")
    if bar_width:
        fraction = (position.index / (position.count - 1)) if position.count > 1 else 1.0
        filled = round(fraction * (bar_width - 1))
        text.append("[")
        text.append("━" * filled, style="bold")
        text.append("●", style="bold reverse")
        text.append("─" * (bar_width - 1 - filled), style="dim")
        text.append("]")
    text.append(tail, style="dim")
    return text


class Timeline(TextLines):
    """Hidden in a live console; the replay's cursor when frames say they come from a replay."""

    DEFAULT_CSS = """
    Timeline { height: 1; display: none; background: $panel; }
    Timeline.replay { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self._last: tuple | None = None

    def show(self, position: ReplayPosition | None, now: float) -> None:
        self.set_class(position is not None, "replay")
        if position is None:
            return
        key = (position, now, self.size.width)
        if key != self._last:
            self._last = key
            self.set_text(timeline_text(position, now, self.size.width or 80))


class JumpScreen(ModalScreen[str | None]):
    """`J` in a replay: where to jump ("+90", "-5m", "14:05:30", "start", "end")."""

    DEFAULT_CSS = """
    JumpScreen { align: center middle; }
    JumpScreen > Input { width: 60; border: round $primary; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        yield Input(placeholder="jump to: +90, -5m, 14:05:30, start, end (Enter)", id="jump")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
