"""Code paths in the console: stack dumps (d), sampled hot paths (S) and allocation sites (a).

Each screen runs its core call (py-spy, the attribution ladder) in a worker thread, which posts
its progress and its immutable result to the screen as messages and never waits on the UI; Esc
cancels, and a cancelled job stops at its next check (py-spy is never left holding the target:
the core functions handle that). What a worker finds is kept with the session (`record`).

Frames, thread names and error messages are the target's text (or a recording's): the tree and
the status line take Rich Text only, never markup, made printable (`printable_text`).
"""

from __future__ import annotations

import threading

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, ProgressBar, Static, Tree
from textual.widgets.tree import TreeNode

from gpuscope.core.diagnosis import ladder as allocations

from gpuscope.core.target import pyspy
from gpuscope.core.diagnosis.attribution import Attribution
from gpuscope.core.target.stacks import KIND_LEGEND, KIND_MARK, LIBRARY, NATIVE, OWN, STDLIB, HotPath, StackDump, StackFrame, StackSample
from gpuscope.core.common.units import format_size
from gpuscope.tui.app_session import session_of
from gpuscope.tui.messages import CodePathRead, WorkFailed, WorkProgress
from gpuscope.tui.palette import palette_of
from gpuscope.tui.textlines import printable_text

STYLE = {OWN: "bold", STDLIB: "dim", LIBRARY: "italic", NATIVE: "dim italic"}
SAMPLE_SECONDS = 5.0
SAMPLE_INTERVAL = 0.1
ATTRIBUTION_SECONDS = 10.0


def frame_label(frame: StackFrame, prefix: str = "") -> Text:
    where = f"{frame.file.rsplit('/', 1)[-1]}:{frame.line}" if frame.line else frame.file.rsplit("/", 1)[-1]
    return Text.assemble(prefix, (f"{KIND_MARK.get(frame.kind, ' ')} {frame.function}", STYLE.get(frame.kind, "")), f"  {where}")


class CodeTree(Tree):
    """A Tree whose labels are never markup and never carry control characters."""

    def process_label(self, label: str | Text) -> Text:
        return super().process_label(printable_text(label))


class CodePathScreen(ModalScreen[None]):
    """The frame shared by the three views: a title, a status line, a progress bar, a tree."""

    DEFAULT_CSS = """
    CodePathScreen { align: center middle; }
    CodePathScreen > Vertical { width: 100%; height: 100%; border: round $primary; background: $surface; padding: 0 1; }
    CodePathScreen #status { height: auto; }
    CodePathScreen ProgressBar { height: 1; }
    CodePathScreen ProgressBar.done { display: none; }
    CodePathScreen Tree { height: 1fr; background: $surface; }
    """
    BINDINGS = [Binding("escape", "close", "Close / cancel"), Binding("q", "close", "Close", show=False)]

    def __init__(self, pid: int, title: str) -> None:
        super().__init__()
        self.pid = pid
        self.title_text = title
        self.cancel = threading.Event()

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text, style="bold"), id="title")
            yield Static(KIND_LEGEND, id="legend")
            yield Static("", id="status")
            yield ProgressBar(total=100, show_eta=False, id="progress")
            yield CodeTree("…", id="tree")
        yield Footer()

    def show(self, value) -> None:
        """Render a worker's result (each view its own)."""

    def on_code_path_read(self, message: CodePathRead) -> None:
        if not self.cancel.is_set():
            self.show(message.value)

    def on_work_progress(self, message: WorkProgress) -> None:
        if message.line is not None:
            self.status(message.line)
        if message.fraction is not None:
            self.progress(message.fraction)

    def on_work_failed(self, message: WorkFailed) -> None:
        self.failed(message.reason)

    def status(self, text: str | Text) -> None:
        self.query_one("#status", Static).update(printable_text(text))

    def progress(self, fraction: float) -> None:
        self.query_one(ProgressBar).update(progress=100 * fraction)

    def done(self) -> None:
        self.query_one(ProgressBar).add_class("done")

    def failed(self, message: str) -> None:
        self.done()
        self.status(Text(f"✖ {message}", style=f"bold {palette_of(self.app).error}"))

    def action_close(self) -> None:
        self.cancel.set()  # a running job stops at its next check
        self.dismiss()

    def on_unmount(self) -> None:
        self.cancel.set()


class DumpScreen(CodePathScreen):
    """`d`: one dump of every thread, innermost frame first."""

    def __init__(self, pid: int, *, native: bool = False, recorded: StackDump | None = None) -> None:
        super().__init__(pid, f"Stacks of PID {pid}" + (" (recorded)" if recorded else ""))
        self.native = native
        self.recorded = recorded

    def on_mount(self) -> None:
        self.query_one(ProgressBar).add_class("done")
        if self.recorded is not None:
            self.show(self.recorded)
            return
        self.status(f"reading the stacks of process {self.pid} with py-spy…")
        self.read()

    @work(thread=True, exclusive=True, group="code-paths", exit_on_error=False)
    def read(self) -> None:
        try:
            dump = pyspy.dump(self.pid, native=self.native)
        except pyspy.PySpyError as exc:
            self.post_message(WorkFailed(str(exc)))
            return
        session_of(self.app).record("stacks", dump)
        self.post_message(CodePathRead(dump))

    def show(self, dump: StackDump) -> None:
        paused = "threads paused while read" if dump.mode == "blocking" else "read without pausing the process"
        self.status(f"{len(dump.threads)} Python threads · {dump.mode} dump ({paused}) · py-spy took {dump.took_s * 1000:.0f} ms")
        tree = self.query_one(Tree)
        tree.reset(Text(f"process {dump.pid}"))
        for thread in dump.threads:
            label = Text.assemble(f"thread {thread.os_thread_id or thread.thread_id} ", (repr(thread.name or "?"), "bold"),
                                  f" [{thread.state}]")
            collapsed = thread.state == "idle"
            if collapsed and thread.frames:  # closed: say how to open it
                label.append(f" · {len(thread.frames)} frames, Enter or a click opens", style="dim")
            node = tree.root.add(label, expand=not collapsed)
            for frame in thread.frames:
                node.add_leaf(frame_label(frame))
        tree.root.expand()
        tree.focus()


class SampleScreen(CodePathScreen):
    """`S`: dumps for a few seconds, aggregated into a tree of hot paths with counts."""

    def __init__(self, pid: int, seconds: float | None = None, interval: float = SAMPLE_INTERVAL,
                 recorded: StackSample | None = None) -> None:
        seconds = recorded.duration_s if recorded else SAMPLE_SECONDS if seconds is None else seconds
        super().__init__(pid, f"Hot paths of PID {pid} ({seconds:g} s)" + (" (recorded)" if recorded else ""))
        self.samples = max(2, round(seconds / interval))
        self.interval = interval
        self.recorded = recorded

    def on_mount(self) -> None:
        if self.recorded is not None:
            self.show(self.recorded)
            return
        self.status(f"sampling process {self.pid}: {self.samples} dumps, {self.interval:g} s apart… (Esc cancels)")
        self.read()

    @work(thread=True, exclusive=True, group="code-paths", exit_on_error=False)
    def read(self) -> None:
        try:
            result = pyspy.sample(
                self.pid, self.samples, self.interval, stop=self.cancel,
                progress=lambda done, total: self.post_message(WorkProgress(done / total)),
            )
        except pyspy.PySpyError as exc:
            self.post_message(WorkFailed(str(exc)))
            return
        if not self.cancel.is_set():
            session_of(self.app).record("hot-paths", result)
        self.post_message(CodePathRead(result))

    def show(self, sample: StackSample) -> None:
        self.done()
        torn = f" · {len(sample.errors)} dumps failed" if sample.errors else ""
        self.status(f"{sample.samples} {sample.mode} dumps over {sample.duration_s:.1f} s{torn} · % of samples of active threads")
        tree = self.query_one(Tree)
        tree.reset(Text(f"process {sample.pid}"))
        if not sample.paths:  # said, rather than an empty tree
            tree.root.add_leaf(Text("no thread was active in any dump: the process was idle (waiting); "
                                    "d shows where each thread waits", style="bold"))
        add_paths(tree.root, sample.paths)
        tree.root.expand()
        tree.focus()


def add_paths(root: TreeNode, paths: tuple[HotPath, ...]) -> None:
    """A trie of the hot paths (outermost frame at the top), expanded along the hottest branch."""
    total = sum(p.count for p in paths) or 1
    trie: dict = {}
    for path in paths:
        level = trie
        for frame in path.frames:
            entry = level.setdefault(frame, [0, {}])
            entry[0] += path.count
            level = entry[1]

    def grow(node: TreeNode, level: dict, expand: bool) -> None:
        for i, (frame, (count, children)) in enumerate(sorted(level.items(), key=lambda kv: -kv[1][0])):
            label = frame_label(frame, f"{100 * count / total:5.1f}% ({count})  ")
            if children:
                child = node.add(label, expand=expand and i == 0)
                grow(child, children, expand and i == 0)
            else:
                node.add_leaf(label)

    grow(root, trie, True)


