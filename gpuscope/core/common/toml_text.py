"""TOML from a file someone may have crafted (settings, themes), parsed in bounded work.

tomllib recurses once a level of nesting (thousands of nested arrays exhaust the stack) and walks
a dotted key from its first part for every further part: `a.a.a... = 1` of 16 KB took 0.5 s, of
1 MB over half an hour; a table header of as many parts makes a table as deep, which every later
walk of it must recurse through. Lines that may hold a key of more than MAX_KEY_PARTS parts are
refused before tomllib sees them.
"""

from __future__ import annotations

import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_KEY_PARTS = 64  # a settings or theme key has two or three


def _long_key(text: str) -> bool:
    """Whether a line may hold a key of more than MAX_KEY_PARTS parts: a table header (`[a.b]`)
    with that many dots, or that many before the line's last `=` (a key ends at its first `=`,
    so they include all of its dots; a value's `=` can only add some)."""
    for line in text.splitlines():
        head = line.lstrip()
        key = head if head.startswith("[") and "," not in head else line.rpartition("=")[0]
        if key.count(".") >= MAX_KEY_PARTS:
            return True
    return False


def parse_toml(text: str) -> dict[str, Any]:
    """TOML, or ValueError with why not (tomllib's own errors are ValueErrors)."""
    if _long_key(text):
        raise ValueError(f"a dotted key of more than {MAX_KEY_PARTS} parts")
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
