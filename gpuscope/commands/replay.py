"""`gpuscope replay FILE`: the console over a journal or a snapshot, with a time cursor.

Damaged records of the file are skipped; how many is a notice in the console and a line on
standard error."""

from __future__ import annotations

import argparse
import sys

from gpuscope.cli import console_settings, terminal_check
from gpuscope.core.session.recording import RecordingError, open_recording
from gpuscope.errors import Failure


def run(args: argparse.Namespace) -> int:
    _, theme, thresholds = console_settings(args)
    try:
        recording = open_recording(args.file)
    except RecordingError as exc:
        raise Failure(str(exc)) from None
    terminal_check()
    if recording.damage:
        print(f"note: {recording.damage}", file=sys.stderr)
    from gpuscope.core.session.replay import ReplaySession
    from gpuscope.tui.app import GpuScopeApp

    app = GpuScopeApp(ReplaySession(recording), theme=theme, thresholds=thresholds)
    app.run()
    return app.return_code or 0
