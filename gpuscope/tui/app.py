"""The console: renders the frames a session sends and turns keys into requests to that session.

Live or replayed, the console speaks to one `Session` and asks its capability flags what it may
do (read a process's stacks, move a time cursor, export). It never reads a collector itself and
never blocks: the session's threads do the reading and post `FrameReady` messages, which
coalesce when the console is behind; workers post their results as messages too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from functools import partial, wraps

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.color import Color
from textual.containers import Horizontal
from textual.filter import Monochrome, NoColor
from textual.theme import Theme
from rich.text import Text
from textual.widgets import Footer, Input

from gpuscope import __version__
from gpuscope.core.node.model import Alert, Frame
from gpuscope.core.common.printable import printable
from gpuscope.core.settings import SloConfig
from gpuscope.core.leak import LeakThresholds
from gpuscope.core.session.format import describe
from gpuscope.core.session.interface import Session
from gpuscope import theme_files
from gpuscope.theme_files import DEFAULT_THEME, VARIABLE_DEFAULTS, ThemeSpec, load_themes
from gpuscope.tui.alerts import AlertBar, AlertListScreen
from gpuscope.tui.chart import MemoryChart
from gpuscope.tui.detail import CommandLineScreen, ProcessPanel
from gpuscope.tui.devices import DevicesPanel
from gpuscope.tui.messages import ExportFailed, FrameReady, ServingReady, SnapshotExported
from gpuscope.tui.processes import SORTS, ProcessTable
from gpuscope.tui.service import ServicePanel
from gpuscope.tui.textlines import TextLines
from gpuscope.tui.terminal_cells import ChangedCellsApp
from gpuscope.tui.timeline import Timeline
from gpuscope.tui.workspace import Workspace

# Screens opened by a key are imported when first opened: the first frame does not wait for them.
if TYPE_CHECKING:
    from textual.driver import Driver

    from gpuscope.core.serving.model import ServingSnapshot
    from gpuscope.tui.fleet import FleetView


HANGUP_EXIT = 128 + signal.SIGHUP
HANGUP_GRACE_S = 2.0


def textual_theme(spec: ThemeSpec) -> Theme:
    colours: dict[str, Any] = dict(spec.colours)  # primary, secondary...: Theme's own keywords
    return Theme(name=spec.name, dark=spec.dark, ansi=spec.ansi, variables=dict(spec.variables), **colours)


def rich_colour(value: str) -> str:
    """A theme colour (#RRGGBB or ansi_*) as a Rich colour name."""
    return Color.parse(value).rich_color.name


def _unless_closed(handler):
    """A message posted (by a source's thread, or the table) just as the console closes finds its
    widgets gone: it is dropped instead of ending the console with an error."""

    @wraps(handler)
    def guarded(self, message):
        try:
            return handler(self, message)
        except NoMatches:
            if self.is_running:  # not shutting down: a widget is missing for real
                raise
            return None

    return guarded


# Terminal output: only the cells that changed go out (gpuscope.tui.terminal_cells).
class GpuScopeApp(ChangedCellsApp):
    CSS_PATH = "gpuscope.tcss"
    TITLE = "gpuscope"
    ENABLE_COMMAND_PALETTE = True
    # Which process a key means, one rule (the help and the README say the same): `w` diagnoses what
    # the operator is looking at: the attached process, else a row they moved the cursor to, else
    # the alert shown in the alert bar, else the selected row; every other key that names a process
    # (Enter, d, S, a, i) means the selected row.
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("f10", "quit", "Quit", show=False),  # as in htop and mc
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),  # as in htop: Ctrl-C ends it
        Binding("question_mark", "help", "Help"),
        Binding("f1", "help", "Help", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("j", "cursor(1)", "Down", show=False),  # as in vi, less, k9s
        Binding("k", "cursor(-1)", "Up", show=False),
        # Sorting keys are in the help (?) and the palette; the footer keeps room for the actions.
        Binding("m", "sort('memory')", "Mem", show=False),
        Binding("g", "sort('growth')", "Growth", show=False),
        Binding("c", "sort('cpu')", "CPU", show=False),
        Binding("o", "sort('default')", "Order", show=False),
        Binding("w", "wizard", "Diagnose"),
        Binding("A", "alerts", "Alerts", show=False),
        Binding("d", "stacks", "Stacks"),
        Binding("S", "sample", "Sample", show=False),
        Binding("a", "allocations", "Alloc"),
        Binding("i", "command_line", "Command line", show=False),
        Binding("x", "detach", "Detach", show=False),
        Binding("f", "fleet", "Fleet"),  # with --prometheus: every node's processes (gpuscope.tui.fleet)
        Binding("t", "next_theme", "Theme", show=False),
        Binding("ctrl+z", "suspend_process", "Suspend", show=False),  # the terminal is raw: ^Z is a key
        Binding("e", "export", "Export"),
        # Esc backs out (the filter); it never detaches: pressed once more than needed after
        # closing a screen, it must not throw the attached process away.
        Binding("escape", "escape", "Back", show=False),
        # The replay's time cursor (only in a replay; see check_action).
        Binding("space", "replay_toggle", "Play/pause"),
        Binding("left_square_bracket", "replay_step(-1)", "Step back", show=False),
        Binding("right_square_bracket", "replay_step(1)", "Step", show=False),
        Binding("left_curly_bracket", "replay_jump(-60)", "-1 min", show=False),
        Binding("right_curly_bracket", "replay_jump(60)", "+1 min", show=False),
        Binding("less_than_sign", "replay_speed(-1)", "Slower", show=False),
        Binding("greater_than_sign", "replay_speed(1)", "Faster", show=False),
        Binding("J", "replay_jump_to", "Jump to a time", show=False),
    ]
    REPLAY_ACTIONS = ("replay_toggle", "replay_step", "replay_jump", "replay_speed", "replay_jump_to")
    # Over the fleet view, the console's own keys would act on the node's processes hidden behind it
    # (`w` would diagnose a local PID while the cursor is on another machine's row): only these stay.
    FLEET_ACTIONS = ("quit", "pop_screen", "suspend_process", "command_palette")

    def _fatal_error(self) -> None:
        # Textual's own shows every frame's local variables: data from other users' processes
        # and from recordings anyone may have written is among them. The code path is enough.
        from rich.traceback import Traceback

        self.panic(Traceback(show_locals=False, width=None))

    def get_driver_class(self) -> type[Driver]:
        # An input thread that sleeps until there is input (gpuscope.tui.input_driver).
        driver = super().get_driver_class()
        if driver.__name__ == "LinuxDriver":  # Textual's, not one chosen through TEXTUAL_DRIVER
            from gpuscope.tui.input_driver import IdleInputDriver

            return IdleInputDriver
        return driver

    def __init__(
        self,
        session: Session,
        *,
        theme: str | None = None,
        slo: SloConfig | None = None,
        thresholds: LeakThresholds | None = None,
        fleet: FleetView | None = None,
    ) -> None:
        super().__init__()
        self.fleet = fleet
        self.thresholds = thresholds or LeakThresholds()  # the settings' [alerts], for the wizard too
        if "TEXTUAL_ANIMATIONS" not in os.environ:
            self.animation_level = "none"  # over a slow link every animation frame is bytes on the wire
        self.session = session
        self.slo = slo
        self._theme_name = theme or DEFAULT_THEME
        self.frame: Frame | None = None
        self._charted_pid: int | None = None  # what the session was last asked to chart
        self._cleanups: list[Callable[[], object]] = []
        self._when_shown: list[Callable[[], object]] = []
        self._started = False
        self._no_colour = NoColor()
        specs, self._theme_problems = load_themes()
        for spec in specs.values():
            self.register_theme(textual_theme(spec))
        self._theme_names: list[str] = sorted(specs)
        self._start_theme(self._theme_name if self._theme_name in specs else DEFAULT_THEME)

    def get_system_commands(self, screen) -> Iterable[SystemCommand]:
        """Every key's action is also in the command palette (Ctrl+P): the mouse and keys are optional."""
        # Textual's own theme picker lists its themes too and forgets the choice: ours replace it.
        yield from (c for c in super().get_system_commands(screen) if c.title != "Theme")
        if self.fleet is not None and self._over_fleet():
            return  # the node's actions would act on the console hidden behind the fleet view
        yield SystemCommand("Next theme", "Cycle through gpuscope's themes (remembered)", self.action_next_theme)
        for name in self._theme_names:
            yield SystemCommand(f"Theme: {name}", "Use this colour theme (remembered)", partial(self.use_theme, name))
        yield SystemCommand("Help", "Keys and what the columns mean", self.action_help)
        yield SystemCommand("Suspend (Ctrl+Z)", "Back to the shell; fg brings the console back", self.action_suspend_process)
        yield SystemCommand("Filter processes", "Filter by command, user or PID", self.action_filter)
        for name, (label, _) in SORTS.items():
            yield SystemCommand(f"Sort: {label}", f"Order the process table by {label}", partial(self.action_sort, name))
        yield SystemCommand("Attach to the selected process", "Details and chart of that process", self._attach_selected)
        yield SystemCommand("Stacks of the selected process", "One py-spy dump of every thread", self.action_stacks)
        yield SystemCommand("Hot paths of the selected process", "py-spy samples for 5 s, aggregated", self.action_sample)
        yield SystemCommand("Allocation sites of the selected process", "Which code allocates memory that stays", self.action_allocations)
        yield SystemCommand("Diagnose", "The seven-step diagnosis of the attached process, else the row moved to, "
                            "else the alert bar's", self.action_wizard)
        yield SystemCommand("All alerts", "List every memory alert; pick one to diagnose", self.action_alerts)
        yield SystemCommand("Command line of the selected process", "The whole of it, wrapped", self.action_command_line)
        yield SystemCommand("Detach", "Stop following the attached process", self.action_detach)
        if self.session.can_export:
            yield SystemCommand("Export a snapshot", "The session, or a part of it, in one file for replay and report",
                                self.action_export)
        if self.session.can_seek:
            yield SystemCommand("Replay: play / pause", "Move the time cursor with the recording", self.action_replay_toggle)
            yield SystemCommand("Replay: step back", "One sample back", partial(self.action_replay_step, -1))
            yield SystemCommand("Replay: step forward", "One sample forward", partial(self.action_replay_step, 1))
            yield SystemCommand("Replay: back a minute", "Move the cursor 60 s back", partial(self.action_replay_jump, -60))
            yield SystemCommand("Replay: forward a minute", "Move the cursor 60 s on", partial(self.action_replay_jump, 60))
            yield SystemCommand("Replay: slower", "Halve the speed", partial(self.action_replay_speed, -1))
            yield SystemCommand("Replay: faster", "Double the speed", partial(self.action_replay_speed, 1))
            yield SystemCommand("Replay: jump to a time", "+90, -5m, 14:05:30, start, end", self.action_replay_jump_to)

    def _over_fleet(self) -> bool:
        from gpuscope.tui.fleet import FleetScreen

        return isinstance(self.screen, FleetScreen)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action not in self.FLEET_ACTIONS and self.fleet is not None and self._over_fleet():
            return False
        if action == "cursor":  # j/k move the table, not a table hidden behind another screen
            return self.screen is self.screen_stack[0]
        if action in self.REPLAY_ACTIONS:
            return self.session.can_seek
        if action == "export":
            return self.session.can_export
        return True

    # -- sessions: export, the replay's cursor ----------------------------------------------------

    def action_export(self) -> None:
        """`e`: the session (or a part of it) as one snapshot file, written off the UI thread."""
        from gpuscope.tui.export import ExportScreen

        now = self.frame.time if self.frame is not None else time.time()
        self.push_screen(ExportScreen(now, cursor=self.session.can_seek), self._export_range)

    def _export_range(self, chosen: tuple[float | None, float | None] | None) -> None:
        if chosen is None:
            return
        from gpuscope.tui.export import export_target

        try:
            target = export_target()
        except OSError as exc:
            self.notify(f"export failed: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"exporting to {target}…", timeout=3)
        self._write_snapshot(target, chosen)

    @work(thread=True, exit_on_error=False, group="export")
    def _write_snapshot(self, target, chosen: tuple[float | None, float | None]) -> None:
        # On a thread: the journal's writer does the work, but waiting on it must not hold the keys.
        try:
            path = self.session.export(target, *chosen).result()
        except Exception as exc:  # OSError, sqlite3.Error: the message is for the operator
            self.post_message(ExportFailed(describe(exc)))
            return
        self.post_message(SnapshotExported(path))

    def on_snapshot_exported(self, message: SnapshotExported) -> None:
        self.notify(f"{message.path}\nreplay: gpuscope replay FILE · report: gpuscope report FILE",
                    title="snapshot exported", timeout=10)

    def on_export_failed(self, message: ExportFailed) -> None:
        self.notify(f"export failed: {message.reason}", severity="error")

    def action_replay_toggle(self) -> None:
        self.session.toggle()

    def action_replay_step(self, frames: int) -> None:
        self.session.step(frames)

    def action_replay_jump(self, seconds: float) -> None:
        self.session.jump(seconds)

    def action_replay_speed(self, steps: int) -> None:
        self.session.faster(steps)

    def action_replay_jump_to(self) -> None:
        from gpuscope.tui.timeline import JumpScreen

        def chosen(text: str | None) -> None:
            if not text:
                return
            try:
                self.session.seek_to(text)
            except ValueError:
                self.notify(f"not a time: {text!r} (try +90, -5m, 14:05:30, start or end)", severity="warning")

        self.push_screen(JumpScreen(), chosen)

    def _selected_pid(self) -> int | None:
        row = self.query_one(ProcessTable).selected_row
        if row is None:
            self.notify("select a process first", severity="warning")
        return row.pid if row else None

    def action_stacks(self) -> None:
        from gpuscope.tui.stacks import DumpScreen

        pid = self._selected_pid()
        if pid is None:
            return
        if self.session.can_attach:
            self.push_screen(DumpScreen(pid))
        else:
            self._show_recorded("stacks", pid, lambda dump: DumpScreen(pid, recorded=dump))

    def action_sample(self) -> None:
        from gpuscope.tui.stacks import SampleScreen

        pid = self._selected_pid()
        if pid is None:
            return
        if self.session.can_attach:
            self.push_screen(SampleScreen(pid))
        else:
            self._show_recorded("hot-paths", pid, lambda sample: SampleScreen(pid, recorded=sample))

    def _show_recorded(self, kind: str, pid: int, screen: Callable) -> None:
        """Where processes cannot be read (a replay), code paths are what the session recorded."""
        value = self.session.recorded(kind, pid)
        if value is None:
            self.notify(f"no {kind.replace('-', ' ')} of PID {pid} were recorded before this point", severity="warning")
        else:
            self.push_screen(screen(value))

    def action_allocations(self) -> None:
        from gpuscope.tui.stacks import AttributionScreen, ConfirmAttach, SuspectsScreen

        pid = self._selected_pid()
        if pid is None:
            return
        if not self.session.can_attach:
            self._show_recorded("allocations", pid, lambda result: AttributionScreen(result, recorded=True))
            return

        def chosen(choice: str | None) -> None:
            if choice is not None:
                self.push_screen(SuspectsScreen(pid, use_memray=choice == "memray"))

        self.push_screen(ConfirmAttach(pid, inject=self.session.can_inject), chosen)

    def _looked_at_pid(self) -> int | None:
        """The process the operator is looking at, before any alert: the attached one (while it
        runs), else a row they moved the cursor to; None: neither."""
        focus = self.frame.focus if self.frame is not None else None
        if focus is not None and not focus.exited:
            return focus.pid
        table = self.query_one(ProcessTable)
        row = table.selected_row
        return row.pid if table.chosen and row is not None else None

    def action_wizard(self) -> None:
        """`w`: the guided diagnosis of what the operator is looking at: the attached process, else
        the row they moved to, else the alert bar's process, else the selected row."""
        from gpuscope.tui.wizard import WizardScreen

        pid = self._looked_at_pid()
        alert = self.query_one(AlertBar).shown
        if pid is None and alert is not None:
            self._diagnose(alert)
            return
        pid = pid if pid is not None else self._selected_pid()
        if pid is not None:
            self.push_screen(WizardScreen(pid))

    def action_fleet(self) -> None:
        if self.fleet is None:
            self.notify("the fleet view reads the gpuscope exporters in Prometheus: start with --prometheus URL",
                        severity="warning")
        else:
            from gpuscope.tui.fleet import FleetScreen

            self.push_screen(FleetScreen(self.fleet))

    def on_alert_bar_open(self, message: AlertBar.Open) -> None:
        self._diagnose(message.alert)

    def _diagnose(self, alert: Alert) -> None:
        pid = alert.subject(self.frame.processes if self.frame is not None else ())
        if pid is None:
            self.notify("no process on that GPU is growing", severity="warning")
            return
        from gpuscope.tui.wizard import WizardScreen

        self.push_screen(WizardScreen(pid))

    def action_alerts(self) -> None:
        """`A`: every alert; the one picked becomes the alert bar's and is diagnosed."""
        bar = self.query_one(AlertBar)
        if not bar.alerts:
            self.notify("no memory alert now", timeout=3)
            return

        def picked(alert: Alert | None) -> None:
            if alert is not None:
                bar.choose(alert)
                self._diagnose(alert)

        self.push_screen(AlertListScreen(bar.alerts, bar.palette), picked)

    def action_cursor(self, delta: int) -> None:
        self.query_one(ProcessTable).action_move(delta)

    def action_command_line(self) -> None:
        """`i`: the selected process's whole command line (the table cuts it to its column)."""
        row = self.query_one(ProcessTable).selected_row
        if row is None:
            self.notify("select a process first", severity="warning")
            return
        self.push_screen(CommandLineScreen(row))

    def action_detach(self) -> None:
        if self.frame is not None and self.frame.focus is not None:
            self.session.focus(None)
        else:
            self.notify("no process attached (Enter attaches the selected one)", timeout=3)

    def _attach_selected(self) -> None:
        row = self.query_one(ProcessTable).selected_row
        if row is not None:
            self.session.focus(row.pid)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def get_line_filters(self):
        # NO_COLOR: Textual's own filter turns colours into greys, which are still colour
        # sequences; no colour at all is what NO_COLOR asks for (bold, dim and reverse stay).
        return [self._no_colour if isinstance(f, Monochrome) else f for f in super().get_line_filters()]

    # -- themes ------------------------------------------------------------------------------------

    def _start_theme(self, name: str) -> None:
        """Start in theme `name` as Textual starts in its default one: the stylesheet is first
        parsed with its colours. Setting `theme` (its watcher) would have Textual parse the whole
        stylesheet again and restyle every widget once the console is up: ~50 ms of a ~0.5 s start."""
        self.set_reactive(App.theme, name)
        dark = self.current_theme.dark
        self.update_classes({f"-theme-{name}": True, "-dark-mode": dark, "-light-mode": not dark}, update=False)
        self._refresh_truecolor_filter(self.ansi_theme)  # as the watcher does: ANSI colours mapped for this theme
        self.stylesheet.set_variables(self.get_css_variables())

    def action_next_theme(self) -> None:
        names = self._theme_names
        at = names.index(self.theme) if self.theme in names else -1
        self.use_theme(names[(at + 1) % len(names)])

    def use_theme(self, name: str) -> None:
        """Switch to a theme and remember it for the next start."""
        self.theme = name
        self._theme_styles()
        try:
            theme_files.remember(name)
        except OSError as exc:
            self.notify(f"theme {name} (not remembered: {exc.strerror or exc})", severity="warning")
            return
        self.notify(f"theme {name}", timeout=2)

    def _theme_styles(self) -> None:
        """Styles drawn into text (not CSS) follow the theme too."""
        growth = self.current_theme.variables.get("gpuscope-growth", VARIABLE_DEFAULTS["gpuscope-growth"])
        table = self.query_one(ProcessTable)
        table.growth_style = f"bold {rich_colour(growth)}"
        table.redraw()

    def compose(self) -> ComposeResult:
        with Horizontal(id="title-bar"):
            yield TextLines("gpuscope", wrap=False, id="title")
            yield TextLines("", id="clock")  # its own widget: the clock ticking resends 8 cells, not the bar
        yield Timeline(id="timeline")
        yield DevicesPanel(id="devices")
        # One line, cut with an ellipsis: on a short terminal the table needs the lines more.
        yield AlertBar(wrap=False, id="alerts")
        yield ServicePanel(self.slo, id="service")
        with Workspace(id="workspace"):
            yield ProcessTable(id="processes")
            with Horizontal(id="bottom"):
                yield MemoryChart(id="chart")
                yield ProcessPanel(id="detail")
        yield Input(placeholder="filter: command, user or PID (Enter keeps it, Esc clears)", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        for problem in self._theme_problems:
            self.notify(problem, title="theme file skipped", severity="warning", timeout=10)
        self._theme_styles()
        self.query_one(ProcessTable).focus()
        # A polite kill (SIGTERM) ends the console the normal way, so the terminal is restored and
        # whoever started it gets to clean up after it; a lost terminal (SIGHUP) too, with a fallback.
        loop = asyncio.get_running_loop()
        for signum, handler in ((signal.SIGTERM, self.exit), (signal.SIGHUP, self._hangup)):
            try:
                loop.add_signal_handler(signum, handler)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        # Back from Ctrl+Z: the terminal was someone else's meanwhile, so every cell is sent again
        # (panels otherwise resend only what changed).
        self.app_resume_signal.subscribe(self, lambda _: self._repaint_everything())
        def frame_ready(frame: Frame) -> None:
            self.post_message(FrameReady(frame))

        def serving_ready(snapshot: ServingSnapshot) -> None:
            self.post_message(ServingReady(snapshot))

        self.session.start(frame_ready, serving_ready)
        self._started = True

    def _repaint_everything(self) -> None:
        for widget in self.screen.walk_children():
            widget.refresh()

    def notify(self, message: str, *, title: str = "", markup: bool = False, **kwargs) -> None:
        """Notifications quote file names and error texts: never markup, always printable."""
        super().notify(printable(message, newlines=True), title=printable(title), markup=markup, **kwargs)

    @property
    def took_terminal(self) -> bool:
        """Whether the console took the terminal over (its driver started): leaving, it gives the
        terminal back itself."""
        return self._driver is not None

    def add_cleanup(self, cleanup: Callable[[], object]) -> None:
        """Something that must happen when the console ends, even if the terminal is lost."""
        self._cleanups.append(cleanup)

    def when_shown(self, callback: Callable[[], object]) -> None:
        """Something to do once the first frame of the node is on the screen."""
        self._when_shown.append(callback)

    def _hangup(self) -> None:
        # The terminal is gone. Textual's shutdown writes to it and can block forever once its
        # writer thread has died on the dead terminal, so if the normal exit has not finished in a
        # moment, do what must be done (stop the source, run the cleanups) and leave.
        def fallback() -> None:
            self.session.stop()
            for cleanup in self._cleanups:
                try:
                    cleanup()
                except Exception:  # leaving is all that is left to do; nothing to report to
                    pass
            os._exit(HANGUP_EXIT)

        timer = threading.Timer(HANGUP_GRACE_S, fallback)
        timer.daemon = True
        timer.start()
        self.exit(return_code=HANGUP_EXIT)

    def on_unmount(self) -> None:
        if self._started:
            self.session.stop()

    def on_resize(self, event) -> None:
        width, height = event.size
        self.set_class(width < 100, "narrow")
        self.set_class(width < 72, "very-narrow")
        self.set_class(height < 30, "short")
        try:
            self.query_one(ServicePanel).set_compact(height < 30)
        except NoMatches:  # not composed yet: the first Resize comes again after
            pass

    # -- rendering ---------------------------------------------------------------------------------

    @_unless_closed
    def on_frame_ready(self, message: FrameReady) -> None:
        frame = message.frame
        first = self.frame is None
        self.frame = frame
        table = self.query_one(ProcessTable)
        with self.batch_update():
            self._show_title(frame)
            self.query_one(Timeline).show(frame.replay, frame.time)
            self.query_one(DevicesPanel).show(frame)
            table.show(frame.processes)
            if first and frame.selected_pid is not None:
                self._charted_pid = frame.selected_pid
                table.select_pid(frame.selected_pid)
            self.query_one(AlertBar).show(frame, self._looked_at_pid())
            self.query_one(MemoryChart).show(frame.chart, now=frame.time)
            self.query_one(ProcessPanel).show(frame)
        if first:
            for callback in self._when_shown:
                self.call_after_refresh(callback)

    @_unless_closed
    def on_serving_ready(self, message: ServingReady) -> None:
        self.query_one(ServicePanel).show(message.snapshot)

    def _show_title(self, frame: Frame) -> None:
        table = self.query_one(ProcessTable)
        gpus = len(frame.nvml.devices)
        parts = [
            f"gpuscope {__version__}",
            printable(frame.hostname),  # a recording's: someone else's text
            f"{gpus} GPU{'s' if gpus != 1 else ''}" if frame.nvml.status is None else "no NVML",
            f"sort: {SORTS[table.sort_name][0]}",
        ]
        if table.filter_text:
            parts.append(f"filter: {table.filter_text}")
        parts.append(frame.source)
        self.query_one("#title", TextLines).set_text(Text(" · ".join(parts)))
        # Minutes only: a seconds clock would cost a repaint every tick for no information
        # (the numbers themselves show the console is live).
        self.query_one("#clock", TextLines).set_text(Text(time.strftime("%H:%M", time.localtime(frame.time))))

    # -- input -------------------------------------------------------------------------------------

    @_unless_closed
    def on_process_table_highlighted(self, event: ProcessTable.Highlighted) -> None:
        current = self.query_one(ProcessTable).selected_row
        if current is None or current.key != event.row.key:
            return  # stale: the cursor has moved on since this was posted
        if current.pid != self._charted_pid:
            self._charted_pid = current.pid
            self.session.select(current.pid)

    @_unless_closed
    def on_process_table_chosen(self, event: ProcessTable.Chosen) -> None:
        if self.frame is not None:  # the bar says at once what `w` means now
            self.query_one(AlertBar).show(self.frame, self._looked_at_pid())

    def on_process_table_selected(self, event: ProcessTable.Selected) -> None:
        self.session.focus(event.row.pid)

    def action_help(self) -> None:
        from gpuscope.tui.help import HelpScreen

        self.push_screen(HelpScreen())

    def action_sort(self, name: str) -> None:
        self.query_one(ProcessTable).set_sort(name)
        if self.frame is not None:
            self._show_title(self.frame)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("visible")
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_one(ProcessTable).set_filter(event.value.strip())
        if self.frame is not None:
            self._show_title(self.frame)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        self._close_filter(keep=True)

    def _close_filter(self, keep: bool) -> None:
        box = self.query_one("#filter", Input)
        if not keep:
            box.value = ""  # Input.Changed clears the table's filter
        box.remove_class("visible")
        self.query_one(ProcessTable).focus()

    def action_escape(self) -> None:
        box = self.query_one("#filter", Input)
        if box.has_class("visible"):
            self._close_filter(keep=False)
        elif self.query_one(ProcessTable).filter_text:
            self._close_filter(keep=False)
        elif self.frame is not None and self.frame.focus is not None:
            self.notify(f"x detaches from PID {self.frame.focus.pid}", timeout=3)
