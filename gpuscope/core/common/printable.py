"""Other people's text made safe to show: no character of it can drive the terminal.

A command line, a working directory, a thread or function name, a metric label, an HTTP reason
phrase, anything read back from a recording: their owners choose every character. Written raw,
an ESC or a C1 control (CSI U+009B, OSC U+009D) starts a sequence that clears the screen,
retitles the window or rewrites the clipboard; a bidi override (U+202E) or a zero-width character
makes text read as something it is not; a newline forges a line of output.

`printable` replaces each such character with one visible character of its own, so the text
stays as long (in code points) as it was and the operator still sees that something was there:
C0 controls and DEL become their Unicode control pictures (ESC is shown as ␛, BEL as ␇, a
newline as ␊), and C1 controls, format characters (bidi overrides, zero-width characters, the
BOM), line and paragraph separators and lone surrogates (undecodable bytes) become U+FFFD (�).
"""

from __future__ import annotations

import re

# Unicode categories Cc (C0, DEL, C1), Cf (format), Cs (surrogates), Zl and Zp, as ranges
# (Unicode 15.1; tests check this against the running Python's unicodedata).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]"
)
REPLACEMENT = "\ufffd"


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # ␀ .. ␟
    if code == 0x7F:
        return "\u2421"  # ␡
    return REPLACEMENT


def _shown_keeping_newlines(match: re.Match[str]) -> str:
    return "\n" if match.group() == "\n" else _shown(match)


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` with every control, format and separator character replaced by a visible one.

    `newlines=True` keeps "\\n" where lines are meant (a multi-line message); everything else,
    tabs and carriage returns included, is always replaced."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_shown_keeping_newlines if newlines else _shown, text)


def shortened(text: str, limit: int) -> str:
    """`text` printable and cut to `limit` characters with "…" (only its first `limit` + 1 are read)."""
    text = printable(text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable_line(text: str, limit: int = 200) -> str:
    """`text` for a one-line message: printable, stripped, and cut to `limit` characters with "…"."""
    text = printable(text[: limit + 1]).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
