"""`gpuscope ramp --target URL [--chat | --body F | --template T | --load-command CMD] [--metrics-url URL]
[--pid P | -- COMMAND]`: rising load until the service's P99 breaks; the critical throughput.

Drives the load (gpuscope.core.ramp.drive), measuring the service's signals (its /metrics), the
client's own latencies and the service's memory (with --pid, or COMMAND started under gpuscope's
probe as `gpuscope check` starts it); then reports (gpuscope.core.ramp.report). Ctrl+C or SIGTERM
stops the load at once; what was measured is still reported and written.

Exit status: 0 the ramp ran (a knee found or not), 1 the knee is below --min-rps or the ramp could
not run, 2 bad input; 130 (143 on SIGTERM) after an interrupt, with the report written.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys

from gpuscope.commands.common import DAY_S, add_service_arguments, attach_check, pid, seconds, signals_raised
from gpuscope.commands.output import check_output, deliver
from gpuscope.commands.run import launch_env
from gpuscope.config import Settings
from gpuscope.errors import Failure, Signalled, UsageError

DEFAULT_CONCURRENCY = 64


def _positive(maximum: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
        if not 0 < value <= maximum:
            raise argparse.ArgumentTypeError(f"must be above 0 and at most {maximum:g}, not {text}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Drive a service with rising load in steps and stop by itself when its P99 breaks: a P99 every --interval "
        "seconds, each judged against the --baseline-points before it (a one-sided CUSUM increment over --threshold "
        "standard deviations with a --drift allowance); --breaks breaks in a row hold the load for a --watch; one "
        "more break ends the ramp and marks the critical throughput. Never past --max-rps, --max-time or "
        "--max-error-rate. Each step reports P95/P99 from the service's histograms (--metrics-url) and measured by "
        "gpuscope, TTFT, tokens/s, errors, queue, and the service's memory (--pid, or COMMAND after --) grown per "
        "request. Exit 0 when the ramp ran, 1 when the knee is below --min-rps or it could not run, 2 bad input."
    )
    load = parser.add_argument_group("the load")
    load.add_argument("--target", metavar="URL", help="where requests go (GET without a body; POST with one)")
    load.add_argument("--body", metavar="FILE", help="POST this file's bytes with every request")
    load.add_argument("--template", metavar="TEXT", help="POST this text, {n} replaced by the request's number")
    load.add_argument("--method", choices=("GET", "POST", "PUT"), help="the HTTP method (default GET, POST with a body)")
    load.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'", help="a request header (repeatable)")
    load.add_argument("--chat", action="store_true",
                      help="--target is an OpenAI-compatible /v1/chat/completions: multi-turn conversations")
    load.add_argument("--model", default="default", help="with --chat: the model named in requests (default 'default')")
    load.add_argument("--turns", type=int, default=4, metavar="N", help="with --chat: turns per conversation (default 4)")
    load.add_argument("--max-tokens", type=int, default=64, metavar="N", help="with --chat: max_tokens per answer (default 64)")
    load.add_argument("--load-command", metavar="CMD",
                      help="your load tool instead, run for each step with {rate} replaced by its requests per second")
    load.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N",
                      help=f"requests in flight at most (default {DEFAULT_CONCURRENCY})")
    load.add_argument("--timeout", type=seconds(0.1, 3600.0), default=30.0, metavar="S", help="per request (default 30)")
    steps = parser.add_argument_group("the steps and the limits")
    steps.add_argument("--start-rps", type=_positive(1e6), default=1.0, metavar="R", help="the first step's load (default 1)")
    steps.add_argument("--step-rps", type=_positive(1e6), default=1.0, metavar="R", help="added at each step (default 1)")
    steps.add_argument("--step-seconds", type=seconds(0.1, DAY_S), default=15.0, metavar="S",
                       help="a step's length, in whole intervals (default 15; the first step is the whole baseline)")
    steps.add_argument("--max-rps", type=_positive(1e6), default=100.0, metavar="R", help="never ask more (default 100)")
    steps.add_argument("--max-time", type=seconds(1.0, DAY_S), default=600.0, metavar="S", help="end by then (default 600)")
    steps.add_argument("--max-error-rate", type=float, default=5.0, metavar="PCT",
                       help="end when a step's errors pass this share of its finished requests (default 5)")
    steps.add_argument("--min-rps", type=float, metavar="R", help="exit 1 when the critical throughput is below R (for CI)")
    rule = parser.add_argument_group("the stop rule")
    rule.add_argument("--interval", type=seconds(0.2, 3600.0), default=5.0, metavar="S", help="seconds per P99 (default 5)")
    rule.add_argument("--baseline-points", type=int, default=12, metavar="N", help="P99s in the baseline (default 12)")
    rule.add_argument("--threshold", type=_positive(1000.0), default=3.2, metavar="SD", help="a break, in standard deviations (default 3.2)")
    rule.add_argument("--drift", type=float, default=0.5, metavar="SD", help="allowance per point (default 0.5)")
    rule.add_argument("--breaks", type=int, default=3, metavar="N", help="breaks in a row that start the watch (default 3)")
    rule.add_argument("--watch", type=seconds(0.1, DAY_S), default=30.0, metavar="S",
                      help="the watch: one more break in it ends the ramp (default 30)")
    rule.add_argument("--min-spread", type=float, default=5.0, metavar="PCT",
                      help="the standard deviation is at least this share of the baseline's mean (default 5)")
    add_service_arguments(parser, scrape_help="the service's /metrics: its own P95/P99, TTFT, queue... (repeatable)",
                          prometheus_help="or a Prometheus server that scrapes the service (more often than --interval)")
    where = parser.add_argument_group("the service")
    where.add_argument("--pid", type=pid, help="the service's process: its memory per request")
    where.add_argument("--no-memray", action="store_true", help="do not track allocation sites with memray inside the service")
    where.add_argument("--ready-timeout", type=seconds(1.0, DAY_S), default=120.0, metavar="S",
                       help="how long to wait for a started COMMAND to answer (default 120)")
    out = parser.add_argument_group("the result")
    out.add_argument("--json", action="store_true", help="the gpuscope.ramp/1 JSON object on stdout")
    out.add_argument("--markdown", metavar="F", help="also write Markdown with a chart to F")
    out.add_argument("--junit", metavar="F", help="also write JUnit XML to F (a test case per step, and the knee)")
    out.add_argument("--force", action="store_true", help="replace an existing --markdown or --junit file")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                        help="start the service too (under gpuscope's probe); it is stopped at the end")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from gpuscope.core.gate.run import StartedService, RunningService, TreeMemory, wait_ready  # noqa: PLC0415
    from gpuscope.core.ramp.drive import drive  # noqa: PLC0415
    from gpuscope.core.ramp.load import ClientTally, LoadCommand, RequestLoad  # noqa: PLC0415
    from gpuscope.core.ramp.report import to_json, to_junit, to_markdown, to_text  # noqa: PLC0415

    command = list(args.program or [])
    if command and command[0] == "--":
        command = command[1:]
    plan, load, target, mode = _plan(args, command)
    for path in (args.markdown, args.junit):
        if path:
            check_output(path, args.force)
    metrics = _spans(args, settings)

    def progress(line: str) -> None:
        print(f"gpuscope ramp: {line}", file=sys.stderr, flush=True)

    tally = ClientTally()
    caught: list[int] = []
    service: StartedService | RunningService | None = None
    memory = None
    try:
        with signals_raised(caught.append):
            if args.pid is not None:
                attach_check(args.pid)
                service = RunningService(args.pid)
            elif command:
                service = _start(command)
            if service is not None:
                from gpuscope.core.node.nvml import NvmlCollector  # noqa: PLC0415

                memory = TreeMemory(service.pid, NvmlCollector(), 1.0)
            if isinstance(service, StartedService):
                ready = args.metrics_url[0] if args.metrics_url else (target if not args.load_command else None)
                problem = wait_ready(service, ready, args.ready_timeout) if ready else None
                if problem:
                    raise Failure(problem)
            if not isinstance(load, LoadCommand):
                problem = load.target.unreachable(min(args.timeout, 10.0))
                if problem:
                    raise Failure(problem)
            driven = load if isinstance(load, LoadCommand) else RequestLoad(load, tally, workers=args.concurrency,
                                                                            timeout_s=args.timeout)
            result = drive(plan, driven, tally, target=target, mode=mode, memory=memory, metrics=metrics, service=service,
                           progress=progress)
    except Signalled as sig:  # before the ramp began: nothing measured
        progress(f"stopped by {sig}")
        return 128 + sig.signum
    finally:
        if isinstance(service, StartedService):
            service.stop()
        if memory is not None:
            memory.close()
    sys.stdout.write(to_json(result) + "\n" if args.json else to_text(result))
    sys.stdout.flush()
    if args.markdown:
        deliver(to_markdown(result), args.markdown, args.force)
    if args.junit:
        deliver(to_junit(result), args.junit, args.force)
    if result.stopped_by == "interrupted":
        return 128 + (caught[-1] if caught else signal.SIGINT)
    if args.min_rps is not None and result.knee is not None and result.knee.critical_rps < args.min_rps:
        print(f"gpuscope ramp: the critical throughput ({result.knee.critical_rps:.2f}/s) is below --min-rps "
              f"{args.min_rps:g}", file=sys.stderr)
        return 1
    return 0


def _spans(args: argparse.Namespace, settings: Settings):
    """Where the service's signals come from: its /metrics, a Prometheus server, or nowhere (None)."""
    from gpuscope.core.gate.run import RoundMetrics  # noqa: PLC0415
    from gpuscope.core.ramp.drive import PrometheusSpans  # noqa: PLC0415
    from gpuscope.core.serving.profiles import load_profiles  # noqa: PLC0415
    from gpuscope.core.serving.scrape import ScrapeCollector  # noqa: PLC0415
    from gpuscope.core.serving.source import make_collector  # noqa: PLC0415

    if (args.job or args.instance) and not args.prometheus:
        raise UsageError("--job and --instance filter a Prometheus server's series: use them with --prometheus")
    try:
        if args.metrics_url:
            profiles = load_profiles(settings.config)
            ScrapeCollector(args.metrics_url, window_s=1.0, profiles=profiles)  # the URLs checked now
            return RoundMetrics(lambda window: ScrapeCollector(args.metrics_url, window_s=window, profiles=profiles))
        if args.prometheus:
            make_collector(window_s=1.0, prometheus=args.prometheus, job=args.job, instance=args.instance,
                           config=settings.config).close()
            return PrometheusSpans(lambda window: make_collector(
                window_s=window, prometheus=args.prometheus, job=args.job, instance=args.instance, config=settings.config))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return None


