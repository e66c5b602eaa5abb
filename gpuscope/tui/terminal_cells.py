"""What the terminal shows, cell by cell, so that an update sends only the cells that changed.

Textual repaints a widget's region whenever the widget refreshes, and writes every cell of it
with a full style before each run of text and a reset after it. Over SSH those bytes are what the
operator feels, and most of them rewrite what the terminal already shows. Like curses,
`TerminalCells` keeps a copy of the screen (per cell: the character and its style's SGR codes)
and turns each of Textual's updates into the runs of cells that differ from the copy: one short
cursor move per run, only the SGR codes that change, no newlines; where a block of lines moved up
or down (a table's rows when a process comes or goes), the terminal scrolls it. The text style in
effect at the end of an update is left for the next (most start in the style the last ended in),
when the terminal driver resets it before handing the terminal back (`carry_style`).

The copy must never disagree with the terminal where it matters. A cell whose content is not
followed (a strip drawn as Textual draws it) is marked unknown, and an unknown cell is always sent
again; a wide character is always sent whole. `forget` makes every cell unknown: on a
resize, a suspend and a resume, and whenever something other than a compositor update was written.

This reads Textual's compositor updates (textual._compositor, App._display), which are not public:
tests/unit/test_terminal_cells.py feeds both outputs to a terminal emulator, so an upgrade of
Textual that changes them fails there.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from itertools import groupby
from operator import itemgetter, ne
from typing import cast

from rich.cells import get_character_cell_size
from rich.color import ColorSystem
from rich.console import Console, RenderableType
from textual import events, on
from textual._compositor import ChopsUpdate, Compositor, CompositorUpdate, LayoutUpdate
from textual.app import App
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip

# One cell: (character, SGR codes, link). The second half of a wide character is CONTINUED.
Cell = tuple[str, str, str]
CONTINUED = ""
UNKNOWN = None  # a cell whose content on the terminal is not known: never equal to a new cell
# Unchanged cells between two changed runs are sent again rather than jumped over when they cost
# no more bytes than the cursor move (4 or 5 bytes), so never more than these.
JOIN_CELLS = 5
# The bytes of a scroll: set the region, place the cursor, insert or delete lines, reset the region.
SCROLL_COST = 24


class TerminalCells:
    """The screen as last sent, and the diff of each compositor update against it.

    `carry_style`: an update ends in the text style of its last cells rather than a reset, and the
    next starts from it. Only where nothing else prints text in between (the SGR codes in effect
    would colour it) and the terminal is reset before it is handed back (see ChangedCellsApp).
    """

    def __init__(self, carry_style: bool = True) -> None:
        self.rows: dict[int, list[Cell | None]] = {}
        self.carry_style = carry_style
        self.sgr: str | None = ""  # the SGR codes in effect on the terminal; None: not known

    def forget(self) -> None:
        """The terminal may show anything now: the next update sends every cell it covers."""
        self.rows.clear()
        self.sgr = None

    def update(self, update: object) -> object:
        """What to hand Textual's display instead of `update`: a compositor update rendered as
        the cells that changed, or `update` itself (after forgetting: it is not ours to follow),
        behind a reset when a style was left in effect."""
        if isinstance(update, (ChopsUpdate, LayoutUpdate)):
            return ChangedCells(self, update)
        left = self.sgr
        self.forget()
        return _AfterReset(update) if left != "" and isinstance(update, CompositorUpdate) else update

    # -- the diff ---------------------------------------------------------------------------------

    def render(self, update: ChopsUpdate | LayoutUpdate, console: Console) -> str:
        color_system = console._color_system or ColorSystem.TRUECOLOR
        placed = [(y, x, strip, self._cells(strip, color_system)) for y, x, strip in _placed_strips(update)]
        out = _Output(self.sgr if self.carry_style else "")
        writes: dict[int, list[tuple[int, list[Cell] | str]]] = {}  # y -> (x, cells or raw text)
        scrolled = self._scroll(placed, out, writes)
        for y, x, strip, new in placed:
            if y not in scrolled:
                self._diff(writes.setdefault(y, []), y, x, new if new is not None else strip.render(console),
                           strip.cell_length)
        for y in sorted(writes):  # the writes do not overlap: any order shows the same screen
            for x, what in self._joined(self.rows[y], sorted(writes[y], key=lambda w: w[0])):
                out.move(x, y)
                if isinstance(what, str):
                    out.raw(what)
                else:
                    out.cells(what)
        text, self.sgr = out.finish(keep_style=self.carry_style)
        return text

    def _diff(self, writes: list, y: int, x: int, new: list[Cell] | str, length: int) -> None:
        """Note in `writes` (and in the copy) what of `new`, placed at `x`, differs: cells, or a
        strip's rendering whose cells are not followed."""
        row = self.rows.setdefault(y, [])
        end = x + length
        if len(row) < end:
            row.extend([UNKNOWN] * (end - len(row)))
        if isinstance(new, str):  # drawn as Textual draws it
            writes.append((x, new))
            start = max(0, x - 1)  # a leading zero-width character joins the cell before
            row[start:end] = [UNKNOWN] * (end - start)
            return
        old = row[x:end]
        if old == new:
            return
        for start, stop in _changed_runs(old, new):
            writes.append((x + start, new[start:stop]))
            row[x + start : x + stop] = new[start:stop]

    def _scroll(self, placed: list, out: _Output, writes: dict) -> set[int]:
        """Where a block of whole lines moved up or down (a table's rows when one comes or goes),
        scroll them on the terminal (a scrolling region, then insert or delete lines) instead of
        sending each line again, as curses does. Returns the rows diffed here, whole."""
        targets: dict[int, list] = {}  # y -> the whole line after the update
        for y, x, _, new in placed:
            row = self.rows.get(y)
            if new is None or row is None or x + len(new) > len(row):
                return set()
            target = targets.get(y)
            if target is None:
                target = targets[y] = list(row)
            target[x:x + len(new)] = new
        best = None  # (cells saved, top, bottom, shift)
        for block in _consecutive(sorted(targets)):
            width = len(self.rows[block[0]])
            if len(block) < 3 or any(len(self.rows[y]) != width or UNKNOWN in self.rows[y] for y in block):
                continue
            unscrolled = [_differing(targets[y], self.rows[y]) for y in block]
            if sum(unscrolled) <= width + SCROLL_COST:  # no scroll can save more
                continue
            for shift in (1, -1, 2, -2, 3, -3):
                found = _best_scroll(block, shift, unscrolled, targets, self.rows, width)
                if found is not None and (best is None or found[0] > best[0]):
                    best = found
        if best is None:
            return set()
        _, top, bottom, shift = best
        out.scroll(top, bottom, shift)
        old = {y: self.rows[y] for y in range(top, bottom + 1)}
        width = len(old[top])
        for y in range(top, bottom + 1):
            source = y - shift
            self.rows[y] = list(old[source]) if top <= source <= bottom else [UNKNOWN] * width
            self._diff(writes.setdefault(y, []), y, 0, targets[y], width)
        return set(range(top, bottom + 1))

    @staticmethod
    def _joined(row: list[Cell | None], writes: list[tuple[int, list[Cell] | str]]) -> list:
        """`writes` with runs of cells joined where the unchanged cells between them (known, in the
        style on both sides) cost no more bytes to send again than a cursor move."""
        joined: list[tuple[int, list[Cell] | str]] = []
        for x, what in writes:
            before = joined[-1] if joined else None
            if before is not None and isinstance(before[1], list) and isinstance(what, list):
                at, cells = before
                end = at + len(cells)
                style = cells[-1][1:]
                if 0 <= x - end <= JOIN_CELLS and what[0][1:] == style and None not in row[end:x]:
                    gap = cast(list[Cell], row[end:x])
                    if (all(c[1:] == style for c in gap)
                            and sum(len(c[0].encode()) for c in gap) <= len(f"\x1b[{x + 1}G")):
                        joined[-1] = (at, [*cells, *gap, *what])
                        continue
            joined.append((x, what))
        return joined

    def _cells(self, strip: Strip, color_system: ColorSystem) -> list[Cell] | None:
        """One cell per terminal column; None for a strip whose cells cannot be followed (a
        control segment, a zero-width character with nothing before it to join)."""
        cells: list[Cell] = []
        append = cells.append
        for text, style, control in strip:
            if control:
                return None
            if style is None:
                sgr, link = "", ""
            else:
                cached = style._ansi  # Textual's own codes for the style, cached on it
                sgr = cached if cached is not None else Strip.render_ansi(style, color_system)
                link = style._link or ""
            if text.isascii() and text.isprintable():
                cells.extend([(ch, sgr, link) for ch in text])
                continue
            for ch in text:
                width = get_character_cell_size(ch)
                if width == 1:
                    append((ch, sgr, link))
                elif width == 2:
                    append((ch, sgr, link))
                    append((CONTINUED, sgr, link))
                elif cells and cells[-1][0] != CONTINUED:
                    last = cells[-1]
                    cells[-1] = (last[0] + ch, last[1], last[2])
                else:
                    return None
        return cells


