"""gpuscope's errors: every exception gpuscope raises derives from `GpuscopeError`.

The command line catches them once (`gpuscope.cli.main`) and prints the message as one plain
line (printable: it may quote other people's text), then exits with the error's `exit_code`.
"""

from __future__ import annotations

import signal


class GpuscopeError(Exception):
    """An error gpuscope knows how to report: one plain line, exit status `exit_code`."""

    exit_code = 1


class UsageError(GpuscopeError):
    """Bad input (an option, a file, a setting): exit status 2."""

    exit_code = 2


class Failure(GpuscopeError):
    """Something the user must fix (no such process, no terminal): exit status 1."""


class Signalled(GpuscopeError):
    """A signal (SIGTERM, SIGHUP) ends a command: raised from its handler so that the `finally`
    blocks on the way out stop what the command started; exit status 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum
