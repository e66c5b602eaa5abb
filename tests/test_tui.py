"""The console driven with Textual's Pilot over injected frames (no collectors involved)."""

from dataclasses import replace

from textual.widgets import Input, Static

from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.devices import DevicesPanel
from gpuscope.tui.detail import ProcessPanel
from gpuscope.tui.help import HelpScreen
from gpuscope.tui.processes import ProcessTable

from frames import FakeSource, frame, no_nvml_frame, rows


def table_pids(app) -> list[int]:
    table = app.query_one(ProcessTable)
    return [int(table.get_row(r.key)[0].plain) for r in table.ordered_rows]


def cell(app, key: str, column: str) -> str:
    return app.query_one(ProcessTable).get_cell(key, column).plain


async def test_frames_fill_devices_table_and_detail():
    app = GpuScopeApp(FakeSource(frame()))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        devices = str(app.query_one(DevicesPanel).render())
        assert "GPU0" in devices and "NVIDIA H200" in devices and "63.0G/141.0G" in devices and "97%" in devices
        assert "HOST" in devices and "gpu-node-7" in devices
        assert table_pids(app)[:3] == [4242, 4243, 5100]  # GPU processes first, by GPU memory
        assert cell(app, "4242:0", "gpu_mem") == "61.0G"
        assert cell(app, "5100:1", "gpu_mem") == "N/A"  # not available is never 0
        assert cell(app, "4242:0", "growth") == "▲+3.10"
        assert "--api-key ***" in cell(app, "4242:0", "command")
        detail = str(app.query_one(ProcessPanel).render())
        assert "PID 4242" in detail and "3.11.9" in detail and "/srv/vllm" in detail and "48" in detail


async def test_without_nvml_one_line_says_so_and_host_memory_carries_on():
    app = GpuScopeApp(FakeSource(no_nvml_frame()))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        devices = str(app.query_one(DevicesPanel).render())
        assert devices.count("NVML unavailable") == 1 and "showing host memory only" in devices
        assert "HOST" in devices
        assert sorted(table_pids(app)) == [777, 9001]
        assert "no NVML" in str(app.query_one("#title", Static).render())


async def test_device_errors_and_notices_are_shown_with_a_symbol():
    lost = replace(frame().nvml.devices[1], error="GPU is lost: it fell off the bus", memory_used=None)
    f = frame(nvml=replace(frame().nvml, devices=(frame().nvml.devices[0], lost)), notices=("2 GPU process(es) ...",))
    app = GpuScopeApp(FakeSource(f))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        devices = str(app.query_one(DevicesPanel).render())
        assert "✖ GPU is lost" in devices and "! 2 GPU process(es)" in devices


async def test_sorting_keys_reorder_and_the_cursor_follows_the_process():
    app = GpuScopeApp(FakeSource(frame()))
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
        assert "sort: GPU first" in str(app.query_one("#title", Static).render())


async def test_rows_update_in_place_only_where_cells_changed():
    source = FakeSource(frame())
    app = GpuScopeApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        table = app.query_one(ProcessTable)
        calls = {"update": [], "add": 0, "remove": 0, "clear": 0}
        orig_update, orig_add, orig_remove, orig_clear = table.update_cell, table.add_row, table.remove_row, table.clear
        table.update_cell = lambda k, c, v, **kw: (calls["update"].append((k, c)), orig_update(k, c, v, **kw))[1]
        table.add_row = lambda *a, **kw: (calls.__setitem__("add", calls["add"] + 1), orig_add(*a, **kw))[1]
        table.remove_row = lambda k: (calls.__setitem__("remove", calls["remove"] + 1), orig_remove(k))[1]
        table.clear = lambda *a, **kw: (calls.__setitem__("clear", calls["clear"] + 1), orig_clear(*a, **kw))[1]

        changed = list(rows())
        changed[1] = replace(changed[1], cpu_percent=55.0)  # one cell of one row
        source.send(frame(processes=tuple(changed)))
        await pilot.pause()
        assert calls == {"update": [("4243:1", "cpu")], "add": 0, "remove": 0, "clear": 0}

        source.send(frame(processes=tuple(changed[:-1])))  # a process exited
        await pilot.pause()
        assert calls["remove"] == 1 and calls["add"] == 0 and calls["clear"] == 0
        assert 9001 not in table_pids(app)


async def test_filter_by_command_user_or_pid_and_escape_clears_it():
    app = GpuScopeApp(FakeSource(frame()))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("slash")
        assert app.query_one("#filter", Input).has_focus
        await pilot.press(*"alice")
        assert table_pids(app) == [5100]
        await pilot.press("enter")  # keep the filter, back to the table
        assert app.query_one(ProcessTable).has_focus and table_pids(app) == [5100]
        assert "filter: alice" in str(app.query_one("#title", Static).render())
        await pilot.press("escape")
        assert len(table_pids(app)) == 5


async def test_moving_selects_and_enter_attaches_escape_detaches():
    source = FakeSource(frame())
    app = GpuScopeApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("down", "down")
        assert source.selected[-1] == 5100
        await pilot.press("enter")
        assert source.focused == [5100]
        await pilot.press("escape")
        assert source.focused == [5100, None]


async def test_help_opens_and_closes_and_q_quits():
    source = FakeSource(frame())
    app = GpuScopeApp(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "attach to the selected process" in str(app.screen.query_one("#help-text", Static).render())
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
    assert source.stopped


async def test_chart_plots_gpu_and_rss_against_seconds_ago():
    app = GpuScopeApp(FakeSource(frame()))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        chart = app.query_one("#chart")
        drawn = chart.plt.build()
        assert "PID 4242: GPU GiB (left), RSS GiB (right)" in drawn and "seconds ago" in drawn
        assert "GPU" in drawn and "RSS" in drawn


async def test_every_action_is_in_the_command_palette():
    source = FakeSource(frame())
    app = GpuScopeApp(source)
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