def _consecutive(rows: list[int]) -> list[list[int]]:
    """Sorted row numbers in blocks of consecutive ones."""
    blocks: list[list[int]] = []
    for y in rows:
        if blocks and blocks[-1][-1] == y - 1:
            blocks[-1].append(y)
        else:
            blocks.append([y])
    return blocks


def _differing(a: list, b: list) -> int:
    """How many cells of two lines differ."""
    return len(a) if len(a) != len(b) else sum(map(ne, a, b))


def _best_scroll(block: list[int], shift: int, unscrolled: list[int], targets: dict, rows: dict,
                 width: int) -> tuple[int, int, int, int] | None:
    """The region of `block` that, its lines moved by `shift` (down if positive), leaves the
    fewest cells to send: (cells saved, top, bottom, shift), or None if none saves any."""
    first, last, n = block[0], block[-1], abs(shift)
    # Per row, the cells left to send once the line it gets has moved there (0 where none can).
    moved = [_differing(targets[y], rows[y - shift]) if first <= y - shift <= last else 0 for y in block]
    before, after = [0], [0]  # prefix sums
    for u, m in zip(unscrolled, moved):
        before.append(before[-1] + u)
        after.append(after[-1] + m)
    best = None
    fixed = SCROLL_COST + width * n  # the scroll, and the lines it leaves blank sent whole
    for top in range(len(block)):
        for bottom in range(top + n, len(block)):
            # rows that get a moved line: below the blank ones (down) or above them (up)
            kept = after[bottom + 1] - after[top + n] if shift > 0 else after[bottom + 1 - n] - after[top]
            saved = before[bottom + 1] - before[top] - fixed - kept
            if saved > 0 and (best is None or saved > best[0]):
                best = (saved, first + top, first + bottom, shift)
    return best


