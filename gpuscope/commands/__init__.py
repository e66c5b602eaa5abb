"""One module per command (console.py: gpuscope without one), each a `Command`.

The command line (gpuscope.cli) gives a command's module its subparser, then calls `run` with
the parsed arguments and the run's settings, read once. Modules import what their work needs
inside `run`, so that parsing one command never imports another's dependencies.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpuscope.config import Settings


class Command(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, settings: Settings) -> int: ...
