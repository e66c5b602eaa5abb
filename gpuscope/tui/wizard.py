"""The guided diagnosis: seven steps from a memory-growth alert to the code path.

Steps 1–6 are computed at once from what the session has already recorded of the process (its
memory, its GPU, the other processes, the service's signals), so a console that has watched for
an hour diagnoses over that hour. Step 7 uses the most informative allocation sites the session
has found for the process (so reopening the wizard keeps a culprit found earlier); `y` looks for
them (memray, the cost said on screen before the key), `a` asks first which way to look, with
elapsed and remaining seconds shown while it runs, and Esc cancels without leaving anything
attached. In a replay the session's recorded diagnosis is shown, and nothing is attached.
`r` re-runs (from the latest data; on step 7 it looks again), `e` exports, Enter on step 7 shows
the stacks behind the suspects. The line above the footer always says how to move and what runs next.
"""

from __future__ import annotations

import json
import threading
import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, OptionList
from textual.widgets.option_list import Option

from gpuscope.core.diagnosis import ladder as allocations

from gpuscope.core.target import probe_client
from gpuscope.core.common.atomic import private_folder, write_private
from gpuscope.core.diagnosis.steps import ALERT, OK, SKIPPED, WARN, Diagnosis, Evidence, Step
from gpuscope.core.diagnosis.evidence import VERDICT, evidence_lines
from gpuscope.core.diagnosis.recorded import with_attribution
from gpuscope.core.common.printable import printable
from gpuscope.core.node.command_display import short_command
from gpuscope.folders import exports_dir
from gpuscope.tui.app_session import console_of, session_of
from gpuscope.tui.messages import CodePathRead, WorkFailed, WorkProgress
from gpuscope.tui.palette import Palette, ThemedPanel
from gpuscope.tui.stacks import AttributionScreen, ConfirmAttach
from gpuscope.tui.textlines import TextLines

HISTORY_S = 3600.0  # diagnose over up to the last hour the console recorded
ATTRIBUTION_S = 10.0
NAME_CELLS = 60  # the process's name in the title: enough to tell one service from another

def mark_of(status: str, palette: Palette) -> tuple[str, str]:
    """(the mark, its style) of a step's status, in the theme's colours; "?" for a status no
    gpuscope writes (a replayed recording was damaged)."""
    return {OK: ("✔", palette.success), WARN: ("!", palette.warning), ALERT: ("✖", f"bold {palette.error}"),
            SKIPPED: ("–", "dim")}.get(status, ("?", "dim"))


