"""`gpuscope report FILE [-o FILE.md]`: the incident report of a snapshot or journal."""

from __future__ import annotations

import argparse
import sys

from gpuscope.core.atomic import write_private
from gpuscope.core.recording import RecordingError, open_recording
from gpuscope.core.report import build_report
from gpuscope.errors import Failure


def run(args: argparse.Namespace) -> int:
    try:
        recording = open_recording(args.file)
        text = build_report(recording)
    except RecordingError as exc:
        raise Failure(str(exc)) from None
    if recording.damage:
        print(f"note: {recording.damage}", file=sys.stderr)
    if args.output:
        try:
            path = write_private(args.output, text)
        except OSError as exc:
            raise Failure(f"cannot write {args.output}: {exc.strerror or exc}") from None
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
