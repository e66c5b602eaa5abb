"""The help screen (`?`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]gpuscope — keys[/b]

  ↑ ↓ PgUp PgDn   move in the table (charts the selected process)
  Enter           attach to the selected process (details + chart)
  Esc             detach / close this help / clear the filter
  /               filter processes by command, user or PID
  m  g  c         sort by memory, growth, CPU
  o               back to the default order (GPU processes first)
  d               stacks of the selected process (py-spy dump)
  S               hot paths: py-spy samples for 5 s, aggregated
  a               allocation sites: the code whose memory stays
  w               diagnose: the alert's process, or the selected one
                  (↑ ↓ steps, r re-run, a sites, Enter stacks, e export)
  f               fleet (--prometheus): all nodes' processes; Enter attaches there
  e               export the session as one snapshot file (replay, report)
  t               next colour theme (remembered; all of them in Ctrl+P)
  replay:         space play/pause · [ ] step · { } ±1 min · < > speed · j jump
  ?               this help
  q               quit

GROW MB/s is the growth of the memory floor over the last 30 s:
GPU memory on GPU rows, host RSS on the others. ▲ marks growth.
N/A means NVML could not say (it is never shown as 0).
"""


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 76; max-width: 100%; height: auto; max-height: 100%; padding: 0 1; border: round $primary; background: $surface; }
    """
    BINDINGS = [
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        # Scrolls (↑ ↓ PgUp PgDn) where the terminal is shorter than the help: 80x24 included.
        with VerticalScroll():
            yield Static(HELP, id="help-text")
