"""Host processes from psutil, against real child processes."""

import dataclasses
import os
import signal
import sys
import time

import psutil
import pytest

from gpuscope.core.node.host import HostCollector, ProcessForbidden, ProcessGone, check_attachable
from gpuscope.core.target.interpreter import is_python
from gpuscope.core.node.live import NodeSource

from helpers import IDLER, LEAKER, wait_until


def test_detail_of_a_python_child(spawn_python):
    child = spawn_python(IDLER, "--api-key", "sk-live-123")
    detail = HostCollector().detail(child.pid)
    assert detail.pid == child.pid and not detail.exited
    assert detail.python_version == ".".join(map(str, sys.version_info[:3]))
    assert detail.threads >= 1 and detail.cwd == os.getcwd()
    assert "sk-live-123" not in detail.command and "--api-key ***" in detail.command


def test_check_attachable_refuses_missing_and_forbidden(spawn_python, monkeypatch):
    child = spawn_python(IDLER)
    assert check_attachable(child.pid).pid == child.pid
    child.kill()
    child.wait()
    with pytest.raises(ProcessGone):
        check_attachable(child.pid)
    with pytest.raises(ProcessGone):
        check_attachable(0)

    def denied(self):
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "cmdline", denied)
    with pytest.raises(ProcessForbidden):
        check_attachable(os.getpid())


def test_python_is_recognised_by_name_or_interpreter():
    assert is_python("python3.11", None) and is_python("python", None)
    assert is_python("vllm", "/usr/bin/python3.12")  # a console script: comm is the script's name
    assert not is_python("bash", "/usr/bin/bash")


def test_the_live_source_sees_a_leaking_child_grow(spawn_python):
    child = spawn_python(LEAKER)
    frames = []
    source = NodeSource(interval=0.25, focus_pid=child.pid)
    source.start(frames.append)
    try:
        def grown():
            rows = [r for r in (frames[-1].processes if frames else ()) if r.pid == child.pid]
            return rows and rows[0].rss_growth_bytes_per_s and rows[0].rss_growth_bytes_per_s > 0.5e6
        wait_until(grown, timeout=60, what="a positive RSS growth for the leaking child")
        frame = frames[-1]
        assert frame.focus.pid == child.pid and frame.selected_pid == child.pid
        assert frame.chart.pid == child.pid and len(frame.chart.ages) >= 4
        assert frame.chart.rss_bytes[-1] > frame.chart.rss_bytes[0]
        assert all(v is None for v in frame.chart.gpu_bytes)  # no NVML here: N/A, never 0
    finally:
        source.stop()


def test_frames_read_ahead_are_handed_over_at_start_in_order(spawn_python):
    child = spawn_python(IDLER)
    source = NodeSource(interval=0.1, focus_pid=child.pid)
    source.prefetch()  # reading starts before anyone listens (the console's screen is still being built)
    try:
        wait_until(lambda: source.last_host is not None and source.last_host.time > 0, timeout=30,
                   what="a host read before start")
        time.sleep(0.3)  # a few more
        shown, samples = [], []
        source.start(shown.append, samples.append)
        assert shown and shown[0].focus.pid == child.pid  # the latest frame read ahead, at once
        assert len(samples) >= 2  # every sample read ahead reaches the journal ...
        wait_until(lambda: len(samples) >= 8, timeout=30, what="samples after start")
        times = [f.time for f in samples]
        assert times == sorted(times) and len(set(times)) == len(times)  # ... once each, in order
    finally:
        source.stop()


def test_an_attached_process_that_exits_keeps_its_details_and_chart(spawn_python):
    child = spawn_python(IDLER)
    source = NodeSource(interval=0.25, focus_pid=child.pid)
    source.sample_once()
    source.sample_once()
    child.kill()
    child.wait()
    frame = source.sample_once()
    assert frame.focus.exited and frame.focus.pid == child.pid
    assert frame.chart is not None and len(frame.chart.ages) == 2


