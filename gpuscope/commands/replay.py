"""`gpuscope replay FILE`: the console over a journal or a snapshot, with a time cursor.

Damaged records of the file are skipped; how many is a notice in the console and a line on
standard error."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from gpuscope.commands.common import console_app, console_theme, terminal_check
from gpuscope.config import Settings
from gpuscope.core.session.recording import Recording, open_recording

if TYPE_CHECKING:
    from gpuscope.tui.app import GpuScopeApp



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Open the console over a recorded session: a snapshot, or a journal from "
        "~/.local/state/gpuscope/sessions. Space plays and pauses, [ and ] step, { and } jump a minute, "
        "< and > change the speed, J jumps to a time."
    )
    parser.add_argument("file", metavar="FILE", help="the snapshot or journal")


def replay_app(recording: Recording, settings: Settings) -> GpuScopeApp:
    from gpuscope.core.session.replay import ReplaySession

    return console_app(ReplaySession(recording), settings)


def run(args: argparse.Namespace, settings: Settings) -> int:
    console_theme(settings)  # a theme that is gone is said before the file is read
    recording = open_recording(args.file)
    terminal_check()
    if recording.damage:
        print(f"note: {recording.damage}", file=sys.stderr)
    app = replay_app(recording, settings)
    app.run()
    return app.return_code or 0
