"""The console driven with Textual's Pilot over injected frames (no collectors involved)."""

import time
from dataclasses import replace

from textual.widgets import Input, Static

from gpuscope.core.node.model import MemorySeries
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.chart import MemoryChart
from gpuscope.tui.devices import DevicesPanel
from gpuscope.tui.detail import ProcessPanel
from gpuscope.tui.help import HelpScreen
from gpuscope.tui.processes import ProcessTable
from gpuscope.tui.textlines import TextLines

from frames import FakeSource, frame, live, no_nvml_frame, rows
from frames import chart as chart_series
from pilot_wait import until


def table_pids(app) -> list[int]:
    return [r.pid for r in app.query_one(ProcessTable).order]


def cell(app, key: str, column: str) -> str:
    return app.query_one(ProcessTable).cell(key, column)


async def test_frames_fill_devices_table_and_detail():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        devices = app.query_one(DevicesPanel).plain
        assert "GPU0" in devices and "NVIDIA H200" in devices and "63.0G/141.0G" in devices and "97%" in devices
        assert "HOST" in devices and "gpu-node-7" in devices
        assert table_pids(app)[:3] == [4242, 4243, 5100]  # GPU processes first, by GPU memory
        assert cell(app, "4242:0", "gpu_mem") == "61.0G"
        assert cell(app, "5100:1", "gpu_mem") == "N/A"  # not available is never 0
        assert cell(app, "4242:0", "growth") == "▲+3.10"
        assert "--api-key ***" in cell(app, "4242:0", "command")
        detail = app.query_one(ProcessPanel).text.plain
        assert "PID 4242" in detail and "3.11.9" in detail and "/srv/vllm" in detail and "48" in detail


async def test_without_nvml_one_line_says_so_and_host_memory_carries_on():
    app = GpuScopeApp(live(FakeSource(no_nvml_frame())))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        devices = app.query_one(DevicesPanel).plain
        assert devices.count("NVML unavailable") == 1 and "showing host memory only" in devices
        assert "HOST" in devices
        assert sorted(table_pids(app)) == [777, 9001]
        assert "no NVML" in app.query_one("#title", TextLines).text.plain


async def test_device_errors_and_notices_are_shown_with_a_symbol():
    lost = replace(frame().nvml.devices[1], error="GPU is lost: it fell off the bus", memory_used=None)
    f = frame(nvml=replace(frame().nvml, devices=(frame().nvml.devices[0], lost)), notices=("2 GPU process(es) ...",))
    app = GpuScopeApp(live(FakeSource(f)))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        devices = app.query_one(DevicesPanel).plain
        assert "✖ GPU is lost" in devices and "! 2 GPU process(es)" in devices


async def test_a_tick_that_changes_no_cell_of_the_devices_panel_draws_nothing_there(monkeypatch):
    """The numbers move by less than they are rounded to on most ticks: then the panel builds no
    text at all; a change that shows is drawn."""
    from gpuscope.tui.messages import FrameReady

    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        panel = app.query_one(DevicesPanel)
        f = frame()
        app.on_frame_ready(FrameReady(f))  # drawn at the panel's laid-out width
        columns = list(panel.query(TextLines))
        drawn: list[TextLines] = []
        real_set_text = TextLines.set_text
        monkeypatch.setattr(TextLines, "set_text", lambda self, text: (drawn.append(self), real_set_text(self, text))[1])
        before = panel.plain
        unseen = replace(f, time=f.time + 1, host=replace(f.host, used=f.host.used + 4096, available=f.host.available - 4096),
                         nvml=replace(f.nvml, devices=tuple(replace(d, memory_used=d.memory_used + 1024) for d in f.nvml.devices)))
        app.on_frame_ready(FrameReady(unseen))
        assert [w for w in drawn if w in columns] == [] and panel.plain == before
        seen = replace(unseen, time=f.time + 2, host=replace(f.host, used=f.host.used + (1 << 30)))
        app.on_frame_ready(FrameReady(seen))
        assert any(w in columns for w in drawn) and "188.0G/512.0G" in panel.plain


async def test_sorting_keys_reorder_and_the_cursor_follows_the_process():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        table = app.query_one(ProcessTable)
        await pilot.press("down")  # select 4243
        assert table.selected_row.pid == 4243
        await pilot.press("c")
        assert table_pids(app) == [4242, 9001, 4243, 5100, 777]
        assert table.selected_row.pid == 4243
        await pilot.press("g")
        assert table_pids(app)[:2] == [4242, 9001]
        await pilot.press("m")
        assert table_pids(app)[0] == 4242 and table_pids(app)[-1] == 777
        await pilot.press("o")
        assert table_pids(app)[:3] == [4242, 4243, 5100]
        assert "sort: GPU first" in app.query_one("#title", TextLines).text.plain


async def test_a_changed_number_repaints_only_its_cells():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        table = app.query_one(ProcessTable)
        repaints: dict[str, list] = {}
        for column in table.query(TextLines):
            original = column.refresh

            def spy(*regions, _id=column.id, _original=original, **kw):
                repaints.setdefault(_id, []).append(regions)
                return _original(*regions, **kw)

            column.refresh = spy

        changed = list(rows())
        changed[1] = replace(changed[1], cpu_percent=55.0)  # one number of one row
        source.send(frame(processes=tuple(changed)))
        await pilot.pause()
        assert cell(app, "4243:1", "cpu") == "55"
        # Only the CPU column repaints, and only the span of that one line (row 2 under the header).
        assert list(repaints) == ["col-cpu"]
        [[region]] = repaints["col-cpu"]
        assert (region.y, region.height) == (2, 1) and region.width <= 6

        source.send(frame(processes=tuple(changed[:-1])))  # a process exited
        await pilot.pause()
        assert 9001 not in table_pids(app)


