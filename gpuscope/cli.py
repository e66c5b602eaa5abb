"""The `gpuscope` command line.

Headless commands (`--help`, `ps`, `demo --headless`) import neither the TUI nor torch: the
console's modules are imported only once it is certain a console will start.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from importlib import import_module

from gpuscope import __version__
from gpuscope.commands.output import add_output_arguments
from gpuscope.core.printable import printable
from gpuscope.errors import Failure, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error; we print one line
        raise UsageError(f"{message} (see '{self.prog} --help')")


PID_LIMIT = 2**31  # Linux PIDs stay below 2**22


def _pid(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"PID must be a whole number, not {text!r}") from None
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"PID must be positive, not {pid}")
    if pid >= PID_LIMIT:
        raise argparse.ArgumentTypeError(f"PID must be below {PID_LIMIT}, not {text}")
    return pid


DAY_S = 86400.0


def _seconds(minimum: float, maximum: float):
    """A number of seconds in [minimum, maximum]: an hour-long or endless wait is a typo, not a wish."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, not {text!r}") from None
        if not value >= minimum:  # NaN too
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g} seconds, not {text}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g} seconds, not {text}")
        return value

    return parse


def _refresh(text: str) -> float:
    """--refresh: the same rule as console.refresh_s in the settings file."""
    from gpuscope.config import check_refresh

    return check_refresh(text, argparse.ArgumentTypeError)