class RowBandCompositor(Compositor):
    """A compositor that renders only the rows that changed.

    Textual renders a partial update over the rectangle around every changed region, and each
    widget it touches renders all of its lines (from its cache, but line by line): a cell that
    changed in the devices panel at the top and one in the attached process's panel near the
    bottom made every widget in between render every row, about 350 lines for 8 changed cells on
    a quiet node. Here the changed regions are grouped into bands of rows that touch, each band is
    rendered over its own rectangle, and a widget renders only its rows inside that rectangle, and
    only where no widget in front of it covers them.
    """

    def render_partial_update(self) -> ChopsUpdate | None:
        regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        if not regions:
            return None
        spans = list(self._regions_to_spans(regions))
        is_rendered_line = {y for y, _, _ in spans}.__contains__
        screen = self.size.region
        chops: list | None = None
        for band in _row_bands(regions):
            crop = Region.from_union(band).intersection(screen)
            band_chops = self._render_chops(crop, is_rendered_line)
            if chops is None:
                chops = list(band_chops)
            else:
                chops[crop.y:crop.bottom] = band_chops[crop.y:crop.bottom]
        return ChopsUpdate(chops or [], spans, [cut_set[1:] for cut_set in self.cuts])

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        """(region, clip, strips) of each visible widget within `crop`, front to back, as
        Textual's own, except that a widget renders only its rows inside the crop (the region and
        clip given are then those rows of it), and not at all where the widgets in front of it
        cover its part of the crop (a container behind the panel that changed)."""
        if not crop:
            yield from super()._get_renders(crop)
            return
        in_front: list[Region] = []
        for widget, (region, clip) in self.visible_widgets.items():
            visible = region.intersection(clip)
            needed = visible.intersection(crop)
            if not needed or _covered(needed, in_front):
                continue
            shown = Region(visible.x, needed.y, visible.width, needed.height)
            in_front.append(shown)
            yield shown, shown, widget.render_lines(Region(visible.x - region.x, needed.y - region.y, visible.width, needed.height))


def _covered(area: Region, regions: list[Region]) -> bool:
    """Whether every cell of `area` lies in one of `regions`."""
    for y in area.line_range:
        x = area.x
        for left, right in sorted((r.x, r.right) for r in regions if r.y <= y < r.bottom):
            if left > x:
                break
            x = max(x, right)
        if x < area.right:
            return False
    return True


