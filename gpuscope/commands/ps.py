"""`gpuscope ps [--json]`: the process table once, for scripts."""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpuscope.config import Settings
from gpuscope.core.node.model import Frame
from gpuscope.core.node.live import NodeSource
from gpuscope.core.common.printable import printable
from gpuscope.core.common.units import format_bytes


def sample_processes() -> Frame:
    """One frame of this node, every process with memory in it, for the one-shot commands (CPU %
    needs two looks, 0.5 s apart)."""
    source = NodeSource(every_process=True)
    source.sample_once()
    time.sleep(0.5)
    frame = source.sample_once()
    source.stop()
    return frame



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "One-shot GPU + host process table."
    parser.add_argument("--json", action="store_true", help="a JSON list, for scripts")


def run(args: argparse.Namespace, settings: Settings) -> int:
    frame = sample_processes()
    # GPU processes first (the most GPU memory first), then by growth where it is known, then by RSS.
    rows = sorted(frame.processes, key=lambda r: (r.gpu is None, -(r.gpu_memory_bytes or 0),
                                                  -(r.growth_bytes_per_s or 0), -(r.rss_bytes or 0)))
    if args.json:
        # Other people's text: printable here too, for the script that prints it with `jq -r`.
        json.dump([{k: printable(v) if isinstance(v, str) else v for k, v in r.to_json().items()} for r in rows],
                  sys.stdout)
        sys.stdout.write("\n")
        return 0
    for line in (frame.nvml.status, *frame.notices):
        if line:
            print(f"# {printable(line)}", file=sys.stderr)
    # Where each runs (its systemd unit or container) in a column of its own, before the command
    # line, which stays whole for whoever copies it.
    where = {r.key: printable(r.runs_in) or "-" for r in rows}
    width = max([len("RUNS IN"), *(len(w) for w in where.values())])
    print(f"{'PID':>7} {'USER':<10} {'GPU':>3} {'GPU MEM':>8} {'RSS':>8} {'CPU%':>6}  {'RUNS IN':<{width}}  COMMAND")
    for r in rows:
        gpu = "-" if r.gpu is None else str(r.gpu)
        gmem = "-" if r.gpu is None else format_bytes(r.gpu_memory_bytes)
        cpu = "" if r.cpu_percent is None else f"{r.cpu_percent:.1f}"
        user = printable(r.user or "?")[:10]
        print(f"{r.pid:>7} {user:<10} {gpu:>3} {gmem:>8} {format_bytes(r.rss_bytes):>8} {cpu:>6}  {where[r.key]:<{width}}  {printable(r.command)}")
    return 0
