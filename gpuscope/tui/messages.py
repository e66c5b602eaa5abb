"""Messages to the console: from its session (frames, serving snapshots) and from its workers."""

from __future__ import annotations

from textual.message import Message

from gpuscope.core.node.model import Frame
from gpuscope.core.serving.model import ServingSnapshot


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


# -- from worker threads (py-spy, the attribution ladder, exports) to the screen that started them.
# A worker posts and goes on; it never waits for the UI. A message that reaches a screen already
# closed is dropped with it.


class WorkProgress(Message):
    """How far a worker is (0..1), a line saying what it does, and how many allocation sites it
    has seen so far where it counts them (newer replaces a queued one)."""

    def __init__(self, fraction: float | None, line: str | None = None, sites: int | None = None) -> None:
        super().__init__()
        self.fraction = fraction
        self.line = line
        self.sites = sites

    def can_replace(self, message: Message) -> bool:
        # A queued count of sites is only replaced by a newer count, never by a bare fraction.
        return isinstance(message, WorkProgress) and (message.sites is None or self.sites is not None)


class CodePathRead(Message):
    """A worker's result: a StackDump, a StackSample or an Attribution."""

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value


class WorkFailed(Message):
    """A worker's one line on why it found nothing (the target's text: shown as plain text)."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class SnapshotExported(Message):
    """`e`: the snapshot file is written."""

    def __init__(self, path: object) -> None:
        super().__init__()
        self.path = path


class ExportFailed(Message):
    """`e`: the snapshot could not be written; one line why."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason
