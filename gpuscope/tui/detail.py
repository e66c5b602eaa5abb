"""The panel about the attached (focused) process, and the whole command line of a process (`i`)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen

from gpuscope.core.node.model import Frame, ProcessRow, TorchMemory
from gpuscope.core.common.printable import printable
from gpuscope.core.common.units import format_bytes, format_rate
from gpuscope.tui.palette import ThemedPanel
from gpuscope.tui.textlines import TextLines


class ProcessPanel(ThemedPanel, TextLines):
    DEFAULT_CSS = """
    ProcessPanel { width: 1fr; min-width: 28; height: 1fr; padding: 0 1; }
    """

    _frame: Frame | None = None

    def on_mount(self) -> None:
        self.follow_theme()

    def redraw(self) -> None:
        if self._frame is not None:
            self.show(self._frame)

    def show(self, frame: Frame) -> None:
        self._frame = frame
        d = frame.focus
        text = Text()
        if d is None:
            text.append("No process attached.\n", style="bold")
            text.append("Enter attaches to the selected process; gpuscope --pid PID attaches at start.", style="dim")
        else:
            rows = [r for r in frame.processes if r.pid == d.pid]
            text.append(f"PID {d.pid}", style="bold")
            if d.runs_in:
                text.append(f" in {printable(d.runs_in)}", style="bold")
            if d.exited:
                text.append("  ✖ exited", style=f"bold {self.palette.error}")
            elif d.status:
                text.append(f"  {printable(d.status)}")
            text.append("  x: detach", style="dim")
            text.append("\n")
            # One line each: a newline in someone's folder name must not forge the next line.
            text.append(f"user    {printable(d.user or '?')}\n")
            text.append(f"python  {d.python_version or 'not Python'}\n")
            text.append(f"threads {'-' if d.threads is None else d.threads}\n")
            text.append(f"cwd     {printable(d.cwd or '(not readable)')}\n")
            text.append_text(_memory_lines(rows))
            torch = next((t for t in frame.torch if t.pid == d.pid), None)
            if torch is not None:
                text.append_text(torch_lines(torch, rows))
            text.append(f"cmd     {printable(d.command)}", style="dim")
        self.set_text(text)


def torch_lines(torch: TorchMemory, rows: list[ProcessRow]) -> Text:
    """PyTorch's allocator beside NVML's number: what is in tensors, what is cached, what is neither."""
    text = Text()
    text.append(f"torch   alloc {format_bytes(torch.allocated_bytes)} · resv {format_bytes(torch.reserved_bytes)}")
    nvml = [r.gpu_memory_bytes for r in rows if r.gpu is not None and r.gpu_memory_bytes is not None]
    if nvml and torch.reserved_bytes is not None:
        # NVML counts the CUDA context and other libraries' memory too: the gap is theirs.
        text.append(f" · other {format_bytes(max(0, sum(nvml) - torch.reserved_bytes))}", style="dim")
    text.append("\n")
    return text


def _memory_lines(rows: list[ProcessRow]) -> Text:
    text = Text()
    if not rows:
        return text
    first = rows[0]
    text.append(f"RSS     {format_bytes(first.rss_bytes)}  {format_rate(first.rss_growth_bytes_per_s)} MB/s\n")
    for r in rows:
        if r.gpu is not None:
            text.append(f"GPU{r.gpu}    {format_bytes(r.gpu_memory_bytes)}  {format_rate(r.gpu_growth_bytes_per_s)} MB/s\n")
    return text


class CommandLineScreen(ModalScreen[None]):
    """`i`: a process's whole command line, wrapped (secrets were redacted before it got here)."""

    DEFAULT_CSS = """
    CommandLineScreen { align: center middle; }
    CommandLineScreen > VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 100%;
                                         padding: 0 1; border: round $primary; background: $surface; }
    """
    BINDINGS = [Binding("escape,q,i,enter", "dismiss", "Close")]

    def __init__(self, row: ProcessRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        r = self.row
        text = Text.assemble((f"PID {r.pid}", "bold"), f"  user {printable(r.user or '?')}",
                             f"  in {printable(r.runs_in)}\n\n" if r.runs_in else "\n\n")
        text.append(printable(r.command) or "(no command line)")
        text.append("\n\nEsc: close", style="dim")
        with VerticalScroll():
            yield TextLines(text, id="command-line")