def _count(maximum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
        if not 1 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be from 1 to {maximum}, not {value}")
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
        "--refresh", type=_refresh, metavar="SECONDS", help="seconds between samples (default 1, or the config file's)"
    )
    parser.add_argument("--theme", metavar="NAME", help="colour theme (default: the last one chosen, else gpuscope-dark)")
    parser.add_argument("--config", metavar="FILE", help="settings file (default $GPUSCOPE_CONFIG, else ~/.config/gpuscope/config.toml)")
    service = parser.add_mutually_exclusive_group()
    service.add_argument("--metrics-url", action="append", metavar="URL", help="the service's /metrics (repeatable)")
    service.add_argument("--prometheus", metavar="URL", help="a Prometheus server that scrapes the service")
    parser.add_argument("--job", metavar="J", help="with --prometheus: only this job label")
    parser.add_argument("--instance", metavar="I", help="with --prometheus: only this instance label")
    parser.add_argument("--no-journal", action="store_true",
                        help="do not record this session to a file (it is kept in memory for 'e' exports)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    ps = sub.add_parser("ps", help="one-shot GPU + host process table", description="One-shot GPU + host process table.")
    ps.add_argument("--json", action="store_true", help="a JSON list, for scripts")

    metrics = sub.add_parser(
        "metrics",
        help="serving signals now (latency quantiles, TTFT, TPOT, tokens/s, stages)",
        description="The service's signals now, from its /metrics endpoint or from a Prometheus server.",
    )
    where = metrics.add_mutually_exclusive_group(required=True)
    where.add_argument("--metrics-url", action="append", metavar="URL", help="scrape this /metrics endpoint (repeatable)")
    where.add_argument("--prometheus", metavar="URL", help="query this Prometheus server")
    metrics.add_argument("--job", metavar="J", help="with --prometheus: only this job label")
    metrics.add_argument("--instance", metavar="I", help="with --prometheus: only this instance label")
    metrics.add_argument(
        "--window", type=_seconds(0.0, 7 * DAY_S), metavar="SECONDS",
        help="rate and quantile window (default: two scrapes 3 s apart, or 30 s of Prometheus; "
             "0: quantiles over the cumulative buckets of one scrape)",
    )
    metrics.add_argument("--watch", action="store_true", help="then print again every --refresh seconds (Ctrl+C stops)")
    metrics.add_argument("--json", action="store_true", help="the gpuscope.metrics/1 JSON object (one a line with --watch)")

    stacks = sub.add_parser(
        "stacks",
        help="py-spy stack dumps of a Python process",
        description="Stack dumps of a running Python process through py-spy (one, or N samples aggregated).",
    )
    stacks.add_argument("--pid", type=_pid, required=True, help="the process")
    stacks.add_argument("--samples", type=_count(10000), default=1, metavar="N", help="dumps to take and aggregate (default 1)")
    stacks.add_argument("--interval", type=_seconds(0.01, 60.0), default=0.2, metavar="S", help="seconds between dumps (default 0.2)")
    stacks.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    stacks.add_argument("--locals", action="store_true", help="include local variables (they can hold secrets)")
    stacks.add_argument("--json", action="store_true", help="JSON output")

    diag = sub.add_parser(
        "diagnose",
        help="the seven-step diagnosis of one process",
        description="Watch a process, its GPU and its service, find what grows and the code that allocates it.",
    )
    diag.add_argument("--pid", type=_pid, required=True, help="the process")
    diag.add_argument("--duration", type=_seconds(5.0, DAY_S), default=30.0, metavar="S", help="seconds to watch (default 30)")
    where = diag.add_mutually_exclusive_group()
    where.add_argument("--metrics-url", action="append", metavar="URL", help="the service's /metrics (repeatable)")
    where.add_argument("--prometheus", metavar="URL", help="a Prometheus server that scrapes the service")
    diag.add_argument("--job", metavar="J", help="with --prometheus: only this job label")
    diag.add_argument("--instance", metavar="I", help="with --prometheus: only this instance label")
    diag.add_argument("--json", action="store_true", help="the gpuscope.diagnosis/1 JSON object")
    add_output_arguments(diag, metavar="FILE", what="the report")
    diag.add_argument("--no-inject", action="store_true", help="never attach memray (nothing runs inside the process)")

    demo = sub.add_parser(
        "demo",
        help="sample leaking RAG service + console",
        description="Start the sample RAG service (whose retriever leaks) under load and attach the console to it.",
    )
    demo.add_argument("--headless", action="store_true", help="no console: print what it would tell")
    demo.add_argument(
        "--duration", type=_seconds(1.0, DAY_S), default=20.0, metavar="S", help="seconds to watch when headless (default 20)"
    )
    demo.add_argument("--json", action="store_true", help="with --headless: print JSON")

    run = sub.add_parser(
        "run",
        help="run a program with gpuscope's probe inside (or --inject it into a running one)",
        description=(
            "Run a program with gpuscope's probe started in each of its Python processes before the main module "
            "runs (gpuscope run -- python serve.py ...): gpuscope then reads PyTorch's allocator and tracks "
            "allocations in-process. The program replaces gpuscope (same PID, signals and exit status). "
            "With --inject --pid PID: start the probe inside a running Python process instead (runs code inside it; "
            "only if it has imported torch, unless --memray)."
        ),
    )
    run.add_argument("--inject", action="store_true", help="start the probe inside the running process --pid (opt-in)")
    run.add_argument("--pid", type=_pid, help="with --inject: the running Python process")
    run.add_argument("--memray", action="store_true",
                     help="with --inject: start the probe even if torch is not imported (for memray tracking)")
    run.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help="the program and its arguments")

    config = sub.add_parser(
        "config",
        help="the effective settings and where each comes from",
        description=(
            "Print every setting's effective value and where it came from: a flag (given before 'config', "
            "e.g. gpuscope --refresh 2 config), the environment, the config file or the default."
        ),
    )
    config.add_argument("--json", action="store_true", help="a JSON object, for scripts")

    snapshot = sub.add_parser(
        "snapshot",
        help="record the node for a while and write one snapshot file (headless export)",
        description=(
            "Record the node (and the process --pid, and the service) for S seconds without a console and write "
            "one snapshot file (mode 0600, written atomically) for 'gpuscope replay' and 'gpuscope report'. "
            "-o writes only a regular file, and replaces one only with --force."
        ),
    )
    snapshot.add_argument("--pid", type=_pid, help="the process to follow (its details and a stack dump go in)")
    snapshot.add_argument("--duration", type=_seconds(1.0, DAY_S), default=10.0, metavar="S", help="seconds to record (default 10)")
    where = snapshot.add_mutually_exclusive_group()
    where.add_argument("--metrics-url", action="append", metavar="URL", help="the service's /metrics (repeatable)")
    where.add_argument("--prometheus", metavar="URL", help="a Prometheus server that scrapes the service")
    add_output_arguments(snapshot, metavar="FILE", what="the snapshot", required=True)

    replay = sub.add_parser(
        "replay",
        help="the console over a recording (a journal or a snapshot)",
        description=(
            "Open the console over a recorded session: a snapshot, or a journal from "
            "~/.local/state/gpuscope/sessions. Space plays and pauses, [ and ] step, { and } jump a minute, "
            "< and > change the speed, j jumps to a time."
        ),
    )
    replay.add_argument("file", metavar="FILE", help="the snapshot or journal")

    report = sub.add_parser(
        "report",
        help="a Markdown incident report from a recording",
        description=(
            "The verdict, the seven steps, the suspects with stacks, charts as text and the key numbers, as Markdown. "
            "-o writes only a regular file, and replaces one only with --force."
        ),
    )
    report.add_argument("file", metavar="FILE", help="the snapshot or journal")
    add_output_arguments(report, metavar="FILE.md", what="the report")

    exporter = sub.add_parser(
        "exporter",
        help="Prometheus metrics of this node (per process)",
        description=(
            "Serve this node's GPUs and processes as Prometheus metrics: per-process GPU memory, RSS, growth and "
            "the leak detector's verdict, sampled every --refresh seconds with the [alerts] thresholds. "
            "Listens on loopback unless told otherwise."
        ),
    )
    exporter.add_argument("--listen", default="127.0.0.1:9835", metavar="ADDR",
                          help="HOST:PORT to serve /metrics on (default 127.0.0.1:9835; 0.0.0.0:9835 for every interface)")
    exporter.add_argument("--node-name", metavar="N", help="the node label (default: this host's name)")
    exporter.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM) ...")
    exporter.add_argument("--tls-key", metavar="FILE", help="... and this private key (PEM)")
    exporter.add_argument("--tls-client-ca", metavar="FILE",
                          help="with --tls-cert: require a client certificate signed by this CA (mutual TLS)")

    rules = sub.add_parser(
        "rules",
        help="Prometheus rules carrying the leak test",
        description=(
            "Prometheus recording and alerting rules that carry gpuscope's leak test (the floor trend over several "
            "horizons, from the [alerts] thresholds) over the exporter's series and dcgm-exporter's, and the "
            "serving classics (P99 jump, TTFT/TPOT SLO burn from [slo]). -o writes only a regular file, and "
            "replaces one only with --force."
        ),
    )
    add_output_arguments(rules, metavar="FILE", what="the rules")

    check = sub.add_parser(
        "check",
        help="CI memory gate: run a service through rounds of load, fail when its memory grows",
        description=(
            "Start COMMAND (the service) under gpuscope's probe, drive it through rounds and fail (exit 1) when its "
            "memory floor grows per round more than a known-good run's (--baseline F) beyond --tolerance PCT of its "
            "memory, when the leak detector finds a leak outright, or when the service or the load command fails. "
            "A round is one run of --load CMD (it ends when CMD exits), or --round-seconds S of the service's own "
            "work without --load. A round's floor is its lowest memory (RSS of the service's process tree, GPU "
            "memory per device) in the quiet --settle seconds at its end (after the load command has exited); "
            "--warmup-rounds rounds come first and are not judged. Exit 0 pass, 1 fail, 2 bad input."
        ),
    )
    check.add_argument("--rounds", type=_count(1000), default=3, metavar="N", help="rounds to judge (default 3)")
    check.add_argument("--warmup-rounds", type=int, default=1, metavar="N",
                       help="rounds before those, not judged (default 1; 0: the idle service is the reference)")
    check.add_argument("--load", metavar="CMD", help="shell command run once per round; the round ends when it exits")
    check.add_argument("--round-seconds", type=_seconds(1.0, DAY_S), metavar="S",
                       help="without --load: each round lasts S seconds (default 10)")
    check.add_argument("--settle", type=_seconds(0.1, 3600.0), metavar="S",
                       help="the quiet seconds at the end of a round whose lowest memory is its floor "
                            "(default 0.25 after the load command; without --load, the last quarter of the round)")
    check.add_argument("--round-timeout", type=_seconds(1.0, DAY_S), default=900.0, metavar="S",
                       help="fail when a load command runs longer than this (default 900)")
    check.add_argument("--baseline", metavar="F", help="the baseline file of a known-good run (gpuscope.check-baseline/1)")
    check.add_argument("--update-baseline", action="store_true",
                       help="write this run to --baseline F instead of comparing (only if the run is healthy)")
    check.add_argument("--tolerance", type=float, metavar="PCT",
                       help="growth per round allowed beyond the baseline's, in %% of the service's memory floor (default 3)")
    check.add_argument("--pid", type=_pid, help="watch this running service instead of starting COMMAND")
    check.add_argument("--metrics-url", action="append", metavar="URL",
                       help="the service's /metrics: requests and P95 latency per round (repeatable)")
    check.add_argument("--ready-url", metavar="URL",
                       help="wait until this answers before the first round (default: the first --metrics-url)")
    check.add_argument("--ready-timeout", type=_seconds(1.0, DAY_S), default=120.0, metavar="S",
                       help="how long to wait for --ready-url (default 120)")
    check.add_argument("--no-memray", action="store_true",
                       help="do not track allocation sites with memray inside the service")
    check.add_argument("--json", action="store_true", help="the gpuscope.check/1 JSON object on stdout")
    check.add_argument("--junit", metavar="F", help="also write JUnit XML to F (a test case per round and criterion)")
    check.add_argument("--markdown", metavar="F", help="also write a Markdown summary to F (for a CI job summary)")
    check.add_argument("--force", action="store_true",
                       help="replace an existing --junit or --markdown file (--update-baseline always replaces the baseline)")
    check.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help="the service and its arguments")
    return parser


