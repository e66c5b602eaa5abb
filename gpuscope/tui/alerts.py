"""The alert bar: what the leak detector calls a leak right now. Enter (or a click) on it opens
the guided diagnosis on that process."""

from __future__ import annotations

import time

from rich.text import Text
from textual.binding import Binding
from textual.message import Message

from gpuscope.core.model import Alert, Frame
from gpuscope.core.printable import printable
from gpuscope.core.units import format_duration, format_rate
from gpuscope.tui.palette import DEFAULT_PALETTE, Palette, follow_theme
from gpuscope.tui.textlines import TextLines


def describe(alert: Alert, palette: Palette = DEFAULT_PALETTE) -> Text:
    text = Text()
    text.append("⚠ LEAK ", style=f"bold {palette.error}")
    text.append(printable(alert.label), style="bold")
    text.append(f" {format_rate(alert.growth_bytes_per_s)} MB/s")
    if alert.since is not None:
        text.append(f" since {time.strftime('%H:%M:%S', time.localtime(alert.since))}")
    if alert.time_to_full_s is not None:
        text.append(f" · full in {format_duration(alert.time_to_full_s)}", style="bold")
    text.append(f" · {alert.confidence:.0%} sure")
    return text


class AlertBar(TextLines, can_focus=True):
    DEFAULT_CSS = """
    AlertBar { height: auto; padding: 0 1; background: $error 15%; }
    AlertBar:focus { background: $error 35%; }
    AlertBar:nocolor:focus { text-style: reverse; }
    AlertBar.empty { display: none; }
    """
    BINDINGS = [Binding("enter", "open", "Diagnose", show=False)]

    class Open(Message):
        """Diagnose the process behind this alert."""

        def __init__(self, alert: Alert) -> None:
            super().__init__()
            self.alert = alert

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.alerts: tuple[Alert, ...] = ()
        self.palette = DEFAULT_PALETTE
        self._frame: Frame | None = None
        self.add_class("empty")

    def on_mount(self) -> None:
        follow_theme(self, self._use_palette)

    def _use_palette(self, palette: Palette) -> None:
        self.palette = palette
        if self._frame is not None:
            self.show(self._frame)

    def show(self, frame: Frame) -> None:
        self._frame = frame
        self.alerts = frame.alerts
        self.set_class(not self.alerts, "empty")
        if not self.alerts:
            self.set_text(Text(""))
            return
        text = describe(self.alerts[0], self.palette)
        more = len(self.alerts) - 1
        text.append(f" · Enter/w: diagnose{f' · {more} more' if more else ''}", style="dim")
        self.set_text(text)

    def action_open(self) -> None:
        if self.alerts:
            self.post_message(self.Open(self.alerts[0]))

    def on_click(self) -> None:
        self.action_open()
