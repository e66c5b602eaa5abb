"""The process table with the chart and the process panel below it, in the lines left over.

The panels above (devices, alert, service) take what they need; the chart and the process panel
(the trend and the details of the process followed: on call, the culprit) take their full height
where the table keeps `TABLE_MIN_LINES` beside them, a smaller one where it keeps
`TABLE_FLOOR_LINES`, and yield only below that: at 80x24 with an alert and the service panel they
stay, and the table's rows past the first few are what yields. The decision is made on the lines
the workspace gets, so it follows the terminal's size and panels coming and going alike.
"""

from __future__ import annotations

from textual import events
from textual.containers import Vertical

TABLE_MIN_LINES = 9  # the header and 8 rows, beside the full chart
TABLE_FLOOR_LINES = 5  # the header and 4 rows: the table yields no further to the chart
# The chart's heights in gpuscope.tcss: `#bottom` and `.chart-small #bottom`.
CHART_LINES, CHART_SMALL_LINES = 14, 9


def chart_classes(lines: int) -> dict[str, bool]:
    """Which of the chart's classes apply when the workspace has `lines` lines."""
    return {
        "chart-small": lines < TABLE_MIN_LINES + CHART_LINES,
        "chart-hidden": lines < TABLE_FLOOR_LINES + CHART_SMALL_LINES,
    }


class Workspace(Vertical):
    DEFAULT_CSS = """
    Workspace { height: 1fr; }
    """

    def on_resize(self, event: events.Resize) -> None:
        for name, on in chart_classes(event.size.height).items():
            self.set_class(on, name)
