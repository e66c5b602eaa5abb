"""The fleet view in the console (Pilot): `f` opens it over a fleet source's rows, Enter suspends
the console and runs the attach command built from the selected row, then the console resumes."""

import contextlib

from textual.widgets import DataTable

from gpuscope.core.fleet.collector import FleetProcess, FleetSnapshot, FleetSource
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.fleet import FleetScreen, FleetView

from frames import FakeSource, frame, live
from pilot_wait import until

ROWS = (
    FleetProcess(node="node-a", pid=4242, start_time="1", command="python serve.py", gpus=(0,), gpu_bytes=6e10,
                 growth_bytes_per_s=3.1e6, growth_memory="gpu", verdict="leak", pattern="steady-growth", alerting=True),
    FleetProcess(node="-oProxyCommand=evil", pid=7, start_time="1", command="x", growth_bytes_per_s=1e3),
)


def view(runs: list) -> FleetView:
    source = FleetSource(lambda: FleetSnapshot(0.0, "http://prometheus:9090", ROWS, "ok", 1.0), "http://prometheus:9090")
    return FleetView(source, "ssh -t {node} gpuscope --pid {pid}", runner=lambda argv: runs.append(argv) or 0)


async def test_enter_runs_the_attach_command_of_the_selected_row_and_the_console_resumes(monkeypatch):
    runs: list = []
    app = GpuScopeApp(live(FakeSource(frame())), fleet=view(runs))
    suspended = []

    @contextlib.contextmanager
    def suspend():  # the headless test driver cannot hand the terminal over
        suspended.append(True)
        yield

    monkeypatch.setattr(app, "suspend", suspend)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await until(pilot, lambda: screen.query_one(DataTable).row_count == 2, "the fleet's two rows")
        await pilot.press("enter")
        await pilot.pause()
        assert runs == [["ssh", "-t", "node-a", "gpuscope", "--pid", "4242"]] and suspended == [True]
        assert app.is_running and isinstance(app.screen, FleetScreen)  # resumed where it was
        await pilot.press("down", "enter")  # the hostile node name is refused: nothing runs
        await pilot.pause()
        assert len(runs) == 1
        await pilot.press("escape")
        assert not isinstance(app.screen, FleetScreen)
    screen.view.source.stop()


async def test_the_fleet_view_offers_and_obeys_only_its_own_keys(monkeypatch):
    """Its rows are other machines' processes: the console's keys (`w` above all, which would
    diagnose the local alert's PID) neither show in its footer nor act."""
    from textual.widgets import Footer

    from gpuscope.core.node.model import Alert
    from gpuscope.tui.wizard import WizardScreen

    alert = Alert("rss", 4243, None, "PID 4243 rag_worker.py · python (RSS)", 6.4e6, 0.0, None, 0.8, "floor rose")
    app = GpuScopeApp(live(FakeSource(frame(alerts=(alert,), focus=None))), fleet=view([]))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("f")
        screen = await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen, "the fleet view")
        footer = " ".join(str(key.render()) for key in screen.query_one(Footer).query("FooterKey"))
        for local in ("Diagnose", "Filter", "Stacks", "Alloc", "Export"):
            assert local not in footer, footer
        assert "Attach" in footer and "Back" in footer
        await pilot.press("w", "d", "a", "e", "slash")
        await pilot.pause()
        assert app.screen is screen and not isinstance(app.screen, WizardScreen)
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("w")  # back on the node, the console's keys are its own again
        assert isinstance(app.screen, WizardScreen) and app.screen.pid == 4243
    screen.view.source.stop()


async def test_without_prometheus_the_key_says_what_to_give():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f")
        await pilot.pause()
        assert not isinstance(app.screen, FleetScreen)
        assert any("--prometheus" in n.message for n in app._notifications)


HOSTILE = {
    "gpuscope_query": "growth", "memory": "gpu", "gpu": "0", "pid": "31337", "start_time": "1",
    "node": "n\x1b]0;pwned\x07ode\u202e-b",
    "pod": "pod\nsecond line\r\x1b[2J",
    "user": "\x00root\t",
    "command": "\x1b[31mpython\x1b[0m serve.py\r\n" + "A" * 5000 + "\x1b[2J\x9b2J tail",
}


def printed_lines(widget) -> list[str]:
    """The widget's cells as the terminal would get them: one string a screen line."""
    from textual.geometry import Region

    region = Region(0, 0, widget.size.width, widget.size.height)
    return ["".join(segment.text for segment in strip) for strip in widget.render_lines(region)]


async def test_a_hostile_label_renders_as_one_printable_bounded_line():
    from gpuscope.core.fleet.collector import COMMAND_CHARS, fleet_rows

    rows, _ = fleet_rows([{"metric": HOSTILE, "value": [0, "5e6"]}])
    source = FleetSource(lambda: FleetSnapshot(0.0, "http://prometheus:9090", rows, "ok", 1.0), "http://prometheus:9090")
    app = GpuScopeApp(live(FakeSource(frame())), fleet=FleetView(source, "ssh -t {node} gpuscope --pid {pid}"))
    async with app.run_test(size=(160, 30)) as pilot:
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen.query_one(DataTable).row_count,
                    "the fleet's row")
        table = app.screen.query_one(DataTable)
        assert table.row_count == 1
        assert table.virtual_size.height == 2  # the header and one line for the row, however long the labels
        lines = printed_lines(table)
        for line in lines:
            assert line.isprintable(), repr(line)
            assert len(line) == table.size.width
        row = [line for line in lines if "31337" in line]
        assert len(row) == 1 and "pwned" in row[0] and "second line" in row[0], lines
        command = table.get_row_at(0)[-1]
        assert command.plain.isprintable() and len(command.plain) <= COMMAND_CHARS
        status = printed_lines(app.screen.query_one("#fleet-status"))
        assert all(line.isprintable() for line in status)
    source.stop()
