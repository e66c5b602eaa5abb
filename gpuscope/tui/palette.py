"""The theme's colours for what widgets draw into text (Rich styles, the chart's lines).

CSS follows a change of theme by itself; colours written into a Text or a chart do not. Each
widget that draws colour asks `follow_theme` for a `Palette` when it mounts and again whenever
the app's theme changes, and draws with that, so the light, high-contrast and ANSI themes reach
the chart, the table and the panels as they reach the CSS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast
from dataclasses import dataclass

from textual.app import App
from textual.color import Color, ColorParseError
from textual.widget import Widget

from gpuscope.theme_files import VARIABLE_DEFAULTS


@dataclass(frozen=True)
class Palette:
    """Rich colour names (#rrggbb, or color(N) for a theme of the terminal's own colours)."""

    gpu: str
    rss: str
    growth: str
    success: str
    warning: str
    error: str
    accent: str
    secondary: str


DEFAULT_SUCCESS, DEFAULT_WARNING, DEFAULT_ERROR = "#4EBF71", "#FFA62B", "#BA3C5B"  # Textual's defaults
DEFAULT_ACCENT, DEFAULT_SECONDARY = "#FFA62B", "#0178D4"


def _rich(value: str | None, fallback: str) -> str:
    try:
        return Color.parse(value or fallback).rich_color.name
    except ColorParseError:
        return Color.parse(fallback).rich_color.name


def palette_of(app: App) -> Palette:
    """The palette of the app's current theme (its CSS variables, gpuscope's own included)."""
    variables = app.get_css_variables()

    def own(name: str) -> str:
        return _rich(variables.get(name), VARIABLE_DEFAULTS[name])

    def textual(name: str, fallback: str) -> str:
        return _rich(variables.get(name), fallback)

    return Palette(
        gpu=own("gpuscope-gpu"),
        rss=own("gpuscope-rss"),
        growth=own("gpuscope-growth"),
        success=textual("success", DEFAULT_SUCCESS),
        warning=textual("warning", DEFAULT_WARNING),
        error=textual("error", DEFAULT_ERROR),
        accent=textual("accent", DEFAULT_ACCENT),
        secondary=textual("secondary", DEFAULT_SECONDARY),
    )


# Until a widget is mounted (and for text built without an app): the default theme's colours.
DEFAULT_PALETTE = Palette(
    gpu=_rich(None, VARIABLE_DEFAULTS["gpuscope-gpu"]), rss=_rich(None, VARIABLE_DEFAULTS["gpuscope-rss"]),
    growth=_rich(None, VARIABLE_DEFAULTS["gpuscope-growth"]), success=_rich(None, DEFAULT_SUCCESS),
    warning=_rich(None, DEFAULT_WARNING), error=_rich(None, DEFAULT_ERROR), accent=_rich(None, DEFAULT_ACCENT),
    secondary=_rich(None, DEFAULT_SECONDARY),
)


def follow_theme(widget: Widget, use: Callable[[Palette], None]) -> None:
    """Call `use` with the theme's palette now and after every change of the app's theme (from
    the widget's on_mount: the watch ends with the widget)."""
    app = widget.app
    widget.watch(app, "theme", lambda _theme: use(palette_of(app)), init=True)


class ThemedPanel:
    """What a panel that writes colours into its text shares: the theme's `palette`, taken when it
    mounts (its on_mount calls `follow_theme()`) and again at each change of theme, after which it
    draws what it shows again in the new colours (`redraw()`, its own)."""

    palette: Palette = DEFAULT_PALETTE

    def follow_theme(self) -> None:
        follow_theme(cast("Widget", self), self._use_palette)

    def _use_palette(self, palette: Palette) -> None:
        self.palette = palette
        self.redraw()

    def redraw(self) -> None:
        """Draw again what is shown (nothing before the first value), in the current palette."""
        raise NotImplementedError
