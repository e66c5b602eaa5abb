"""How deep JSON from elsewhere nests, measured before it is parsed.

json's parser recurses once a level: text nested thousands deep raises RecursionError (in
whatever thread parses it), and text nested hundreds deep costs stack in every later walk. A
caller refuses text deeper than it ever expects, in time linear in the text.
"""

from __future__ import annotations

import re

# With every escaped backslash and then every escaped quote gone, a string runs from a quote to
# the next one (or to the end of the text): one pattern without nested repetition, linear in time
# and in memory. (A pattern that steps over escapes one at a time keeps a mark per escape, and
# one that needs the closing quote retries from each escaped quote of an unterminated string.)
_JSON_STRING = re.compile(rb'"[^"]*(?:"|\Z)')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


def nests_deeper(text: bytes, depth: int) -> bool:
    """Whether JSON `text` nests arrays and objects more than `depth` deep, found without parsing
    it: with the strings gone and only the brackets left, each of `depth` passes removes the
    innermost pairs, `[]`, one level."""
    unescaped = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    shape = _JSON_STRING.sub(b"", unescaped).translate(_ONE_KIND, _NOT_BRACKETS)
    for _ in range(depth):
        if not shape:
            return False
        shape = shape.replace(b"[]", b"")
    return bool(shape)
