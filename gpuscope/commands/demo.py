"""`gpuscope demo [--headless] [--duration S] [--json]`: start the leaking sample RAG service under
load and watch it.

Interactive, the console attaches to the service. Headless, it diagnoses the service as
`gpuscope diagnose` would and prints the report (text, or the gpuscope.diagnosis/1 JSON).
Everything started here is stopped here, whatever ends the demo (gpuscope.demo.run.Demo).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from gpuscope.commands.common import DAY_S, console_theme, seconds, serving_source, terminal_check
from gpuscope.errors import GpuscopeError, Signalled

if TYPE_CHECKING:
    from gpuscope.config import Settings
    from gpuscope.demo.run import Demo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Start the sample RAG service (whose retriever leaks) under load and attach the console to it."
    parser.add_argument("--headless", action="store_true", help="no console: print what it would tell")
    parser.add_argument(
        "--duration", type=seconds(1.0, DAY_S), default=20.0, metavar="S", help="seconds to watch when headless (default 20)"
    )
    parser.add_argument("--json", action="store_true", help="with --headless: print JSON")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from gpuscope.demo.run import Demo, cuda_usable

    headless = bool(args.headless or args.json)  # JSON is for scripts
    if not headless:
        terminal_check()  # before anything starts: no terminal, nothing to clean up, one line to read

    stop = threading.Event()
    previous: dict[int, Any] = {}

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        raise Signalled(signum)  # unwinds through the finally below, which stops the children

    demo: Demo | None = None
    try:
        for caught in (signal.SIGTERM, signal.SIGHUP):
            if headless:
                previous[caught] = signal.signal(caught, on_signal)
        demo = Demo(cuda=cuda_usable())
        demo.start()
        if headless:
            return _headless(demo, args, settings, stop)
        return _console(demo, settings)
    except Signalled as sig:
        return 128 + sig.signum
    except GpuscopeError:
        raise  # one plain line, from the command line
    except Exception as exc:  # anything else is still one line, never a traceback
        print(f"gpuscope: demo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        # Signals during cleanup must not interrupt it: the handlers are removed first.
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if demo is not None:
            demo.stop()


def _headless(demo: Demo, args: argparse.Namespace, settings: Settings, stop: threading.Event) -> int:
    """The diagnosis of the demo service, as `gpuscope diagnose` would print it."""
    from gpuscope.commands.diagnose import emit
    from gpuscope.core.diagnosis.steps import diagnose
    from gpuscope.core.diagnosis.investigation import investigate
    from gpuscope.demo.run import DemoError

    assert demo.service is not None
    serving = serving_source(settings, [f"{demo.url}/metrics"])
    evidence = investigate(
        demo.service.pid, args.duration, serving=serving, stop=stop,
        progress=lambda line: print(f"demo service at {demo.url}: {line}", file=sys.stderr, flush=True),
    )
    if evidence.exited:
        raise DemoError(f"the demo service (PID {demo.service.pid}) exited while being watched")
    return emit(diagnose(evidence, settings.thresholds), args)


def _console(demo: Demo, settings: Settings) -> int:
    from gpuscope.commands.console import run_console
    from gpuscope.core.node.live import NodeSource

    assert demo.service is not None
    console_theme(settings)  # a theme that is gone is said before the console starts
    source = NodeSource(interval=settings.refresh_s, focus_pid=demo.service.pid, thresholds=settings.thresholds)
    serving = serving_source(settings, [f"{demo.url}/metrics"])
    # The console ends itself cleanly on SIGTERM / SIGHUP; run's finally then stops the children.
    # If the terminal is lost and that exit cannot finish, the app runs demo.stop itself.
    return run_console(settings, source, serving, pid=demo.service.pid, cleanups=(demo.stop,))
