"""The process table with the chart and the process panel below it, in the lines left over.

The panels above (devices, alert, service) take what they need; the table takes at least
`TABLE_MIN_LINES` of what is left, and the chart gets the rest: its full height, a smaller one,
or, on a short terminal, none at all. The table wins because on call it is where the answer is
(which process); the chart is the trend of the one selected. The decision is made on the lines
the workspace gets, so it follows the terminal's size and panels coming and going alike.
"""

from __future__ import annotations

from textual import events
from textual.containers import Vertical

TABLE_MIN_LINES = 9  # the header and 8 rows
# The chart's heights in gpuscope.tcss: `#bottom` and `.chart-small #bottom`.
CHART_LINES, CHART_SMALL_LINES = 14, 9


def chart_classes(lines: int) -> dict[str, bool]:
    """Which of the chart's classes apply when the workspace has `lines` lines."""
    return {
        "chart-small": lines < TABLE_MIN_LINES + CHART_LINES,
        "chart-hidden": lines < TABLE_MIN_LINES + CHART_SMALL_LINES,
    }


class Workspace(Vertical):
    DEFAULT_CSS = """
    Workspace { height: 1fr; }
    """

    def on_resize(self, event: events.Resize) -> None:
        for name, on in chart_classes(event.size.height).items():
            self.set_class(on, name)
