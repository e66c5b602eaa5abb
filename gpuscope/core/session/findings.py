"""What a session found: every stack dump, hot-path sample, allocation-site search and diagnosis.

Live and replay keep them the same way, so the console, the wizard and the report ask the same
questions of both: the latest of a kind for a process, and the most informative one. A search
that named the code allocating the memory beats a later one that found nothing or was not run
(a diagnosis re-run without a new search would otherwise hide the culprit found a minute ago).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the diagnosis is imported when one is made: the console starts without it
    from gpuscope.core.diagnosis.attribution import Attribution
    from gpuscope.core.diagnosis.steps import Diagnosis

CONFIDENCE_RANK = {"high": 2, "low": 1}  # an attribution's; anything else ("none") ranks 0


@dataclass(frozen=True, slots=True)
class Finding:
    time: float
    kind: str  # one of gpuscope.core.session.format.EVENT_KINDS
    value: Any


def attribution_rank(a: Attribution) -> tuple[int, int]:
    return (1 if a.suspects else 0, CONFIDENCE_RANK.get(a.confidence, 0))


def diagnosis_rank(d: Diagnosis) -> tuple[int, int]:
    """A named culprit first, then a code-path step that ran (whatever it found)."""
    code_path = next((s for s in d.steps if s.number == 7), None)
    ran = code_path is not None and code_path.status != "skipped"
    return (1 if d.suspects else 0, 1 if ran else 0)


class Findings:
    """A session's findings in the order they were made (safe to add to from any thread)."""

    def __init__(self) -> None:
        self._items: list[Finding] = []
        self._lock = threading.Lock()

    def add(self, kind: str, value: Any, t: float) -> None:
        with self._lock:
            self._items.append(Finding(t, kind, value))

    def __len__(self) -> int:
        return len(self._items)

    def of(self, kind: str, pid: int | None = None, until: float | None = None) -> list[Finding]:
        """Every `kind` finding (of `pid`, up to `until`), oldest first."""
        with self._lock:
            items = list(self._items)
        return [f for f in items if f.kind == kind and (until is None or f.time <= until)
                and (pid is None or getattr(f.value, "pid", None) == pid)]

    def latest(self, kind: str, pid: int | None = None, until: float | None = None) -> Any:
        found = self.of(kind, pid, until)
        return found[-1].value if found else None

    def best_attribution(self, pid: int, until: float | None = None) -> Attribution | None:
        """The most informative allocation-site search of `pid` (the latest among equals)."""
        return _best(self.of("allocations", pid, until), attribution_rank)

    def best_diagnosis(self, pid: int, until: float | None = None) -> Diagnosis | None:
        """The most informative diagnosis of `pid` (the latest among equals)."""
        return _best(self.of("diagnosis", pid, until), diagnosis_rank)

    def subjects(self) -> list[int]:
        """The processes diagnosed, in the order of their latest diagnosis."""
        order: dict[int, None] = {}
        for f in self.of("diagnosis"):
            order.pop(f.value.pid, None)
            order[f.value.pid] = None
        return list(order)


def _best(found: list[Finding], rank) -> Any:
    if not found:
        return None
    # max() keeps the first of equals: walk newest first so the latest wins a tie.
    return max(reversed(found), key=lambda f: rank(f.value)).value