def _row_bands(regions: set[Region]) -> list[list[Region]]:
    """The regions in groups whose rows touch or overlap, top to bottom."""
    bands: list[list[Region]] = []
    bottom = -1
    for region in sorted(regions, key=lambda r: r.y):
        if bands and region.y <= bottom:
            bands[-1].append(region)
            bottom = max(bottom, region.bottom)
        else:
            bands.append([region])
            bottom = region.bottom
    return bands


class ChangedCellsApp(App):
    """An App that writes to the terminal only the cells that changed (see TerminalCells), and
    renders its main screen's changes by bands of rows (see RowBandCompositor)."""

    _terminal_cells: TerminalCells | None = None

    def get_default_screen(self) -> Screen:
        screen = super().get_default_screen()
        screen._compositor = RowBandCompositor()
        return screen

    @property
    def terminal_cells(self) -> TerminalCells:
        if self._terminal_cells is None:
            self._terminal_cells = TerminalCells()
        return self._terminal_cells

    def _display(self, screen: Screen, renderable: RenderableType | None) -> None:
        if renderable is not None and self._driver is not None and not self._driver.is_inline:
            # A style left in effect between updates must not reach the shell: only with a driver
            # that resets it when it hands the terminal back (on exit and on a suspend).
            self.terminal_cells.carry_style = getattr(self._driver, "resets_style_on_stop", False)
            renderable = self.terminal_cells.update(renderable)  # type: ignore[assignment]
        super()._display(screen, renderable)

    @on(events.Mount)
    def _follow_suspends(self) -> None:
        # Suspended (Ctrl+Z, or to run another program in the terminal), the terminal is someone
        # else's: what it shows afterwards is not known.
        for signal in (self.app_suspend_signal, self.app_resume_signal):
            signal.subscribe(self, lambda _: self.terminal_cells.forget(), immediate=True)

    @on(events.Resize)
    def _forget_on_resize(self) -> None:
        self.terminal_cells.forget()  # a resized terminal may have moved, cut or cleared its cells


class _AfterReset(CompositorUpdate):
    """A compositor update written after a reset of the text style."""

    def __init__(self, update: CompositorUpdate) -> None:
        self.update = update

    def render_segments(self, console: Console) -> str:
        return "\x1b[0m" + self.update.render_segments(console)


class ChangedCells(CompositorUpdate):
    """A compositor update that renders as the cells that differ from what the terminal shows."""

    def __init__(self, terminal: TerminalCells, update: ChopsUpdate | LayoutUpdate) -> None:
        self.terminal = terminal
        self.update = update

    def render_segments(self, console: Console) -> str:
        return self.terminal.render(self.update, console)


def _placed_strips(update: ChopsUpdate | LayoutUpdate):
    """(y, x, strip) for every strip the update writes, cropped as Textual crops it."""
    if isinstance(update, LayoutUpdate):
        for y, line in enumerate(update.strips, update.region.y):
            x = update.region.x
            for strip in line:
                yield y, x, strip
                x += strip.cell_length
        return
    for y, x1, x2 in update.spans:
        for end, (x, chop) in zip(update.chop_ends[y], update.chops[y].items()):
            if chop is None or x > x2 or end <= x1:
                continue
            if x2 > x >= x1 and end <= x2:
                yield y, x, chop
            else:
                yield y, x, chop.crop(0, min(end, x2) - x)


def _changed_runs(old: list, new: list[Cell]) -> list[tuple[int, int]]:
    """[start, stop) runs where `new` differs from `old`. A run that starts on the second half of
    a wide character starts on its first: the terminal may have blanked that half when the second
    was overwritten, whatever the copy says."""
    runs: list[tuple[int, int]] = []
    n = len(new)
    i = 0
    while i < n:
        if old[i] == new[i]:
            i += 1
            continue
        start = i
        while i < n and old[i] != new[i]:
            i += 1
        while start > 0 and new[start][0] == CONTINUED:
            start -= 1
        runs.append((start, i))
    return runs


