"""`gpuscope snapshot [--pid PID] [--duration S] [--metrics-url URL | --prometheus URL] -o FILE [--force]`.

Records the node (and the service, and the process's stacks) for S seconds without a console
and writes one snapshot file, the same format the console's `e` exports. With --pid the snapshot
is about that process (report and replay open on it, whatever else raised an alert), and its
stack dump is taken while the node is still sampled, stamped at the last sample before it, so a
replay shows it. Ctrl-C ends the recording early; what was recorded is still written. `-o -` writes the snapshot to standard
output (a pipe or a file, never a terminal: it is binary).
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpuscope.commands.common import DAY_S, add_service_arguments, attach_check, pid, seconds, serving_source
from gpuscope.commands.output import add_output_arguments, check_output, refusal, to_stdout
from gpuscope.config import Settings
from gpuscope.core.common.atomic import RefusedPath
from gpuscope.core.target import pyspy
from gpuscope.core.node.live import NodeSource
from gpuscope.core.session.format import describe, session_meta
from gpuscope.core.session.journal import Journal
from gpuscope.core.session.live import LiveSession
from gpuscope.errors import Failure, UsageError



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Record the node (and the process --pid, and the service) for S seconds without a console and write "
        "one snapshot file (mode 0600, written atomically) for 'gpuscope replay' and 'gpuscope report'. "
        "-o writes only a regular file, and replaces one only with --force."
    )
    parser.add_argument("--pid", type=pid, help="the process to follow (its details and a stack dump go in)")
    parser.add_argument("--duration", type=seconds(1.0, DAY_S), default=10.0, metavar="S", help="seconds to record (default 10)")
    add_service_arguments(parser, labels=False)
    add_output_arguments(parser, metavar="FILE", what="the snapshot", required=True)


def run(args: argparse.Namespace, settings: Settings) -> int:
    check_output(args.output, args.force)  # before the recording: its minutes are not lost to a bad -o
    if to_stdout(args.output) and sys.stdout.isatty():
        raise UsageError("-o - writes the binary snapshot to standard output: redirect it to a file or a pipe")
    if args.pid is not None:
        attach_check(args.pid)
    refresh, thresholds = settings.refresh_s, settings.thresholds
    live_serving = serving_source(settings)
    journal = Journal(None, meta=session_meta("journal", pid=args.pid, interval_s=refresh))
    session = LiveSession(NodeSource(interval=refresh, focus_pid=args.pid, thresholds=thresholds),
                          serving=live_serving, journal=journal)
    frames = threading.Event()
    session.start(lambda frame: frames.set(), lambda snapshot: None)
    print(f"recording for {args.duration:g} s (Ctrl-C ends it early)…", file=sys.stderr, flush=True)
    try:
        try:
            time.sleep(args.duration)
        except KeyboardInterrupt:
            print("stopped early; writing what was recorded", file=sys.stderr)
        if args.pid is not None:
            _record_stacks(session, args.pid)
    finally:
        session.stop()
    if not frames.is_set():
        journal.close()
        raise Failure("nothing was recorded (no sample was taken); try a longer --duration")
    try:
        if to_stdout(args.output):
            _export_to_stdout(journal)
            return 0
        path = journal.export(args.output, replace=args.force).result(timeout=120)
    except RefusedPath as exc:  # the name was taken while recording
        raise UsageError(refusal(exc)) from None
    except BrokenPipeError:
        raise  # the reader left: cli.main says nothing
    except (OSError, sqlite3.Error) as exc:
        where = "standard output" if to_stdout(args.output) else args.output
        raise Failure(f"cannot write {where}: {describe(exc)}") from None
    finally:
        journal.close()
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _record_stacks(session: LiveSession, pid: int) -> None:
    """`pid`'s stack dump, stamped at the last sample before it (a replay shows a finding once
    its cursor reaches the finding's time: one stamped after the last frame would never show)."""
    try:
        dump = pyspy.dump(pid)
    except pyspy.PySpyError as exc:
        print(f"no stack dump in the snapshot: {exc}", file=sys.stderr)
        return
    last = session.last_sample_time
    session.record("stacks", dump, at=min(last, dump.time) if last is not None else None)


def _export_to_stdout(journal: Journal) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuscope-snapshot-") as work:
        path = journal.export(Path(work) / "snapshot.gpuscope").result(timeout=120)
        with open(path, "rb") as snapshot:
            shutil.copyfileobj(snapshot, sys.stdout.buffer)
    sys.stdout.buffer.flush()
