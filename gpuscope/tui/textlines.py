"""A block of text that repaints only the cells that changed.

A Static repaints its whole region whenever its text changes, so a panel whose clock or RSS
ticks every second resends every line of it over SSH. TextLines keeps the rendered cells of each
line and, on an update, asks Textual to repaint just the span between the first and the last cell
that differ on each changed line; the rest of the panel costs no bytes at all.

Most of what the console shows passes through here, much of it other people's text (command
lines, folders, function names, label values, a recording's contents): every text is made
printable on the way in (`printable_text`), so no control character reaches the terminal. Text is
a Rich Text, never markup, so "[bold]" in a command line is shown as it is.
"""

from __future__ import annotations

from rich.console import Console, OverflowMethod
from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from gpuscope.core.common.printable import printable

Cells = tuple[tuple[str, Style | None], ...]
# What a line of Text draws: its characters, styles, justification and overflow.
LineKey = tuple[str, tuple[Span, ...], str | Style, str | None, str | None]
DrawnLine = tuple[LineKey, list[tuple[Strip, Cells | None]]]


def printable_text(text: Text | str, newlines: bool = True) -> Text:
    """`text` as a Text (a str is never read as markup) with every control, format and separator
    character replaced by a visible one; newlines stay unless `newlines` is False. One character
    is replaced by one, so the styles' spans stay where they were."""
    if isinstance(text, str):
        text = Text(text)
    plain = text.plain
    shown = printable(plain, newlines=newlines)
    if shown == plain:
        return text
    text = text.copy()
    text.plain = shown
    return text


def _styled_through(line: Text) -> Text:
    """A line whose own style is a span, as joining lines makes it (Text.render draws spans only)."""
    if not line.style:
        return line
    line = line.copy()
    line.stylize_before(line.style, 0, len(line))
    line.style = ""
    return line


def cells_of(segments: list[Segment]) -> Cells | None:
    """One (character, style) per terminal cell; None if a character is not one cell wide."""
    out: list[tuple[str, Style | None]] = []
    for seg in segments:
        if seg.cell_length != len(seg.text):
            return None
        out.extend((ch, seg.style) for ch in seg.text)
    return tuple(out)


def changed_span(old: Cells | None, new: Cells | None, width: int) -> tuple[int, int] | None:
    """The [start, end) columns that differ between two rendered lines, or None if none do."""
    if old is None or new is None:
        return (0, width)
    if old == new:
        return None
    blank = (" ", None)  # past its end a line is painted blank
    differ = [
        i for i in range(min(width, max(len(old), len(new))))
        if (old[i] if i < len(old) else blank) != (new[i] if i < len(new) else blank)
    ]
    return (differ[0], differ[-1] + 1) if differ else None