def _plan(args: argparse.Namespace, command: list[str]):
    from gpuscope.core.ramp.drive import Plan  # noqa: PLC0415
    from gpuscope.core.ramp.load import ChatRequests, HttpRequests, LoadCommand, LoadError, Target, parse_header, read_body_file  # noqa: PLC0415
    from gpuscope.core.ramp.rule import StopRule  # noqa: PLC0415

    if args.pid is not None and command:
        raise UsageError("give either --pid P (a service that runs already) or a COMMAND to start, not both")
    if not args.target and not args.load_command:
        raise UsageError("give --target URL (gpuscope sends the load) or --load-command CMD (your load tool, with {rate})")
    if args.load_command and (args.chat or args.body or args.template):
        raise UsageError("--load-command drives the load itself: --chat, --body and --template are for gpuscope's own")
    if args.load_command and not (args.metrics_url or args.prometheus):
        raise UsageError("with --load-command, gpuscope sees latency only in the service's histograms: "
                         "give --metrics-url or --prometheus")
    if args.chat and (args.body or args.template):
        raise UsageError("--chat writes its own requests: no --body or --template with it")
    if not 0 <= args.max_error_rate <= 100:
        raise UsageError(f"--max-error-rate is a percentage from 0 to 100, not {args.max_error_rate:g}")
    if not 0 <= args.min_spread <= 100:
        raise UsageError(f"--min-spread is a percentage from 0 to 100, not {args.min_spread:g}")
    try:
        rule = StopRule(args.interval, args.baseline_points, args.threshold, args.drift, args.breaks, args.watch,
                        args.min_spread / 100)
        plan = Plan(args.start_rps, args.step_rps, args.step_seconds, args.max_rps, args.max_time,
                    args.max_error_rate / 100, rule, memray=not args.no_memray)
        if args.load_command:
            shown = LoadCommand(args.load_command)
            return plan, shown, shown.shown, "command"
        target = Target.parse(args.target)
        headers = dict(parse_header(h) for h in args.header)
        if args.chat:
            if not 1 <= args.max_tokens <= 1 << 20:
                raise UsageError(f"--max-tokens must be from 1 to {1 << 20}, not {args.max_tokens}")
            return plan, ChatRequests(target, model=args.model, turns=args.turns, max_tokens=args.max_tokens,
                                      headers=headers), target.shown, "chat"
        body = read_body_file(args.body) if args.body else None
        return plan, HttpRequests(target, body=body, template=args.template, method=args.method,
                                  headers=headers), target.shown, "http"
    except (ValueError, LoadError) as exc:
        raise UsageError(str(exc)) from None


def _start(command: list[str]):
    from gpuscope.core.gate.run import StartedService  # noqa: PLC0415

    env = launch_env(os.environ)
    program = shutil.which(command[0], path=env.get("PATH")) if os.sep not in command[0] else command[0]
    if program is None or not os.path.exists(program):
        raise UsageError(f"no such program: {command[0]}")
    try:
        proc = subprocess.Popen([program, *command[1:]], env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                                start_new_session=True)
    except OSError as exc:
        raise Failure(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    return StartedService(proc)
