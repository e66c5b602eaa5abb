"""Process lifetime helpers shared by the demo's child processes (service and load generator).

A demo child must never outlive the `gpuscope demo` that started it: the parent stops it
explicitly, and as a second line of defence each child watches its parent PID and stops itself
when it changes (the parent died, even by SIGKILL, and the child was re-parented).
"""

from __future__ import annotations

import os
import signal
import threading

PARENT_POLL_S = 0.5
# Set by the parent to its own PID: a child whose parent died before the child got as far as
# looking (the child was still importing) would otherwise take its new parent for the original.
PARENT_ENV = "GPUSCOPE_DEMO_PARENT_PID"


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a demo child: this process's, plus its PID for the watchdog."""
    env = dict(os.environ if environ is None else environ)
    env[PARENT_ENV] = str(os.getpid())
    return env


def watch_parent(stop: threading.Event, interval: float = PARENT_POLL_S) -> threading.Thread:
    """Set `stop` once this process's parent is gone. Returns the (daemon) watcher thread."""
    original = os.getppid()
    expected = os.environ.pop(PARENT_ENV, "")  # meant for this process, not its own children
    if expected.isdigit() and int(expected) != original:
        stop.set()  # orphaned before it could look

    def run() -> None:
        while not stop.wait(interval):
            if os.getppid() != original:
                stop.set()
                return

    thread = threading.Thread(target=run, name="parent-watchdog", daemon=True)
    thread.start()
    return thread


def stop_on_signals(stop: threading.Event, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)) -> None:
    """SIGTERM / SIGINT / SIGHUP set `stop` (the main thread then shuts down cleanly) instead of killing."""

    def handler(signum: int, frame: object) -> None:
        stop.set()

    for signum in signals:
        signal.signal(signum, handler)