# Subcommands with a module in gpuscope/commands/ (its run(args)); the demo and the console are below.
COMMAND_MODULES = ("ps", "metrics", "stacks", "diagnose", "run", "config", "snapshot", "replay", "report", "exporter",
                   "rules", "check")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        status = _dispatch(args)
        sys.stdout.flush()  # a full disk under `> FILE` is found here, while there is still a way to say so
        return status
    except UsageError as exc:
        print(f"gpuscope: {printable(str(exc), newlines=True)}", file=sys.stderr)  # may quote others' text
        return 2
    except Failure as exc:
        print(f"gpuscope: {printable(str(exc), newlines=True)}", file=sys.stderr)
        return 1
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


def _dispatch(args: argparse.Namespace) -> int:
    if args.theme is not None:
        theme_check(args.theme)
    if args.command in COMMAND_MODULES:
        # Imported only when used: a command's module (and what it needs) never slows the others.
        return import_module(f"gpuscope.commands.{args.command}").run(args)
    if args.command == "demo":
        from gpuscope.demo.run import run_demo

        return run_demo(args)
    return cmd_console(args)


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


def theme_check(name: str, where: str = "") -> None:
    from gpuscope.theme_files import load_themes

    themes, _ = load_themes()
    if name not in themes:
        raise UsageError(f"unknown theme {name!r}{where}; available: {', '.join(sorted(themes))}")


