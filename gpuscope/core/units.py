"""How sizes and rates read: one formatting for the console, `ps` and reports alike."""

from __future__ import annotations

import math

_UNITS = (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def format_bytes(n: float | None, *, na: str = "N/A") -> str:
    """1536 -> '1.5K', 3.2e9 -> '3.0G'; None or NaN -> 'N/A' (unknown is never shown as 0)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return na
    for unit, size in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{int(n)}B"


def format_rate(bytes_per_s: float | None, *, na: str = "…") -> str:
    """Growth in MB/s with a sign: '+1.25', '-0.40', '0.00'; `na` while there is too little data."""
    if bytes_per_s is None or math.isnan(bytes_per_s):
        return na
    mb = bytes_per_s / 1e6
    if abs(mb) < 0.005:
        return "0.00"
    return f"{mb:+.2f}"
