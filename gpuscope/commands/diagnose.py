"""`gpuscope diagnose --pid PID [--duration S] [--metrics-url URL | --prometheus URL] [--json] [-o FILE [--force]]`.

Watches the process for S seconds (its memory, its GPU, the service's signals) while it looks
for the code that allocates memory that stays, then prints the seven steps: Markdown-like text,
or DESIGN.md's gpuscope.diagnosis/1 JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpuscope.cli import alert_thresholds, attach_check, serving_source
from gpuscope.commands.output import check_output, deliver
from gpuscope.core.diagnosis import Diagnosis, diagnose
from gpuscope.core.investigation import investigate
from gpuscope.errors import Failure


def run(args: argparse.Namespace) -> int:
    check_output(args.output, args.force)  # before the watch: its minutes are not lost to a bad -o
    attach_check(args.pid)
    serving, _ = serving_source(args)
    evidence = investigate(
        args.pid, args.duration, serving=serving, use_memray=not args.no_inject,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if evidence.exited and len(evidence.rss.known()) < 2:
        raise Failure(f"process {args.pid} exited before it could be watched")
    return emit(diagnose(evidence, alert_thresholds(args)), args)


def emit(diagnosis: Diagnosis, args: argparse.Namespace) -> int:
    """Print (or write to -o FILE, privately and atomically) the report."""
    text = json.dumps(diagnosis.to_json()) + "\n" if args.json else diagnosis.to_text()
    deliver(text, getattr(args, "output", None), getattr(args, "force", False))
    return 0