class _Output:
    """Escape sequences for one update; the style carried from one run to the next."""

    def __init__(self, sgr: str | None = "") -> None:
        """`sgr`: the SGR codes in effect on the terminal at the start (None: not known)."""
        self.parts: list[str] = []
        self.style: tuple[str | None, str] = (sgr, "")  # SGR codes and link in effect
        # Where the cursor is: the row, and the column if it is sure (not after a character whose
        # width the terminal might count otherwise than Rich: a wide or combined one).
        self.y: int | None = None
        self.x: int | None = None

    def move(self, x: int, y: int) -> None:
        if y == self.y:
            if x == self.x:
                return
            # The column alone; a carriage return is the shortest way to the first.
            self.parts.append("\r" if x == 0 else f"\x1b[{x + 1}G")
        elif x == self.x:
            self.parts.append(f"\x1b[{y + 1}d")  # the row alone
        else:
            self.parts.append(f"\x1b[{y + 1};{x + 1}H")
        self.x, self.y = x, y

    def cells(self, cells: list[Cell]) -> None:
        for style, group in groupby(cells, key=itemgetter(1, 2)):
            if style != self.style:
                self._set_style(*style)
            text = "".join([cell[0] for cell in group])  # the second half of a wide one is ""
            self.parts.append(text)
            if self.x is not None:
                self.x = self.x + len(text) if text.isascii() else None

    def scroll(self, top: int, bottom: int, shift: int) -> None:
        """Move the lines top..bottom by `shift` (down if positive); lines leaving the region are
        lost, lines coming in are blank. The margins are set back to the whole screen."""
        self._set_style("", "")  # many terminals fill the lines coming in with the background in effect
        self.parts.append(f"\x1b[{top + 1};{bottom + 1}r\x1b[{top + 1};1H"
                          f"\x1b[{abs(shift)}{'L' if shift > 0 else 'M'}\x1b[r")
        self.x = self.y = None

    def raw(self, text: str) -> None:
        self._set_style("", "")
        self.parts.append(text)  # ends with its styles reset, as Textual's strips do
        self.x = None

    def _set_style(self, sgr: str, link: str) -> None:
        was_sgr, was_link = self.style
        if link != was_link:
            self.parts.append(f"\x1b]8;;{link}\x1b\\" if link else "\x1b]8;;\x1b\\")
        if was_sgr is None:
            self.parts.append(f"\x1b[0;{sgr}m" if sgr else "\x1b[0m")
        elif sgr != was_sgr:
            self.parts.append(sgr_change(was_sgr, sgr))
        self.style = (sgr, link)

    def finish(self, keep_style: bool = False) -> tuple[str, str | None]:
        """The update's text, and the SGR codes in effect after it: those of its last cells if
        `keep_style`, else none (it ends with a reset). A link never outlasts the update."""
        sgr = self.style[0]
        self._set_style(sgr if keep_style and sgr is not None else "", "")
        return "".join(self.parts), self.style[0]


# SGR codes that turn an attribute off (22 turns off bold and dim both, 24 both underlines...).
ATTRIBUTE_OFF = {"1": "22", "2": "22", "3": "23", "4": "24", "21": "24", "5": "25", "6": "25", "7": "27",
                 "8": "28", "9": "29", "51": "54", "52": "54", "53": "55"}


@lru_cache(maxsize=1024)
def sgr_parts(sgr: str) -> tuple[frozenset[str], str, str]:
    """SGR codes as Textual writes them (attributes, then foreground, then background) read back
    as (attributes, foreground, background); a colour not set is ""."""
    codes = sgr.split(";") if sgr else []
    attributes: set[str] = set()
    fg = bg = ""
    i = 0
    while i < len(codes):
        code = codes[i]
        if code in ("38", "48"):
            size = 3 if codes[i + 1] == "5" else 5
            colour, i = ";".join(codes[i:i + size]), i + size
            if code == "38":
                fg = colour
            else:
                bg = colour
            continue
        number = int(code)
        if 30 <= number <= 39 or 90 <= number <= 97:
            fg = code
        elif 40 <= number <= 49 or 100 <= number <= 107:
            bg = code
        else:
            attributes.add(code)
        i += 1
    return frozenset(attributes), fg, bg


@lru_cache(maxsize=4096)
def sgr_change(old: str, new: str) -> str:
    """The shortest SGR sequence that takes the terminal from the `old` codes to the `new`: only
    what differs, or a reset and the whole of `new`, whichever is shorter."""
    reset = f"\x1b[0;{new}m" if new else "\x1b[0m"
    old_attributes, old_fg, old_bg = sgr_parts(old)
    attributes, fg, bg = sgr_parts(new)
    off = {ATTRIBUTE_OFF[a] for a in old_attributes - attributes}
    # An attribute kept but turned off with another (bold kept, dim dropped: 22) is set again.
    on = [a for a in sorted(attributes) if a not in old_attributes or ATTRIBUTE_OFF[a] in off]
    codes = sorted(off) + on
    if fg != old_fg:
        codes.append(fg or "39")
    if bg != old_bg:
        codes.append(bg or "49")
    delta = f"\x1b[{';'.join(codes)}m"
    return delta if len(delta) < len(reset) else reset
