"""The interface every frame source offers the console: the live node, and later a replay.

The console calls these and renders the frames it is handed; it never reads a collector itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gpuscope.core.diagnosis import Evidence
from gpuscope.core.model import Frame


class Source(Protocol):
    kind: str  # "live" or "replay"

    def start(self, on_frame: Callable[[Frame], None]) -> None:
        """Begin delivering frames to `on_frame` (called from a background thread)."""

    def stop(self) -> None:
        """Stop delivering frames and release everything the source holds."""

    def select(self, pid: int | None) -> None:
        """Chart this process's memory in the next frames (and send one promptly)."""

    def focus(self, pid: int | None) -> None:
        """Attach to this process: its details come in every frame (None detaches)."""

    def evidence(self, pid: int, seconds: float) -> Evidence:
        """What was recorded of this process over the last `seconds`, for the diagnosis wizard."""
