"""The memory chart of the selected process: GPU memory and RSS against seconds ago.

x is plain numbers (seconds before now): plotext's date helpers are broken with current plotext.
Redraws are rate-limited, because a chart is the largest block of cells that changes every tick.
"""

from __future__ import annotations

import time

from textual_plotext import PlotextPlot

from gpuscope.core.model import MemorySeries

MIN_REDRAW_S = 2.0


def scale(values: list[float]) -> tuple[float, str]:
    top = max(values, default=0.0)
    return ((1 << 30), "GiB") if top >= 2 * (1 << 30) else ((1 << 20), "MiB")


class MemoryChart(PlotextPlot):
    DEFAULT_CSS = """
    MemoryChart { width: 2fr; height: 1fr; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._series: MemorySeries | None = None
        self._drawn_at = 0.0
        self._drawn_pid: int | None = None
        self.plt.title("Select a process to chart its memory")

    def show(self, series: MemorySeries | None, force: bool = False) -> None:
        now = time.monotonic()
        pid = series.pid if series else None
        if not force and pid == self._drawn_pid and now - self._drawn_at < MIN_REDRAW_S:
            return
        self._series = series
        self._drawn_at = now
        self._drawn_pid = pid
        self.replot()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        series = self._series
        if series is None or not series.ages:
            plt.title("Select a process to chart its memory")
            self.refresh()
            return
        gpu = [(-a, v) for a, v in zip(series.ages, series.gpu_bytes) if v is not None]
        rss = [(-a, v) for a, v in zip(series.ages, series.rss_bytes) if v is not None]
        # Each on its own axis (GPU left, RSS right): their sizes differ by orders of magnitude
        # and a shared axis would flatten the smaller one's trend.
        parts = []
        for name, points, side, colour in (("GPU", gpu, "left", "green"), ("RSS", rss, "right", "cyan")):
            if not points:
                continue
            unit, label = scale([v for _, v in points])
            side = side if gpu and rss else "left"
            plt.plot([x for x, _ in points], [v / unit for _, v in points], label=f"{name} {label}",
                     marker="braille", color=colour, yside=side)
            parts.append(f"{name} {label}" + (f" ({side})" if gpu and rss else ""))
        plt.title(f"PID {series.pid}: {', '.join(parts)} — seconds ago")
        plt.xlim(min(-10.0, -max(series.ages)), 0)  # never a zero-width axis
        self.refresh()
