"""`gpuscope report FILE [-o FILE.md [--force]]`: the incident report of a snapshot or journal.

Damaged records of the file are left out of the report; how many is said on standard error and
in the report's header."""

from __future__ import annotations

import argparse
import sys

from gpuscope.cli import alert_thresholds
from gpuscope.commands.output import check_output, deliver
from gpuscope.core.session.recording import RecordingError, open_recording
from gpuscope.core.session.report import build_report
from gpuscope.errors import Failure


def run(args: argparse.Namespace) -> int:
    check_output(args.output, args.force)
    try:
        recording = open_recording(args.file)
        text = build_report(recording, alert_thresholds(args))
    except RecordingError as exc:
        raise Failure(str(exc)) from None
    if recording.damage:
        print(f"note: {recording.damage}", file=sys.stderr)
    deliver(text, args.output, args.force)
    return 0