def settings(args: argparse.Namespace):
    """(the config file, every effective setting): flags, then the environment, the file, the defaults."""
    from pathlib import Path

    from gpuscope.config import ConfigError, load_config, resolve

    given = getattr(args, "config", None)
    flags = {
        "console.refresh_s": getattr(args, "refresh", None),
        "console.theme": getattr(args, "theme", None),
        "service.metrics_url": getattr(args, "metrics_url", None),
        "prometheus.url": getattr(args, "prometheus", None),
        "prometheus.job": getattr(args, "job", None),
        "prometheus.instance": getattr(args, "instance", None),
        "journal.enabled": False if getattr(args, "no_journal", False) else None,
    }
    try:
        config = load_config(Path(given).expanduser() if given else None)
        return config, resolve(config, os.environ, flags)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def alert_thresholds(args: argparse.Namespace):
    """The leak thresholds of the settings' [alerts] section (the defaults where it is silent)."""
    config, _ = settings(args)
    return config.alerts.thresholds()


def console_settings(args: argparse.Namespace):
    """(refresh seconds, theme name, leak thresholds) for a console, the theme checked."""
    config, effective = settings(args)
    theme = effective["console.theme"]
    if theme.origin in ("file", "environment"):  # a flag was checked already; a remembered one may be gone
        theme_check(theme.value, f" (console.theme from {theme.detail})")
    return effective["console.refresh_s"].value, theme.value, config.alerts.thresholds()


