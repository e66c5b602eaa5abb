"""The guided diagnosis: seven steps from a memory-growth alert to the code path.

Steps 1–6 are computed at once from what the session has already recorded of the process (its
memory, its GPU, the other processes, the service's signals), so a console that has watched for
an hour diagnoses over that hour. Step 7 uses the most informative allocation sites the session
has found for the process (so reopening the wizard keeps a culprit found earlier); `a` looks
again (asking before memray is attached), with progress, and Esc cancels without leaving
anything attached. In a replay the session's recorded diagnosis is shown, and nothing is attached.
`r` re-runs (from the latest data; on step 7 it looks again), `e` exports, Enter on step 7 shows
the stacks behind the suspects.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, OptionList
from textual.widgets.option_list import Option

from gpuscope.core import allocations
from gpuscope.core.atomic import private_folder, write_private
from gpuscope.core.diagnosis import ALERT, OK, SKIPPED, WARN, Diagnosis, Evidence, Step
from gpuscope.core.evidence import VERDICT, evidence_lines
from gpuscope.core.printable import printable
from gpuscope.folders import exports_dir
from gpuscope.tui.messages import CodePathRead, WorkProgress
from gpuscope.tui.stacks import AttributionScreen, ConfirmAttach
from gpuscope.tui.textlines import TextLines

HISTORY_S = 3600.0  # diagnose over up to the last hour the console recorded
ATTRIBUTION_S = 10.0
MARK = {OK: ("✔", "green"), WARN: ("!", "yellow"), ALERT: ("✖", "bold red"), SKIPPED: ("–", "dim")}
UNKNOWN_MARK = ("?", "dim")  # a status no gpuscope writes: a replayed recording was damaged


class WizardScreen(Screen[None]):
    DEFAULT_CSS = """
    WizardScreen #wizard-title { height: auto; background: $panel; padding: 0 1; }
    WizardScreen #steps { width: 34; height: 1fr; }
    WizardScreen #step { width: 1fr; height: 1fr; padding: 0 1; overflow-y: auto; }
    """
    BINDINGS = [
        Binding("escape", "close", "Close / cancel"),
        Binding("r", "rerun", "Re-run"),
        Binding("a", "allocations", "Alloc sites"),
        Binding("e", "export", "Export"),
        Binding("left,p", "step(-1)", "Prev", show=False),
        Binding("right,n", "step(1)", "Next", show=False),
    ]

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.evidence: Evidence | None = None
        self.diagnosis: Diagnosis | None = None
        self.working = threading.Event()  # the allocation-site search is running
        self.cancel = threading.Event()
        self._status = ""

    def compose(self) -> ComposeResult:
        yield TextLines(f"Diagnosis of PID {self.pid}", id="wizard-title")
        with Horizontal():
            yield OptionList(id="steps")
            yield TextLines("", id="step")
        yield Footer()

    def on_mount(self) -> None:
        self.compute()
        self.query_one("#steps", OptionList).focus()

    # -- evidence and steps ----------------------------------------------------------------------

    def compute(self, attribution=None) -> None:
        """Steps 1–6 from what the session has recorded; step 7 from `attribution` (a search just
        made) or the most informative one the session has."""
        session = self.app.session
        evidence = session.evidence(self.pid, HISTORY_S)
        if attribution is not None:
            evidence = replace(evidence, attribution=attribution)
        self.evidence = evidence
        self.diagnosis, self._status = session.diagnose(self.pid, evidence, self.app.thresholds)
        self.render_steps()

    def render_steps(self) -> None:
        d = self.diagnosis
        steps = self.query_one("#steps", OptionList)
        highlighted = steps.highlighted if steps.highlighted is not None else self._first_interesting(d)
        steps.clear_options()
        for step in d.steps:
            mark, style = MARK.get(step.status, UNKNOWN_MARK)
            title = printable(step.title)  # a replayed recording's text
            label = Text.assemble((f"{mark} ", style), f"{step.number}. {title}")
            if step.number == 7 and self.working.is_set():
                label = Text.assemble(("… ", "bold"), f"{step.number}. {title}")
            steps.add_option(Option(label, id=str(step.number)))
        steps.highlighted = highlighted
        self._show_title()
        self.show_step(d.steps[highlighted])

    @staticmethod
    def _first_interesting(d: Diagnosis) -> int:
        return next((i for i, s in enumerate(d.steps) if s.status == ALERT), 0)

    def _show_title(self) -> None:
        d = self.diagnosis
        verdict_style = {"leak": "bold red", "no-leak": "bold green"}.get(d.verdict, "bold yellow")
        text = Text.assemble(
            (f"Diagnosis of PID {d.pid} ", "bold"),
            (f"{d.verdict}", verdict_style),
            f" ({d.pattern}) · {d.memory_source} memory over {d.duration_s:.0f} s of what the console recorded",
        )
        if self._status:
            text.append(f" · {self._status}", style="bold")
        self.query_one("#wizard-title", TextLines).set_text(text)

    def status(self, line: str) -> None:
        self._status = line
        if self.diagnosis is not None:
            self._show_title()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.action_stacks()  # Enter on a step: on step 7, the stacks behind the suspects

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if self.diagnosis is not None and event.option_index is not None:
            self.show_step(self.diagnosis.steps[event.option_index])

    def show_step(self, step: Step) -> None:
        mark, style = MARK.get(step.status, UNKNOWN_MARK)
        text = Text.assemble((f"{step.number}. {printable(step.title)}", "bold"), "  ", (f"{mark} {step.status}", style), "\n\n")
        text.append(printable(step.finding) + "\n")
        serving = self.evidence.serving_end if self.evidence else None
        if step.number == 3 and serving is not None and serving.p99_jump is not None:
            text.append(serving.p99_jump.describe() + "\n", style="bold yellow")  # the snapshot's finding
        if step.next:
            text.append("\nnext: ", style="bold")
            text.append(printable(step.next) + "\n")
        if step.number == 7:
            text.append("\na: look for the allocation sites again · Enter: the stacks behind the suspects\n", style="dim")
        text.append_text(self.evidence_panel(step))
        self.query_one("#step", TextLines).set_text(text)

    def evidence_panel(self, step: Step) -> Text:
        """The evidence lines of `step` (and, on the Classify step, the verdict's): the report's own."""
        if self.diagnosis is None:
            return Text()
        lines = evidence_lines(self.diagnosis, time.time())
        shown = [*lines[step.number], *(lines[VERDICT] if step.number == 6 else ())]
        if not shown:
            return Text()
        text = Text("\nevidence\n", style="bold")
        text.append("\n".join(printable(line) for line in shown), style="dim")  # a recording's text, made printable
        return text

    # -- actions ----------------------------------------------------------------------------------

    def action_step(self, delta: int) -> None:
        steps = self.query_one("#steps", OptionList)
        steps.highlighted = max(0, min(6, (steps.highlighted or 0) + delta))

    def action_rerun(self) -> None:
        steps = self.query_one("#steps", OptionList)
        if steps.highlighted == 6:
            self.action_allocations()
        else:
            self.compute()
            self.app.notify("re-ran from the latest data")

    def action_allocations(self) -> None:
        if self.working.is_set():
            return
        if not self.app.session.can_attach:
            self.app.notify("a replay shows the allocation sites that were recorded; nothing is attached", severity="warning")
            return

        def chosen(choice: str | None) -> None:
            if choice is not None:
                self.cancel.clear()
                self.working.set()
                self.query_one("#steps", OptionList).highlighted = 6
                self.render_steps()
                self.look_for_allocations(choice == "memray")

        self.app.push_screen(ConfirmAttach(self.pid, inject=self.app.session.can_inject), chosen)

    @work(thread=True, exclusive=True, group="wizard", exit_on_error=False)
    def look_for_allocations(self, use_memray: bool) -> None:
        started = time.monotonic()

        def progress(rung: str, fraction: float) -> None:
            line = f"step 7: {rung} {fraction * 100:.0f}% · {time.monotonic() - started:.0f} s (Esc cancels)"
            self.post_message(WorkProgress(fraction, line))

        try:
            result = allocations.attribute(self.pid, ATTRIBUTION_S, use_memray=use_memray,
                                           cancelled=self.cancel.is_set, progress=progress)
        finally:
            self.working.clear()
        if not self.cancel.is_set():
            self.app.session.record("allocations", result)  # kept even if the wizard closes now
            self.post_message(CodePathRead(result))

    def on_work_progress(self, message: WorkProgress) -> None:
        if message.line is not None:
            self.status(message.line)

    def on_code_path_read(self, message: CodePathRead) -> None:
        self._status = ""
        self.compute(attribution=message.value)

    def action_stacks(self) -> None:
        att = self.evidence.attribution if self.evidence else None
        if self.query_one("#steps", OptionList).highlighted == 6 and att is not None:
            self.app.push_screen(AttributionScreen(att))

    def action_export(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            folder = private_folder(exports_dir())  # ours alone: no other user's folder or link on the way
            json_path = write_private(folder / f"diagnosis-{self.pid}-{stamp}.json", json.dumps(self.diagnosis.to_json(), indent=1),
                                      replace=True)
            write_private(folder / f"diagnosis-{self.pid}-{stamp}.md", self.diagnosis.to_text(), replace=True)
        except OSError as exc:
            self.app.notify(f"export failed: {exc.strerror or exc}", severity="error")
            return
        self.app.notify(f"exported {json_path} (+ .md)", title="diagnosis exported")

    def action_close(self) -> None:
        self.cancel.set()  # the ladder stops at its next check and detaches whatever it attached
        self.dismiss()

    def on_unmount(self) -> None:
        self.cancel.set()
