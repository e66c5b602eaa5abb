"""`gpuscope snapshot [--pid PID] [--duration S] [--metrics-url URL | --prometheus URL] -o FILE`.

Records the node (and the service, and the process's stacks) for S seconds without a console
and writes one snapshot file, the same format the console's `e` exports. Ctrl-C ends the
recording early; what was recorded is still written.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import threading
import time

from gpuscope.cli import attach_check, console_settings, serving_source
from gpuscope.core import pyspy
from gpuscope.core.journal import Journal, Recorded, describe, session_meta
from gpuscope.core.node import NodeSource
from gpuscope.errors import Failure


def run(args: argparse.Namespace) -> int:
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
        path = journal.export(args.output).result(timeout=120)
    except (OSError, sqlite3.Error) as exc:
        raise Failure(f"cannot write {args.output}: {describe(exc)}") from None
    finally:
        journal.close()
    print(f"wrote {path}", file=sys.stderr)
    return 0
