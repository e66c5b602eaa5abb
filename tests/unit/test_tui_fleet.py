"""The fleet view in the console (Pilot): `f` opens it over a fleet source's rows, Enter suspends
the console and runs the attach command built from the selected row, then the console resumes."""

import contextlib

from textual.widgets import DataTable

from gpuscope.core.fleet import FleetProcess, FleetSnapshot, FleetSource
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.fleet import FleetScreen, FleetView

from frames import FakeSource, frame

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
    app = GpuScopeApp(FakeSource(frame()), fleet=view(runs))
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
        await pilot.pause(0.3)
        assert screen.query_one(DataTable).row_count == 2
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


async def test_without_prometheus_the_key_says_what_to_give():
    app = GpuScopeApp(FakeSource(frame()))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f")
        await pilot.pause()
        assert not isinstance(app.screen, FleetScreen)
        assert any("--prometheus" in n.message for n in app._notifications)
