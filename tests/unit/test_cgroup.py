"""Where a process runs, from /proc/PID/cgroup: systemd units and containers in the formats the
kernel writes (cgroup v1 and v2), and any bytes at all without a traceback or a control character."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuscope.core.node.cgroup import MAX_LINES, NAME_CHARS, Cgroup, parse_cgroup, read_cgroup
from gpuscope.core.node.host import HostCollector

DOCKER_ID = "4f0c5d1e2a3b" + "0123456789abcdef" * 3 + "0123"  # 64 hex
CTR_ID = "9e8d7c6b5a41" + "fedcba9876543210" * 3 + "cafe"
POD = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
assert len(DOCKER_ID) == len(CTR_ID) == 64

V1_LINES = ("12:pids:{p}\n11:memory:{p}\n10:cpu,cpuacct:{p}\n9:devices:{p}\n4:blkio:{p}\n"
            "1:name=systemd:{p}\n0::{p}\n")


@pytest.mark.parametrize(("text", "name"), [
    # systemd: a system service, its own sub-cgroups, a user's service, an instance
    ("0::/system.slice/vllm.service\n", "vllm.service"),
    ("0::/system.slice/rag.service/workers/w1\n", "rag.service"),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.service\n", "x.service"),
    ("0::/system.slice/system-getty.slice/getty@tty1.service\n", "getty@tty1.service"),
    (V1_LINES.format(p="/system.slice/vllm.service"), "vllm.service"),
    # what says nothing of what a process belongs to
    ("0::/user.slice/user-1000.slice/session-3.scope\n", ""),
    ("0::/init.scope\n", ""),
    ("0::/user.slice/user-1000.slice/user@1000.service/init.scope\n", ""),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal.slice/"
     "vte-spawn-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.scope\n", ""),
    ("0::/\n", ""),
    (V1_LINES.format(p="/"), ""),
    # Docker: the systemd driver (v2 and v1), cgroupfs (v1 and v2), nested (Docker in Docker)
    (f"0::/system.slice/docker-{DOCKER_ID}.scope\n", f"docker:{DOCKER_ID[:12]}"),
    (V1_LINES.format(p=f"/system.slice/docker-{DOCKER_ID}.scope"), f"docker:{DOCKER_ID[:12]}"),
    (V1_LINES.format(p=f"/docker/{DOCKER_ID}"), f"docker:{DOCKER_ID[:12]}"),
    (f"0::/docker/{DOCKER_ID}\n", f"docker:{DOCKER_ID[:12]}"),
    (f"0::/system.slice/docker-{CTR_ID}.scope/docker/{DOCKER_ID}\n", f"docker:{DOCKER_ID[:12]}"),
    # dockerd itself is a unit, not a container
    ("0::/system.slice/docker.service\n", "docker.service"),
    # Kubernetes: containerd and CRI-O under the systemd driver, cgroupfs (v1), a pod's own cgroup
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + POD.replace("-", "_")
     + f".slice/cri-containerd-{CTR_ID}.scope\n", f"pod:{POD[:8]}/ctr:{CTR_ID[:12]}"),
    ("0::/kubepods.slice/kubepods-pod" + POD.replace("-", "_") + f".slice/crio-{CTR_ID}.scope\n",
     f"pod:{POD[:8]}/ctr:{CTR_ID[:12]}"),
    (V1_LINES.format(p=f"/kubepods/besteffort/pod{POD}/{CTR_ID}"), f"pod:{POD[:8]}/ctr:{CTR_ID[:12]}"),
    (f"0::/kubepods/burstable/pod{POD}\n", f"pod:{POD[:8]}"),
    # containerd alone, Podman (rootless: a folder of its own inside the container's scope)
    (f"0::/system.slice/containerd.service/cri-containerd-{CTR_ID}.scope\n", f"ctr:{CTR_ID[:12]}"),
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CTR_ID}.scope/container\n",
     f"ctr:{CTR_ID[:12]}"),
])
def test_units_and_containers_in_the_formats_the_kernel_writes(text, name):
    assert parse_cgroup(text.encode()).name == name


def test_the_container_keeps_its_whole_id_and_the_pod_its_uid():
    cg = parse_cgroup(("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + POD.replace("-", "_")
                       + f".slice/cri-containerd-{CTR_ID}.scope\n").encode())
    assert (cg.pod_uid, cg.container_id, cg.runtime) == (POD, CTR_ID, "")
    assert parse_cgroup(f"0::/docker/{DOCKER_ID}".encode()).runtime == "docker"


def test_the_unit_is_the_systemd_hierarchys_on_cgroup_v1():
    # Another controller's line may still place the process where it was first started.
    text = "5:cpu:/system.slice/old.service\n1:name=systemd:/user.slice/user-0.slice/session-2.scope\n"
    assert parse_cgroup(text.encode()).name == ""
    assert parse_cgroup(b"5:cpu:/system.slice/only.service\n").name == "only.service"  # no systemd line at all


@pytest.mark.parametrize("data", [
    b"",
    b"\n\n\n",
    b"garbage",
    b"no:path",
    b"0::relative/vllm.service",
    b"\x00\xff\xfe:\x80:/\xc3\x28.service\n",
    b"0::/" + b"a" * (1 << 20) + b".service\n",  # a 1 MB line
    b"0::/" + b"/" * (1 << 20),
    b"0::/system.slice/" + b"docker-" * 100_000 + b".scope",
    b"0::/" + b"x/" * 500_000,
    b":" * 100_000,
    (b"0::/system.slice/a.service\n" * 10_000),
])
def test_any_bytes_give_a_short_printable_name_and_never_raise(data):
    cg = parse_cgroup(data)
    assert isinstance(cg, Cgroup) and len(cg.name) <= NAME_CHARS
    assert cg.name.isprintable()


def test_escape_sequences_and_undecodable_bytes_in_a_unit_never_reach_the_terminal_raw():
    cg = parse_cgroup(b"0::/system.slice/\x1b]0;owned\x07\x1b[2J\x9b31m\xff\xfeevil\xe2\x80\xaename.service\n")
    assert cg.name.endswith("name.service") and cg.name.isprintable()
    assert not any(c in cg.name for c in "\x1b\x07\x9b\u202e")
    long = parse_cgroup(b"0::/system.slice/" + b"\x1b" * 500 + b".service\n").name
    assert len(long) == NAME_CHARS and long.endswith("…") and "\x1b" not in long


def test_lines_past_the_bound_are_not_read():
    text = "".join(f"{i}:c{i}:/\n" for i in range(MAX_LINES)) + "99:x:/system.slice/late.service\n"
    assert parse_cgroup(text.encode()).name == ""
    assert parse_cgroup(text.encode()[-40:]).name == "late.service"


def test_a_real_process_cgroup_is_read_without_error():
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with open(f"/proc/{child.pid}/cgroup", "rb") as f:
            expected = parse_cgroup(f.read())
        assert read_cgroup(child.pid) == expected
    finally:
        child.kill()
        child.wait()
    assert read_cgroup(child.pid) == Cgroup()  # gone: nothing, not an error


def test_the_cgroup_is_read_once_per_process_and_again_for_a_new_one(monkeypatch):
    # The console asks for the same processes each tick: the file is read when a process is new.
    import gpuscope.core.node.host as host

    reads: list[int] = []
    monkeypatch.setattr(host, "read_cgroup", lambda pid: reads.append(pid) or Cgroup(unit=f"u{pid}.service"))
    collector = HostCollector()
    me = next(s for s in collector.scan() if s.pid == os.getpid())
    for _ in range(3):
        (row,) = collector.complete([me])
        assert row.cgroup.name == f"u{me.pid}.service"
    assert reads == [me.pid]
    # The same PID with another start time is another process: read again
    from dataclasses import replace
    collector.complete([replace(me, create_time=me.create_time + 1.0)])
    assert reads == [me.pid, me.pid]


def test_the_row_and_the_alert_name_the_unit_after_what_runs():
    # What the console shows (the row, the alert bar and the `A` list's label) comes from the host's
    # row, read once: the unit sits between the script and the interpreter.
    from gpuscope.core.leak import LeakAlert, LeakAssessment, LeakWatch
    from gpuscope.core.node.live import NodeSource
    from helpers import NoAllocator, NoNvml, OneProcessHost

    unit = parse_cgroup(b"1:name=systemd:/system.slice/rag.service\n")

    leak = LeakAssessment("leak", "steady-growth", 2e6, 0.9, None, None, 1e8, 2e8, 30, 30.0, "rising")

    class Watch(LeakWatch):
        def update(self):
            return [LeakAlert(("rss", 1000, 1.0), leak, 0.0)]

    node = NodeSource(nvml=NoNvml(), host=OneProcessHost("python3 serve.py --port 8000", unit), allocator=NoAllocator(),
                      watch=Watch())
    frame = node.sample_once()
    row = next(r for r in frame.processes if r.pid == 1000)
    assert row.runs_in == "rag.service" and row.to_json()["runs_in"] == "rag.service"
    (alert,) = frame.alerts
    assert alert.label == "PID 1000 serve.py --port 8000 · rag.service · python3 (RSS)", alert.label
