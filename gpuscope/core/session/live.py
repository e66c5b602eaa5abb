"""The live session: a node's frames, teed into the journal where each sample is taken.

The journal hears of a frame once, when it is sampled, never when it is shown (a frame shown
again because another process was selected is the same sample); serving snapshots likewise.
Findings (stack dumps, allocation sites, diagnoses) come in through `record`: the one route into
the journal for events. They are also kept in memory, so the wizard reopened on a process shows
the allocation sites found earlier in the session.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscope.core.leak import LeakThresholds
from gpuscope.core.node.model import Frame
from gpuscope.core.serving.model import ServingSnapshot
from gpuscope.core.session.findings import Findings
from gpuscope.core.session.interface import Session, Source
from gpuscope.core.session.journal import Journal

if TYPE_CHECKING:  # imported when used: the console's first frame does not wait for them
    from gpuscope.core.diagnosis.attribution import Attribution
    from gpuscope.core.diagnosis.steps import Diagnosis, Evidence
    from gpuscope.core.serving.source import ServingSource


class LiveSession(Session):
    is_live = True
    can_attach = True
    can_inject = True

    def __init__(self, source: Source, *, serving: ServingSource | None = None, journal: Journal | None = None,
                 evidence: Callable[[Source, int, float], Evidence] | None = None) -> None:
        self.source = source
        # How the source's records become a diagnosis's evidence (by default `diagnosis.recorded`'s way,
        # imported when first asked: the console starts without the diagnosis).
        self._evidence = evidence
        self.serving = serving
        self.journal = journal  # None: nothing is written (findings are still kept for this session)
        self.findings = Findings()
        self.last_sample_time: float | None = None
        self._serving_snapshot: ServingSnapshot | None = None

    # -- frames ----------------------------------------------------------------------------------

    def start(self, on_frame: Callable[[Frame], None], on_serving: Callable[[ServingSnapshot], None]) -> None:
        def show(frame: Frame) -> None:
            problem = (self.journal.problem or self.journal.note) if self.journal is not None else None
            if problem:
                frame = dataclasses.replace(frame, notices=(*frame.notices, problem))
            on_frame(frame)

        def serving(snapshot: ServingSnapshot) -> None:
            self._serving_snapshot = snapshot
            if self.journal is not None:
                self.journal.serving(snapshot)
            on_serving(snapshot)

        self.source.start(show, self._sampled)
        if self.serving is not None:
            self.serving.start(serving)

    def _sampled(self, frame: Frame) -> None:
        self.last_sample_time = frame.time
        if self.journal is not None:
            self.journal.frame(frame)

    def stop(self) -> None:
        self.source.stop()
        if self.serving is not None:
            self.serving.stop()

    def select(self, pid: int | None) -> None:
        self.source.select(pid)

    def focus(self, pid: int | None) -> None:
        self.source.focus(pid)

    # -- evidence and findings ---------------------------------------------------------------------

    def evidence(self, pid: int, seconds: float) -> Evidence:
        if self._evidence is None:
            from gpuscope.core.diagnosis.recorded import source_evidence

            self._evidence = source_evidence
        from gpuscope.core.diagnosis.endpoint import serves_endpoint
        from gpuscope.core.diagnosis.recorded import with_attribution

        evidence = self._evidence(self.source, pid, seconds)
        serving = self._serving_snapshot
        evidence = dataclasses.replace(evidence, serving_end=serving,
                                       serves=serves_endpoint(pid, serving.target) if serving is not None else None)
        return with_attribution(evidence, self.best_attribution(pid))

    def recorded(self, kind: str, pid: int) -> Any:
        return self.findings.latest(kind, pid)

    def best_attribution(self, pid: int) -> Attribution | None:
        return self.findings.best_attribution(pid)

    def diagnose(self, pid: int, evidence: Evidence, thresholds: LeakThresholds) -> tuple[Diagnosis, str]:
        from gpuscope.core.diagnosis.steps import diagnose

        diagnosis = diagnose(evidence, thresholds)
        self.record("diagnosis", diagnosis)  # every one is kept: the report picks the most informative
        return diagnosis, ""

    def record(self, kind: str, value: Any, *, at: float | None = None) -> None:
        t = time.time() if at is None else at
        self.findings.add(kind, value, t)
        if self.journal is not None:
            self.journal.event(kind, value, t)

    # -- snapshots ---------------------------------------------------------------------------------

    @property
    def can_export(self) -> bool:
        return self.journal is not None

    def export(self, target: Path, since: float | None = None, until: float | None = None, *,
               replace: bool = False) -> Future:
        if self.journal is None:
            return super().export(target, since, until)
        return self.journal.export(target, since, until, replace=replace)
