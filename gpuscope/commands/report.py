"""`gpuscope report FILE [-o FILE.md [--force]]`: the incident report of a snapshot or journal.

Damaged records of the file are left out of the report; how many is said on standard error and
in the report's header."""

from __future__ import annotations

import argparse
import sys

from gpuscope.commands.output import add_output_arguments, check_output, deliver
from gpuscope.config import Settings
from gpuscope.core.session.recording import open_recording
from gpuscope.core.session.report import build_report



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The verdict, the seven steps, the suspects with stacks, charts as text and the key numbers, as Markdown. "
        "-o writes only a regular file, and replaces one only with --force."
    )
    parser.add_argument("file", metavar="FILE", help="the snapshot or journal")
    add_output_arguments(parser, metavar="FILE.md", what="the report")


def run(args: argparse.Namespace, settings: Settings) -> int:
    check_output(args.output, args.force)
    recording = open_recording(args.file)
    text = build_report(recording, settings.thresholds)
    if recording.damage:
        print(f"note: {recording.damage}", file=sys.stderr)
    deliver(text, args.output, args.force)
    return 0