class SuspectsScreen(CodePathScreen):
    """`a`: the attribution ladder — which code allocated the memory that stays."""

    def __init__(self, pid: int, *, use_memray: bool, seconds: float | None = None) -> None:
        super().__init__(pid, f"Allocation sites of PID {pid}")
        self.use_memray = use_memray
        self.seconds = ATTRIBUTION_SECONDS if seconds is None else seconds

    def on_mount(self) -> None:
        ladder = "memray, then tracemalloc, then stack sampling" if self.use_memray else "stack sampling only"
        self.status(f"watching process {self.pid} for {self.seconds:g} s ({ladder})… (Esc cancels)")
        self.read()

    @work(thread=True, exclusive=True, group="code-paths", exit_on_error=False)
    def read(self) -> None:
        def progress(rung: str, fraction: float) -> None:
            self.post_message(WorkProgress(fraction, f"{rung}: {fraction * 100:.0f}% … (Esc cancels)"))

        result = allocations.attribute(
            self.pid, self.seconds, use_memray=self.use_memray, cancelled=self.cancel.is_set, progress=progress
        )
        if not self.cancel.is_set():
            session_of(self.app).record("allocations", result)
        self.post_message(CodePathRead(result))

    def show(self, result: Attribution) -> None:
        self.done()
        show_attribution(self, result)


def show_attribution(screen: CodePathScreen, result: Attribution) -> None:
    """Suspects best first, each with the stack behind it, and how the ladder was climbed."""
    confidence = {"high": "allocation tracking", "low": "LOW confidence: stack sampling", "none": "no suspects"}
    screen.status(Text.assemble(("suspects by " + (result.method or "-"), "bold"), f" · {confidence[result.confidence]}"))
    tree = screen.query_one(Tree)
    tree.reset(Text(f"process {result.pid}"))
    for rank, s in enumerate(result.suspects, start=1):
        size = format_size(s.bytes, na="bytes unknown")
        # The share and the size first: a long path is what a narrow terminal cuts, not the numbers.
        label = Text.assemble(f"{rank}. {s.share * 100:.0f}% · {size}  ", (s.function, "bold"), f"  {s.file}:{s.line}")
        node = tree.root.add(label, expand=rank == 1)
        for frame in s.stack:
            node.add_leaf(frame_label(frame))
    rungs = tree.root.add(Text("how the ladder was climbed", style="dim"), expand=result.confidence != "high")
    for rung in result.rungs:
        rungs.add_leaf(Text(f"{rung.method}: {rung.status} — {rung.detail}"))
    tree.root.expand()
    tree.focus()


class AttributionScreen(CodePathScreen):
    """The suspects of an attribution already made (the wizard's step 7, one key away)."""

    def __init__(self, result: Attribution, *, recorded: bool = False) -> None:
        super().__init__(result.pid, f"Allocation sites of PID {result.pid}" + (" (recorded)" if recorded else ""))
        self.result = result

    def on_mount(self) -> None:
        self.done()
        show_attribution(self, self.result)


class ConfirmAttach(ModalScreen[str | None]):
    """memray runs code inside the service: ask first, and offer the harmless rung instead."""

    DEFAULT_CSS = """
    ConfirmAttach { align: center middle; }
    ConfirmAttach > Vertical { width: 76; max-width: 100%; height: auto; border: round $warning; background: $surface; padding: 0 1; }
    """
    BINDINGS = [
        Binding("y", "choose('memray')", "memray, then sampling"),
        Binding("s", "choose('sampling')", "Sampling only"),
        Binding("escape,n", "choose(None)", "Cancel"),
    ]

    def __init__(self, pid: int, *, inject: bool = True, probe: bool | None = None) -> None:
        """`inject`: whether the session may run code inside a process (else sampling only);
        `probe`: whether the process has gpuscope's probe (memray then runs through it, no debugger)."""
        super().__init__()
        self.pid = pid
        self.inject = inject
        self.probe = probe

    def compose(self) -> ComposeResult:
        if self.probe:
            how = ("the service has gpuscope's probe: memray runs inside it through the probe, "
                   "nothing is injected, and it stops as soon as gpuscope goes away")
        elif self.probe is None:
            how = ("through the service's gpuscope probe if it has one; else with memray attach, which "
                   "injects through gdb or lldb before Python 3.14 (each tried first on a throwaway process: "
                   "refused if that is harmed)")
        else:
            how = ("with memray attach, which injects through gdb or lldb before Python 3.14 (each tried first on a "
                   "throwaway process: refused if that is harmed)")
        memray = (
            f"memray tracks allocations from inside the process, {how}. {allocations.TRACKING_COST}.\n\n"
            "  y  track with memray for 10 s, fall back to stack sampling\n"
        ) if self.inject else ""
        with Vertical():
            yield Static(
                f"[b]Find the code that allocates memory that stays in PID {self.pid}[/b]\n\n{memray}"
                "  s  stack sampling only (nothing runs inside the service; low confidence)\n"
                "  Esc  cancel"
            )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.inject or parameters != ("memray",)

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
