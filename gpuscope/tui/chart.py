"""The memory chart of the selected process: GPU memory and RSS over time.

The chart is the largest block of cells on screen, so its axes stand still: x is the time of day
over a span laid out ahead of the data (the newest points are drawn on the right as they come,
the older ones stay where they are), y is a range with headroom around the values. Axes and
labels are laid out again only when the data leaves them (reaches the right edge, or outgrows
the range), or another process is chosen. A redraw then changes only the cells where new points
land, and only the spans of lines that changed are sent to the terminal. Redraws happen at most
every few seconds.

x is plain numbers (seconds since the axis' origin, labelled with the time of day): plotext's
date helpers are broken with current plotext.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rich.ansi import AnsiDecoder
from rich.segment import Segment
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual_plotext import PlotextPlot

from gpuscope.core.model import MemorySeries
from gpuscope.tui.palette import Palette, follow_theme, palette_of
from gpuscope.tui.textlines import Cells, cells_of, changed_span

# Seconds between redraws: often while a process has just been chosen and the operator is
# looking, then slower (the table's numbers move every tick; the chart is the trend).
FAST_REDRAW_S, SLOW_REDRAW_S, FAST_FOR_S = 2.0, 10.0, 30.0


def scale(values: list[float]) -> tuple[float, str]:
    top = max(values, default=0.0)
    return ((1 << 30), "GiB") if top >= 2 * (1 << 30) else ((1 << 20), "MiB")


MARKERS_NO_COLOUR = {"GPU": "braille", "RSS": "•", "resv": "+", "alloc": "x"}

# x spans (seconds) an axis is laid out over, the shortest that leaves room ahead of the data;
# past the longest, the axis moves on by a step at a time, keeping HISTORY_S of data in view.
SPANS_S = (60.0, 120.0, 360.0)
HISTORY_S = 300.0  # the history the source charts (its CHART_WINDOW_S)
Y_AXIS_LINES = {"GPU": ("GPU", "resv", "alloc"), "RSS": ("RSS",)}  # torch's figures on the GPU's axis
Y_HEADROOM = 0.25  # of the values' range (or of the value, when flat), above and below
# Lines of the chart that are not the plot: the title, the frame's top, the x axis, its labels.
CHART_FURNITURE_LINES = 4


def y_ticks(low: float, high: float, rows: int) -> tuple[list[float], list[str]]:
    """Ticks for a y axis from `low` (the bottom row) to `high` (the top row) over `rows` rows:
    one every other row (every third on a tall chart) from the top down, each exactly on its row,
    so the labels stand evenly spaced and say the value of the row they are on."""
    if rows < 2 or high <= low:
        return [], []
    every = 3 if rows > 12 else 2 if rows > 3 else 1
    per_row = (high - low) / (rows - 1)
    values = [high - per_row * row for row in range(0, rows, every)]
    step = per_row * every
    decimals = max(0, min(3, 1 - math.floor(math.log10(step))))
    return values, [f"{v:.{decimals}f}" for v in values]


@dataclass(frozen=True, slots=True)
class Axes:
    pid: int
    origin: float  # wall-clock time at x = 0
    span: float
    ylims: dict  # "GPU" / "RSS" -> (unit, unit label, low, high) in bytes


def lay_out_x(oldest: float, now: float) -> tuple[float, float]:
    """(origin, span) of an x axis that shows everything since `oldest` with room ahead."""
    for span in SPANS_S:
        if now - oldest <= span * 0.75:
            return oldest, span
    return now - HISTORY_S, SPANS_S[-1]


def lay_out_y(values: list[float]) -> tuple[float, str, float, float]:
    unit, label = scale(values)
    low, high = min(values), max(values)
    pad = max((high - low) * Y_HEADROOM, high * 0.02, float(1 << 20))
    return unit, label, max(0.0, low - pad), high + pad


def clock(t: float, span: float) -> str:
    return time.strftime("%H:%M:%S" if span < 300 else "%H:%M", time.localtime(t))


class MemoryChart(PlotextPlot):
    DEFAULT_CSS = """
    MemoryChart { width: 2fr; height: 1fr; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._series: MemorySeries | None = None
        self._x_labels: list[str] = []
        self._y_ranges: dict[str, tuple[float, float]] = {}  # yside -> (low, high) in the axis' unit
        self._now = 0.0  # the time the series' ages count back from
        self._axes: Axes | None = None
        self._kept: dict[str, dict[float, float]] = {}  # line -> time -> bytes, drawn since the origin
        self._drawn_at = 0.0
        self._chosen_at = 0.0
        self._drawn_pid: int | None = None
        self._strips: list[Strip] | None = None
        self._cells: list[Cells | None] = []
        self._drawn_for: tuple | None = None  # (size, theme) the lines were drawn for
        self._palette: Palette | None = None
        self.plt.title("Select a process to chart its memory")

    def on_mount(self) -> None:
        follow_theme(self, self._use_palette)

    def _use_palette(self, palette: Palette) -> None:
        """The lines take the theme's colours: plotted again with them."""
        if palette != self._palette:
            self._palette = palette
            self.replot()

    def show(self, series: MemorySeries | None, force: bool = False, now: float | None = None) -> None:
        """Chart `series` (ages counted back from `now`, the frame's time; the clock if None)."""
        self._now = time.time() if now is None else now
        now = time.monotonic()
        pid = series.pid if series else None
        if pid != self._drawn_pid:
            self._chosen_at = now
        elif not force:
            wait = FAST_REDRAW_S if now - self._chosen_at < FAST_FOR_S else SLOW_REDRAW_S
            if now - self._drawn_at < wait:
                return
        self._series = series
        self._drawn_at = now
        self._drawn_pid = pid
        self.replot()

    def _build(self) -> None:
        """Draw the figure into lines of cells (what PlotextPlot.render() would draw), kept so
        that a redraw is diffed against them and the lines are rendered once, not per repaint."""
        width, height = self.size.width, self.size.height
        self.plt.plotsize(width, height)
        self.plt._set_size(width, height)  # see textual-plotext#5: plotsize alone is not enough
        # plotext's own y ticks are evenly spaced in value but land on rows unevenly on a short chart.
        for side, (low, high) in self._y_ranges.items():
            self.plt.yticks(*y_ticks(low, high, height - CHART_FURNITURE_LINES), yside=side)
        # A theme of the terminal's own colours gets a chart without a painted background (plotext's
        # themes are RGB); the lines keep their ANSI colours.
        self.plt.theme("clear" if self.app.native_ansi_color else self._get_plotext_theme_name(self.app.theme))
        console = self.app.console
        strips: list[Strip] = []
        cells: list[Cells | None] = []
        # Line by line: Text.from_ansi joins the lines into one Text, which would be split again.
        lines = list(AnsiDecoder().decode(self.plt.build()))
        axis = next((y for y in range(len(lines) - 2, -1, -1) if "└" in lines[y].plain), None)
        if self._x_labels and axis is not None:
            lines[axis + 1] = self._label_row(lines[axis], width)
        for line in lines:
            segments = list(Segment.simplify(line.render(console, end="")))
            strips.append(Strip(segments, line.cell_len))
            cells.append(cells_of(segments))
        self._strips, self._cells = strips, cells
        self._drawn_for = (self.size, self.app.theme)

    def _label_row(self, axis: Text, width: int) -> Text:
        """The x labels, each centred under its tick mark on the axis line above."""
        marks = [i for i, ch in enumerate(axis.plain) if ch == "┬"]
        if len(marks) != len(self._x_labels):  # plotext left a mark out: spread them over the axis
            left, right = axis.plain.find("└"), axis.plain.rfind("┘")
            n = len(self._x_labels) - 1
            marks = [round(left + 1 + (right - left - 2) * i / n) for i in range(n + 1)]
        row = [" "] * width
        for mark, label in zip(marks, self._x_labels):
            start = max(0, min(width - len(label), mark - len(label) // 2))
            row[start:start + len(label)] = label
        style = axis.get_style_at_offset(self.app.console, marks[0]) if marks and marks[0] < len(axis) else ""
        return Text("".join(row)[:width], style=style)

    @property
    def plain(self) -> str:
        """The chart as a reader sees it (for tests)."""
        return "\n".join("".join(seg.text for seg in strip) for strip in self._strips)

    def render_line(self, y: int) -> Strip:
        if self._strips is None or self._drawn_for != (self.size, self.app.theme):
            self._build()
        width = self.size.width
        style = self.rich_style
        if y >= len(self._strips):
            return Strip.blank(width, style)
        return self._strips[y].apply_style(style).crop_extend(0, width, style)

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        self._x_labels = []
        self._y_ranges = {}
        series = self._series
        if series is None or not series.ages:
            plt.title("Select a process to chart its memory")
        else:
            self._plot_series(series)
        self._repaint_changes()

    def _points(self, series: MemorySeries) -> dict[str, list[tuple[float, float]]]:
        """Each line's (time, bytes) since the axes' origin: what was drawn before stays drawn,
        also once the source's history window has moved past it."""
        now = self._now
        fresh = {name: {now - a: v for a, v in zip(series.ages, values) if v is not None}
                 for name, values in (("GPU", series.gpu_bytes), ("RSS", series.rss_bytes),
                                      ("resv", series.reserved_bytes), ("alloc", series.allocated_bytes))}
        axes = self._axes
        if axes is None or axes.pid != series.pid or not axes.origin <= now <= axes.origin + axes.span:
            self._kept, axes = fresh, None
        else:
            for name, points in fresh.items():
                self._kept.setdefault(name, {}).update(points)
        if axes is None or any(not low <= v <= high for side, (_, _, low, high) in axes.ylims.items()
                               for name in Y_AXIS_LINES[side] for v in self._kept.get(name, {}).values()):
            axes = self._lay_out(series.pid)
        self._axes = axes
        return {name: sorted((t, v) for t, v in points.items() if t >= axes.origin) for name, points in self._kept.items()}

    def _lay_out(self, pid: int) -> Axes:
        times = [t for points in self._kept.values() for t in points]
        origin, span = lay_out_x(min(times, default=self._now), self._now)
        self._kept = {name: {t: v for t, v in points.items() if t >= origin} for name, points in self._kept.items()}
        ylims = {}
        for side, names in Y_AXIS_LINES.items():
            if self._kept.get(side):
                ylims[side] = lay_out_y([v for name in names for v in self._kept.get(name, {}).values()])
        return Axes(pid, origin, span, ylims)

    def _plot_series(self, series: MemorySeries) -> None:
        plt = self.plt
        points = self._points(series)
        axes = self._axes
        gpu, rss = points.get("GPU"), points.get("RSS")
        # Each on its own axis (GPU left, RSS right): their sizes differ by orders of magnitude
        # and a shared axis would flatten the smaller one's trend.
        parts = []
        # Without colour (NO_COLOR) only the marker tells the lines apart: each gets its own.
        marker = MARKERS_NO_COLOUR if self.app.no_color else dict.fromkeys(MARKERS_NO_COLOUR, "braille")
        palette = self._palette or palette_of(self.app)
        colours = {"GPU": palette.plotext("gpu"), "RSS": palette.plotext("rss"), "resv": palette.plotext("warning"),
                   "alloc": palette.plotext("accent")}
        for name, side in (("GPU", "left"), ("RSS", "right")):
            colour = colours[name]
            line = points.get(name)
            if not line or name not in axes.ylims:
                continue
            unit, label, low, high = axes.ylims[name]
            side = side if gpu and rss else "left"
            plt.plot([t - axes.origin for t, _ in line], [v / unit for _, v in line], label=f"{name} {label}",
                     marker=marker[name], color=colour, yside=side)
            plt.ylim(low / unit, high / unit, yside=side)
            self._y_ranges[side] = (low / unit, high / unit)
            parts.append(f"{name} {label}" + (f" ({side})" if gpu and rss else ""))
            if name == "GPU":
                # PyTorch's allocator (a process with a probe) on the GPU's axis: the gap between
                # reserved and allocated is cache, between NVML and reserved the CUDA context.
                for tname in ("resv", "alloc"):
                    tcolour = colours[tname]
                    tline = points.get(tname)
                    if tline:
                        plt.plot([t - axes.origin for t, _ in tline], [v / unit for _, v in tline],
                                 label=f"torch {tname}", marker=marker[tname], color=tcolour, yside=side)
        plt.title(f"PID {series.pid}: {', '.join(parts)} — time of day")
        plt.xlim(0, axes.span)
        ticks = [axes.span * i / 4 for i in range(5)]
        # Blank labels from plotext (where it puts them shifts with state it keeps between
        # charts); _build writes the times under the tick marks itself.
        plt.xticks(ticks, [""] * len(ticks))
        self._x_labels = [clock(axes.origin + x, axes.span) for x in ticks]

    def _repaint_changes(self) -> None:
        if self._strips is None or not self.size.area or self._drawn_for != (self.size, self.app.theme):
            self._strips = None
            self.refresh()
            return
        old = self._cells
        self._build()
        if len(old) != len(self._cells):
            self.refresh()
            return
        width = self.size.width
        for y, (a, b) in enumerate(zip(old, self._cells)):
            span = changed_span(a, b, width)
            if span is not None:
                self.refresh(Region(span[0], y, span[1] - span[0], 1))
