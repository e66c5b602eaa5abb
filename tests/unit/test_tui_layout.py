"""The console's layout on small terminals, the process table's header and where its cursor
opens (Pilot over injected frames)."""

from dataclasses import replace

import pytest

from gpuscope.core.node.model import Alert, Device, NvmlReading, ProcessRow
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.chart import MemoryChart, y_ticks
from gpuscope.tui.processes import COLUMNS, SORT_COLUMN, SORT_MARK, SORTS, ProcessTable
from gpuscope.tui.service import ServicePanel
from gpuscope.tui.textlines import TextLines

from frames import GIB, MIB, T0, FakeServing, FakeSource, frame, live, rows
from test_tui_service import snapshot

SORT_KEYS = {"memory": "m", "growth": "g", "cpu": "c"}


def crowded_frame():
    """A node in trouble: a leak alert, an NVML notice, and more processes than fit."""
    alert = Alert("gpu", 4242, 0, "PID 4242 python -m vllm.entrypoints.openai.api_server (GPU memory)", 3.1e6,
                  T0 - 600, 5 * 3600.0, 0.93, "steady growth")
    extra = tuple(ProcessRow(20000 + i, "svc", None, None, (100 + i) * MIB, 1.0, f"python worker_{i}.py", "python",
                             True, None, 0.0) for i in range(30))
    notice = "NVML: GPU processes of other containers are not visible; their memory counts in the device totals only"
    return frame(alerts=(alert,), notices=(notice,), processes=rows() + extra)


def shown_rows(app) -> int:
    """Process rows a reader sees: drawn by the table and inside the screen, above the footer."""
    table = app.query_one(ProcessTable)
    region = table.region
    screen_lines = app.screen.region.height - 1  # the footer's line
    inside = max(0, min(region.bottom, screen_lines) - region.y - 1)  # less the header
    drawn = sum(1 for line in table.query_one("#col-pid", TextLines).lines[1:] if line.strip())
    return min(inside, drawn)


@pytest.mark.parametrize("size, at_least", [((80, 24), 4), ((60, 16), 1)])
async def test_the_table_keeps_its_rows_with_an_alert_and_the_service_panel(size, at_least):
    app = GpuScopeApp(live(FakeSource(crowded_frame()), serving=FakeServing(snapshot())))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        assert app.query_one("#alerts").region.height == 1  # one line, cut with an ellipsis
        assert app.query_one("#notices").region.height == 1
        service = app.query_one(ServicePanel)
        assert service.region.height == 3  # compact: where from, the signals, the stages
        if size[0] >= 80:
            assert "llm 300ms/450ms 90%" in service.lines[2] and "…" not in service.lines[2]
        assert shown_rows(app) >= at_least, app.query_one(ProcessTable).region


async def test_at_80x24_with_an_alert_and_the_service_panel_the_chart_and_the_process_panel_stay():
    """The culprit's trend and details stay: the table's rows past the first few are what yields,
    and what is cut on the way says so with an ellipsis."""
    from gpuscope.tui.detail import ProcessPanel

    app = GpuScopeApp(live(FakeSource(crowded_frame()), serving=FakeServing(snapshot())))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.query_one("#alerts").region.height == 1 and app.query_one(ServicePanel).region.height == 3
        chart, panel = app.query_one(MemoryChart), app.query_one(ProcessPanel)
        assert chart.region.height >= 8 and panel.region.height >= 8 and panel.region.width >= 20
        assert chart.region.bottom <= app.screen.region.height - 1  # above the footer, on screen
        assert "PID 4242" in panel.text.plain
        assert shown_rows(app) >= 4
        title = chart.plain.splitlines()[0].strip()
        assert title.startswith("PID 4242") and (title.endswith("time of day") or title.endswith("…")), title


async def test_at_80x24_without_panels_the_chart_stays_beside_a_full_table():
    app = GpuScopeApp(live(FakeSource(frame(processes=crowded_frame().processes))))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert shown_rows(app) >= 8
        assert app.query_one(MemoryChart).region.height >= 8


async def test_a_tall_terminal_keeps_the_service_panel_whole():
    app = GpuScopeApp(live(FakeSource(frame()), serving=FakeServing(snapshot())))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        text = app.query_one(ServicePanel).text.plain
        assert "retriever █" in text and "▁" in text  # the stages and the sparklines
        assert app.query_one(MemoryChart).region.height == 14


@pytest.mark.parametrize("sort", sorted(SORT_COLUMN))
@pytest.mark.parametrize("width", [60, 80, 120])
async def test_the_sort_mark_is_shown_whole_for_every_sort(sort, width):
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(width, 24)) as pilot:
        await pilot.pause()
        await pilot.press(SORT_KEYS[sort])
        assert app.query_one(ProcessTable).sort_name == sort
        column = SORT_COLUMN[sort]
        label = next(label for key, label, _, _ in COLUMNS if key == column)
        header = app.query_one(f"#col-{column}", TextLines).lines[0]
        assert header.strip() == label + SORT_MARK, (sort, header)


