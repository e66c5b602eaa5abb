"""The one interface the console works with, live or replayed: a `Session`.

A session sends frames and serving snapshots, answers for the evidence of a process, keeps what
was found (stack dumps, hot paths, allocation sites, diagnoses) and writes snapshots. What a
session can do beyond that is said by its capability flags, never by its name: the console asks
`can_attach` before reading a process's stacks, `can_seek` before moving a time cursor.

A `Source` is what a live session samples: the node (gpuscope.core.node.live.NodeSource) or a test's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuscope.core.leak import LeakThresholds
from gpuscope.core.node.model import Frame, MemorySeries
from gpuscope.core.serving.model import ServingSnapshot

if TYPE_CHECKING:  # the diagnosis is imported when one is made: the console starts without it
    from gpuscope.core.diagnosis.attribution import Attribution
    from gpuscope.core.diagnosis.steps import Diagnosis, Evidence


class Source(Protocol):
    """A live frame source."""

    def start(self, on_frame: Callable[[Frame], None], on_sample: Callable[[Frame], None] | None = None) -> None:
        """Begin delivering frames to `on_frame` (from a background thread). `on_sample` is called
        once for each sample when it is taken, before it is shown; a frame shown again (another
        process selected, a read that failed) goes to `on_frame` only."""

    def stop(self) -> None:
        """Stop delivering frames and release everything the source holds."""

    def select(self, pid: int | None) -> None:
        """Chart this process's memory in the next frames (and send one promptly)."""

    def focus(self, pid: int | None) -> None:
        """Attach to this process: its details come in every frame (None detaches)."""

    def latest_frame(self) -> tuple[Frame | None, float]:
        """The latest frame (None before the first sample) and the time it stands for."""

    def history(self, pid: int, seconds: float, now: float | None = None) -> MemorySeries | None:
        """What was sampled of this process's memory over the last `seconds`."""

    def device_history(self, index: int, seconds: float, now: float | None = None) -> tuple[list[float], list[float | None]]:
        """What was sampled of GPU `index`'s used memory over the last `seconds`."""


class Session(ABC):
    """What the console shows and asks: a live node or a recording behind the same methods."""

    is_live: bool = False  # the frames are the node now: a diagnosis is made, and recorded
    can_attach: bool = False  # processes may be read (py-spy stacks, hot paths, allocation sites)
    can_inject: bool = False  # code may be run inside a process (memray's allocation tracking)
    can_seek: bool = False  # a time cursor: play, pause, step, jump, speed

    # -- frames ----------------------------------------------------------------------------------

    @abstractmethod
    def start(self, on_frame: Callable[[Frame], None], on_serving: Callable[[ServingSnapshot], None]) -> None:
        """Begin delivering frames and serving snapshots (both from background threads)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop delivering and release what the session holds (a live session's journal stays open)."""

    @abstractmethod
    def select(self, pid: int | None) -> None:
        """Chart this process's memory in the next frames."""

    @abstractmethod
    def focus(self, pid: int | None) -> None:
        """Follow this process's details (None: none)."""

    # -- evidence and findings ---------------------------------------------------------------------

    @abstractmethod
    def evidence(self, pid: int, seconds: float) -> Evidence:
        """What the session knows of `pid` over the last `seconds` (to the cursor in a replay),
        with the service's latest signals and the most informative allocation sites found."""

    @abstractmethod
    def recorded(self, kind: str, pid: int) -> Any:
        """The latest `kind` finding ("stacks", "hot-paths", "allocations") of `pid`, or None."""

    @abstractmethod
    def diagnose(self, pid: int, evidence: Evidence, thresholds: LeakThresholds) -> tuple[Diagnosis, str]:
        """The diagnosis to show for `pid` and one line on where it comes from ("" for a fresh one)."""

    def record(self, kind: str, value: Any, *, at: float | None = None) -> None:
        """Keep a finding with the session (any thread). A replay records nothing."""

    def best_attribution(self, pid: int) -> Attribution | None:
        """The most informative allocation-site search of `pid` so far, or None."""
        return None

    # -- snapshots ---------------------------------------------------------------------------------

    @property
    def can_export(self) -> bool:
        return False

    def export(self, target: Path, since: float | None = None, until: float | None = None) -> Future:
        """The session (or the part between `since` and `until`) as a snapshot file; the Future
        gives the path or raises OSError / sqlite3.Error with the reason."""
        done: Future = Future()
        done.set_exception(OSError("this session is not recorded"))
        return done

    # -- the time cursor (only where can_seek) -----------------------------------------------------

    def toggle(self) -> None:
        """Play or pause."""

    def step(self, frames: int) -> None:
        """Pause and move by `frames` samples."""

    def jump(self, seconds: float) -> None:
        """Move the cursor by `seconds`."""

    def faster(self, steps: int = 1) -> None:
        """Change the speed by `steps` (negative: slower)."""

    def seek_to(self, text: str) -> None:
        """Move the cursor to a time written by a person ("+90", "-5m", "14:05:30", "start");
        ValueError when the text is none of those."""
        raise ValueError(text)
