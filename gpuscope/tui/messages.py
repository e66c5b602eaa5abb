"""Messages from sources to the console."""

from __future__ import annotations

from textual.message import Message

from gpuscope.core.model import Frame


class FrameReady(Message):
    """A new frame to render. If the console is behind, a newer frame replaces a queued one."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FrameReady)
