"""The memory chart's figure, drawn cell by cell: each point on the row its y label names and in
the column of its time, consecutive points joined, the legend over the lines, any size."""

import random

from rich.style import Style

from gpuscope.tui.chart import CHART_FURNITURE_LINES, Figure, Line, draw

GPU, RSS = Style(color="#4fa3e0"), Style(color="#e0a34f")


def figure(*lines: Line, span: float = 60.0, left=(10.0, 20.0), right=(1.0, 2.0)) -> Figure:
    return Figure("PID 1: test", lines, (("left", *left), ("right", *right)), span,
                  ("t0", "t1", "t2", "t3", "t4"))


def plain(cells) -> list[str]:
    return ["".join(ch for ch, _ in line) for line in cells]


def frame_left(lines: list[str]) -> int:
    return lines[1].index("┌")


def y_labels(lines: list[str], side: str) -> dict[int, float]:
    """Plot row -> the value its label names, on one side."""
    out = {}
    for y, line in enumerate(lines[2:-2]):
        head, tick, tail = line.partition("┤") if side == "left" else line.rpartition("├")
        label = head if side == "left" else tail
        if tick and label.strip():
            out[y] = float(label)
    return out


def lit_rows(cells, style: Style) -> list[tuple[int, int]]:
    """(plot row, column) of each cell drawn in `style`, the legend's sample of it left out."""
    lines = plain(cells)
    left = frame_left(lines) + 1
    legend = {(y, x) for y, line in enumerate(lines[2:4]) for x in range(left, left + 6) if line[x] in "⢕•"}
    return [(y - 2, x) for y, line in enumerate(cells) for x, (ch, s) in enumerate(line)
            if s is style and ch.strip() and (y - 2, x) not in legend]


def test_every_point_lands_on_the_row_whose_label_is_nearest_its_value():
    rng = random.Random(3)
    width, height = 70, 16
    for side, (low, high), style in (("left", (10.0, 20.0), GPU), ("right", (1.0, 2.0), RSS)):
        for _ in range(40):
            v = rng.uniform(low, high)
            cells = draw(figure(Line("x", ((30.0, v),), side, style, "braille")), width, height)
            lines = plain(cells)
            labels = y_labels(lines, side)
            rows = height - CHART_FURNITURE_LINES
            per_row = (high - low) / (rows - 1)
            value_of_row = {y: high - per_row * y for y in range(rows)}
            assert all(abs(value_of_row[y] - labelled) < per_row / 10 for y, labelled in labels.items())
            (row, _), = lit_rows(cells, style)
            assert abs(value_of_row[row] - v) <= per_row / 2 + 1e-9, (v, row, lines)


def test_a_point_at_a_ticks_time_lands_in_that_ticks_column():
    for i in range(5):
        cells = draw(figure(Line("x", ((60.0 * i / 4, 15.0),), "left", GPU, "•")), 81, 12)
        lines = plain(cells)
        ticks = [x for x, ch in enumerate(lines[-2]) if ch == "┬"]
        (_, column), = lit_rows(cells, GPU)
        assert column == ticks[i]
        label = f"t{i}"
        assert abs(lines[-1].index(label) + len(label) // 2 - ticks[i]) <= 1


def test_consecutive_points_are_joined():
    # From the bottom of the range to its top within one cell's width: every row between is lit.
    cells = draw(figure(Line("x", ((30.0, 10.0), (30.2, 20.0)), "left", GPU, "braille")), 60, 14)
    rows = sorted({row for row, _ in lit_rows(cells, GPU)})
    assert rows == list(range(14 - CHART_FURNITURE_LINES))
    marks = draw(figure(Line("x", ((0.0, 10.0), (60.0, 20.0)), "left", GPU, "•")), 60, 14)
    cols = sorted(x for _, x in lit_rows(marks, GPU))
    assert cols == list(range(cols[0], cols[-1] + 1))  # a diagonal without holes


def test_the_legend_names_each_line_and_its_axis_over_the_lines():
    cells = draw(figure(Line("GPU GiB", ((0.0, 20.0), (60.0, 20.0)), "left", GPU, "braille"),
                        Line("RSS GiB", ((0.0, 1.0),), "right", RSS, "•")), 60, 12)
    lines = plain(cells)
    assert " L ⢕⢕ GPU GiB " in lines[2] and " ⅃ •• RSS GiB " in lines[3]
    one_side = plain(draw(figure(Line("GPU GiB", ((0.0, 15.0),), "left", GPU, "braille")), 60, 12))
    assert " ⢕⢕ GPU GiB " in one_side[2] and "L ⢕⢕" not in one_side[2]


def test_any_size_draws_its_size_and_nothing_else():
    fig = figure(Line("GPU GiB", ((0.0, 12.0), (30.0, 18.0)), "left", GPU, "braille"),
                 Line("RSS GiB", ((0.0, 1.5),), "right", RSS, "•"))
    for width in range(0, 30, 3):
        for height in range(0, 10):
            cells = draw(fig, width, height)
            assert len(cells) == height and all(len(line) == width for line in cells)
    assert plain(draw(Figure("Select a process to chart its memory"), 50, 8))[0].strip() == "Select a process to chart its memory"
