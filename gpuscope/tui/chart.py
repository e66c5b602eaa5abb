"""The memory chart of the selected process: GPU memory and RSS over time.

The chart is the largest block of cells on screen, so its axes stand still: x is the time of day
over a span laid out ahead of the data (the newest points are drawn on the right as they come,
the older ones stay where they are), y is a range with headroom around the values. Axes and
labels are laid out again only when the data leaves them (reaches the right edge, or outgrows
the range), or another process is chosen. A redraw then changes only the cells where new points
land, and only the spans of lines that changed are sent to the terminal. Redraws happen at most
every few seconds.

The figure is drawn here, cell by cell, in braille (2x4 dots a cell): a general plotting library
built a small matrix for every point and cost the console as much as all its panels together.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from gpuscope.core.node.model import MemorySeries
from gpuscope.tui.palette import Palette, follow_theme, palette_of
from gpuscope.tui.textlines import Cells, changed_span

# Seconds between redraws: often while a process has just been chosen and the operator is
# looking, then slower (the table's numbers move every tick; the chart is the trend).
FAST_REDRAW_S, SLOW_REDRAW_S, FAST_FOR_S = 2.0, 10.0, 30.0


def scale(values: list[float]) -> tuple[float, str]:
    top = max(values, default=0.0)
    return ((1 << 30), "GiB") if top >= 2 * (1 << 30) else ((1 << 20), "MiB")


MARKERS_NO_COLOUR = {"GPU": "braille", "RSS": "•", "resv": "+", "alloc": "x"}
EMPTY_TITLE = "Select a process to chart its memory"

# x spans (seconds) an axis is laid out over, the shortest that leaves room ahead of the data;
# past the longest, the axis moves on by a step at a time, keeping HISTORY_S of data in view.
SPANS_S = (60.0, 120.0, 360.0)
HISTORY_S = 300.0  # the history the source charts (its CHART_WINDOW_S)
Y_AXIS_LINES = {"GPU": ("GPU", "resv", "alloc"), "RSS": ("RSS",)}  # torch's figures on the GPU's axis
Y_HEADROOM = 0.25  # of the values' range (or of the value, when flat), above and below
# Lines of the chart that are not the plot: the title, the frame's top, the x axis, its labels.
CHART_FURNITURE_LINES = 4


def tick_every(rows: int) -> int:
    """Rows from one y tick to the next on a plot `rows` high."""
    return 3 if rows > 12 else 2 if rows > 3 else 1


def y_ticks(low: float, high: float, rows: int) -> tuple[list[float], list[str]]:
    """Ticks for a y axis from `low` (the bottom row) to `high` (the top row) over `rows` rows:
    one every other row (every third on a tall chart) from the top down, each exactly on its row,
    so the labels stand evenly spaced and say the value of the row they are on."""
    if rows < 2 or high <= low:
        return [], []
    every = tick_every(rows)
    per_row = (high - low) / (rows - 1)
    values = [high - per_row * row for row in range(0, rows, every)]
    step = per_row * every
    decimals = max(0, min(3, 1 - math.floor(math.log10(step))))
    return values, [f"{v:.{decimals}f}" for v in values]


@dataclass(frozen=True, slots=True)
class Axes:
    """The chart's axes for one process: kept while what is drawn fits them (the older points stay
    put), laid out again for another process, past the span, or for a value out of range."""

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


@dataclass(frozen=True, slots=True)
class Line:
    """One line of the figure: points (seconds since the axis' origin, value in its axis' unit)."""

    label: str
    points: tuple[tuple[float, float], ...]
    side: str  # "left" or "right": the y axis it is read against
    style: Style | None
    marker: str  # "braille": drawn in dots, 2x4 a cell; else this character, one a cell


@dataclass(frozen=True, slots=True)
class Figure:
    """What the chart shows, whatever its size: drawn into cells by `draw`."""

    title: str
    lines: tuple[Line, ...] = ()
    ylims: tuple[tuple[str, float, float], ...] = ()  # (side, low, high) in the side's unit
    span: float = 0.0  # x runs from 0 to span seconds
    x_labels: tuple[str, ...] = ()  # under the x ticks, one every quarter of the span


# Braille dots: the bit of each dot of a cell, by its column (0, 1) and row (0-3, top first).
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
_BRAILLE = 0x2800


def draw(figure: Figure, width: int, height: int) -> list[Cells]:
    """The figure as `height` lines of `width` cells: the title, a frame with the y labels on
    either side, the lines inside it and their legend, the x ticks and their labels."""
    blank = (" ", None)
    rows = height - CHART_FURNITURE_LINES
    ticks = {side: dict(zip(range(0, rows, tick_every(rows)), y_ticks(low, high, rows)[1]))
             for side, low, high in figure.ylims} if rows >= 2 else {}
    left_w = max((len(label) for label in ticks.get("left", {}).values()), default=0)
    right_w = max((len(label) for label in ticks.get("right", {}).values()), default=0)
    plot_w = width - left_w - right_w - 2
    out: list[list[tuple[str, Style | None]]] = [[blank] * width for _ in range(height)]
    if rows < 1 or plot_w < 2:
        return [tuple(line) for line in out]

    def put(y: int, x: int, text: str, style: Style | None = None) -> None:
        line = out[y]
        for offset, ch in enumerate(text[: max(0, width - x)]):
            line[x + offset] = (ch, style)

    title = figure.title if len(figure.title) <= width else figure.title[: max(0, width - 1)] + "…"
    put(0, max(0, (width - len(title)) // 2), title, _TITLE)
    put(1, left_w, "┌" + "─" * plot_w + "┐")
    for row in range(rows):
        y = row + 2
        left, right = ticks.get("left", {}).get(row), ticks.get("right", {}).get(row)
        put(y, 0, (left or "").rjust(left_w) + ("┤" if left else "│"))
        put(y, left_w + 1 + plot_w, ("├" if right else "│") + (right or ""))
    tick_columns = [round((plot_w - 1) * i / 4) for i in range(5)] if figure.span > 0 else []
    axis = ["─"] * plot_w
    for column in tick_columns:
        axis[column] = "┬"
    put(rows + 2, left_w, "└" + "".join(axis) + "┘")
    for column, label in zip(tick_columns, figure.x_labels):
        mark = left_w + 1 + column
        put(rows + 3, max(0, min(width - len(label), mark - len(label) // 2)), label)

    plot = _plot(figure, plot_w, rows)
    for (x, y), cell in plot.items():
        out[y + 2][left_w + 1 + x] = cell
    _legend(out, figure, left_w + 1, plot_w, rows)
    return [tuple(line) for line in out]


_TITLE = Style(bold=True)


def _plot(figure: Figure, plot_w: int, rows: int) -> dict[tuple[int, int], tuple[str, Style | None]]:
    """The cells the lines land on, each line drawn over the ones before it; consecutive points
    are joined."""
    limits = {side: (low, high) for side, low, high in figure.ylims}
    cells: dict[tuple[int, int], tuple[str, Style | None]] = {}
    for line in figure.lines:
        if line.side not in limits or figure.span <= 0:
            continue
        low, high = limits[line.side]
        dots = line.marker == "braille"
        across, down = (2, 4) if dots else (1, 1)  # dots in a cell
        x_scale = (plot_w - 1) * across / figure.span
        y_scale = (rows - 1) * down / (high - low) if high > low else 0.0
        y_centre = (down - 1) / 2  # a value exactly on a row's tick lands in the middle of the row
        x_max, y_max = plot_w * across - 1, rows * down - 1
        points = [(min(x_max, max(0, round(x * x_scale + (across - 1) / 2))),
                   min(y_max, max(0, round((high - v) * y_scale + y_centre)))) for x, v in line.points]
        lit: dict[tuple[int, int], int] = {}
        for (x0, y0), (x1, y1) in zip(points, points[1:] or points):
            steps = max(abs(x1 - x0), abs(y1 - y0), 1)
            for k in range(steps + 1):
                px, py = x0 + round((x1 - x0) * k / steps), y0 + round((y1 - y0) * k / steps)
                cell = (px // across, py // down)
                lit[cell] = lit.get(cell, 0) | (_DOTS[px % 2][py % 4] if dots else 1)
        for cell, bits in lit.items():
            cells[cell] = (chr(_BRAILLE + bits) if dots else line.marker, line.style)
    return cells


def _legend(out: list[list[tuple[str, Style | None]]], figure: Figure, left: int, plot_w: int, rows: int) -> None:
    """Each line's marker and label, top left inside the frame, over the lines (L / ⅃: which y
    axis it is read against, where there are two)."""
    sides = {line.side for line in figure.lines}
    for row, line in enumerate(figure.lines[:rows]):
        sample = ("⢕⢕" if line.marker == "braille" else line.marker * 2)
        mark = ("L " if line.side == "left" else "⅃ ") if len(sides) > 1 else ""
        cells = [(ch, None) for ch in f" {mark}"] + [(ch, line.style) for ch in sample]
        cells += [(ch, None) for ch in f" {line.label} "]
        for offset, cell in enumerate(cells[:plot_w]):
            out[row + 2][left + offset] = cell


def _strip(cells: Cells) -> Strip:
    """A line of cells as a Strip: a segment for each run of one style."""
    segments: list[Segment] = []
    run: list[str] = []
    style: Style | None = None
    for ch, cell_style in cells:
        if cell_style is not style and run:
            segments.append(Segment("".join(run), style))
            run = []
        style = cell_style
        run.append(ch)
    if run:
        segments.append(Segment("".join(run), style))
    return Strip(segments, len(cells))


class MemoryChart(Widget):
    DEFAULT_CSS = """
    MemoryChart { width: 2fr; height: 1fr; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._series: MemorySeries | None = None
        self._figure = Figure(EMPTY_TITLE)
        self._now = 0.0  # the time the series' ages count back from
        self._axes: Axes | None = None
        self._kept: dict[str, dict[float, float]] = {}  # line -> time -> bytes, drawn since the origin
        self._drawn_at = 0.0
        self._chosen_at = 0.0
        self._drawn_pid: int | None = None
        self._strips: list[Strip] | None = None
        self._cells: list[Cells] = []
        self._drawn_for: tuple | None = None  # (size, theme) the lines were drawn for
        self._palette: Palette | None = None

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
        """Draw the figure into lines of cells, kept so that a redraw is diffed against them and
        the lines are rendered once, not per repaint."""
        self._cells = draw(self._figure, self.size.width, self.size.height)
        self._strips = [_strip(line) for line in self._cells]
        self._drawn_for = (self.size, self.app.theme)

    @property
    def plain(self) -> str:
        """The chart as a reader sees it (for tests)."""
        return "\n".join("".join(seg.text for seg in strip) for strip in self._strips or [])

    def render_line(self, y: int) -> Strip:
        if self._strips is None or self._drawn_for != (self.size, self.app.theme):
            self._build()
        width = self.size.width
        style = self.visual_style.rich_style  # cached by Textual until the styles change
        if y >= len(self._strips):
            return Strip.blank(width, style)
        return self._strips[y].apply_style(style).crop_extend(0, width, style)

    def replot(self) -> None:
        series = self._series
        if series is None or not series.ages:
            self._figure = Figure(EMPTY_TITLE)
        else:
            self._figure = self._plot_series(series)
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

    def _plot_series(self, series: MemorySeries) -> Figure:
        points = self._points(series)
        axes = self._axes
        gpu, rss = points.get("GPU"), points.get("RSS")
        # Each on its own axis (GPU left, RSS right): their sizes differ by orders of magnitude
        # and a shared axis would flatten the smaller one's trend.
        parts = []
        lines: list[Line] = []
        ylims = []
        # Without colour (NO_COLOR) only the marker tells the lines apart: each gets its own.
        marker = MARKERS_NO_COLOUR if self.app.no_color else dict.fromkeys(MARKERS_NO_COLOUR, "braille")
        palette = self._palette or palette_of(self.app)
        styles = {"GPU": palette.gpu, "RSS": palette.rss, "resv": palette.warning, "alloc": palette.accent}
        for name, side in (("GPU", "left"), ("RSS", "right")):
            line = points.get(name)
            if not line or name not in axes.ylims:
                continue
            unit, label, low, high = axes.ylims[name]
            side = side if gpu and rss else "left"
            lines.append(Line(f"{name} {label}", tuple((t - axes.origin, v / unit) for t, v in line), side,
                              Style(color=styles[name]), marker[name]))
            ylims.append((side, low / unit, high / unit))
            parts.append(f"{name} {label}" + (f" ({side})" if gpu and rss else ""))
            if name == "GPU":
                # PyTorch's allocator (a process with a probe) on the GPU's axis: the gap between
                # reserved and allocated is cache, between NVML and reserved the CUDA context.
                for tname in ("resv", "alloc"):
                    tline = points.get(tname)
                    if tline:
                        lines.append(Line(f"torch {tname}", tuple((t - axes.origin, v / unit) for t, v in tline),
                                          side, Style(color=styles[tname]), marker[tname]))
        ticks = [axes.span * i / 4 for i in range(5)]
        return Figure(f"PID {series.pid}: {', '.join(parts)} — time of day", tuple(lines), tuple(ylims), axes.span,
                      tuple(clock(axes.origin + x, axes.span) for x in ticks))

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
