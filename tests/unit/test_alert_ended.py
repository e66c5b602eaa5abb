"""An alert whose process has exited reaches the frame marked `ended` (the console dims it)."""

from types import SimpleNamespace

from gpuscope.core.leak import LeakAlert
from gpuscope.core.node.model import HostMemory
from gpuscope.core.node.live import HostSnapshot, NodeSource


def frame_alert(ended: bool, processes=()):
    assessment = SimpleNamespace(growth_bytes_per_s=6e6, since=100.0, time_to_full_s=None, confidence=0.9, reason="floor rose")
    leak = LeakAlert(("rss", 77), assessment, raised_at=100.0, ended=ended)
    snap = HostSnapshot(200.0, HostMemory(total=1, used=1, available=0), tuple(processes), frozenset(), None)
    node = SimpleNamespace(_nvml_reading=SimpleNamespace(devices=()))
    return NodeSource._alert(node, leak, snap)


def test_an_exited_processs_alert_is_marked_ended():
    alert = frame_alert(ended=True)
    assert alert.ended and alert.pid == 77 and alert.label == "PID 77 (RSS)"


def test_a_live_processs_alert_is_not():
    assert not frame_alert(ended=False).ended
