"""Where a command's report goes: stdout, or a private file written atomically (-o FILE)."""

from __future__ import annotations

import sys

from gpuscope.core.atomic import write_private
from gpuscope.errors import Failure


def deliver(text: str, output: str | None) -> None:
    if output:
        try:
            path = write_private(output, text)
        except OSError as exc:
            raise Failure(f"cannot write {output}: {exc.strerror or exc}") from None
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
