"""The help screen (`?`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]gpuscope — keys[/b]

  w is for what you look at: the attached process, else a row you
  moved to, else the alert bar's; every other key that names a
  process means the selected row.

  ↑ ↓ j k         move in the table (charts the selected process)
  PgUp PgDn       a page up, down · Home End  the first, the last row
  Enter           attach to the selected process (details + chart)
  x               detach (Esc never does)
  w               diagnose the attached process, else the row moved to,
                  else the alert bar's
                  (↑ ↓ j k steps, y find the code, r re-run, e export, Esc back)
  A               all alerts: pick one to diagnose (it stays in the bar)
  /               filter processes by command, user or PID
  m  g  c         sort by memory, growth, CPU
  o               back to the default order (GPU processes first)
  d               stacks of the selected process (py-spy dump)
  S               hot paths: py-spy samples for 5 s, aggregated
  a               allocation sites: the code whose memory stays (asks first)
  i               the selected process's whole command line
  f               fleet (--prometheus): all nodes' processes; Enter attaches there
  e               export the session as one snapshot file (replay, report)
  t               next colour theme (remembered; all of them in Ctrl+P)
  Esc             close this help, a screen, the filter
  Tab             move the focus (the table, an open filter box)
  Ctrl+P          every action by name · Ctrl+Z suspend (fg resumes)
  replay:         space play/pause · [ ] step · { } ±1 min · < > speed · J jump to a time
  ? F1            this help
  q F10 Ctrl+C    quit

Mouse (optional): a click selects a row, a double click attaches,
a click on the alert bar diagnoses its alert.

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
        Binding("escape,q,question_mark,f1", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        # Scrolls (↑ ↓ PgUp PgDn) where the terminal is shorter than the help: 80x24 included.
        with VerticalScroll():
            yield Static(HELP, id="help-text")