def test_one_python_version_detection_for_the_console_and_the_injection():
    import os

    from gpuscope.core.node.host import HostCollector
    from gpuscope.core.target.interpreter import python_version_of, version_in_name

    assert python_version_of(os.getpid()) == sys.version_info[:2]
    assert HostCollector().detail(os.getpid()).python_version.startswith("%d.%d" % sys.version_info[:2])
    assert version_in_name("/usr/bin/python3.12") == (3, 12) and version_in_name("/usr/bin/pypy3.10") == (3, 10)
    assert version_in_name("/usr/bin/python3") is None and version_in_name(None) is None


def test_the_console_read_does_not_wait_for_the_interpreter_version(spawn_python):
    child = spawn_python(IDLER)
    host = HostCollector()
    first = host.detail(child.pid, wait_for_version=False)
    # The quick answer, from the executable's name or libpython: nothing was run for it.
    assert first.python_version == "%d.%d" % sys.version_info[:2]
    full = ".".join(map(str, sys.version_info[:3]))
    assert wait_until(lambda: host.detail(child.pid, wait_for_version=False).python_version == full, timeout=20)


def open_stat_files(pids) -> dict[int, list[int]]:
    """The file descriptors this process holds on /proc/PID/stat of each of `pids`."""
    out: dict[int, list[int]] = {pid: [] for pid in pids}
    for fd in os.listdir("/proc/self/fd"):
        try:
            parts = os.readlink(f"/proc/self/fd/{fd}").split("/")
        except OSError:
            continue
        if len(parts) == 4 and parts[1] == "proc" and parts[3] == "stat" and parts[2].isdigit() and int(parts[2]) in out:
            out[int(parts[2])].append(int(fd))
    return out


def test_the_scan_keeps_each_process_s_stat_file_open_and_closes_those_of_processes_gone(spawn_python):
    child, other = spawn_python(IDLER), spawn_python(IDLER)
    pids = (child.pid, other.pid)
    host = HostCollector()
    host.scan()
    held = open_stat_files(pids)
    assert all(len(fds) == 1 for fds in held.values())
    host.scan()
    assert open_stat_files(pids) == held  # read again, not opened again
    child.kill()
    child.wait()
    assert child.pid not in {s.pid for s in host.scan()}
    assert open_stat_files(pids) == {child.pid: [], other.pid: held[other.pid]}
    host.close()
    assert open_stat_files(pids) == {child.pid: [], other.pid: []}


def test_a_stat_file_kept_open_for_a_process_gone_is_never_read_as_the_process_that_took_its_pid(spawn_python):
    """A PID reused between two passes: the file kept open belongs to the process that ended, so
    the new process is read from its own file, with its own start time and memory."""
    gone = spawn_python(IDLER)
    stale = os.open(f"/proc/{gone.pid}/stat", os.O_RDONLY)
    gone.kill()
    gone.wait()
    child = spawn_python(LEAKER, "20")
    host = HostCollector()
    host.scan()
    kept = host._stat_files.pop(child.pid, None)
    if kept is not None:
        os.close(kept)
    host._stat_files[child.pid] = stale  # as if the child had taken the PID of the one gone
    row = next(s for s in host.scan() if s.pid == child.pid)
    assert row.create_time == pytest.approx(psutil.Process(child.pid).create_time(), abs=0.05)
    assert row.rss == pytest.approx(psutil.Process(child.pid).memory_info().rss, rel=0.2)
    host.close()


def test_the_scan_keeps_no_more_files_open_than_its_share_of_the_limit(spawn_python, monkeypatch):
    monkeypatch.setattr("gpuscope.core.node.host._stat_files_to_keep", lambda: 2)
    children = [spawn_python(IDLER) for _ in range(3)]
    pids = [c.pid for c in children]
    host = HostCollector()
    seen = {s.pid for s in host.scan()} & {s.pid for s in host.scan()}
    assert set(pids) <= seen
    assert len(host._stat_files) == 2  # the first two processes listed, others opened each pass
    assert sum(map(len, open_stat_files(pids).values())) <= 2
    host.close()


