"""The `gpuscope` command line: it parses, reads the settings once, and hands both to the command.

Each command is a module of gpuscope.commands (the console is gpuscope.commands.console) with
`add_arguments(parser)` and `run(args, settings) -> int`. Only the module of the command given is
imported, so a command never pays for the others, and headless commands (`--help`, `ps`,
`demo --headless`) import neither the TUI nor torch. Every error gpuscope raises is a
GpuscopeError: caught here, once, and printed as one plain line.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any, NoReturn, cast

from gpuscope import __version__
from gpuscope.commands import Command, console
from gpuscope.commands.common import theme_check
from gpuscope.core.common.printable import printable
from gpuscope.errors import GpuscopeError, UsageError

# name: the one-line help (the module gpuscope.commands.<name> owns everything else).
COMMANDS = {
    "ps": "one-shot GPU + host process table",
    "metrics": "serving signals now (latency quantiles, TTFT, TPOT, tokens/s, stages)",
    "stacks": "py-spy stack dumps of a Python process",
    "diagnose": "the seven-step diagnosis of one process",
    "demo": "sample leaking RAG service + console",
    "run": "run a program with gpuscope's probe inside (or --inject it into a running one)",
    "config": "the effective settings and where each comes from",
    "snapshot": "record the node for a while and write one snapshot file (headless export)",
    "replay": "the console over a recording (a journal or a snapshot)",
    "report": "a Markdown incident report from a recording",
    "exporter": "Prometheus metrics of this node (per process)",
    "rules": "Prometheus rules carrying the leak test",
    "check": "CI memory gate: run a service through rounds of load, fail when its memory grows",
    "ramp": "load ramp to the P99 knee: the critical throughput, memory per request at every step",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage + error; we print one line
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _refresh(text: str) -> float:
    """--refresh: the same rule as console.refresh_s in the settings file."""
    from gpuscope.config import check_refresh

    return check_refresh(text, argparse.ArgumentTypeError)


def add_global_arguments(parser: argparse.ArgumentParser, *, after_command: bool) -> None:
    """The options every command takes, before or after its name. After it, an option not given
    leaves no default behind (argparse.SUPPRESS), so it never hides the same option given before."""
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if after_command else {}
    parser.add_argument("--config", metavar="FILE", **unset,
                        help="settings file (default $GPUSCOPE_CONFIG, else ~/.config/gpuscope/config.toml)")
    parser.add_argument("--theme", metavar="NAME", **unset,
                        help="colour theme (default: the last one chosen, else gpuscope-dark)")
    parser.add_argument("--refresh", type=_refresh, metavar="SECONDS", **unset,
                        help="seconds between samples (default 1, or the config file's)")
    parser.add_argument("--no-journal", action="store_true", **unset,
                        help="do not record this session to a file (it is kept in memory for 'e' exports)")


def command_module(name: str) -> Command:
    return cast(Command, import_module(f"gpuscope.commands.{name}"))


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given `argv`, only the arguments of the command it names are added (and only
    that command's module imported); without, every command's."""
    parser = _Parser(prog="gpuscope", description=console.DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    add_global_arguments(parser, after_command=False)
    console.add_arguments(parser)
    chosen = None if argv is None else command_named(parser, argv)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, help_line in COMMANDS.items():
        command = sub.add_parser(name, help=help_line, description=help_line[0].upper() + help_line[1:] + ".")
        add_global_arguments(command, after_command=True)
        if argv is None or name == chosen:
            command_module(name).add_arguments(command)
    return parser


def command_named(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The command `argv` names, as argparse will find it: the first word that is not an option
    or an option's value (None: the console)."""
    options = {option: action.nargs != 0 for action in parser._actions for option in action.option_strings}
    words = iter(argv)
    for word in words:
        if word == "--":
            return None
        if word.startswith("-"):
            if "=" in word:
                continue
            known = [o for o in options if o == word] or [o for o in options if o.startswith(word)]
            if len(known) == 1 and options[known[0]]:  # argparse takes unique prefixes too
                next(words, None)
            continue
        return word if word in COMMANDS else None
    return None


def setting_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives (None: not given), by setting key."""
    return {
        "console.refresh_s": getattr(args, "refresh", None),
        "console.theme": getattr(args, "theme", None),
        "service.metrics_url": getattr(args, "metrics_url", None),
        "prometheus.url": getattr(args, "prometheus", None),
        "prometheus.job": getattr(args, "job", None),
        "prometheus.instance": getattr(args, "instance", None),
        "journal.enabled": False if getattr(args, "no_journal", False) else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        status = _run(argv)
        sys.stdout.flush()  # a full disk under `> FILE` is found here, while there is still a way to say so
        return status
    except GpuscopeError as exc:
        print(f"gpuscope: {printable(str(exc), newlines=True)}", file=sys.stderr)  # may quote others' text
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpuscope ps | head`: the reader left; nothing more to say.
        sys.stderr.close()
        return 0
    except OSError as exc:  # standard output on a full disk (ENOSPC) or a failing device (EIO), ...
        print(f"gpuscope: {printable(_os_failure(exc))}", file=sys.stderr)
        return 1
    except (RecursionError, OverflowError, MemoryError) as exc:  # input past what gpuscope can hold
        print(f"gpuscope: cannot go on: {type(exc).__name__} ({printable(str(exc))})", file=sys.stderr)
        return 1


def _run(argv: Sequence[str]) -> int:
    args = build_parser(argv).parse_args(argv)  # --help and usage errors end here, before the settings load
    if args.theme is not None:
        theme_check(args.theme)
    from gpuscope.config import Settings

    settings = Settings.load(args.config, setting_flags(args))
    command: Command = cast(Command, console) if args.command is None else command_module(args.command)
    return command.run(args, settings)


def _os_failure(exc: OSError) -> str:
    """One line for an OSError nothing else caught; standard output, if it is what failed, is set
    aside (to /dev/null) so that the exit does not try to write it again and print a traceback."""
    reason = exc.strerror or str(exc)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return f"cannot write the output: {reason}"
    if exc.filename:
        return f"{exc.filename}: {reason}"
    if exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG):
        return f"cannot write the output: {reason}"
    return reason
