"""`gpuscope stacks --pid PID [--samples N] [--interval S] [--native] [--locals] [--json]`."""

from __future__ import annotations

import argparse
import json
import sys

from gpuscope.commands.common import attach_check, count, pid, seconds
from gpuscope.config import Settings
from gpuscope.core.target import pyspy
from gpuscope.core.target.stacks import KIND_LEGEND, KIND_MARK, StackDump, StackSample, stack_json, thread_json

SCHEMA = "gpuscope.stacks/1"



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Stack dumps of a running Python process through py-spy (one, or N samples aggregated)."
    parser.add_argument("--pid", type=pid, required=True, help="the process")
    parser.add_argument("--samples", type=count(10000), default=1, metavar="N", help="dumps to take and aggregate (default 1)")
    parser.add_argument("--interval", type=seconds(0.01, 60.0), default=0.2, metavar="S", help="seconds between dumps (default 0.2)")
    parser.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    parser.add_argument("--locals", action="store_true", help="include local variables (they can hold secrets)")
    parser.add_argument("--json", action="store_true", help="JSON output")


def run(args: argparse.Namespace, settings: Settings) -> int:
    attach_check(args.pid)
    result: StackDump | StackSample
    if args.samples == 1:
        result = pyspy.dump(args.pid, native=args.native, locals_=args.locals)
    else:
        print(f"sampling process {args.pid}: {args.samples} dumps, {args.interval:g} s apart", file=sys.stderr)
        result = pyspy.sample(args.pid, args.samples, args.interval, native=args.native)
    if args.json:
        json.dump(to_json(result), sys.stdout)
        sys.stdout.write("\n")
    elif isinstance(result, StackDump):
        print_dump(result)
    else:
        print_sample(result)
    return 0


def to_json(result: StackDump | StackSample) -> dict:
    if isinstance(result, StackDump):
        return {
            "schema": SCHEMA,
            "pid": result.pid,
            "mode": result.mode,
            "native": result.native,
            "samples": 1,
            "took_s": round(result.took_s, 4),
            "threads": [thread_json(t) for t in result.threads],
        }
    return {
        "schema": SCHEMA,
        "pid": result.pid,
        "mode": result.mode,
        "native": result.native,
        "samples": result.samples,
        "interval_s": result.interval_s,
        "duration_s": round(result.duration_s, 3),
        "errors": list(result.errors),
        "hot_paths": [
            {"count": p.count, "share": round(p.share, 4), "frames": stack_json(p.frames)} for p in result.paths
        ],
        "threads": [thread_json(t) for t in result.last.threads] if result.last else [],
    }


def _frame_line(frame, indent: str = "  ") -> str:
    where = f"{frame.file}:{frame.line}" if frame.line else frame.file
    text = f"{indent}{KIND_MARK.get(frame.kind, ' ')} {frame.function}  {where}"
    for name, value in frame.locals:
        text += f"\n{indent}      {name} = {value}"
    return text


def print_dump(dump: StackDump) -> None:
    paused = "threads paused while read" if dump.mode == "blocking" else "read without pausing the process"
    print(f"process {dump.pid}: {len(dump.threads)} Python threads, {dump.mode} dump ({paused}, {dump.took_s * 1000:.0f} ms)")
    print(KIND_LEGEND)
    for t in dump.threads:
        print(f"\nthread {t.os_thread_id or t.thread_id} {t.name or '?'!r} [{t.state}]")
        for frame in t.frames:
            print(_frame_line(frame))


IDLE_SAMPLE = "no thread was active in any dump: the process was idle (waiting) the whole time"


def print_sample(sample: StackSample) -> None:
    print(
        f"process {sample.pid}: {sample.samples} {sample.mode} dumps over {sample.duration_s:.1f} s; "
        f"hot paths of active threads (innermost frame first)"
    )
    if sample.errors:
        print(f"({len(sample.errors)} dumps failed: {sample.errors[-1]})")
    if not sample.paths:
        print(f"{IDLE_SAMPLE} (one dump, without --samples, shows where each thread waits)")
        return
    print(KIND_LEGEND)
    for path in sample.paths[:15]:
        print(f"\n{path.share * 100:5.1f}%  {path.count} samples")
        for frame in reversed(path.frames):
            print(_frame_line(frame, "        "))