def test_every_sort_but_the_default_order_has_a_column_to_mark():
    assert set(SORT_COLUMN) == set(SORTS) - {"default"}


@pytest.mark.parametrize("width", [60, 80, 120, 200])
async def test_the_command_column_takes_the_rest_of_the_width(width):
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(width, 30)) as pilot:
        await pilot.pause()
        command = app.query_one("#col-command")
        assert command.region.right == width
        others = [c for c in app.query_one(ProcessTable).query(TextLines) if c.id != "col-command" and c.display]
        assert command.region.x == max(c.region.right for c in others)
        if width >= 120:  # room for the whole command line
            assert "-m vllm.entrypoints.openai.api_server --api-key ***" in command.lines[1]


def label_rows(chart: MemoryChart) -> list[tuple[int, float, float]]:
    """(line, value, the label's precision) of each left y label."""
    out = []
    for y, line in enumerate(chart.plain.splitlines()):
        head, sep, _ = line.partition("┤")
        if sep and head.strip():
            decimals = len(head.strip().partition(".")[2])
            out.append((y, float(head), 10.0 ** -decimals))
    return out


@pytest.mark.parametrize("height", [7, 8, 9, 10, 11, 12, 14, 17])
async def test_y_labels_stand_evenly_spaced_on_every_chart_height(height):
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        app.query_one("#bottom").styles.height = height
        await pilot.pause()
        chart = app.query_one(MemoryChart)
        chart.show(app.frame.chart, force=True, now=app.frame.time)
        await pilot.pause()
        labels = label_rows(chart)
        assert len(labels) >= 2, chart.plain
        lines = {b[0] - a[0] for a, b in zip(labels, labels[1:])}
        values = [round(a[1] - b[1], 6) for a, b in zip(labels, labels[1:])]
        assert len(lines) == 1, chart.plain  # the same number of lines between labels
        # and the same step in value, to the labels' precision (each is its row's value, rounded)
        assert max(values) - min(values) <= labels[0][2] * 1.01, chart.plain


def test_y_ticks_lie_on_rows():
    values, labels = y_ticks(10.0, 20.0, 11)  # one row per unit: a label every other row
    assert values == [20.0, 18.0, 16.0, 14.0, 12.0, 10.0] and labels[0] == "20.0"
    values, labels = y_ticks(0.0, 150.0, 16)  # a tall chart: every third row
    assert values == [150.0, 120.0, 90.0, 60.0, 30.0, 0.0] and labels == ["150", "120", "90", "60", "30", "0"]
    assert y_ticks(1.0, 1.0, 5) == ([], [])


def eight_gpu_frames():
    """A node of 8 GPUs x 25 processes as a console sees it start: first the host's processes
    (NVML still being read), then NVML's 200 GPU processes, sorted above them."""
    host = tuple(ProcessRow(100 + i, "root", None, None, (4 + i) * GIB, 2.0, f"/usr/bin/host_daemon_{i}", "daemon",
                            False, None, 0.0) for i in range(5))
    starting = frame(nvml=NvmlReading(status="reading NVML..."), processes=host, focus=None, selected_pid=None,
                     chart=None)
    devices = tuple(Device(i, "NVIDIA H200", f"GPU-{i}", 60 * GIB, 141 * GIB, 10 * i, 50) for i in range(8))
    gpu = tuple(ProcessRow(30000 + n, "svc", n % 8, (1 + n % 7) * GIB // 4, 512 * MIB, 1.0, "sleep 100000", "sleep",
                           False, 0.0, 0.0) for n in range(200))
    leaker = replace(gpu[0], gpu_memory_bytes=40 * GIB, command="python -m vllm.entrypoints.openai.api_server")
    node = frame(nvml=NvmlReading(status=None, devices=devices), processes=host + (leaker,) + gpu[1:], focus=None,
                 selected_pid=None, chart=None)
    return starting, node


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_an_8x200_node_opens_at_the_top_on_the_biggest_gpu_process(size):
    starting, node = eight_gpu_frames()
    source = FakeSource(starting)
    app = GpuScopeApp(live(source))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        table = app.query_one(ProcessTable)
        for i in range(3):  # frames arrive; the leaker grows, others come and go
            source.send(replace(node, time=T0 + i))
            await pilot.pause()
        assert table.selected_row.pid == 30000 and table.selected_row.gpu is not None
        assert table.order.index(table.selected_row) == 0
        assert "rows 1-" in table.query_one("#col-command", TextLines).lines[0]
        assert table.query_one("#col-pid", TextLines).lines[1].strip() == "30000"
        assert source.selected[-1] == 30000  # its memory is what the chart shows

        await pilot.press("down")  # the operator moves: the cursor follows that process now
        chosen = table.selected_row.pid
        bigger = replace(node, processes=tuple(replace(r, gpu_memory_bytes=80 * GIB) if r.pid == 30006 else r
                                               for r in node.processes))
        source.send(bigger)
        await pilot.pause()
        assert table.selected_row.pid == chosen and table.order[0].pid == 30006
        await pilot.press("home")  # back to the top, and it stays there
        source.send(node)
        await pilot.pause()
        assert table.selected_row.pid == 30000
