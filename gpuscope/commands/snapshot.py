"""`gpuscope snapshot [--pid PID] [--duration S] [--metrics-url URL | --prometheus URL] -o FILE [--force]`.

Records the node (and the service, and the process's stacks) for S seconds without a console
and writes one snapshot file, the same format the console's `e` exports. Ctrl-C ends the
recording early; what was recorded is still written. `-o -` writes the snapshot to standard
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

from gpuscope.cli import attach_check, console_settings, serving_source
from gpuscope.commands.output import check_output, refusal, to_stdout
from gpuscope.core.atomic import RefusedPath
from gpuscope.core import pyspy
from gpuscope.core.journal import Journal, Recorded, describe, session_meta
from gpuscope.core.node import NodeSource
from gpuscope.errors import Failure, UsageError


def run(args: argparse.Namespace) -> int:
    check_output(args.output, args.force)  # before the recording: its minutes are not lost to a bad -o
    if to_stdout(args.output) and sys.stdout.isatty():
        raise UsageError("-o - writes the binary snapshot to standard output: redirect it to a file or a pipe")
    if args.pid is not None:
        attach_check(args.pid)
    refresh, _, thresholds = console_settings(args)
    serving, _ = serving_source(args)
    journal = Journal(None, meta=session_meta("journal", pid=args.pid, interval_s=refresh))
    source = Recorded(NodeSource(interval=refresh, focus_pid=args.pid, thresholds=thresholds), journal.frame, journal)
    frames = threading.Event()
    source.start(lambda frame: frames.set())
    if serving is not None:
        serving = Recorded(serving, journal.serving, journal)
        serving.start(lambda snapshot: None)
    print(f"recording for {args.duration:g} s (Ctrl-C ends it early)…", file=sys.stderr, flush=True)
    try:
        time.sleep(args.duration)
    except KeyboardInterrupt:
        print("stopped early; writing what was recorded", file=sys.stderr)
    finally:
        source.stop()
        if serving is not None:
            serving.stop()
    if args.pid is not None:
        try:
            journal.event("stacks", pyspy.dump(args.pid))
        except pyspy.PySpyError as exc:
            print(f"no stack dump in the snapshot: {exc}", file=sys.stderr)
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


def _export_to_stdout(journal: Journal) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuscope-snapshot-") as work:
        path = journal.export(Path(work) / "snapshot.gpuscope").result(timeout=120)
        with open(path, "rb") as snapshot:
            shutil.copyfileobj(snapshot, sys.stdout.buffer)
    sys.stdout.buffer.flush()