def terminal_check() -> None:
    """The console needs a real terminal; say what to use instead when there is none."""
    term = os.environ.get("TERM", "")
    if not (sys.stdin.isatty() and sys.stdout.isatty()) or term in ("", "dumb", "unknown"):
        raise Failure(
            f"this terminal cannot run the console (TERM={term or 'unset'}, "
            f"{'a TTY' if sys.stdout.isatty() else 'not a TTY'}); "
            "use the headless commands instead: 'gpuscope ps --json', 'gpuscope demo --headless'"
        )


CONSOLE_WINDOW_S = 30.0  # the serving signals' rate and quantile window in the console


def serving_source(args: argparse.Namespace, metrics_urls: list[str] | None = None):
    """The console's serving-metrics source from --metrics-url / --prometheus, or None."""
    config, effective = settings(args)
    if metrics_urls:
        urls, prometheus = metrics_urls, None
    elif args.metrics_url or args.prometheus:  # a source on the command line replaces the file's
        urls, prometheus = args.metrics_url, args.prometheus
    else:
        urls = list(config.service.metrics_url)
        prometheus = None if urls else config.prometheus.url
    job, instance = args.job, args.instance
    if prometheus is not None:
        job, instance = effective["prometheus.job"].value, effective["prometheus.instance"].value
    if not urls and not prometheus:
        if job or instance:
            raise UsageError("--job and --instance go with --prometheus")
        return None, None
    from gpuscope.config import ConfigError
    from gpuscope.core.serving import ServingSource, make_collector

    try:
        collector = make_collector(
            window_s=CONSOLE_WINDOW_S, metrics_urls=urls, prometheus=prometheus,
            job=job, instance=instance, config=config,
        )
    except (ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return ServingSource(collector, interval=effective["console.refresh_s"].value), config.slo


def cmd_console(args: argparse.Namespace) -> int:
    refresh, theme, thresholds = console_settings(args)
    if args.pid is not None:
        attach_check(args.pid)
    serving, slo = serving_source(args)
    terminal_check()
    from gpuscope.core.node import NodeSource

    source = NodeSource(interval=refresh, focus_pid=args.pid, thresholds=thresholds)
    return run_console(args, source, serving, slo=slo, theme=theme, thresholds=thresholds, pid=args.pid,
                       interval=refresh)


def run_console(args: argparse.Namespace, source, serving, *, slo, theme: str, thresholds, pid: int | None,
                interval: float, cleanups: Sequence = ()) -> int:
    """Run the live console over `source`, recording the session to its journal."""
    from gpuscope.core.session.format import session_meta
    from gpuscope.core.session.journal import open_session_journal
    from gpuscope.tui.app import GpuScopeApp

    config, effective = settings(args)
    journal = open_session_journal(
        enabled=effective["journal.enabled"].value, keep_days=config.journal.keep_days, max_mb=config.journal.max_mb,
        meta=session_meta("journal", pid=pid, interval_s=interval),
    )
    app = GpuScopeApp(source, theme=theme, serving=serving, slo=slo, journal=journal, thresholds=thresholds)
    for cleanup in (journal.close, *cleanups):  # also when a lost terminal cuts the exit short
        app.add_cleanup(cleanup)
    try:
        app.run()
    finally:
        journal.close()
    if journal.path is not None:
        print(f"gpuscope: session recorded in {journal.path} (gpuscope replay FILE, gpuscope report FILE)", file=sys.stderr)
    return app.return_code or 0
