"""Python stacks as gpuscope keeps them: threads of frames, classified, aggregated, attributed.

A frame is the program's own code, the standard library, an installed package (site-packages)
or native code. The operator cares about the first kind: that is where a fix goes. Suspects are
named after the innermost own frame of a stack, with comprehension frames folded into the
function that holds them.

Function, file and thread names come from the target process (or from a recording), so they are
made printable (gpuscope.core.common.printable) when a frame is made, wherever it is made.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuscope.core.common.printable import printable

OWN, STDLIB, LIBRARY, NATIVE = "own", "stdlib", "library", "native"
KIND_MARK = {OWN: "●", STDLIB: "·", LIBRARY: "○", NATIVE: "◆"}  # the kind of a frame, readable without colour
KIND_LEGEND = "● your code   · standard library   ○ installed package   ◆ native"

_SITE = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
_STDLIB = re.compile(r"[/\\]lib[/\\](?:python|pypy)\d[\d.]*t?[/\\]")
# gpuscope's probe inside a service is an installed package there, wherever gpuscope was installed
# from (a source tree is outside site-packages): its threads' allocations and stacks are the
# instrument's, never the service's code.
_PROBE = re.compile(r"[/\\]gpuscope[/\\]probe\.py$")
_COMPREHENSION = re.compile(r"<(?:listcomp|dictcomp|setcomp|genexpr|lambda)>$")


@dataclass(frozen=True, slots=True)
class StackFrame:
    function: str  # qualified name where the interpreter gives it (Class.method)
    file: str
    line: int
    kind: str = OWN
    locals: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # only when asked for

    def __post_init__(self) -> None:
        object.__setattr__(self, "function", printable(self.function))
        object.__setattr__(self, "file", printable(self.file))
        if self.locals:
            object.__setattr__(self, "locals", tuple((printable(n), printable(v)) for n, v in self.locals))

    def label(self) -> str:
        return f"{self.function} ({self.file}:{self.line})" if self.line else f"{self.function} ({self.file})"


@dataclass(frozen=True, slots=True)
class ThreadStack:
    thread_id: int
    name: str | None
    os_thread_id: int | None
    active: bool
    owns_gil: bool
    frames: tuple[StackFrame, ...]  # innermost first

    def __post_init__(self) -> None:
        if self.name is not None:
            object.__setattr__(self, "name", printable(self.name))

    @property
    def state(self) -> str:
        return "gil" if self.owns_gil else "active" if self.active else "idle"


@dataclass(frozen=True, slots=True)
class StackDump:
    """One look at every thread of a process."""

    pid: int
    time: float
    mode: str  # "blocking" (threads paused while read) or "nonblocking"
    native: bool
    threads: tuple[ThreadStack, ...]
    took_s: float = 0.0


@dataclass(frozen=True, slots=True)
class HotPath:
    """One distinct stack seen while sampling, outermost frame first, and how often."""

    frames: tuple[StackFrame, ...]
    count: int
    share: float


@dataclass(frozen=True, slots=True)
class StackSample:
    """Several dumps of one process, aggregated into hot paths."""

    pid: int
    mode: str
    native: bool
    samples: int
    interval_s: float
    duration_s: float
    paths: tuple[HotPath, ...]  # most frequent first
    last: StackDump | None = None
    errors: tuple[str, ...] = ()  # dumps that failed (a torn stack, the GIL moving): counted, not fatal


@dataclass(frozen=True, slots=True)
class Suspect:
    """A code path that allocated memory which stayed (the diagnosis JSON's `suspects` entry)."""

    function: str
    file: str
    line: int
    bytes: int | None
    share: float
    method: str  # "torch-history" | "memray" | "stack-sampling"
    stack: tuple[StackFrame, ...] = field(default=(), compare=False)  # innermost first
    count: int | None = None  # allocations (memray) or samples (stack sampling)

    def __post_init__(self) -> None:
        object.__setattr__(self, "function", printable(self.function))
        object.__setattr__(self, "file", printable(self.file))

    def to_json(self) -> dict:
        return {
            "function": self.function,
            "file": self.file,
            "line": self.line,
            "bytes": self.bytes,
            "share": round(self.share, 4),
            "method": self.method,
        }


def classify(filename: str, *, native_module: str | None = None, own_roots: Sequence[str] = ()) -> str:
    """Own code, standard library, installed package or native, from a frame's file name.

    `own_roots` are path fragments (the target's main package, its script's folder) whose frames
    are the program's own even though they may live where libraries do.
    """
    if native_module or filename.endswith((".so", ".c", ".cpp", ".h")) or filename.startswith("<native"):
        return NATIVE
    if _PROBE.search(filename):
        return LIBRARY
    if any(root in filename for root in own_roots if root):
        return OWN
    if filename.startswith("<frozen "):
        return STDLIB
    if _SITE.search(filename):
        return LIBRARY
    if _STDLIB.search(filename):
        return STDLIB
    return OWN


def is_comprehension(function: str) -> bool:
    return bool(_COMPREHENSION.search(function))


def owner_frame(frames: Sequence[StackFrame]) -> StackFrame | None:
    """The innermost own frame of a stack (innermost first), comprehensions folded outward.

    A `<listcomp>` or `<genexpr>` frame is part of the function that contains it: the suspect is
    that function, at the line of the comprehension frame (where the allocation happened).
    """
    line_inside: int | None = None
    for frame in frames:
        if frame.kind != OWN:
            continue
        if frame.function == "<module>" and line_inside is None:
            return frame
        if is_comprehension(frame.function):
            line_inside = line_inside or frame.line
            continue
        if line_inside is not None and frame.function != "<module>":
            return StackFrame(frame.function, frame.file, line_inside, frame.kind)
        return frame
    return None


def aggregate(dumps: Iterable[StackDump], *, active_only: bool = True) -> tuple[HotPath, ...]:
    """Count identical stacks across dumps (per thread), most frequent first.

    Idle threads (waiting on a lock or in sleep) say nothing about where time goes; they are left
    out unless `active_only` is False.
    """
    counts: Counter[tuple[StackFrame, ...]] = Counter()
    for dump in dumps:
        for thread in dump.threads:
            if active_only and not (thread.active or thread.owns_gil):
                continue
            if thread.frames:
                counts[tuple(reversed(thread.frames))] += 1
    total = sum(counts.values())
    return tuple(
        HotPath(frames=path, count=n, share=n / total)
        for path, n in sorted(counts.items(), key=lambda item: (-item[1], item[0][-1].label()))
    )


def stack_json(frames: Sequence[StackFrame]) -> list[dict]:
    out = []
    for f in frames:
        item = {"function": f.function, "file": f.file, "line": f.line, "kind": f.kind}
        if f.locals:
            item["locals"] = dict(f.locals)
        out.append(item)
    return out


def thread_json(thread: ThreadStack) -> dict:
    return {
        "thread_id": thread.thread_id,
        "os_thread_id": thread.os_thread_id,
        "name": thread.name,
        "state": thread.state,
        "frames": stack_json(thread.frames),
    }
