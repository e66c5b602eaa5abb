"""PyTorch's allocator beside NVML's number: the live source reads every probe it finds, the
console shows allocated vs reserved and the gap, the diagnosis tells cache growth from a leak."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from frames import GIB, FakeSource, frame, live
from gpuscope.core.target import probe_client
from gpuscope.core.diagnosis.steps import diagnose
from gpuscope.core.diagnosis.recorded import source_evidence
from gpuscope.core.session.journal import Journal
from gpuscope.core.node.model import TorchMemory
from gpuscope.core.node.live import NodeSource
from gpuscope.core.session.recording import open_recording
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.detail import ProcessPanel
from helpers import wait_until
from pilot_wait import until
from test_probe import CUDA_LEAKING, FAKE_CUDA, probed
from gpuscope.core.target.probe_client import ProbeWatch

# Only the cache grows: every block is freed (it stays reserved); the process's own memory grows
# with it, as NVML would see a pool that keeps growing.
CUDA_CACHE_CHURN = """
pool = []
step = 0
while True:
    torch.free(torch.empty(((step % 5) + 1) << 20))
    pool.append(bytearray(300_000))
    step += 1
    time.sleep(0.02)
"""


def watch(fake_nvml, child, seconds: float):
    fake_nvml.configure({"devices": [{"name": "NVIDIA H200", "total": 141 * GIB, "util": 50, "temp": 60,
                                      "compute": [{"pid": child.pid, "used": "rss"}]}]})
    source = NodeSource(interval=0.25, focus_pid=child.pid)
    frames = []
    source.start(frames.append)

    def enough():
        history = source.history(child.pid, 600)
        known = [a for a, v in zip(history.ages, history.allocated_bytes) if v is not None] if history else []
        return len(known) >= 4 and max(known) >= seconds and frames[-1]
    try:
        last = wait_until(enough, timeout=60, interval=0.1, what="allocator samples from the probe")
        return last, source_evidence(source, child.pid, 600)
    finally:
        source.stop()


def test_a_leak_of_tensors_shows_allocated_growing(spawn_python, fake_nvml):
    child = probed(spawn_python, CUDA_LEAKING, FAKE_CUDA)
    last, evidence = watch(fake_nvml, child, 3)
    [torch] = [t for t in last.torch if t.pid == child.pid]
    assert torch.reserved_bytes >= torch.allocated_bytes > 0 and torch.devices == 1
    allocated = evidence.allocated.known()
    assert allocated[-1] > allocated[0] and len(evidence.reserved.values) == len(evidence.rss.values)


def test_a_growing_cache_is_not_called_a_leak(spawn_python, fake_nvml):
    child = probed(spawn_python, CUDA_CACHE_CHURN, FAKE_CUDA)
    _, evidence = watch(fake_nvml, child, 12)  # the classifier wants 10 s or more
    # Nothing stays allocated: a read may land between a tensor's allocation and its free (a
    # loaded machine preempts the loop there), never on one that stays.
    allocated = sorted(evidence.allocated.known())
    assert allocated[len(allocated) // 2] == 0 and allocated[-1] <= 5 << 20, allocated
    d = diagnose(evidence)
    assert d.memory_source == "gpu" and d.pattern == "cache-growth" and d.verdict == "no-leak", d.to_text()


async def test_the_console_shows_allocated_reserved_and_the_rest():
    # NVML: 61 GiB for PID 4242; PyTorch: 50 allocated, 58 reserved -> 3 GiB are the context and others.
    torch = TorchMemory(4242, 50 * GIB, 58 * GIB)
    app = GpuScopeApp(live(FakeSource(frame(torch=(torch,)))))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: "torch   alloc" in app.query_one(ProcessPanel).text.plain, "the torch line")
        text = app.query_one(ProcessPanel).text.plain
        assert "torch   alloc 50.0G · resv 58.0G · other 3.0G" in text


def test_the_allocator_numbers_are_recorded_and_replayed(tmp_path):
    path = tmp_path / "s.gpuscope"
    j = Journal(path)
    for i in range(5):
        j.frame(frame(time=frame().time + i, chart=None, torch=(TorchMemory(4242, (50 + i) * GIB, 58 * GIB),)))
    j.close()
    rec = open_recording(path)
    history = rec.history(4242, 60, rec.end)
    assert history.allocated_bytes == tuple((50 + i) * GIB for i in range(5))
    assert history.reserved_bytes == (58 * GIB,) * 5
    assert rec.frame(4).torch == (TorchMemory(4242, 54 * GIB, 58 * GIB),)


# -- finding the probes: every refresh asks, the folders are listed only when they change ----------


@pytest.fixture
def listings(monkeypatch):
    """The folders' listings the watch makes, counted. The watch sees only this test's probe
    folder, in a temporary folder of its own (this process's and its children's, through
    XDG_RUNTIME_DIR and TMPDIR): the machine's own probe folders change whenever another test, or
    anything else here, starts or stops a probe."""
    private = tempfile.mkdtemp(prefix="gpuscope-w-")  # short: a socket's path has at most 107 bytes
    monkeypatch.setenv("XDG_RUNTIME_DIR", private)
    monkeypatch.setenv("TMPDIR", private)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    real_folders, real_stamp, real_list = probe_client._probe_folders, probe_client._stamp, probe_client._list_in
    monkeypatch.setattr(probe_client, "_probe_folders", lambda: [f for f in real_folders() if f[0].startswith(private)])
    monkeypatch.setattr(probe_client, "_stamp", lambda path: real_stamp(path) if path.startswith(private) else None)
    counted = []

    def counting(folders, *, clean):
        counted.append(len(folders))
        return real_list(folders, clean=clean)

    monkeypatch.setattr(probe_client, "_list_in", counting)
    monkeypatch.setattr(ProbeWatch, "RACY_S", 0.05)  # the folders' clock ticks here are far finer
    yield counted
    shutil.rmtree(private, ignore_errors=True)


def test_probes_are_listed_again_only_when_their_folders_change(spawn_python, listings):
    watch = ProbeWatch()
    first = probed(spawn_python)
    assert first.pid in [p.pid for p in watch.probes()]
    time.sleep(0.1)
    watch.probes()  # a folder modified just before the listing is looked at once more
    listed = len(listings)
    for _ in range(20):
        # The temporary folder itself changes whenever any program makes a file in it: that is
        # not a probe's doing, and no reason to list again.
        with tempfile.NamedTemporaryFile(prefix="unrelated-"):
            assert first.pid in [p.pid for p in watch.probes()]
    assert len(listings) == listed  # no probe folder changed: no listing

    second = probed(spawn_python)  # its socket appears: the next ask lists again and finds it
    assert {first.pid, second.pid} <= {p.pid for p in watch.probes()}
    assert len(listings) > listed


def test_the_socket_of_a_killed_process_is_removed_and_it_leaves_the_list(spawn_python, listings):
    watch = ProbeWatch()
    child = probed(spawn_python)
    [info] = [p for p in watch.probes() if p.pid == child.pid]
    child.kill()
    child.wait(10)
    assert os.path.exists(info.path)  # SIGKILL: the probe could not remove it
    assert child.pid not in [p.pid for p in watch.probes()]
    assert not os.path.exists(info.path)
