"""How deep JSON from elsewhere nests, and how many values it holds, measured before it is parsed.

json's parser recurses once a level: text nested thousands deep raises RecursionError (in
whatever thread parses it), and text nested hundreds deep costs stack in every later walk. A
caller refuses text deeper than it ever expects, or holding more values, in time and memory
linear in the text.
"""

from __future__ import annotations

# With every escaped backslash and then every escaped quote gone, a string runs from a quote to
# the next one (or to the end of the text). The text is cut at its quotes a piece at a time: cut
# whole, or by a pattern's substitution, 16 MiB of empty strings made 5.5 million pieces at once
# (929 MB). (A pattern that steps over escapes one at a time keeps a mark per escape, and one that
# needs the closing quote retries from each escaped quote of an unterminated string.)
_PIECE = 1 << 16
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


def _without_strings(text: bytes) -> bytes:
    unescaped = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = bytearray()
    inside = False  # in a string where this piece begins
    for start in range(0, len(unescaped), _PIECE):
        parts = unescaped[start:start + _PIECE].split(b'"')
        kept += b"".join(parts[1 if inside else 0::2])
        inside ^= len(parts) % 2 == 0  # an odd number of quotes in the piece
    return bytes(kept)


def nests_deeper(text: bytes, depth: int) -> bool:
    """Whether JSON `text` nests arrays and objects more than `depth` deep, found without parsing
    it: with the strings gone and only the brackets left, each of `depth` passes removes the
    innermost pairs, `[]`, one level."""
    return _deeper(_without_strings(text), depth)


def _deeper(bare: bytes, depth: int) -> bool:
    shape = bare.translate(_ONE_KIND, _NOT_BRACKETS)
    for _ in range(depth):
        if not shape:
            return False
        shape = shape.replace(b"[]", b"")
    return bool(shape)


# Values a caller parses from elsewhere at most. What a value costs once parsed does not follow its
# size in the text: "{}," is 3 bytes and 72 once parsed (an empty object and its place in a list),
# so 16 MiB of them took 420 MB. This many values hold under 100 MB whatever they are (strings'
# text aside, which is no larger than what was sent; an object's distinct keys cost most); the
# answers gpuscope asks for hold far fewer (a probe's tracking reply, 200 stacks of 3,600
# readings, about 800,000).
MAX_VALUES = 1_000_000


def values_in(text: bytes) -> int:
    """At most how many values JSON `text` holds, counted without parsing it: with the strings gone,
    the whole, then an element for each array or object (its first) and for each comma and colon
    (a key and its value are two)."""
    return _values(_without_strings(text))


def _values(bare: bytes) -> int:
    return 1 + bare.count(b"[") + bare.count(b"{") + bare.count(b",") + bare.count(b":")


def too_large(text: bytes, depth: int) -> str | None:
    """Why JSON `text` from elsewhere must not be parsed ("nested more than `depth` deep", "of more
    than MAX_VALUES values"), or None: both checks over one pass that takes the strings out."""
    bare = _without_strings(text)
    if _deeper(bare, depth):
        return f"nested more than {depth} deep"
    if _values(bare) > MAX_VALUES:
        return f"of more than {MAX_VALUES:,} values"
    return None
