"""The memory chart of the selected process: GPU memory and RSS against seconds ago.

x is plain numbers (seconds before now): plotext's date helpers are broken with current plotext.
The chart is the largest block of cells on screen, so it is redrawn at most every few seconds,
and then only the spans of its lines that changed are sent to the terminal.
"""

from __future__ import annotations

import time

from rich.ansi import AnsiDecoder
from textual.geometry import Region
from textual.strip import Strip
from textual_plotext import PlotextPlot

from gpuscope.core.model import MemorySeries
from gpuscope.tui.textlines import Cells, cells_of, changed_span

# Seconds between redraws: often while a process has just been chosen and the operator is
# looking, then slower (the table's numbers move every tick; the chart is the trend).
FAST_REDRAW_S, SLOW_REDRAW_S, FAST_FOR_S = 2.0, 10.0, 30.0


def scale(values: list[float]) -> tuple[float, str]:
    top = max(values, default=0.0)
    return ((1 << 30), "GiB") if top >= 2 * (1 << 30) else ((1 << 20), "MiB")


MARKERS_NO_COLOUR = {"GPU": "braille", "RSS": "•", "resv": "+", "alloc": "x"}


class MemoryChart(PlotextPlot):
    DEFAULT_CSS = """
    MemoryChart { width: 2fr; height: 1fr; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._series: MemorySeries | None = None
        self._drawn_at = 0.0
        self._chosen_at = 0.0
        self._drawn_pid: int | None = None
        self._strips: list[Strip] | None = None
        self._cells: list[Cells | None] = []
        self._drawn_for: tuple | None = None  # (size, theme) the lines were drawn for
        self.plt.title("Select a process to chart its memory")

    def show(self, series: MemorySeries | None, force: bool = False) -> None:
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
        # A theme of the terminal's own colours gets a chart without a painted background (plotext's
        # themes are RGB); the lines keep their ANSI colours.
        self.plt.theme("clear" if self.app.native_ansi_color else self._get_plotext_theme_name(self.app.theme))
        console = self.app.console
        strips: list[Strip] = []
        cells: list[Cells | None] = []
        # Line by line: Text.from_ansi joins the lines into one Text, which would be split again.
        for line in AnsiDecoder().decode(self.plt.build()):
            segments = list(line.render(console, end=""))
            strips.append(Strip(segments, line.cell_len))
            cells.append(cells_of(segments))
        self._strips, self._cells = strips, cells
        self._drawn_for = (self.size, self.app.theme)

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
        series = self._series
        if series is None or not series.ages:
            plt.title("Select a process to chart its memory")
        else:
            self._plot_series(series)
        self._repaint_changes()

    def _plot_series(self, series: MemorySeries) -> None:
        plt = self.plt
        gpu = [(-a, v) for a, v in zip(series.ages, series.gpu_bytes) if v is not None]
        rss = [(-a, v) for a, v in zip(series.ages, series.rss_bytes) if v is not None]
        # Each on its own axis (GPU left, RSS right): their sizes differ by orders of magnitude
        # and a shared axis would flatten the smaller one's trend.
        parts = []
        # Without colour (NO_COLOR) only the marker tells the lines apart: each gets its own.
        marker = MARKERS_NO_COLOUR if self.app.no_color else dict.fromkeys(MARKERS_NO_COLOUR, "braille")
        for name, points, side, colour in (("GPU", gpu, "left", "green"), ("RSS", rss, "right", "cyan")):
            if not points:
                continue
            unit, label = scale([v for _, v in points])
            side = side if gpu and rss else "left"
            plt.plot([x for x, _ in points], [v / unit for _, v in points], label=f"{name} {label}",
                     marker=marker[name], color=colour, yside=side)
            parts.append(f"{name} {label}" + (f" ({side})" if gpu and rss else ""))
            if name == "GPU":
                # PyTorch's allocator (a process with a probe) on the GPU's axis: the gap between
                # reserved and allocated is cache, between NVML and reserved the CUDA context.
                for tname, values, tcolour in (("resv", series.reserved_bytes, "yellow"), ("alloc", series.allocated_bytes, "magenta")):
                    tpoints = [(-a, v) for a, v in zip(series.ages, values) if v is not None]
                    if tpoints:
                        plt.plot([x for x, _ in tpoints], [v / unit for _, v in tpoints], label=f"torch {tname}",
                                 marker=marker[tname], color=tcolour, yside=side)
        plt.title(f"PID {series.pid}: {', '.join(parts)} — seconds ago")
        plt.xlim(min(-10.0, -max(series.ages)), 0)  # never a zero-width axis

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
