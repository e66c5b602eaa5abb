"""Other people's text inside Markdown (reports, the diagnosis as text): nothing in it can break out.

Plain text gets its Markdown characters backslash-escaped, code spans and blocks get a fence
longer than any run of backticks inside them (CommonMark's rule), table cells get their `|`
escaped; everything is made printable first.
"""

from __future__ import annotations

import re

from gpuscope.core.common.printable import printable

# Characters that start Markdown (GitHub's flavour) inline constructs: emphasis, code, links,
# HTML, tables, strikethrough, entities, maths. An underscore only counts at a word's edge.
_INLINE = re.compile(r"[\\`*\[\]<>|~&$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# What starts a block at the beginning of a line: a heading, a list item, a rule (a quote's ">"
# is escaped with the inline characters).
_BLOCK_START = re.compile(r"^(?:[#+=-]|\d+(?=[.)]))")
_BACKTICKS = re.compile(r"`+")


def md_text(text: object, *, line_start: bool = False) -> str:
    """Plain text for Markdown: printable, one line, every inline construct escaped, and at the
    start of a line (`line_start`) whatever would begin a block."""
    escaped = _INLINE.sub(lambda m: "\\" + m.group(), printable(str(text)))
    if not line_start:
        return escaped
    # "#" -> "\#"; "1." -> "1\." (the escape goes before the punctuation)
    return _BLOCK_START.sub(lambda m: m.group() + "\\" if m.group().isdigit() else "\\" + m.group(), escaped)


def md_code(text: str, *, in_table: bool = False, empty: str = "(none)") -> str:
    """A code span that no backtick inside `text` can close; `empty` in italics for no text."""
    text = printable(text)
    if not text:
        return f"*{empty}*"
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(text)), default=0) + 1)
    # A span's content that starts or ends with a backtick or a space needs a space of padding
    # (CommonMark strips one from each side).
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    if in_table:
        text = text.replace("|", "\\|")  # GFM splits cells at | even inside code spans
    return f"{fence}{pad}{text}{pad}{fence}"


def md_block(lines: list[str]) -> list[str]:
    """A fenced code block no line inside can close: the fence outnumbers every backtick run."""
    lines = [printable(line) for line in lines]
    longest = max((len(run) for line in lines for run in _BACKTICKS.findall(line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *lines, fence]
