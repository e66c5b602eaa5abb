"""Messages from sources to the console."""

from __future__ import annotations

from textual.message import Message

from gpuscope.core.model import Frame
from gpuscope.core.serving_model import ServingSnapshot


class FrameReady(Message):
    """A new frame to render. If the console is behind, a newer frame replaces a queued one."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FrameReady)


class ServingReady(Message):
    """A new snapshot of the service's signals (newer replaces a queued one)."""

    def __init__(self, snapshot: ServingSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ServingReady)