async def test_filter_by_command_user_or_pid_and_escape_clears_it():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("slash")
        assert app.query_one("#filter", Input).has_focus
        await pilot.press(*"alice")
        assert table_pids(app) == [5100]
        await pilot.press("enter")  # keep the filter, back to the table
        assert app.query_one(ProcessTable).has_focus and table_pids(app) == [5100]
        assert "filter: alice" in app.query_one("#title", TextLines).text.plain
        await pilot.press("escape")
        assert len(table_pids(app)) == 5


async def test_moving_selects_and_enter_attaches_x_detaches():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("down", "down")
        assert source.selected[-1] == 5100
        await pilot.press("enter")
        assert source.focused == [5100]
        await pilot.press("x")
        assert source.focused == [5100, None]


async def test_help_opens_and_closes_and_q_quits():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "attach to the selected process" in str(app.screen.query_one("#help-text", Static).render())
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
    assert source.stopped


async def test_ctrl_c_quits_even_from_the_filter_box():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("slash", "ctrl+c")
    assert source.stopped and app.return_code == 0


async def test_chart_plots_gpu_and_rss_against_the_time_of_day():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        chart = app.query_one(MemoryChart)
        drawn = chart.plain
        assert "PID 4242: GPU GiB (left), RSS GiB (right) — time of day" in drawn
        # The x labels are clock times, from the oldest sample (a minute before the frame) on.
        oldest = app.frame.time - max(app.frame.chart.ages)
        labels = drawn.splitlines()[-1].split()
        assert labels[0] == time.strftime("%H:%M:%S", time.localtime(oldest)) and len(labels) == 5


def moved_on(series: MemorySeries, seconds: float, grow: float) -> MemorySeries:
    """The same history `seconds` later, one sample more (each value `grow` bytes up)."""
    return replace(series, ages=(*(a + seconds for a in series.ages), 0.0),
                   gpu_bytes=(*series.gpu_bytes, series.gpu_bytes[-1] + grow),
                   rss_bytes=(*series.rss_bytes, series.rss_bytes[-1] + grow))


async def test_the_chart_axes_stand_still_while_the_data_fits():
    app = GpuScopeApp(live(FakeSource(frame(chart=None))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        chart = app.query_one(MemoryChart)
        first = chart_series(n=20)  # 20 s of history: laid out over a minute, room ahead
        now = app.frame.time
        chart.show(first, force=True, now=now)
        before, axes = chart.plain.splitlines(), chart._axes
        chart.show(moved_on(first, 2.0, 12 << 20), force=True, now=now + 2.0)
        after = chart.plain.splitlines()
        assert chart._axes is axes  # still inside the range laid out: not laid out again
        assert len(before) == len(after)
        changed = [(y, next(i for i, (a, b) in enumerate(zip(old, new)) if a != b))
                   for y, (old, new) in enumerate(zip(before, after)) if old != new]
        # Only where the new point lands (20 s into a minute's axis, past the y labels and the
        # older points): no label, axis or older point moves.
        assert changed and all(column >= 25 for _, column in changed), changed
        assert before[0] == after[0] and before[-2:] == after[-2:]

        # Data past the right edge: the axes are laid out again (a longer span, new labels).
        chart.show(moved_on(first, 60.0, 1 << 20), force=True, now=now + 60.0)
        assert chart.plain.splitlines()[-1] != before[-1]


async def test_every_action_is_in_the_command_palette():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        titles = {c.title: c for c in app.get_system_commands(app.screen)}
        for title in ("Help", "Filter processes", "Sort: memory", "Sort: growth", "Sort: CPU", "Sort: GPU first",
                      "Attach to the selected process", "Detach", "Quit"):
            assert title in titles
        titles["Sort: CPU"].callback()
        assert app.query_one(ProcessTable).sort_name == "cpu"
        titles["Attach to the selected process"].callback()
        assert source.focused == [4242]


async def test_attached_process_stays_charted_when_it_is_not_the_first_row():
    source = FakeSource(frame(selected_pid=4243))
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.query_one(ProcessTable).selected_row.pid == 4243
        assert source.selected == []  # the cursor landed on what the source already charts
        await pilot.press("up")
        assert source.selected == [4242]


async def test_a_click_selects_and_a_double_click_attaches():
    source = FakeSource(frame())
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.click("#col-command", offset=(5, 3))  # line 3 = the third process under the header
        assert app.query_one(ProcessTable).selected_row.pid == 5100 and source.selected[-1] == 5100
        await pilot.double_click("#col-command", offset=(5, 3))
        assert source.focused == [5100]


async def test_without_colour_the_chart_lines_differ_by_marker(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frame is not None and app.frame.chart is not None, "the first frame's chart")
        chart = app.query_one(MemoryChart)
        chart.show(app.frame.chart, force=True)
        text = await until(pilot, lambda: "•" in chart.plain and chart.plain, "the chart drawn")
        assert "•" in text and any("\u2800" < ch <= "\u28ff" for ch in text)  # RSS dots, GPU braille
