"""The devices panel: one line per GPU, one for host memory, and any notices."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuscope.core.model import Frame
from gpuscope.core.units import format_bytes


def bar(used: int | None, total: int | None, width: int) -> Text:
    if not used or not total or width <= 0:
        return Text("░" * width, style="dim")
    filled = max(0, min(width, round(width * used / total)))
    share = used / total
    style = "red" if share >= 0.9 else "yellow" if share >= 0.75 else "green"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"))


def percent(used: int | None, total: int | None) -> str:
    return f"{100 * used / total:3.0f}%" if used is not None and total else "  - "


class DevicesPanel(Static):
    DEFAULT_CSS = """
    DevicesPanel { height: auto; padding: 0 1; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self._last: tuple | None = None

    def show(self, frame: Frame) -> None:
        width = (self.size.width or 80) - 2  # minus padding
        name_width = 22 if width >= 110 else 12
        # label + bar + " 63.0G/141.0G   45%  util  97% 64°C": the bar takes what is left.
        bar_width = max(6, min(40, width - (6 + name_width + 1) - 36))
        text = Text()
        if frame.nvml.status:
            text.append("⚠ ", style="bold yellow")
            text.append(f"{frame.nvml.status} — showing host memory only\n", style="yellow")
        for d in frame.nvml.devices:
            label = f"GPU{d.index:<2} {d.name[:name_width]:<{name_width}} "
            text.append(label)
            if d.error:
                text.append(f"✖ {d.error}\n", style="bold red")
                continue
            util = "N/A" if d.utilization is None else f"{d.utilization}%"
            temp = "" if d.temperature is None else f" {d.temperature}°C"
            text.append_text(bar(d.memory_used, d.memory_total, bar_width))
            text.append(
                f" {format_bytes(d.memory_used):>6}/{format_bytes(d.memory_total):<6}"
                f" {percent(d.memory_used, d.memory_total)} util {util:>4}{temp}\n"
            )
        host = frame.host
        if host is not None:
            text.append(f"HOST  {frame.hostname[:name_width]:<{name_width}} ")
            text.append_text(bar(host.used, host.total, bar_width))
            text.append(f" {format_bytes(host.used):>6}/{format_bytes(host.total):<6} {percent(host.used, host.total)}\n")
        for notice in frame.notices:
            text.append("! ", style="bold yellow")
            text.append(notice + "\n", style="yellow")
        text.rstrip()
        key = (text.plain, tuple(str(s) for s in text.spans), bar_width)
        if key != self._last:  # repaint only when the text changed
            self._last = key
            self.update(text)

    def on_resize(self) -> None:
        self._last = None  # the bar width depends on the width: redraw at the next frame
