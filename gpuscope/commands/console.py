"""`gpuscope [--pid PID] [--metrics-url URL | --prometheus URL [--job J] [--instance I]]`: the live
console of this node (what `gpuscope` with no command runs).

Light to import: the TUI (Textual) is imported only once it is certain a console will start.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuscope.commands.common import add_service_arguments, attach_check, console_app, console_theme, pid, serving_source, terminal_check

if TYPE_CHECKING:
    from gpuscope.config import Settings
    from gpuscope.core.session.journal import Journal

DESCRIPTION = (
    "Live console of this GPU node: per-process GPU and host memory, growth, and the "
    "process you attach to. Run without a command for the console."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pid", type=pid, help="attach to this process: the console focuses on it")
    add_service_arguments(parser)


def run(args: argparse.Namespace, settings: Settings) -> int:
    console_theme(settings)  # a theme that is gone is said before anything starts
    if args.pid is not None:
        attach_check(args.pid)
    serving = serving_source(settings)
    terminal_check()
    from gpuscope.core.node.live import NodeSource

    source = NodeSource(interval=settings.refresh_s, focus_pid=args.pid, thresholds=settings.thresholds)
    return run_console(settings, source, serving, pid=args.pid)


def fleet_view(settings: Settings, serving: Any) -> Any:
    """The fleet view (gpuscope.tui.fleet.FleetView) where the service is read from Prometheus:
    the same server holds the gpuscope exporters' series. None otherwise."""
    if serving is None or serving.collector.source != "prometheus":
        return None
    from gpuscope.core.fleet.collector import FleetSource, open_client
    from gpuscope.tui.fleet import FleetView

    client = open_client(settings.value("prometheus.url"), config=settings.config.prometheus)
    return FleetView(FleetSource.of(client), settings.fleet.attach)


def run_console(settings: Settings, source: Any, serving: Any, *, pid: int | None,
                cleanups: Sequence[Callable[[], object]] = ()) -> int:
    """Run the live console over `source` (and `serving`, with the fleet view where that is read
    from Prometheus), recording the session to its journal."""
    skeleton = paint_skeleton()
    source.prefetch()  # the first frame is read while the console is imported and built
    app = None
    gc.disable()  # until the first frame: see keep_startup_heap
    try:
        from gpuscope.core.session.live import LiveSession

        fleet = fleet_view(settings, serving)
        if fleet is not None:
            cleanups = (*cleanups, fleet.source.stop)
        journal = open_journal(settings, pid=pid)
        app = console_app(LiveSession(source, serving=serving, journal=journal), settings, fleet=fleet)
        for cleanup in (journal.close, *cleanups):  # also when a lost terminal cuts the exit short
            app.add_cleanup(cleanup)
        app.when_shown(keep_startup_heap)
        try:
            app.run()
        finally:
            journal.close()
    finally:
        gc.enable()
        source.stop()
        if skeleton and (app is None or not app.took_terminal):
            leave_skeleton()  # the console never started: what it says next goes to the shell's screen
    if journal.path is not None:
        print(f"gpuscope: session recorded in {journal.path} (gpuscope replay FILE, gpuscope report FILE)", file=sys.stderr)
    return app.return_code or 0


def keep_startup_heap() -> None:
    """Set aside what starting the console built, once its first frame is shown.

    Nearly all of the console's objects are made while it starts (Textual's modules, styles and
    widgets) and live until it ends, yet each full garbage collection walks them all again: about
    50 ms of CPU every minute or two, as much as everything else the console does in a few seconds.
    The collector is off while the console starts (the imports would run it again and again over
    the growing heap), then one collection frees the start's garbage, and the survivors are frozen
    out of later collections, which then walk only what the console made since.
    """
    gc.collect()
    gc.freeze()
    gc.enable()


# Python and Textual take a few hundred ms to import and lay out the console (longer on a loaded
# node). Meanwhile the operator sees its title bar rather than nothing, on the alternate screen
# the console then takes over, in the same place.
SKELETON = "\x1b[?1049h\x1b[?25l\x1b[2J\x1b[H\x1b[7m{title}\x1b[0m\x1b[3;2H{status}"
LEAVE_SKELETON = "\x1b[2J\x1b[?25h\x1b[?1049l"


def paint_skeleton() -> bool:
    """Show the console's title bar at once (the terminal is a TTY: `terminal_check` said so)."""
    try:
        width, _ = os.get_terminal_size(sys.stdout.fileno())
    except (OSError, ValueError):
        return False
    from gpuscope import __version__
    from gpuscope.core.common.printable import printable

    title = f" gpuscope {__version__} · {printable(socket.gethostname())}"
    sys.stdout.write(SKELETON.format(title=title[:width].ljust(width), status="starting…"[:max(0, width - 2)]))
    sys.stdout.flush()
    return True


def leave_skeleton() -> None:
    sys.stdout.write(LEAVE_SKELETON)
    sys.stdout.flush()


def open_journal(settings: Settings, *, pid: int | None) -> Journal:
    """The session's journal, as the [journal] settings say (a journal that writes nothing when disabled)."""
    from gpuscope.core.session.format import session_meta
    from gpuscope.core.session.journal import open_session_journal

    return open_session_journal(
        enabled=settings.journal.enabled, keep_days=settings.journal.keep_days, max_mb=settings.journal.max_mb,
        meta=session_meta("journal", pid=pid, interval_s=settings.refresh_s),
    )
