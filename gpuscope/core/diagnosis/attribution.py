"""What attribution finds and how allocation stacks become suspects.

An allocation tracker (torch's allocator history, memray, tracemalloc) or the stack sampler gives
stacks with bytes (or weights) behind them; each stack is charged to its owning frame, the
innermost frame of the program's own code (`stacks.owner_frame`), and the owners ranked: the
suspects. `Attribution` is what the ladder (`allocations.attribute`) reports: the suspects, the
rung they come from, what each rung did, and what the tracking cost the service.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuscope.core.target.stacks import StackFrame, Suspect, classify, owner_frame


@dataclass(frozen=True, slots=True)
class Rung:
    """What one rung of the ladder did: "used", "skipped" or "failed", and why."""

    method: str
    status: str
    detail: str


@dataclass(frozen=True, slots=True)
class Site:
    """What one allocation site (an owning frame) held at each time of `Attribution.times`."""

    function: str
    file: str
    line: int
    held: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Attribution:
    pid: int
    suspects: tuple[Suspect, ...]  # best first
    rungs: tuple[Rung, ...]
    method: str | None  # the rung the suspects come from
    confidence: str  # "high" (allocation tracking) | "low" (stack sampling) | "none"
    duration_s: float = 0.0
    notes: tuple[str, ...] = field(default=())
    times: tuple[float, ...] = ()  # seconds since tracking began, for `sites`
    sites: tuple[Site, ...] = ()  # held bytes over time, per site (trackers that read it over time)
    window: tuple[float, float] | None = None  # when a tracker ran inside the process (time.time())
    cost: dict = field(default_factory=dict)  # the tracker's: "rss_before", "rss_tracking", "rss_after", "from", "sees"
    # The allocator's bytes in use while the tracker ran (glibc's, through the probe), at
    # `heap_times` (seconds since tracking began): what the tracker's sites are judged against.
    heap_times: tuple[float, ...] = ()
    heap: tuple[int, ...] = ()
    heap_blocks: tuple[int, ...] = ()  # Python's small-object blocks handed out (its arenas are not malloc's)


# -- grouping allocation stacks into suspects ------------------------------------------------------


def suspects_from_stacks(
    weighted: Sequence[tuple[Sequence[StackFrame], float, int]], method: str, *, known_bytes: bool, limit: int = 10,
    by_function: bool = False,
) -> tuple[Suspect, ...]:
    """Group (stack innermost-first, weight, count) by the owning frame of each stack (by its
    function, not its line, with `by_function`: one function's share is not split over its
    lines). Weights may be negative (a fall debits a rise); owners whose net is not positive are
    left out."""
    Key = tuple[str, str, int | None]
    weight: dict[Key, float] = defaultdict(float)
    count: dict[Key, int] = defaultdict(int)
    stack_of: dict[Key, tuple[StackFrame, ...]] = {}  # the heaviest stack behind each
    heaviest: dict[Key, float] = defaultdict(float)
    line_of: dict[Key, int] = {}
    for frames, w, n in weighted:
        owner = owner_frame(frames)
        if owner is None or w == 0:
            continue
        key: Key = (owner.function, owner.file, None if by_function else owner.line)
        weight[key] += w
        count[key] += n
        if w > heaviest[key]:
            heaviest[key] = w
            stack_of[key] = tuple(frames)
            line_of[key] = owner.line
    gained = [k for k in weight if weight[k] > 0 and k in stack_of]
    total = sum(weight[k] for k in gained)
    ranked = sorted(gained, key=lambda k: -weight[k])[:limit]
    return tuple(
        Suspect(
            function=k[0],
            file=k[1],
            line=line_of[k],
            bytes=int(weight[k]) if known_bytes else None,
            share=weight[k] / total if total else 0.0,
            method=method,
            stack=stack_of[k],
            count=count[k],
        )
        for k in ranked
    )


def suspects_from_records(
    records: Sequence[tuple[Sequence[Sequence], float, int]], roots: Sequence[str] = (), method: str = "memray"
) -> tuple[Suspect, ...]:
    """Allocation stacks (frames as (function, file, line), innermost first; bytes; count) by owning
    frame, largest first: the grouping every allocation-tracking rung shares."""
    weighted = []
    for frames, size, n in records:
        stack = tuple(
            StackFrame(function=str(fn), file=str(filename), line=int(line or 0), kind=classify(str(filename), own_roots=roots))
            for fn, filename, line in frames
        )
        weighted.append((stack, float(size), int(n)))
    return suspects_from_stacks(weighted, method, known_bytes=True)


def sites_from_records(groups: Sequence[dict], times: Sequence[float], roots: Sequence[str] = ()) -> tuple[Site, ...]:
    """Held-over-time records of a tracker (`held` per record, aligned with `times`) summed by
    owning frame, the largest at the end first."""
    held: dict[tuple[str, str, int], list[int]] = {}
    for g in groups:
        series = g.get("held")
        frames = g.get("frames") or ()
        if not isinstance(series, list) or len(series) != len(times):
            continue
        stack = tuple(
            StackFrame(function=str(f[0]), file=str(f[1]), line=int(f[2] or 0), kind=classify(str(f[1]), own_roots=roots))
            for f in frames if isinstance(f, (list, tuple)) and len(f) == 3
        )
        owner = owner_frame(stack)
        if owner is None:
            continue
        total = held.setdefault((owner.function, owner.file, owner.line), [0] * len(times))
        for k, v in enumerate(series):
            total[k] += int(v or 0)
    ranked = sorted(held.items(), key=lambda kv: -kv[1][-1])
    return tuple(Site(k[0], k[1], k[2], tuple(v)) for k, v in ranked)


def suspects_from_capture(path: str, roots: Sequence[str] = ()) -> tuple[Suspect, ...]:
    """The allocations still alive at the end of a memray capture, by owning frame, largest first."""
    return counted_suspects_from_capture(path, roots)[0]


def counted_suspects_from_capture(path: str, roots: Sequence[str] = ()) -> tuple[tuple[Suspect, ...], int]:
    """`suspects_from_capture`, and how many allocation stacks still alive the capture holds."""
    from gpuscope.probe import leaked_records  # noqa: PLC0415 - imports memray: only this rung needs it

    records = leaked_records(path)
    return suspects_from_records(records, roots), len(records)