class TextLines(Widget):
    DEFAULT_CSS = """
    TextLines { height: auto; }
    """

    def __init__(self, text: Text | str = "", *, wrap: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self._text: Text | None = printable_text(text)
        self._given: list[Text] | None = None  # the lines, when set by set_lines (then _text is joined when asked)
        self.wrap = wrap  # False: one line per "\n"-separated line, cropped to the width
        self._strips: list[Strip] = []
        self._cells: list[Cells | None] = []
        self._width = 0
        self._auto_width = -1
        self._drawn: list[DrawnLine] = []  # each line of the text, as given, and what it was drawn as
        self._drawn_width = 0

    @property
    def text(self) -> Text:
        if self._text is None:
            self._text = Text("\n").join(self._given or [])
        return self._text

    @property
    def lines(self) -> list[str]:
        """The wrapped lines as plain text (what a reader sees)."""
        return ["".join(seg.text for seg in strip) for strip in self._strips]

    def set_text(self, text: Text) -> None:
        text = printable_text(text)
        if text == self.text:  # same characters and styles: nothing to lay out or send
            return
        self._text, self._given = text, None
        self._rebuild(diff=True)

    def set_lines(self, lines: list[Text]) -> None:
        """The text as its lines, one Text each (a newline inside one is shown, not followed):
        set_text without joining the lines to split them again, for a widget that is not wrapped
        and changes every tick."""
        lines = [_styled_through(printable_text(line, newlines=False)) for line in lines]
        if lines == self._given:
            return
        self._given, self._text = lines, None
        self._rebuild(diff=True)

    def set_wrap(self, wrap: bool) -> None:
        """Wrap long lines (True) or cut each to one line with an ellipsis (False)."""
        if wrap != self.wrap:
            self.wrap = wrap
            self._drawn = []  # drawn the other way
            self._rebuild(diff=False)

    def on_resize(self) -> None:
        self._rebuild(diff=False)

    def _content_width(self) -> int:
        return max((line.cell_len for line in self._split()), default=0)

    def _split(self) -> list[Text]:
        """The lines as given; the caller copies one before changing it."""
        if self._given is not None:
            return self._given
        return list(self.text.split("\n", allow_blank=True))

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return self._content_width()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width != self._width:
            self._width = width
            self._wrap(width)
        return max(1, len(self._strips))

    def _wrap(self, width: int) -> tuple[list[Strip], list[Cells | None]]:
        console = self.app.console
        strips: list[Strip] = []
        cells: list[Cells | None] = []
        # A line that reads as before at the same width is drawn as before: a panel or a table's
        # column changes in a few lines a tick, and wrapping and rendering the others again is
        # most of its cost. Wrapped, each line is wrapped on its own, as Text.wrap does.
        lines = list(self.text.split("\n", allow_blank=True)) if self.wrap else self._split()
        before = self._drawn if width == self._drawn_width else []
        drawn: list[DrawnLine] = []
        for y, line in enumerate(lines):
            key = (line.plain, tuple(line.spans), line.style, line.justify, line.overflow)
            if y < len(before) and before[y][0] == key:
                drawn.append(before[y])
            else:
                drawn.append((key, self._draw(line, width, console)))
            for strip, line_cells in drawn[-1][1]:
                strips.append(strip)
                cells.append(line_cells)
        self._strips, self._cells = strips, cells
        self._drawn, self._drawn_width = drawn, width
        return strips, cells

    def _draw(self, line: Text, width: int, console: Console) -> list[tuple[Strip, Cells | None]]:
        """The strips (and their cells) one line of the text takes at `width`."""
        if self.wrap:
            pieces = list(line.wrap(console, max(1, width), no_wrap=False))
        else:
            line = line.copy()
            if line.cell_len > width:
                # Only text that does not fit earns an ellipsis; trailing padding is just cut.
                overflow: OverflowMethod = "crop" if not line.plain[width:].strip() else "ellipsis"
                line.truncate(width, overflow=overflow)
            pieces = [line]
        drawn = []
        for piece in pieces:
            piece.end = ""
            segments = list(piece.render(console))
            drawn.append((Strip(segments, piece.cell_len), cells_of(segments)))
        return drawn

    def _rebuild(self, diff: bool) -> None:
        width = self.size.width or self._width
        if not width:
            self.refresh(layout=True)
            return
        old_cells = self._cells
        self._width = width
        _, cells = self._wrap(width)
        if self.styles.width is not None and self.styles.width.is_auto:
            content_width = self._content_width()
            if content_width != self._auto_width:
                self._auto_width = content_width
                self.refresh(layout=True)  # an auto-width widget whose text changed width
                return
        if len(cells) != len(old_cells) and self._height_follows_lines():
            self.refresh(layout=True)  # its height is its number of lines: the layout moves
            return
        if not diff or len(cells) != len(old_cells):
            # A layout costs the whole screen's compositor: a widget whose size stays (a table's
            # column, 1fr high) only repaints.
            self.refresh()
            return
        for y, (old, new) in enumerate(zip(old_cells, cells)):
            span = changed_span(old, new, width)
            if span is not None:
                self.refresh(Region(span[0], y, span[1] - span[0], 1))

    def _height_follows_lines(self) -> bool:
        height = self.styles.height
        return height is None or height.is_auto

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self.visual_style.rich_style  # cached by Textual until the styles change
        if y >= len(self._strips):
            return Strip.blank(width, style)
        return self._strips[y].apply_style(style).crop_extend(0, width, style)
