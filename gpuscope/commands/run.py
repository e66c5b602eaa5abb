"""`gpuscope run [--] COMMAND [ARGS...]` and `gpuscope run --inject --pid PID [--memray]`.

The first runs a program with gpuscope's probe started in every Python process it starts, before
the program's main module runs. The launcher puts `gpuscope/_probe_boot/` first on PYTHONPATH (its
`sitecustomize.py` starts the probe, then runs any sitecustomize it shadows) and then *replaces
itself* with the program (exec): the program keeps gpuscope's PID, its arguments, its terminal and
its process group, gets every signal (SIGINT, SIGTERM, SIGHUP, ...) directly, and its exit status
(or the signal that killed it, 128+N to a shell) is the command's. Nothing stays between the
shell and the service to forward or lose signals.

Why sitecustomize rather than a `python -c` bootstrap + runpy: it works whatever the command is —
`python serve.py`, `python -m vllm...`, a console script such as `vllm serve` or `uvicorn`, a
shell script that ends in python — and in the worker processes the service spawns (vLLM's engine
core, which holds the GPU memory, is a child process), each of which gets a probe under its own
PID. It is not seen by an interpreter started with -I, -E or -S (those ignore PYTHONPATH or site).

The second starts the probe inside a running process (see gpuscope.core.target.inject): opt-in, with a
warning, refused with one line where it is unsafe.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from gpuscope.commands.common import pid
from gpuscope.config import Settings
from gpuscope.core.common.redact import without_own_secrets
from gpuscope.errors import Failure, UsageError

BOOT_DIR = Path(__file__).resolve().parent.parent / "_probe_boot"


def launch_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The program's environment: the caller's less gpuscope's own credentials, with the probe's
    start-up folder first on PYTHONPATH."""
    env = without_own_secrets(environ)
    boot = str(BOOT_DIR)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot, *rest])
    return env



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a program with gpuscope's probe started in each of its Python processes before the main module "
        "runs (gpuscope run -- python serve.py ...): gpuscope then reads PyTorch's allocator and tracks "
        "allocations in-process. The program replaces gpuscope (same PID, signals and exit status). "
        "With --inject --pid PID: start the probe inside a running Python process instead (runs code inside it; "
        "only if it has imported torch, unless --memray)."
    )
    parser.add_argument("--inject", action="store_true", help="start the probe inside the running process --pid (opt-in)")
    parser.add_argument("--pid", type=pid, help="with --inject: the running Python process")
    parser.add_argument("--memray", action="store_true",
                        help="with --inject: start the probe even if torch is not imported (for memray tracking)")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help="the program and its arguments")


def run(args: argparse.Namespace, settings: Settings) -> int:
    command = list(args.program or [])
    if command and command[0] == "--":
        command = command[1:]
    if args.inject:
        if command:
            raise UsageError("--inject attaches to a running process: give --pid PID, not a command")
        if args.pid is None:
            raise UsageError("--inject needs --pid PID (the running Python process to start the probe in)")
        return inject(args.pid, anyway=args.memray)
    if args.pid is not None or args.memray:
        raise UsageError("--pid and --memray go with --inject")
    if not command:
        raise UsageError("give the program to run, e.g. 'gpuscope run -- python serve.py --port 8000'")
    env = launch_env(os.environ)
    program = shutil.which(command[0], path=env.get("PATH")) if os.sep not in command[0] else command[0]
    if program is None or not os.path.exists(program):
        print(f"gpuscope: no such program: {command[0]}", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(program, command, env)
    except OSError as exc:
        print(f"gpuscope: cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 126
    return 0  # not reached


def inject(pid: int, *, anyway: bool) -> int:
    from gpuscope.core.target.inject import WARNING, InjectRefused, inject_probe

    def warn() -> None:
        print(f"gpuscope: warning: {WARNING.format(pid=pid)}", file=sys.stderr, flush=True)

    print(f"gpuscope: checking whether the probe can be started safely inside process {pid}...", file=sys.stderr, flush=True)
    try:
        done = inject_probe(pid, anyway=anyway, warn=warn)
    except InjectRefused as exc:
        raise Failure(f"refused: {exc}") from None
    if done.method == "already running":
        print(f"process {pid} already has a probe: {done.path}")
    else:
        print(f"probe started in process {pid} (through {done.method}): {done.path}")
    return 0