def test_a_process_whose_stat_line_is_unchanged_is_taken_as_it_was_and_its_owner_read_again_in_time(spawn_python, monkeypatch):
    """A stopped process's /proc/PID/stat reads the same each pass: its row is the last one (CPU
    0.0), as a full read gives it, without asking its owner, until the owner is due again; a
    process that runs is read afresh each pass."""
    from gpuscope.core.node import host as host_module

    stopped, running = spawn_python(IDLER), spawn_python(LEAKER, "20")
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        host = HostCollector()
        wait_until(lambda: next(s for s in host.scan() if s.pid == stopped.pid).status == "stopped")
        host.scan()
        asked: list[int] = []
        real_stat = os.stat

        def stat(path, *args, **kwargs):
            parts = str(path).split("/")
            if len(parts) == 3 and parts[1] == "proc" and parts[2].isdigit():
                asked.append(int(parts[2]))
            return real_stat(path, *args, **kwargs)

        monkeypatch.setattr(host_module.os, "stat", stat)
        time.sleep(0.3)  # the running one grows 200 KB every 0.1 s
        rows = {s.pid: s for s in host.scan()}
        assert stopped.pid not in asked and running.pid in asked
        assert rows[stopped.pid].cpu == 0.0
        fresh = HostCollector()
        assert dataclasses.replace(rows[stopped.pid], cpu=None) == next(s for s in fresh.scan() if s.pid == stopped.pid)
        fresh.close()
        asked.clear()
        for _ in range(host_module._UNCHANGED_PASSES):
            host.scan()
        assert stopped.pid in asked  # its owner, read again within the bound
        host.close()
    finally:
        os.kill(stopped.pid, signal.SIGCONT)


def counted_reads(monkeypatch, fd: int) -> list[int]:
    """Every read of the open file `fd` (a process's /proc/PID/stat, kept open between passes)."""
    from gpuscope.core.node import host as host_module

    reads: list[int] = []
    real_pread = os.pread

    def pread(f, n, offset):
        if f == fd:
            reads.append(1)
        return real_pread(f, n, offset)

    monkeypatch.setattr(host_module.os, "pread", pread)
    return reads


def test_a_calm_process_is_read_every_third_pass_unless_asked_fresh_and_its_change_shows_within_them(spawn_python, monkeypatch):
    """Per-process work follows what changes: a process whose line read the same CALM_READS
    times is taken as it was between reads every CALM_EVERY-th pass; one on screen (asked fresh)
    is read every pass; a calm one that changes shows within CALM_EVERY passes."""
    from gpuscope.core.node.host import CALM_EVERY, CALM_READS

    stopped = spawn_python(IDLER)
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        host = HostCollector()
        wait_until(lambda: next(s for s in host.scan() if s.pid == stopped.pid).status == "stopped")
        for _ in range(CALM_READS + 1):
            host.scan()
        reads = counted_reads(monkeypatch, host._stat_files[stopped.pid])
        for _ in range(2 * CALM_EVERY):
            assert next(s for s in host.scan() if s.pid == stopped.pid).status == "stopped"
        assert len(reads) == 2
        reads.clear()
        for _ in range(2 * CALM_EVERY):
            host.scan({stopped.pid})
        assert len(reads) == 2 * CALM_EVERY
        for _ in range(CALM_READS + CALM_EVERY):
            host.scan()  # calm again, in the middle of its rest
        os.kill(stopped.pid, signal.SIGCONT)
        time.sleep(0.05)
        statuses = [next(s for s in host.scan() if s.pid == stopped.pid).status for _ in range(CALM_EVERY)]
        assert statuses[-1] != "stopped", statuses
        host.close()
    finally:
        os.kill(stopped.pid, signal.SIGCONT)


