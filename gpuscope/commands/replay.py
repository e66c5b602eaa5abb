"""`gpuscope replay FILE`: the console over a journal or a snapshot, with a time cursor.

Damaged records of the file are skipped; how many is a notice in the console and a line on
standard error."""

from __future__ import annotations

import argparse
import sys

from gpuscope.commands.common import console_theme, terminal_check
from gpuscope.config import Settings
from gpuscope.core.session.recording import open_recording



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Open the console over a recorded session: a snapshot, or a journal from "
        "~/.local/state/gpuscope/sessions. Space plays and pauses, [ and ] step, { and } jump a minute, "
        "< and > change the speed, J jumps to a time."
    )
    parser.add_argument("file", metavar="FILE", help="the snapshot or journal")


def run(args: argparse.Namespace, settings: Settings) -> int:
    theme = console_theme(settings)
    recording = open_recording(args.file)
    terminal_check()
    if recording.damage:
        print(f"note: {recording.damage}", file=sys.stderr)
    from gpuscope.core.session.replay import ReplaySession
    from gpuscope.tui.app import GpuScopeApp

    app = GpuScopeApp(ReplaySession(recording), theme=theme, thresholds=settings.thresholds)
    app.run()
    return app.return_code or 0
