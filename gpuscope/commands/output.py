"""Where a command's output goes: standard output (no -o, or -o -), or a private file (-o FILE).

-o FILE writes only a regular file, 0600 and atomically (gpuscope.core.common.atomic): a device, a FIFO,
a socket, a folder or a symbolic link is refused, and an existing file is replaced only with
--force. Commands check -o before they start work (`check_output`), so an hour of recording is
never lost to a name that cannot be written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import BinaryIO

from gpuscope.core.common.atomic import RefusedPath, check_target, write_private
from gpuscope.errors import Failure, UsageError

STDOUT = "-"


def add_output_arguments(parser: argparse.ArgumentParser, *, metavar: str, what: str, required: bool = False) -> None:
    """-o FILE and --force, as every command that writes a file has them."""
    parser.add_argument(
        "-o", "--output", metavar=metavar, required=required,
        help=(f"write {what} to this new regular file (mode 0600, written atomically; a device, FIFO, socket, "
              "folder or symbolic link is refused); - for standard output"),
    )
    parser.add_argument("--force", action="store_true", help="with -o: replace the file if it exists (a regular file only)")


def to_stdout(output: str | None) -> bool:
    return output is None or output == STDOUT


def check_output(output: str | None, force: bool) -> None:
    """Refuse an unusable -o FILE before any work is done: UsageError, one line."""
    if to_stdout(output):
        return
    if not output:
        raise UsageError("-o needs a file name (or - for standard output)")
    try:
        check_target(output, replace=force)
    except RefusedPath as exc:
        raise UsageError(refusal(exc)) from None
    if not os.path.isdir(os.path.dirname(output) or "."):
        raise UsageError(f"{output}: no such folder")


def refusal(exc: RefusedPath) -> str:
    """The refusal, with what the user can do instead."""
    return f"{exc} ({'--force replaces it' if exc.exists else '-o writes only regular files; -o - writes to standard output'})"


def write_output(output: str, data: bytes | str | BinaryIO, force: bool) -> Path:
    """Write -o FILE (privately, atomically); UsageError or Failure with one line when it cannot be."""
    try:
        return write_private(output, data, replace=force)
    except RefusedPath as exc:
        raise UsageError(refusal(exc)) from None
    except OSError as exc:
        raise Failure(f"cannot write {output}: {exc.strerror or exc}") from None


def deliver(text: str, output: str | None, force: bool = False) -> None:
    if output is None or to_stdout(output):
        sys.stdout.write(text)
        return
    path = write_output(output, text, force)
    print(f"wrote {path}", file=sys.stderr)
