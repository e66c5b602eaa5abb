"""`gpuscope diagnose --pid PID [--duration S] [--metrics-url URL | --prometheus URL] [--json] [-o FILE [--force]]`.

Watches the process for S seconds (its memory, its GPU, the service's signals) while it looks
for the code that allocates memory that stays, then prints the seven steps: Markdown-like text,
or DESIGN.md's gpuscope.diagnosis/1 JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpuscope.commands.common import DAY_S, add_service_arguments, attach_check, pid, seconds, serving_source
from gpuscope.commands.output import add_output_arguments, check_output, deliver
from gpuscope.config import Settings
from gpuscope.core.diagnosis import Diagnosis, diagnose
from gpuscope.core.investigation import investigate
from gpuscope.errors import Failure



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Watch a process, its GPU and its service, find what grows and the code that allocates it."
    parser.add_argument("--pid", type=pid, required=True, help="the process")
    parser.add_argument("--duration", type=seconds(5.0, DAY_S), default=30.0, metavar="S", help="seconds to watch (default 30)")
    add_service_arguments(parser)
    parser.add_argument("--json", action="store_true", help="the gpuscope.diagnosis/1 JSON object")
    add_output_arguments(parser, metavar="FILE", what="the report")
    parser.add_argument("--no-inject", action="store_true", help="never attach memray (nothing runs inside the process)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    check_output(args.output, args.force)  # before the watch: its minutes are not lost to a bad -o
    attach_check(args.pid)
    serving = serving_source(settings)
    evidence = investigate(
        args.pid, args.duration, serving=serving, use_memray=not args.no_inject,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if evidence.exited and len(evidence.rss.known()) < 2:
        raise Failure(f"process {args.pid} exited before it could be watched")
    return emit(diagnose(evidence, settings.thresholds), args)


def emit(diagnosis: Diagnosis, args: argparse.Namespace) -> int:
    """Print (or write to -o FILE, privately and atomically) the report."""
    text = json.dumps(diagnosis.to_json()) + "\n" if args.json else diagnosis.to_text()
    deliver(text, getattr(args, "output", None), getattr(args, "force", False))
    return 0
