"""SVG snapshots of the console at 80x24 and 120x40 (update with --snapshot-update after review)."""

import time

import pytest

from gpuscope.tui.app import GpuScopeApp

from frames import FakeSource, frame, no_nvml_frame


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_gpu_node(snap_compare, size):
    assert snap_compare(GpuScopeApp(FakeSource(frame())), terminal_size=size)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_node_without_nvml(snap_compare, size):
    assert snap_compare(GpuScopeApp(FakeSource(no_nvml_frame())), terminal_size=size)


def test_help_screen(snap_compare):
    assert snap_compare(GpuScopeApp(FakeSource(frame())), press=["question_mark"], terminal_size=(80, 24))
