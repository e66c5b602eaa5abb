"""SVG snapshots of the console at 80x24, 120x40 and 160x50, in the dark and the light theme
(update with --snapshot-update after review)."""

import time

import pytest

from gpuscope.tui.app import GpuScopeApp

from gpuscope.core.node.model import Alert

from frames import T0, FakeSource, frame, live, no_nvml_frame


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_gpu_node(snap_compare, size):
    assert snap_compare(GpuScopeApp(live(FakeSource(frame()))), terminal_size=size)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_node_without_nvml(snap_compare, size):
    assert snap_compare(GpuScopeApp(live(FakeSource(no_nvml_frame()))), terminal_size=size)


def test_help_screen(snap_compare):
    assert snap_compare(GpuScopeApp(live(FakeSource(frame()))), press=["question_mark"], terminal_size=(80, 24))


def leaking_frame():
    alert = Alert("gpu", 4242, 0, "PID 4242 python -m vllm.entrypoints.openai.api_server (GPU memory)", 3.1e6,
                  T0 - 600, None, 0.93, "steady growth")
    return frame(alerts=(alert,))


@pytest.mark.parametrize("theme", ["gpuscope-dark", "gpuscope-light"])
@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
def test_main_screen_in_two_themes(snap_compare, size, theme):
    assert snap_compare(GpuScopeApp(live(FakeSource(leaking_frame())), theme=theme), terminal_size=size)
