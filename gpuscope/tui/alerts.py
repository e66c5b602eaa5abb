"""The alert bar: what the leak detector calls a leak right now, one alert at a time, with the key
that diagnoses it; `A` lists them all. A click on the bar diagnoses its alert.

The bar holds on to the alert it shows while that alert lasts: another process growing faster
does not move it (the operator may be reading it, or diagnosing it). It shows first the attached
process's alert, else the first one; with several it says which of how many it shows.

Alerts of processes that have exited stay a while (the core marks them `ended` and lists them
after the live ones): they are shown dim and marked "(exited)".
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from gpuscope.core.node.model import Alert, Frame
from gpuscope.core.common.printable import printable
from gpuscope.core.common.units import format_duration, format_rate
from gpuscope.tui.palette import DEFAULT_PALETTE, Palette, ThemedPanel
from gpuscope.tui.textlines import TextLines

DIAGNOSE_HINT = "w: diagnose"


def identity(alert: Alert) -> tuple:
    """What stays the same about an alert from one frame to the next."""
    return (alert.kind, alert.pid, alert.device)


def describe(alert: Alert, palette: Palette = DEFAULT_PALETTE, keys: Text | None = None) -> Text:
    """One line: the rate and the keys first (what an 80-column bar must keep), then which process
    and the rest; the line is cut at the right edge."""
    text = Text()
    text.append("⚠ LEAK ", style=f"bold {palette.error}" if not alert.ended else "dim")
    text.append(f"{format_rate(alert.growth_bytes_per_s)} MB/s", style="bold")
    if keys is not None:
        text.append(" · ")
        text.append_text(keys)
    text.append(" · ")
    text.append(printable(alert.label), style="bold" if not alert.ended else "dim")
    if alert.ended:
        text.append(" (exited)", style="bold")
    if alert.since is not None:
        text.append(f" since {time.strftime('%H:%M:%S', time.localtime(alert.since))}")
    if alert.time_to_full_s is not None and not alert.ended:
        text.append(f" · full in {format_duration(alert.time_to_full_s)}", style="bold")
    text.append(f" · {alert.confidence:.0%} sure")
    if alert.ended:
        text.stylize("dim")
    return text


class AlertBar(ThemedPanel, TextLines):
    """Not focusable: `w` (an app key) diagnoses the alert shown here unless the operator is
    looking at another process (attached, or a row moved to); the bar then says what `w` means."""

    DEFAULT_CSS = """
    AlertBar { height: auto; padding: 0 1; background: $error 15%; }
    AlertBar.ended { background: $panel; }
    AlertBar.empty { display: none; }
    """

    class Open(Message):
        """Diagnose the process behind this alert."""

        def __init__(self, alert: Alert) -> None:
            super().__init__()
            self.alert = alert

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.alerts: tuple[Alert, ...] = ()
        self._frame: Frame | None = None
        self._shown: tuple | None = None  # the alert in the bar, kept while it lasts
        self._picked = False  # the operator picked it (from the list): kept even once it has ended
        self._attached: int | None = None
        self._w_pid: int | None = None  # what `w` diagnoses when it is not this bar's alert
        self.add_class("empty")

    @property
    def shown(self) -> Alert | None:
        """The alert in the bar (see the module's docstring for which one)."""
        return next((a for a in self.alerts if identity(a) == self._shown), None)

    def _keep_or_pick(self) -> None:
        kept = self.shown
        live = [a for a in self.alerts if not a.ended] or list(self.alerts)
        attached = next((a for a in live if self._attached is not None and a.pid == self._attached), None)
        if kept is not None and (self._picked or not kept.ended or all(a.ended for a in self.alerts)) \
                and (self._picked or attached is None or kept.pid == attached.pid):
            return
        # Nothing held, an exited one while a live one is listed, or the attached process's alert
        # has come (the process the operator follows): that one, else the first (live ones come
        # first, fastest first).
        first = attached or (live[0] if live else None)
        self._shown = identity(first) if first is not None else None
        self._picked = False

    def on_mount(self) -> None:
        self.follow_theme()

    def redraw(self) -> None:
        if self._frame is not None:
            self.show(self._frame, self._w_pid)

    def choose(self, alert: Alert) -> None:
        """Show this alert in the bar, for as long as it is listed."""
        self._shown = identity(alert)
        self._picked = True
        self.redraw()

    def show(self, frame: Frame, w_pid: int | None = None) -> None:
        """Show `frame`'s alerts; `w_pid` is the process `w` diagnoses instead of the bar's alert
        (the attached one, or a row the operator moved to), None when `w` means the bar's."""
        self._frame = frame
        self._w_pid = w_pid
        self._attached = frame.focus.pid if frame.focus is not None else None
        self.alerts = frame.alerts
        self._keep_or_pick()
        shown = self.shown
        self.set_class(shown is None, "empty")
        self.set_class(shown is not None and shown.ended, "ended")
        if shown is None:
            self.set_text(Text(""))
            return
        if w_pid is None or w_pid == shown.pid:
            keys = Text(DIAGNOSE_HINT, style="bold reverse")
        else:
            keys = Text(f"click: diagnose · w: PID {w_pid}", style="bold")
        if len(self.alerts) > 1:
            at = next(i for i, a in enumerate(self.alerts) if identity(a) == self._shown) + 1
            keys.append(f" · {at} of {len(self.alerts)} alerts, A: all", style="bold")
        self.set_text(describe(shown, self.palette, keys))

    def on_click(self) -> None:
        if self.shown is not None:
            self.post_message(self.Open(self.shown))


class AlertListScreen(ModalScreen[Alert | None]):
    """`A`: every alert, live ones first; Enter diagnoses the one picked (and shows it in the bar)."""

    DEFAULT_CSS = """
    AlertListScreen { align: center middle; }
    AlertListScreen > Vertical { width: 100; max-width: 100%; height: auto; max-height: 100%;
                                 border: round $error; background: $surface; padding: 0 1; }
    AlertListScreen OptionList { height: auto; max-height: 20; }
    """
    BINDINGS = [
        Binding("escape,q", "dismiss(None)", "Close"),
        Binding("j", "cursor(1)", "Down", show=False),
        Binding("k", "cursor(-1)", "Up", show=False),
    ]

    def __init__(self, alerts: tuple[Alert, ...], palette: Palette = DEFAULT_PALETTE) -> None:
        super().__init__()
        self.alerts = alerts
        self.palette = palette

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(f"{len(self.alerts)} alerts · ↑↓: pick · Enter: diagnose · Esc: close", style="bold"))
            yield OptionList(*(Option(describe(a, self.palette), id=str(i)) for i, a in enumerate(self.alerts)),
                             id="alert-list")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def action_cursor(self, delta: int) -> None:
        options = self.query_one(OptionList)
        at = options.highlighted if options.highlighted is not None else 0
        options.highlighted = max(0, min(len(self.alerts) - 1, at + delta))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.alerts[event.option_index])