class WizardScreen(ThemedPanel, Screen[None]):
    DEFAULT_CSS = """
    WizardScreen #wizard-title { height: auto; background: $panel; padding: 0 1; }
    WizardScreen #steps { width: 34; height: 1fr; }
    WizardScreen #step { width: 1fr; height: 1fr; padding: 0 1; overflow-y: auto; }
    WizardScreen #wizard-keys { height: auto; background: $panel; padding: 0 1; }
    WizardScreen.narrow #steps { width: 26; }
    """
    BINDINGS = [
        Binding("escape", "close", "Back / cancel"),
        Binding("y", "find", "Find the code"),
        Binding("r", "rerun", "Re-run"),
        Binding("a", "allocations", "Look again…", show=False),
        Binding("e", "export", "Export"),
        Binding("left,p,k", "step(-1)", "Prev", show=False),
        Binding("right,n,j", "step(1)", "Next", show=False),
    ]

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.evidence: Evidence | None = None
        self.diagnosis: Diagnosis | None = None
        self.working = threading.Event()  # the allocation-site search is running
        self.cancel = threading.Event()
        self._status = ""
        self._probe: bool | None = None  # whether the process has gpuscope's probe (None: not known yet)
        self._search: tuple[str, float] | None = None  # the search's rung and when it began
        self._sites_seen: int | None = None  # allocation sites the running rung has seen

    def compose(self) -> ComposeResult:
        yield TextLines(f"Diagnosis of PID {self.pid}", id="wizard-title")
        with Horizontal():
            yield OptionList(id="steps")
            yield TextLines("", id="step")
        yield TextLines("", id="wizard-keys")
        yield Footer()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("find", "allocations"):  # a replay attaches nothing: its footer does not offer them
            return session_of(self.app).can_attach
        return True

    def redraw(self) -> None:
        if self.diagnosis is not None:
            self.render_steps()

    def on_mount(self) -> None:
        self.set_class(self.app.size.width < 100, "narrow")
        self.follow_theme()
        self.compute()
        self.query_one("#steps", OptionList).focus()
        if session_of(self.app).can_attach:
            self.find_probe()
        self.set_interval(1.0, self._tick)

    @work(thread=True, exclusive=True, group="wizard-probe", exit_on_error=False)
    def find_probe(self) -> None:
        # Off the UI thread: looking for the socket reads another user's folders.
        try:
            found = probe_client.probe_path(self.pid) is not None
        except Exception:  # whatever the folders hold, the wizard carries on without knowing
            found = False
        self.post_message(ProbeFound(found))

    def on_probe_found(self, message: "ProbeFound") -> None:
        self._probe = message.found
        self._show_keys()
        if self.diagnosis is not None:
            self.render_steps()

    # -- what runs next, said where the operator looks ---------------------------------------------

    def _search_offer(self) -> str | None:
        """What `y` does here, with its cost, or None where nothing may be attached (a replay)."""
        if not session_of(self.app).can_attach:
            return None
        seconds = f"{ATTRIBUTION_S:g} s"
        if not session_of(self.app).can_inject:
            return f"y: find where the process was while memory grew (stack sampling, about {seconds})"
        way = ("inside the service through its gpuscope probe" if self._probe
               else "inside the service, through gpuscope's probe brought in first")
        return f"y: find the code that keeps memory (memray {way}, about {seconds})"

    def _looked(self) -> bool:
        return self.evidence is not None and self.evidence.attribution is not None

    def _show_keys(self) -> None:
        parts = ["↑↓ j k: steps"]
        if self._search is not None:
            parts.append("Esc: cancel the search")
        else:
            offer = self._search_offer()
            if offer is not None:
                parts.append(offer.replace("y: find", "y: look again for", 1) if self._looked() else offer)
            if self._looked():
                parts.append("Enter on 7: its stacks")
            parts.append("Esc: back")
        self.query_one("#wizard-keys", TextLines).set_text(Text(" · ".join(parts), style="bold"))

    def _progress_line(self) -> str:
        rung, started = self._search or ("", time.monotonic())
        elapsed = time.monotonic() - started
        left = max(0.0, ATTRIBUTION_S - elapsed)
        sites = f" · {self._sites_seen} allocation sites seen" if self._sites_seen is not None else ""
        return f"step 7: {rung} running · {elapsed:.0f} s, about {left:.0f} s left{sites} (Esc cancels)"

    def _tick(self) -> None:
        # memray reports nothing until it stops: the clock says the search is alive meanwhile.
        if self._search is not None:
            self.status(self._progress_line())

    # -- evidence and steps ----------------------------------------------------------------------

    def compute(self, attribution=None) -> None:
        """Steps 1–6 from what the session has recorded; step 7 from `attribution` (a search just
        made) or the most informative one the session has."""
        console = console_of(self.app)
        session = console.session
        evidence = session.evidence(self.pid, HISTORY_S)
        if attribution is not None:
            evidence = with_attribution(evidence, attribution)
        self.evidence = evidence
        self.diagnosis, self._status = session.diagnose(self.pid, evidence, console.thresholds)
        self.render_steps()

    def render_steps(self) -> None:
        d = self.diagnosis
        if d is None:
            return
        steps = self.query_one("#steps", OptionList)
        highlighted = steps.highlighted if steps.highlighted is not None else self._first_interesting(d)
        steps.clear_options()
        for step in d.steps:
            mark, style = mark_of(step.status, self.palette)
            title = printable(step.title)  # a replayed recording's text
            label = Text.assemble((f"{mark} ", style), f"{step.number}. {title}")
            if step.number == 7 and self.working.is_set():
                label = Text.assemble(("… ", "bold"), f"{step.number}. {title}")
            steps.add_option(Option(label, id=str(step.number)))
        steps.highlighted = highlighted
        self._show_title()
        self._show_keys()
        self.show_step(d.steps[highlighted])

    @staticmethod
    def _first_interesting(d: Diagnosis) -> int:
        return next((i for i, s in enumerate(d.steps) if s.status == ALERT), 0)

    def _show_title(self) -> None:
        d = self.diagnosis
        if d is None:
            return
        p = self.palette
        verdict_style = {"leak": f"bold {p.error}", "no-leak": f"bold {p.success}"}.get(d.verdict, f"bold {p.warning}")
        text = Text.assemble(
            (f"Diagnosis of PID {d.pid}", "bold"),
            (f" ({short_command(d.command, NAME_CELLS, d.runs_in)})" if d.command else "", "bold"),
            ": ",
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
        mark, style = mark_of(step.status, self.palette)
        searching = step.number == 7 and self._search is not None
        if searching:
            mark, style = "…", "bold"
        status = "running" if searching else step.status
        if step.number == 7 and not searching and not self._looked():
            status = "not looked for yet"
        text = Text.assemble((f"{step.number}. {printable(step.title)}", "bold"), "  ", (f"{mark} {status}", style), "\n\n")
        if step.number == 7 and not self._looked():
            text.append_text(self._not_looked_yet())
        else:
            text.append(printable(step.finding) + "\n")
        serving = self.evidence.serving_end if self.evidence else None
        if step.number == 3 and serving is not None and serving.p99_jump is not None:
            text.append(serving.p99_jump.describe() + "\n", style=f"bold {self.palette.warning}")  # the snapshot's finding
        if step.next:
            text.append("\nnext: ", style="bold")
            text.append(printable(step.next) + "\n")
        if step.number == 7 and self._looked() and not searching:
            found = bool(self.evidence and self.evidence.attribution and self.evidence.attribution.suspects)
            again = "a: look again (asks how) · "
            text.append(f"\n{again}Enter: the stacks behind the suspects\n" if found else f"\n{again}Enter: how each way fared\n",
                        style="dim")
        text.append_text(self.evidence_panel(step))
        self.query_one("#step", TextLines).set_text(text)

    def _not_looked_yet(self) -> Text:
        text = Text()
        if self._search is not None:
            text.append(self._progress_line() + "\n", style="bold")
            return text
        text.append("Which code allocates the memory that stays: not looked for yet.\n")
        offer = self._search_offer()
        if offer is not None:
            text.append(f"\n{offer}\n", style="bold")
            if session_of(self.app).can_inject:
                text.append(f"{allocations.TRACKING_COST}.\na: other ways (stack sampling only, nothing runs inside)\n",
                            style="dim")
        else:
            text.append("This recording holds no allocation sites of this process.\n", style="dim")
        return text

    def evidence_panel(self, step: Step) -> Text:
        """The evidence lines of `step` (and, on the Classify step, the verdict's): the report's own."""
        if self.diagnosis is None:
            return Text()
        # Ages from the moment shown: the replay's position in a replay, the latest frame live.
        frame = console_of(self.app).frame
        lines = evidence_lines(self.diagnosis, frame.time if frame is not None else time.time())
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

    def action_find(self) -> None:
        """`y`: look for the allocation sites the way the screen offers (its cost is on screen)."""
        if self._refuse_search():
            return
        self._start_search(session_of(self.app).can_inject)

    def action_allocations(self) -> None:
        """`a`: ask first how to look (memray, or stack sampling only)."""
        if self._refuse_search():
            return

        def chosen(choice: str | None) -> None:
            if choice is not None:
                self._start_search(choice == "memray")

        self.app.push_screen(ConfirmAttach(self.pid, inject=session_of(self.app).can_inject, probe=self._probe), chosen)

    def _refuse_search(self) -> bool:
        if self.working.is_set():
            return True
        if not session_of(self.app).can_attach:
            self.app.notify("a replay shows the allocation sites that were recorded; nothing is attached", severity="warning")
            return True
        return False

    def _start_search(self, use_memray: bool) -> None:
        self.cancel.clear()
        self.working.set()
        self._search = ("memray" if use_memray else "stack sampling", time.monotonic())
        self._sites_seen = None
        self.query_one("#steps", OptionList).highlighted = 6
        self.status(self._progress_line())
        self.render_steps()
        self.look_for_allocations(use_memray)

    @work(thread=True, exclusive=True, group="wizard", exit_on_error=False)
    def look_for_allocations(self, use_memray: bool) -> None:
        def progress(rung: str, fraction: float) -> None:
            self.post_message(WorkProgress(fraction, rung))

        def sites_seen(rung: str, sites: int) -> None:
            self.post_message(WorkProgress(None, rung, sites=sites))

        try:
            result = allocations.attribute(self.pid, ATTRIBUTION_S, use_memray=use_memray,
                                           cancelled=self.cancel.is_set, progress=progress, sites_seen=sites_seen)
        except Exception as exc:  # a surprise in the ladder: said on screen, never "running" forever
            self.post_message(WorkFailed(f"{type(exc).__name__}: {exc}"))
            return
        finally:
            self.working.clear()
        if not self.cancel.is_set():
            session_of(self.app).record("allocations", result)  # kept even if the wizard closes now
            self.post_message(CodePathRead(result))

    def on_work_progress(self, message: WorkProgress) -> None:
        if self._search is not None and message.line is not None:
            rung = message.line.replace("-", " ")
            if rung != self._search[0]:  # the next rung: its own clock
                self._search = (rung, time.monotonic())
                self._sites_seen = None
            if message.sites is not None:
                self._sites_seen = message.sites
            self.status(self._progress_line())
            if self.query_one("#steps", OptionList).highlighted == 6 and self.diagnosis is not None:
                self.show_step(self.diagnosis.steps[6])

    def on_work_failed(self, message: WorkFailed) -> None:
        self._search = None
        self.status(f"step 7 failed: {message.reason}")
        self.render_steps()

    def on_code_path_read(self, message: CodePathRead) -> None:
        self._status = ""
        self._search = None
        self.compute(attribution=message.value)

    def action_stacks(self) -> None:
        att = self.evidence.attribution if self.evidence else None
        if self._search is not None:
            return
        if self.query_one("#steps", OptionList).highlighted == 6 and att is not None:
            self.app.push_screen(AttributionScreen(att))

    def action_export(self) -> None:
        d = self.diagnosis
        if d is None:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            folder = private_folder(exports_dir())  # ours alone: no other user's folder or link on the way
            json_path = write_private(folder / f"diagnosis-{self.pid}-{stamp}.json", json.dumps(d.to_json(), indent=1),
                                      replace=True)
            write_private(folder / f"diagnosis-{self.pid}-{stamp}.md", d.to_text(), replace=True)
        except OSError as exc:
            self.app.notify(f"export failed: {exc.strerror or exc}", severity="error")
            return
        self.app.notify(f"exported {json_path} (+ .md)", title="diagnosis exported")

    def action_close(self) -> None:
        self.cancel.set()  # the ladder stops at its next check and detaches whatever it attached
        self.dismiss()

    def on_unmount(self) -> None:
        self.cancel.set()


class ProbeFound(Message):
    """Whether the process has gpuscope's probe (found off the UI thread)."""

    def __init__(self, found: bool) -> None:
        super().__init__()
        self.found = found
