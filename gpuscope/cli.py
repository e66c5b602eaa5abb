"""The `gpuscope` command line.

Headless commands (`--help`, `ps`, `demo --headless`) import neither the TUI nor torch: the
console's modules are imported only once it is certain a console will start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from gpuscope import __version__


class UsageError(Exception):
    """Bad input: printed as one plain line, exit status 2."""


class Failure(Exception):
    """Something the user must fix (no such process, no terminal): one plain line, exit status 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error; we print one line
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _pid(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"PID must be a whole number, not {text!r}") from None
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"PID must be positive, not {pid}")
    return pid


def _seconds(minimum: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, not {text!r}") from None
        if not value >= minimum or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g} seconds, not {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpuscope",
        description=(
            "Live console of this GPU node: per-process GPU and host memory, growth, and the "
            "process you attach to. Run without a command for the console."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    parser.add_argument("--pid", type=_pid, help="attach to this process: the console focuses on it")
    parser.add_argument(
        "--refresh", type=_seconds(0.25), default=1.0, metavar="SECONDS", help="seconds between samples (default 1)"
    )
    parser.add_argument("--theme", metavar="NAME", help="colour theme (default gpuscope-dark)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    ps = sub.add_parser("ps", help="one-shot GPU + host process table", description="One-shot GPU + host process table.")
    ps.add_argument("--json", action="store_true", help="a JSON list, for scripts")

    demo = sub.add_parser(
        "demo",
        help="sample leaking RAG service + console",
        description="Start the sample RAG service (whose retriever leaks) under load and attach the console to it.",
    )
    demo.add_argument("--headless", action="store_true", help="no console: print what it would tell")
    demo.add_argument(
        "--duration", type=_seconds(1.0), default=20.0, metavar="S", help="seconds to watch when headless (default 20)"
    )
    demo.add_argument("--json", action="store_true", help="with --headless: print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.theme is not None:
            theme_check(args.theme)
        if args.command == "ps":
            return cmd_ps(args)
        if args.command == "demo":
            from gpuscope.demo.run import run_demo

            return run_demo(args)
        return cmd_console(args)
    except UsageError as exc:
        print(f"gpuscope: {exc}", file=sys.stderr)
        return 2
    except Failure as exc:
        print(f"gpuscope: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpuscope ps | head`: the reader left; nothing more to say.
        sys.stderr.close()
        return 0


def attach_check(pid: int) -> None:
    """Refuse an unusable --pid before any console starts."""
    from gpuscope.core.host import ProcessForbidden, ProcessGone, check_attachable

    try:
        check_attachable(pid)
    except ProcessGone:
        raise Failure(f"no process with PID {pid}; list running ones with 'gpuscope ps'") from None
    except ProcessForbidden:
        raise Failure(
            f"no permission to read process {pid}: run gpuscope as the user who owns it, or as root"
        ) from None


def theme_check(name: str) -> None:
    from gpuscope.theme_files import load_themes

    themes, _ = load_themes()
    if name not in themes:
        raise UsageError(f"unknown theme {name!r}; available: {', '.join(sorted(themes))}")


def terminal_check() -> None:
    """The console needs a real terminal; say what to use instead when there is none."""
    term = os.environ.get("TERM", "")
    if not (sys.stdin.isatty() and sys.stdout.isatty()) or term in ("", "dumb", "unknown"):
        raise Failure(
            f"this terminal cannot run the console (TERM={term or 'unset'}, "
            f"{'a TTY' if sys.stdout.isatty() else 'not a TTY'}); "
            "use the headless commands instead: 'gpuscope ps --json', 'gpuscope demo --headless'"
        )


def cmd_console(args: argparse.Namespace) -> int:
    if args.pid is not None:
        attach_check(args.pid)
    terminal_check()
    from gpuscope.core.node import NodeSource
    from gpuscope.tui.app import GpuScopeApp

    source = NodeSource(interval=args.refresh, focus_pid=args.pid)
    app = GpuScopeApp(source, theme=args.theme)
    app.run()
    return app.return_code or 0


def sample_processes():
    """One frame of this node for the one-shot commands (CPU % needs two looks, 0.5 s apart)."""
    from gpuscope.core.node import NodeSource

    source = NodeSource()
    source.sample_once()
    time.sleep(0.5)
    frame = source.sample_once()
    source.stop()
    return frame


def cmd_ps(args: argparse.Namespace) -> int:
    from gpuscope.core.units import format_bytes

    frame = sample_processes()
    rows = sorted(frame.processes, key=lambda r: (r.gpu is None, -(r.gpu_memory_bytes or 0), -(r.rss_bytes or 0)))
    if args.json:
        json.dump([r.to_json() for r in rows], sys.stdout)
        sys.stdout.write("\n")
        return 0
    for line in (frame.nvml.status, *frame.notices):
        if line:
            print(f"# {line}", file=sys.stderr)
    print(f"{'PID':>7} {'USER':<10} {'GPU':>3} {'GPU MEM':>8} {'RSS':>8} {'CPU%':>6}  COMMAND")
    for r in rows:
        gpu = "-" if r.gpu is None else str(r.gpu)
        gmem = "-" if r.gpu is None else format_bytes(r.gpu_memory_bytes)
        cpu = "" if r.cpu_percent is None else f"{r.cpu_percent:.1f}"
        print(f"{r.pid:>7} {(r.user or '?')[:10]:<10} {gpu:>3} {gmem:>8} {format_bytes(r.rss_bytes):>8} {cpu:>6}  {r.command}")
    return 0
