"""`gpuscope diagnose --pid PID [--duration S] [--metrics-url URL | --prometheus URL] [--json] [-o FILE [--force]]`
and `gpuscope diagnose --prometheus URL --node N --pid PID [--duration S] ...`.

Watches the process for S seconds (its memory, its GPU, the service's signals) while it looks
for the code that allocates memory that stays, then prints the seven steps: Markdown-like text,
or the gpuscope.diagnosis/1 JSON object. A Python service without gpuscope's probe gets one
brought in first (sys.remote_exec, or gdb or lldb after a throwaway check), which runs the allocation
trackers inside it and stays there idle; --no-inject runs nothing inside the process.

With --node, nothing on this machine is watched: the last S seconds (default 600) of the
history `gpuscope exporter` on node N left in Prometheus are diagnosed instead (steps 1 to 6);
the code path (step 7) needs the process itself, and the report says where to run it.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpuscope.commands.common import DAY_S, add_service_arguments, attach_check, pid, seconds, serving_source
from gpuscope.commands.output import add_output_arguments, check_output, deliver, to_stdout
from gpuscope.config import Settings
from gpuscope.core.diagnosis.steps import Diagnosis, diagnose
from gpuscope.core.diagnosis.investigation import investigate
from gpuscope.core.common.printable import printable_line
from gpuscope.core.serving.model import SourceError
from gpuscope.errors import Failure, UsageError

WATCH_S = 30.0  # a live watch
HISTORY_S = 600.0  # history in Prometheus: ten minutes at a 15 s scrape is 40 samples


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Watch a process, its GPU and its service, find what grows and the code that allocates it."
    parser.add_argument("--pid", type=pid, required=True, help="the process")
    parser.add_argument("--duration", type=seconds(5.0, DAY_S), default=None, metavar="S",
                        help=f"seconds to watch (default {WATCH_S:g}); with --node, of history (default {HISTORY_S:g})")
    add_service_arguments(parser)
    parser.add_argument("--node", type=node_name, metavar="N",
                        help="with --prometheus: the node (the exporter's node label) whose history to diagnose")
    parser.add_argument("--json", action="store_true", help="the gpuscope.diagnosis/1 JSON object")
    add_output_arguments(parser, metavar="FILE", what="the report")
    parser.add_argument("--no-inject", action="store_true",
                        help="never bring gpuscope's probe or memray into the process (nothing runs inside it: "
                             "stack sampling only)")


def node_name(text: str) -> str:
    if not text or len(text) > 253 or not all(c.isprintable() for c in text):
        raise argparse.ArgumentTypeError("expected a node name, as the exporter's node label has it")
    return text


def run(args: argparse.Namespace, settings: Settings) -> int:
    check_output(args.output, args.force)  # before the watch: its minutes are not lost to a bad -o
    if args.node is not None:
        return remote(args, settings)
    attach_check(args.pid)
    serving = serving_source(settings)
    evidence = investigate(
        args.pid, args.duration or WATCH_S, serving=serving, use_memray=not args.no_inject,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if evidence.exited and len(evidence.rss.known()) < 2:
        raise Failure(f"process {args.pid} exited before it could be watched")
    return emit(diagnose(evidence, settings.thresholds), args)


def remote(args: argparse.Namespace, settings: Settings) -> int:
    """Steps 1-6 from the exporter's series in Prometheus: the node itself is never reached."""
    from gpuscope.core.fleet.collector import ProcessNotExported, open_client, remote_diagnosis, remote_evidence
    from gpuscope.core.serving.source import observe

    url = settings.value("prometheus.url")
    if not url or settings.effective["service.metrics_url"].origin == "flag":
        raise UsageError("--node reads the node's history from Prometheus: give --prometheus URL")
    duration = args.duration or HISTORY_S
    try:
        client = open_client(url, config=settings.config.prometheus)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        evidence = remote_evidence(client, args.node, args.pid, duration)
    except ProcessNotExported:
        raise Failure(
            f"Prometheus at {client.target} has no gpuscope exporter series of PID {args.pid} on node "
            f"{printable_line(args.node, 80)} over the last {duration:g} s (is `gpuscope exporter` running there, "
            "and the process among those it exports?)"
        ) from None
    except SourceError as exc:
        raise Failure(str(exc)) from None
    finally:
        client.close()
    serving = None
    service = serving_source(settings)
    if service is not None:  # the service's signals now, where Prometheus holds a profile's series
        snapshot = observe(service.collector)
        serving = snapshot if snapshot.ok and snapshot.profile is not None else None
    return emit(remote_diagnosis(evidence, args.node, thresholds=settings.thresholds, serving=serving), args)


def emit(diagnosis: Diagnosis, args: argparse.Namespace) -> int:
    """Print (or write to -o FILE, privately and atomically) the report."""
    output = getattr(args, "output", None)
    # Markdown for a file or a pipe; on a terminal, the same lines without Markdown's escapes.
    terminal = (output is None or to_stdout(output)) and sys.stdout.isatty()
    text = json.dumps(diagnosis.to_json()) + "\n" if args.json else diagnosis.to_text(markdown=not terminal)
    deliver(text, output, getattr(args, "force", False))
    return 0
