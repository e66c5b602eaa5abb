"""What the exporter puts in its labels: names cut to a bound and made printable, NVML's status as a
short reason, a process's pod and container, and which processes it exports."""

from __future__ import annotations

from gpuscope.core.common.printable import shortened
from gpuscope.core.fleet.exporter import choose_exported, nvml_reason
from gpuscope.core.node.cgroup import parse_cgroup
from gpuscope.core.node.host import HostProcess

UID = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"


def test_a_label_is_cut_to_its_bound_with_an_ellipsis_and_shows_no_control_character():
    assert shortened("abcd", 4) == "abcd"
    assert shortened("abcde", 4) == "abc…"
    shown = shortened("evil\x1b[2J\nname\x00", 120)
    assert not any(ord(c) < 32 or ord(c) == 127 for c in shown) and shown.startswith("evil")
    assert len(shortened("\x07" * 10, 5)) == 5


def test_nvml_status_reads_as_a_short_reason():
    assert nvml_reason(None) == ""
    assert nvml_reason("NVML not installed (libnvidia-ml.so.1 not found)") == "not-installed"
    assert nvml_reason("the library is not NVIDIA's") == "not-installed"
    assert nvml_reason("NVML unavailable: no NVIDIA driver") == "no-driver"
    assert nvml_reason("Insufficient Permissions") == "no-permission"
    assert nvml_reason("Unknown Error") == "error"


def test_the_pod_and_container_labels_come_from_paths_read_whole_and_lines_read_together():
    # a path with colons of its own is read whole (only the first two separate the fields)
    odd = parse_cgroup(f"0::/kubepods/pod{UID}/x:y/{'ef' * 32}\n".encode())
    assert (odd.pod_uid, odd.container_id) == (UID, "ef" * 32)
    # a pod named on one line and its container on a later one
    split = parse_cgroup(f"1:cpu:/kubepods/pod{UID}\n0::/system.slice/docker-{'12' * 32}.scope\n".encode())
    assert (split.pod_uid, split.container_id) == (UID, "12" * 32)


def proc(pid: int, rss: int | None) -> HostProcess:
    return HostProcess(pid, 1.0, "u", "python", "python x", rss, None, True)


def test_the_top_of_each_ranking_is_exported_largest_first():
    procs = [proc(pid, rss) for pid, rss in ((1, 10), (2, 20), (3, 30), (4, None))]
    assert [p.pid for p in choose_exported(procs, {}, {}, set(), top=2)] == [2, 3]
    gpu = {1: 5.0, 2: 0.0, 3: 1.0, 4: 9.0}
    assert [p.pid for p in choose_exported(procs, gpu, {}, set(), top=1)] == [3, 4]  # RSS: 3; GPU: 4
    growth = {1: 0.5, 2: 0.0, 4: 2.0}
    assert [p.pid for p in choose_exported(procs, {}, growth, set(), top=2)] == [1, 2, 3, 4]
    assert [p.pid for p in choose_exported(procs, {}, {2: 1.0, 1: 3.0}, set(), top=1)] == [1, 3]
    assert [p.pid for p in choose_exported(procs, {}, {}, {4}, top=0)] == [4]