def test_the_console_reads_the_attached_process_every_pass(spawn_python, monkeypatch):
    """The node source asks the host scan for its rows, the attached process and the alerting
    ones fresh: what the operator reads is never a calm row's last reading."""
    stopped = spawn_python(IDLER)
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        from helpers import NoAllocator, NoNvml

        host = HostCollector()
        node = NodeSource(nvml=NoNvml(), host=host, allocator=NoAllocator(), focus_pid=stopped.pid)
        wait_until(lambda: next(s for s in host.scan() if s.pid == stopped.pid).status == "stopped")
        for _ in range(4):
            node.sample_once()
        reads = counted_reads(monkeypatch, host._stat_files[stopped.pid])
        for _ in range(6):
            node.sample_once()
        assert len(reads) == 6
        host.close()
    finally:
        os.kill(stopped.pid, signal.SIGCONT)


def test_host_memory_reads_what_psutil_reads_and_asks_psutil_where_the_kernel_has_no_memavailable(tmp_path, monkeypatch):
    host = HostCollector()
    mine, theirs = host.memory(), psutil.virtual_memory()
    assert mine.total == theirs.total and mine.used == mine.total - mine.available
    assert abs(mine.available - theirs.available) < 64 * 2**20  # read a moment apart
    with monkeypatch.context() as m:
        m.setattr(psutil, "virtual_memory", None)  # this kernel has MemAvailable: read directly
        assert host.memory().total == theirs.total
    old_kernel = tmp_path / "meminfo"
    old_kernel.write_text("MemTotal:        1000 kB\nMemFree:          600 kB\nBuffers:          100 kB\n")
    os.close(host._meminfo_fd)
    host._meminfo_fd = os.open(old_kernel, os.O_RDONLY)
    estimate = type(theirs)(*[0] * len(theirs))._replace(total=1024000, available=716800)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: estimate)
    assert host.memory() == type(mine)(total=1024000, used=1024000 - 716800, available=716800)
    host.close()
    assert host._meminfo_fd is None


def test_following_a_process_from_the_scan_says_what_psutil_says_and_reads_its_command_once(spawn_python, monkeypatch):
    import signal

    child = spawn_python(IDLER, "--api-key", "sk-live-123")
    host = HostCollector()

    def both(status):
        """The detail read both ways, once the child reads `status` both times (a sleeping
        child is running now and then)."""
        def read():
            row = next(s for s in host.scan() if s.pid == child.pid)
            followed, full = host.detail(child.pid, seen=row), host.detail(child.pid)
            return (followed, full) if followed.status == full.status == status else None
        return wait_until(read, timeout=10, interval=0.05, what=f"the child {status}")

    followed, full = both("sleeping")
    assert followed == full and "sk-live-123" not in followed.command
    os.kill(child.pid, signal.SIGSTOP)
    try:
        followed, full = both("stopped")
        assert followed == full
    finally:
        os.kill(child.pid, signal.SIGCONT)
    row = next(s for s in host.scan() if s.pid == child.pid)
    monkeypatch.setattr(psutil, "Process", None)  # the command line is the table's, read once
    again = host.detail(child.pid, seen=row)
    assert dataclasses.replace(again, status=None) == dataclasses.replace(full, status=None)


def test_a_process_that_has_exited_but_is_not_yet_collected_is_no_sample(spawn_python):
    """A zombie (exited, its parent has not waited for it) holds no memory: a row of it would end
    its memory series at 0, which reads as a fall rather than as the process's end."""
    child = spawn_python(IDLER)
    host = HostCollector()
    assert child.pid in {s.pid for s in host.scan()}
    child.kill()  # not waited for: a zombie until the test's cleanup collects it
    wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, timeout=10, what="a zombie")
    assert child.pid not in {s.pid for s in host.scan()}
    host.close()
