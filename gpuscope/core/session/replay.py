"""Replay: a recording behind the same Session interface as the live node.

The console cannot tell the difference except by what the frames say (`source="replay"` and a
`replay` position) and the capability flags (nothing is attached, a time cursor moves): the same
panels, charts rebuilt from the recorded series, the service's recorded signals, and the stacks,
allocation sites and diagnoses recorded with the session, as they stood at the cursor. A
recording made for one process (`snapshot --pid`, `gpuscope --pid`) opens on that process.
What could not be read of the file (damaged records skipped) is a notice on every frame.
A time cursor plays, pauses, steps, jumps and changes speed; a thread moves it while playing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuscope.core.diagnosis.attribution import Attribution
from gpuscope.core.diagnosis.steps import Diagnosis, Evidence, diagnose
from gpuscope.core.leak import LeakThresholds
from gpuscope.core.node.model import Frame, ProcessDetail, ReplayPosition
from gpuscope.core.diagnosis.recorded import evidence_of, with_attribution
from gpuscope.core.node.live import CHART_WINDOW_S
from gpuscope.core.serving.model import ServingSnapshot
from gpuscope.core.session.export import export_file
from gpuscope.core.session.interface import Session
from gpuscope.core.session.recording import Recording

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
MAX_WAIT_S = 1.0  # a long gap in the recording plays as at most this long


class ReplaySession(Session):
    can_seek = True

    def __init__(self, recording: Recording, *, playing: bool = True, speed: float = 1.0) -> None:
        self.recording = recording
        self._index = 0
        self._playing = playing and len(recording) > 1
        self._speed = speed
        self._selected: int | None = recording.subject
        self._focus: int | None = recording.subject
        self._on_frame: Callable[[Frame], None] | None = None
        self._on_serving: Callable[[ServingSnapshot], None] | None = None
        self._last_serving: ServingSnapshot | None = None
        self._lock = threading.RLock()
        self._moved = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._play, name="gpuscope-replay", daemon=True)

    # -- Session interface ------------------------------------------------------------------

    def start(self, on_frame: Callable[[Frame], None], on_serving: Callable[[ServingSnapshot], None] | None = None) -> None:
        self._on_frame = on_frame
        if self.recording.serving:
            self._on_serving = on_serving
        self._emit()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._moved.set()
        if self._thread.is_alive():
            self._thread.join(1.0)

    def select(self, pid: int | None) -> None:
        self._selected = pid
        self._emit()

    def focus(self, pid: int | None) -> None:
        self._focus = pid
        if pid is not None:
            self._selected = pid
        self._emit()

    def evidence(self, pid: int, seconds: float) -> Evidence:
        rec = self.recording
        with self._lock:
            frame = rec.frame(self._index)
        evidence = evidence_of(pid, seconds, frame, frame.time, rec.history, rec.device_history)
        return with_attribution(replace(evidence, serving_end=rec.serving_at(frame.time)), self.best_attribution(pid))

    def recorded(self, kind: str, pid: int) -> Any:
        """The last `kind` finding ("stacks", "allocations", ...) of `pid` up to the cursor, or None."""
        return self.recording.findings.latest(kind, pid, until=self.now)

    def best_attribution(self, pid: int) -> Attribution | None:
        return self.recording.findings.best_attribution(pid, until=self.now)

    def diagnose(self, pid: int, evidence: Evidence, thresholds: LeakThresholds) -> tuple[Diagnosis, str]:
        """The most informative diagnosis the session made of `pid` by the cursor, else one
        computed from the recording (and not recorded: a replay writes nothing)."""
        recorded = self.recording.findings.best_diagnosis(pid, until=self.now)
        if recorded is not None:
            return recorded, "as recorded during the session"
        return diagnose(evidence, thresholds), "from the recording"

    # -- snapshots ---------------------------------------------------------------------------

    @property
    def can_export(self) -> bool:
        return True

    def export(self, target: Path, since: float | None = None, until: float | None = None) -> Future:
        """A snapshot of the recording (or of a part of it), written on a thread of its own."""
        done: Future = Future()

        def write() -> None:
            try:
                done.set_result(export_file(self.recording.path, target, since, until))
            except BaseException as exc:  # handed to whoever waits on the Future
                done.set_exception(exc)

        threading.Thread(target=write, name="gpuscope-export", daemon=True).start()
        return done

    # -- the time cursor ---------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.recording.times[self._index]

    def toggle(self) -> None:
        with self._lock:
            if not self._playing and self._index >= len(self.recording) - 1:
                self._index = 0  # play again from the start
            self._playing = not self._playing
        self._moved.set()
        self._emit()

    def step(self, frames: int) -> None:
        with self._lock:
            self._playing = False
            self._index = min(max(0, self._index + frames), len(self.recording) - 1)
        self._moved.set()
        self._emit()

    def seek(self, t: float) -> None:
        with self._lock:
            self._index = self.recording.index_at(t)
        self._moved.set()
        self._emit()

    def jump(self, seconds: float) -> None:
        self.seek(self.now + seconds)

    def seek_to(self, text: str) -> None:
        self.seek(parse_time(text, self.recording, self.now))

    def faster(self, steps: int = 1) -> None:
        with self._lock:
            i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - self._speed))
            self._speed = SPEEDS[min(max(0, i + steps), len(SPEEDS) - 1)]
        self._moved.set()
        self._emit()

    def position(self) -> ReplayPosition:
        rec = self.recording
        return ReplayPosition(
            index=self._index, count=len(rec), start=rec.start, end=rec.end, playing=self._playing,
            speed=self._speed, file=str(rec.path), damage=rec.damage,
        )

    def _play(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                playing = self._playing
                i = self._index
            if not playing:
                self._moved.wait()
                self._moved.clear()
                continue
            times = self.recording.times
            if i >= len(times) - 1:
                with self._lock:
                    self._playing = False
                self._emit()
                continue
            wait = min(MAX_WAIT_S, (times[i + 1] - times[i]) / self._speed)
            if self._moved.wait(max(0.0, wait)):
                self._moved.clear()
                continue  # the cursor or the speed changed: start again from there
            with self._lock:
                if self._playing and self._index == i:
                    self._index = i + 1
            self._emit()

    # -- frames --------------------------------------------------------------------------------

    def _emit(self) -> None:
        if self._on_frame is None or self._stopping.is_set():
            return
        rec = self.recording
        with self._lock:
            frame = rec.frame(self._index)
            position = self.position()
        focus = None
        if self._focus is not None:
            focus = frame.focus if frame.focus and frame.focus.pid == self._focus else _detail_from_rows(frame, self._focus)
        chart = rec.history(self._selected, CHART_WINDOW_S, frame.time) if self._selected is not None else None
        notices = (*frame.notices, f"{rec.path.name}: {rec.damage}") if rec.damage else frame.notices
        self._on_frame(replace(frame, source="replay", focus=focus, selected_pid=self._selected, chart=chart, replay=position,
                               notices=notices))
        if self._on_serving is not None:
            snapshot = rec.serving_at(frame.time)
            if snapshot is not None and snapshot is not self._last_serving:
                self._last_serving = snapshot
                self._on_serving(snapshot)


def _detail_from_rows(frame: Frame, pid: int) -> ProcessDetail:
    """What the recording knows of a process the recording session was not attached to."""
    row = next((r for r in frame.processes if r.pid == pid), None)
    return ProcessDetail(
        pid=pid, user=row.user if row else None, command=row.command if row else "", exe=None, cwd=None,
        threads=None, python_version=None, status=None, create_time=None, exited=row is None,
        runs_in=row.runs_in if row else "",
    )


def parse_time(text: str, recording: Recording, now: float) -> float:
    """A jump target: "+90", "-5m", "+1h" (from the cursor), "14:05" or "14:05:30" (that clock
    time, local, on the recording's days), or "start" / "end". ValueError when it is none of those."""
    text = text.strip().lower()
    if text in ("start", "begin"):
        return recording.start
    if text == "end":
        return recording.end
    if text and text[0] in "+-":
        units = {"s": 1, "m": 60, "h": 3600}
        unit = units.get(text[-1], None)
        number = text[1:-1] if unit else text[1:]
        seconds = float(number) * (unit or 1)
        return now + (seconds if text[0] == "+" else -seconds)
    parts = text.split(":")
    if 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
        h, m, s = (int(p) for p in (parts + ["0"])[:3])
        if h > 23 or m > 59 or s > 59:
            raise ValueError(text)
        for day_of in (recording.start, recording.end):
            day = time.localtime(day_of)
            t = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, h, m, s, 0, 0, -1))
            if recording.start - 1 <= t <= recording.end + 1:
                return t
        return time.mktime((*time.localtime(recording.start)[:3], h, m, s, 0, 0, -1))
    raise ValueError(text)
