"""How sizes, rates and durations read: one formatting for the console, `ps`, reports and the
detector's sentences alike.

One byte convention: binary multiples for sizes (K = 2^10, M = 2^20, G = 2^30; the compact
form in tables, "1.5 GiB" in sentences), as memory is allocated and as the GPU and the kernel
report it. Rates are the exception the alert rules are written in: MB/s, MB = 10^6 bytes
("5 MB/s for 10 s"), everywhere a rate is shown, so a rate reads the same in the table, the
alert bar, the rules and the diagnosis.
"""

from __future__ import annotations

import math
import time

_UNITS = (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def format_bytes(n: float | None, *, sign: bool = False, na: str = "N/A") -> str:
    """1536 -> '1.5K', 3.2e9 -> '3.0G'; None or NaN -> 'N/A' (unknown is never shown as 0);
    `sign`: '+1.5K' (a change)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return na
    plus = "+" if sign and n >= 0 else ""
    for unit, size in _UNITS:
        if abs(n) >= size:
            return f"{plus}{n / size:.1f}{unit}"
    return f"{plus}{int(n)}B"


def format_limit(n: int) -> str:
    """A limit, a round number of binary units: '256 MiB', '64 KiB', '1 GiB' (rounded down)."""
    for unit, size in _UNITS:
        if n >= size:
            return f"{n // size} {unit}iB"
    return f"{n} B"


def format_size(n: float | None, *, sign: bool = False, na: str = "N/A") -> str:
    """A size in a sentence: '2.0 GiB', '340 MiB', '3.4 MiB', '512 KiB', '12 B' (`sign`: '+2.0 GiB')."""
    if n is None or math.isnan(n):
        return na
    s = ("+" if n >= 0 else "-") if sign else ("-" if n < 0 else "")
    a = abs(n)
    for unit, size in _UNITS:
        if a >= size:
            x = a / size
            return f"{s}{x:.1f} {unit}iB" if x < 100 else f"{s}{x:.0f} {unit}iB"
    return f"{s}{a:.0f} B"


def format_rate(bytes_per_s: float | None, *, na: str = "…") -> str:
    """Growth in MB/s with a sign, for a column headed MB/s: '+1.25', '-0.40', '0.00'; `na` while
    there is too little data."""
    if bytes_per_s is None or math.isnan(bytes_per_s):
        return na
    mb = bytes_per_s / 1e6
    if abs(mb) < 0.005:
        return "0.00"
    return f"{mb:+.2f}"


def format_speed(bytes_per_s: float | None, *, na: str = "N/A") -> str:
    """A rate in a sentence, digits by size: '120 MB/s', '2.0 MB/s', '0.14 MB/s', '0.005 MB/s'."""
    if bytes_per_s is None or math.isnan(bytes_per_s):
        return na
    mb = bytes_per_s / 1e6
    a = abs(mb)
    digits = 0 if a >= 100 else 1 if a >= 1 else 2 if a >= 0.01 else 3
    return f"{mb:.{digits}f} MB/s"


def format_duration(seconds: float | None, *, na: str = "?") -> str:
    """'4.5 s', '42 s', '17 min', '3.2 h'; `na` for None or an infinite time."""
    if seconds is None or math.isnan(seconds) or math.isinf(seconds):
        return na
    if seconds < 120:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_latency(seconds: float | None, *, na: str = "-") -> str:
    """A latency: '850 ms', '12 ms', '0.4 ms', '1.25 s', '14.2 s' (three significant digits at most)."""
    if seconds is None or math.isnan(seconds) or math.isinf(seconds):
        return na
    if abs(seconds) < 1:
        ms = seconds * 1000
        return f"{ms:.0f} ms" if abs(ms) >= 1 else f"{ms:.1f} ms"
    return f"{seconds:.2f} s" if abs(seconds) < 10 else f"{seconds:.1f} s" if abs(seconds) < 100 else f"{seconds:.0f} s"


def format_clock(t: float, now: float | None = None) -> str:
    """A wall-clock moment, local time: '09:51:02' on the day of `now`, else '2026-11-30 09:51:02'."""
    moment = time.localtime(t)
    if now is not None and time.localtime(now)[:3] == moment[:3]:
        return time.strftime("%H:%M:%S", moment)
    return time.strftime("%Y-%m-%d %H:%M:%S", moment)


def format_ago(seconds: float) -> str:
    """How long ago: '18 s ago', '4.5 s ago', '17 min ago', 'just now'; never a negative age (a
    moment ahead of the clock, as another host's clock may put it, is 'just now')."""
    if not seconds >= 0.5:  # also NaN
        return "just now"
    return f"{format_duration(seconds)} ago"


def whole_number(text: object, max_digits: int) -> int | None:
    """The number `text` writes in 1 to `max_digits` ASCII digits, else None. For numbers in text
    from elsewhere (labels, headers, files): str.isdigit() also takes digits int() cannot read
    (superscripts, "²"), and int() takes signs, blanks and underscores."""
    if not isinstance(text, str) or not 0 < len(text) <= max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)
