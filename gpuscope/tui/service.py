"""The service panel: what the memory problem does to the service.

Three lines: where the numbers come from, whether the source answers, and the P99 jump the core
found (the snapshot carries it; nothing is computed here); the headline signals
with a sparkline of their recent history (latency over its SLO is coloured and marked "!"); and
the pipeline's stages with their share of the request time as bars. When the target stops
answering, the panel says since when instead of showing stale numbers as if they were current.

On a short terminal the panel is compact: one line each for where from, the signals (without
their sparklines) and the stages (without their bars), each cut with an ellipsis rather than
wrapped, and no fleet line, so the process table keeps its rows.
"""

from __future__ import annotations

import time

from rich.text import Text

from gpuscope.core.settings import SloConfig
from gpuscope.core.common.printable import printable
from gpuscope.core.serving.model import ServingSnapshot
from gpuscope.tui.palette import ThemedPanel
from gpuscope.tui.textlines import TextLines

SPARK = "▁▂▃▄▅▆▇█"
SPARK_POINTS = 8


def sparkline(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return " " * SPARK_POINTS
    lo, hi = min(known), max(known)
    span = hi - lo or 1.0
    cells = [" " if v is None else SPARK[min(7, int((v - lo) / span * 7.999))] for v in values[-SPARK_POINTS:]]
    return "".join(cells).rjust(SPARK_POINTS)


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def number(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


class ServicePanel(ThemedPanel, TextLines):
    DEFAULT_CSS = """
    ServicePanel { height: auto; padding: 0 1; background: $surface; }
    ServicePanel.empty { display: none; }
    """

    def __init__(self, slo: SloConfig | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.slo = slo or SloConfig()
        self._snap: ServingSnapshot | None = None
        self.compact = False
        self.add_class("empty")

    def on_mount(self) -> None:
        self.follow_theme()

    def redraw(self) -> None:
        if self._snap is not None:
            self.show(self._snap)

    def set_compact(self, compact: bool) -> None:
        """Three lines that never wrap (a short terminal), or every line, wrapped."""
        if compact == self.compact:
            return
        self.compact = compact
        if self._snap is not None:
            self.set_text(self.render_snapshot(self._snap))
        self.set_wrap(not compact)

    def show(self, snap: ServingSnapshot) -> None:
        self._snap = snap
        self.remove_class("empty")
        self.set_text(self.render_snapshot(snap))

    def render_snapshot(self, snap: ServingSnapshot) -> Text:
        s = snap.signals
        p = self.palette
        text = Text()
        text.append("SERVICE ", style="bold")
        text.append(printable(f"{snap.profile or 'unknown profile'} · {snap.source} {snap.target}"))
        if snap.ok:
            text.append(f" · {snap.window_s:g} s window")
        else:
            text.append(f" · ✖ {printable(snap.state)}", style=f"bold {p.error}")  # may quote the server
            if snap.as_of:
                text.append(f" (numbers as of {time.strftime('%H:%M:%S', time.localtime(snap.as_of))})", style="dim")
        if snap.p99_jump is not None:  # found by the core when the snapshot was made
            text.append(f" · ▲ {snap.p99_jump.describe()}", style=f"bold {p.warning}")
        text.append("\n")
        stale = "" if snap.ok else "dim"
        self._signal(text, "P95", seconds(s.e2e_latency_p95_s), snap, "e2e_latency_p95_s", self.slo.e2e_latency_p95_s, stale)
        self._signal(text, "P99", seconds(s.e2e_latency_p99_s), snap, "e2e_latency_p99_s", None, stale)
        self._signal(text, "TTFT95", seconds(s.ttft_p95_s), snap, "ttft_p95_s", self.slo.ttft_p95_s, stale)
        self._signal(text, "TPOT95", seconds(s.tpot_p95_s), snap, "tpot_p95_s", None, stale)
        self._signal(text, "tok/s", number(s.tokens_per_s), snap, "tokens_per_s", None, stale)
        text.append(
            f"req/s {number(s.requests_per_s)}  err {number(None if s.error_rate is None else 100 * s.error_rate)}%  "
            f"queue {number(s.queue_depth, '{:.0f}')}  KV {number(None if s.kv_cache_usage is None else 100 * s.kv_cache_usage, '{:.0f}%')}",
            style=stale,
        )
        if snap.stages:
            text.append("\n")
            for stage in snap.stages:
                share = stage.share or 0.0
                text.append(f"{stage.name} ")
                if not self.compact:  # the share says what the bar shows
                    filled = round(share * 10)
                    text.append("█" * filled, style=p.secondary)
                    text.append("░" * (10 - filled), style="dim")
                    text.append(" ")
                text.append(f"{seconds(stage.p50_s)}/{seconds(stage.p95_s)} {share * 100:.0f}%",
                            style=stale)
                text.append("  " if self.compact else "   ")
        if snap.fleet and not self.compact:
            text.append("\nFLEET growth ", style="bold")
            for row in snap.fleet[:4]:
                where = "/".join(x for x in (row.host, f"gpu{row.gpu}" if row.gpu is not None else None, row.pod) if x)
                rate = "-" if row.growth_mib_per_s is None else f"{row.growth_mib_per_s:+.1f} MiB/s"
                text.append(f"{where} {rate}   ")
        text.rstrip()
        return text

    def _signal(self, text: Text, label: str, value: str, snap: ServingSnapshot, name: str, slo: float | None, style: str) -> None:
        current = snap.signals.get(name)
        breach = slo is not None and current is not None and current > slo
        text.append(f"{label} ", style=style)
        text.append(f"{'!' if breach else ''}{value}", style=f"bold {self.palette.error}" if breach else style or "bold")
        if self.compact:
            text.append("  ")
        else:
            text.append(f" {sparkline([v for _, v in snap.series(name)])}  ", style="dim")
