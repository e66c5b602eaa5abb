"""Waiting in a console test for what it expects, not for a time: the app runs (its pending
messages and timers) between each look, until the condition holds or a generous deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE_S = 30.0


async def until(pilot, condition: Callable[[], T], what: str = "the condition", timeout: float = DEADLINE_S) -> T:
    """Poll `condition()` with `pilot.pause()` until it is truthy (its value returned); fail, never
    hang, after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await pilot.pause()
        await pilot.pause(0.02)  # a timer or another thread may be what the condition waits on
