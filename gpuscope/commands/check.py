"""`gpuscope check [--rounds N] [--baseline F] [--tolerance PCT] [--batch] [--junit F] [--json] -- COMMAND...`:
the CI memory gate.

Starts COMMAND (the service) under gpuscope's probe, as `gpuscope run` would, in a session of its
own; or, with `--pid P`, watches a service that already runs. Drives the rounds
(gpuscope.core.gate.run), stops the service it started (SIGTERM to its process group, SIGKILL
after 10 s), judges the rounds against the baseline (gpuscope.core.gate.verdict) and reports
(gpuscope.core.gate.report). COMMAND's and the load command's output goes to stderr, so that
stdout holds only the summary (or the JSON).

Exit status: 0 the gate passes (or the baseline was written), 1 it fails (or the check could not
run the service), 2 bad input (options, a missing or damaged baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from gpuscope import __version__
from gpuscope.commands.common import DAY_S, attach_check, count, pid, seconds, signals_raised
from gpuscope.commands.output import check_output, deliver
from gpuscope.commands.run import launch_env
from gpuscope.config import Settings
from gpuscope.core.gate.verdict import (
    DEFAULT_TOLERANCE_PCT,
    Baseline,
    CheckRun,
    baseline_json,
    judge,
    load_baseline,
)
from gpuscope.core.gate.report import to_json, to_junit, to_markdown, to_text
from gpuscope.core.gate.run import (
    DEFAULT_ROUND_S,
    LOAD_SETTLE_S,
    PROBE_WAIT_S,
    Plan,
    RoundMetrics,
    RunningService,
    StartedService,
    TreeMemory,
    drive,
    drive_batch,
    wait_ready,
)
from gpuscope.core.common.redact import redact_command
from gpuscope.errors import Failure, Signalled, UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start COMMAND (the service) under gpuscope's probe, drive it through rounds and fail (exit 1) when its "
        "memory floor grows per round more than a known-good run's (--baseline F) beyond --tolerance PCT of its "
        "memory, when the leak detector finds a leak outright, or when the service or the load command fails. "
        "A round is one run of --load CMD (it ends when CMD exits), or --round-seconds S of the service's own "
        "work without --load. A round's floor is its lowest memory (RSS of the service's process tree, GPU "
        "memory per device) in the quiet --settle seconds at its end (after the load command has exited); "
        "--warmup-rounds rounds come first and are not judged. Exit 0 pass, 1 fail, 2 bad input."
    )
    parser.add_argument("--rounds", type=count(1000), default=3, metavar="N", help="rounds to judge (default 3)")
    parser.add_argument("--warmup-rounds", type=int, default=1, metavar="N",
                        help="rounds before those, not judged (default 1; 0: the idle service is the reference)")
    parser.add_argument("--load", metavar="CMD", help="shell command run once per round; the round ends when it exits")
    parser.add_argument("--batch", action="store_true",
                        help="COMMAND finishes (a batch job): run it once per round and compare the median of its peak "
                             "memory with the baseline's, within --tolerance")
    parser.add_argument("--round-seconds", type=seconds(1.0, DAY_S), metavar="S",
                        help="without --load: each round lasts S seconds (default 10)")
    parser.add_argument("--settle", type=seconds(0.1, 3600.0), metavar="S",
                        help="the quiet seconds at the end of a round whose lowest memory is its floor "
                             "(default 0.25 after the load command; without --load, the last quarter of the round)")
    parser.add_argument("--round-timeout", type=seconds(1.0, DAY_S), default=900.0, metavar="S",
                        help="fail when a load command runs longer than this (default 900)")
    parser.add_argument("--baseline", metavar="F", help="the baseline file of a known-good run (gpuscope.check-baseline/1)")
    parser.add_argument("--update-baseline", action="store_true",
                        help="write this run to --baseline F instead of comparing (only if the run is healthy)")
    parser.add_argument("--tolerance", type=float, metavar="PCT",
                        help="growth per round allowed beyond the baseline's, in %% of the service's memory floor (default 3)")
    parser.add_argument("--pid", type=pid, help="watch this running service instead of starting COMMAND")
    parser.add_argument("--metrics-url", action="append", metavar="URL",
                        help="the service's /metrics: requests and P95 latency per round (repeatable)")
    parser.add_argument("--ready-url", metavar="URL",
                        help="wait until this answers before the first round (default: the first --metrics-url)")
    parser.add_argument("--ready-timeout", type=seconds(1.0, DAY_S), default=120.0, metavar="S",
                        help="how long to wait for --ready-url (default 120)")
    parser.add_argument("--no-memray", action="store_true",
                        help="do not track allocation sites with memray inside the service")
    parser.add_argument("--json", action="store_true", help="the gpuscope.check/1 JSON object on stdout")
    parser.add_argument("--junit", metavar="F", help="also write JUnit XML to F (a test case per round and criterion)")
    parser.add_argument("--markdown", metavar="F", help="also write a Markdown summary to F (for a CI job summary)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --junit or --markdown file (--update-baseline always replaces the baseline)")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help="the service and its arguments")


def run(args: argparse.Namespace, settings: Settings) -> int:
    command = list(args.program or [])
    if command and command[0] == "--":
        command = command[1:]
    plan, baseline = _plan(args, command, settings)
    metrics = _metrics(args, settings)
    ready_url = args.ready_url or (args.metrics_url[0] if args.metrics_url else None)
    if ready_url:
        _check_url(ready_url, "--ready-url")
    from gpuscope.core.node.nvml import NvmlCollector  # noqa: PLC0415 - imported once the options are good

    def progress(line: str) -> None:
        print(f"gpuscope check: {line}", file=sys.stderr, flush=True)

    if args.batch:
        return _run_batch(args, command, plan, baseline, progress, NvmlCollector)
    service: StartedService | RunningService | None = None
    memory: TreeMemory | None = None
    try:
        with signals_raised():
            service, shown = _start(args, command)
            memory = TreeMemory(service.pid, NvmlCollector(), plan.gpu_interval_s)
            problem = wait_ready(service, ready_url, args.ready_timeout) if ready_url else None
            if problem:
                progress(problem)
                outcome = CheckRun(shown, plan.settings(), (), exit_status=service.shell_status(), stopped=problem,
                                   stopped_by="service")
            else:
                outcome = drive(service, plan, command=shown, memory=memory, metrics=metrics, progress=progress,
                                probe_wait_s=PROBE_WAIT_S if isinstance(service, StartedService) else 0.0)
    except Signalled as sig:
        print(f"gpuscope check: stopped by {sig}", file=sys.stderr)
        return 128 + sig.signum
    finally:
        if isinstance(service, StartedService):
            service.stop()
        if memory is not None:
            memory.close()
    return _report(args, outcome, baseline)


def _run_batch(args: argparse.Namespace, command: list[str], plan: Plan, baseline: Baseline | None,
               progress, nvml_collector) -> int:
    env = launch_env(os.environ)
    program = shutil.which(command[0], path=env.get("PATH")) if os.sep not in command[0] else command[0]
    if program is None or not os.path.exists(program):
        raise UsageError(f"no such program: {command[0]}")

    def start() -> subprocess.Popen:
        try:
            return subprocess.Popen([program, *command[1:]], env=env, stdin=subprocess.DEVNULL,
                                    stdout=sys.stderr.fileno(), start_new_session=True)
        except OSError as exc:
            raise Failure(f"cannot run {command[0]}: {exc.strerror or exc}") from None

    try:
        with signals_raised():
            outcome = drive_batch(start, plan, command=redact_command(command), progress=progress,
                                  memory_of=lambda pid: TreeMemory(pid, nvml_collector(), plan.gpu_interval_s))
    except Signalled as sig:
        print(f"gpuscope check: stopped by {sig}", file=sys.stderr)
        return 128 + sig.signum
    return _report(args, outcome, baseline)


def _plan(args: argparse.Namespace, command: list[str], settings: Settings) -> tuple[Plan, Baseline | None]:
    """Every option checked before anything starts; the baseline read (one line when it is bad)."""
    if args.pid is not None and command:
        raise UsageError("give either --pid P (a service that runs already) or a COMMAND to start, not both")
    if args.pid is None and not command:
        raise UsageError(
            "give the service to run after '--', e.g. gpuscope check --load 'python load.py' -- python serve.py"
        )
    if args.warmup_rounds < 0:
        raise UsageError(f"--warmup-rounds must be 0 or more, not {args.warmup_rounds}")
    if args.tolerance is not None and not 0 <= args.tolerance <= 100:
        raise UsageError(f"--tolerance is a percentage of the service's memory, from 0 to 100, not {args.tolerance:g}")
    if args.load is not None and not args.load.strip():
        raise UsageError("--load needs a command (it runs once per round, through /bin/sh -c)")
    if args.batch and (args.pid is not None or args.load or args.round_seconds is not None or args.settle is not None):
        raise UsageError("--batch runs COMMAND once per round until it exits: without --pid, --load, --round-seconds "
                         "or --settle")
    if args.load and args.round_seconds is not None:
        raise UsageError("--round-seconds is for rounds without --load: with --load a round lasts until the load command exits")
    round_s = args.round_seconds if args.round_seconds is not None else DEFAULT_ROUND_S
    settle = args.settle if args.settle is not None else (LOAD_SETTLE_S if args.load else round_s / 4)
    if not args.load and settle >= round_s:
        raise UsageError(f"--settle ({settle:g} s) must be shorter than a round ({round_s:g} s)")
    if args.update_baseline and not args.baseline:
        raise UsageError("--update-baseline writes the file given with --baseline F")
    # The files come at the end of the rounds: a folder that is not there should not cost a whole check.
    for path, force in ((args.junit, args.force), (args.markdown, args.force),
                        (args.baseline if args.update_baseline else None, True)):
        if path:
            check_output(path, force)
    baseline = None
    if args.baseline and not args.update_baseline:
        baseline = load_baseline(args.baseline)
    first = None
    if baseline is not None and args.load:
        reference = baseline.reference
        first = max(0.0, reference.duration_s - settle) if reference is not None and reference.load_exit is not None else None
    plan = Plan(
        rounds=args.rounds, warmup_rounds=args.warmup_rounds, load=args.load, round_s=round_s, settle_s=settle,
        round_timeout_s=args.round_timeout, memray=not args.no_memray and not args.batch, first_round_s=first,
        thresholds=settings.thresholds, batch=args.batch,
    )
    return plan, baseline


def _metrics(args: argparse.Namespace, settings: Settings) -> RoundMetrics | None:
    if not args.metrics_url:
        return None
    from gpuscope.core.serving.profiles import load_profiles  # noqa: PLC0415
    from gpuscope.core.serving.scrape import ScrapeCollector  # noqa: PLC0415

    try:
        profiles = load_profiles(settings.config)
        return RoundMetrics(lambda window: ScrapeCollector(args.metrics_url, window_s=window, profiles=profiles))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_url(url: str, option: str) -> None:
    from gpuscope.core.serving.exposition import Endpoint  # noqa: PLC0415

    try:
        Endpoint.parse(url)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _start(args: argparse.Namespace, command: list[str]) -> tuple[StartedService | RunningService, str]:
    if args.pid is not None:
        attach_check(args.pid)
        service = RunningService(args.pid)
        try:
            import psutil  # noqa: PLC0415

            shown = redact_command(psutil.Process(args.pid).cmdline()) or f"PID {args.pid}"
        except Exception:
            shown = f"PID {args.pid}"
        return service, f"{shown} (PID {args.pid})"
    env = launch_env(os.environ)
    program = shutil.which(command[0], path=env.get("PATH")) if os.sep not in command[0] else command[0]
    if program is None or not os.path.exists(program):
        raise UsageError(f"no such program: {command[0]}")
    try:
        proc = subprocess.Popen(
            [program, *command[1:]], env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
            start_new_session=True,  # its own process group: stopped whole, and away from the terminal's Ctrl-C
        )
    except OSError as exc:
        raise Failure(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    return StartedService(proc), redact_command(command)


def _report(args: argparse.Namespace, outcome: CheckRun, baseline: Baseline | None) -> int:
    tolerance = DEFAULT_TOLERANCE_PCT if args.tolerance is None else args.tolerance
    verdict = judge(outcome, baseline, tolerance, compare=not args.update_baseline)
    if args.json:
        sys.stdout.write(json.dumps(to_json(outcome, verdict, baseline, tolerance)) + "\n")
    else:
        sys.stdout.write(to_text(outcome, verdict, baseline))
    sys.stdout.flush()
    if args.junit:
        deliver(to_junit(outcome, verdict, baseline), args.junit, args.force)
    if args.markdown:
        deliver(to_markdown(outcome, verdict, baseline), args.markdown, args.force)
    if args.update_baseline:
        if not verdict.passed:
            print(f"gpuscope check: baseline {args.baseline} not written: this run is not a known-good one "
                  f"({verdict.failed[0].message})", file=sys.stderr)
            return 1
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        deliver(json.dumps(baseline_json(outcome, version=__version__, created=created), indent=1) + "\n", args.baseline,
                force=True)
        return 0
    return 0 if verdict.passed else 1
