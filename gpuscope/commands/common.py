"""What several commands share: option types, the service options, and the checks made before a
command starts work (the process, the terminal, the theme).

Light to import: what a check needs is imported when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from gpuscope.errors import Failure, Signalled, UsageError

if TYPE_CHECKING:
    from gpuscope.config import Settings
    from gpuscope.core.serving.source import ServingSource
    from gpuscope.core.session.interface import Session
    from gpuscope.tui.app import GpuScopeApp
    from gpuscope.tui.fleet import FleetView

PID_LIMIT = 2**31  # Linux PIDs stay below 2**22
DAY_S = 86400.0
CONSOLE_WINDOW_S = 30.0  # the serving signals' rate and quantile window in the console (and snapshots)



@contextlib.contextmanager
def signals_raised(seen: Callable[[int], None] = lambda signum: None) -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise `Signalled` (after `seen(signum)`), so the
    `finally` clauses around it stop what the command started; the handlers from before are back
    as the block is left, before those clauses run: a second signal cannot cut a cleanup short."""

    def raised(signum: int, frame: object) -> None:
        seen(signum)
        raise Signalled(signum)

    previous = {s: signal.signal(s, raised) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

def pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"PID must be a whole number, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"PID must be positive, not {value}")
    if value >= PID_LIMIT:
        raise argparse.ArgumentTypeError(f"PID must be below {PID_LIMIT}, not {text}")
    return value


def seconds(minimum: float, maximum: float) -> Callable[[str], float]:
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


def count(maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
        if not 1 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be from 1 to {maximum}, not {value}")
        return value

    return parse


def add_service_arguments(parser: argparse.ArgumentParser, *, required: bool = False, labels: bool = True,
                          scrape_help: str = "the service's /metrics (repeatable)",
                          prometheus_help: str = "a Prometheus server that scrapes the service") -> None:
    """--metrics-url URL... | --prometheus URL [--job J] [--instance I]: where the service's signals are."""
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument("--metrics-url", action="append", metavar="URL", help=scrape_help)
    where.add_argument("--prometheus", metavar="URL", help=prometheus_help)
    if labels:
        parser.add_argument("--job", metavar="J", help="with --prometheus: only this job label")
        parser.add_argument("--instance", metavar="I", help="with --prometheus: only this instance label")


def attach_check(pid: int) -> None:
    """Refuse an unusable --pid before any work starts, saying what to do."""
    from gpuscope.core.node.host import ProcessForbidden, ProcessGone, check_attachable

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


def console_theme(settings: Settings) -> str:
    """The console's theme, checked: a flag was checked when parsed; a remembered one may be gone."""
    theme = settings.effective["console.theme"]
    if theme.origin in ("file", "environment"):
        theme_check(theme.value, f" (console.theme from {theme.detail})")
    return settings.theme


def console_app(session: Session, settings: Settings, *, fleet: FleetView | None = None) -> GpuScopeApp:
    """The console over a live or a recorded session, with the same settings either way."""
    from gpuscope.tui.app import GpuScopeApp  # noqa: PLC0415 - Textual only for the console

    return GpuScopeApp(session, theme=console_theme(settings), slo=settings.slo, thresholds=settings.thresholds,
                       fleet=fleet)


def terminal_check() -> None:
    """The console needs a real terminal; say what to use instead when there is none."""
    term = os.environ.get("TERM", "")
    if not (sys.stdin.isatty() and sys.stdout.isatty()) or term in ("", "dumb", "unknown"):
        raise Failure(
            f"this terminal cannot run the console (TERM={term or 'unset'}, "
            f"{'a TTY' if sys.stdout.isatty() else 'not a TTY'}); "
            "use the headless commands instead: 'gpuscope ps --json', 'gpuscope demo --headless'"
        )


def serving_source(settings: Settings, metrics_urls: list[str] | None = None) -> ServingSource | None:
    """The serving-metrics source of the console (and of diagnose, snapshot): `metrics_urls`, else
    the settings' (--metrics-url / --prometheus, else the file's), or None when there is none."""
    config = settings.config

    def flag(key: str):  # the command line's value, else None
        setting = settings.effective[key]
        return setting.value if setting.origin == "flag" else None

    prometheus: str | None
    if metrics_urls:
        urls, prometheus = list(metrics_urls), None
    elif flag("service.metrics_url") or flag("prometheus.url"):  # a source on the command line replaces the file's
        urls, prometheus = list(flag("service.metrics_url") or ()), flag("prometheus.url")
    else:
        urls = list(config.service.metrics_url)
        prometheus = None if urls else config.prometheus.url
    job, instance = flag("prometheus.job"), flag("prometheus.instance")
    if prometheus is not None:  # the flags, else the environment and the file
        job, instance = settings.value("prometheus.job"), settings.value("prometheus.instance")
    if not urls and not prometheus:
        if job or instance:
            raise UsageError("--job and --instance go with --prometheus")
        return None
    from gpuscope.core.serving.source import ServingSource, make_collector

    try:
        collector = make_collector(
            window_s=CONSOLE_WINDOW_S, metrics_urls=urls or None, prometheus=prometheus,
            job=job, instance=instance, config=config,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return ServingSource(collector, interval=settings.refresh_s)
