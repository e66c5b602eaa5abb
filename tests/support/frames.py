"""Hand-made frames and a source that replays them: the console tested without collectors."""

from __future__ import annotations

import sqlite3
import zlib
from dataclasses import replace
from pathlib import Path

from gpuscope.core.diagnosis.steps import Evidence, Series
from gpuscope.core.node.model import Device, Frame, HostMemory, MemorySeries, NvmlReading, ProcessDetail, ProcessRow

GIB = 1 << 30
MIB = 1 << 20
T0 = 1_767_000_000.0  # a fixed wall-clock time, so snapshots do not depend on today


def rows() -> tuple[ProcessRow, ...]:
    return (
        ProcessRow(4242, "svc", 0, 61 * GIB, 9 * GIB, 97.0, "python -m vllm.entrypoints.openai.api_server --api-key ***",
                   "python", True, 3.1e6, 0.1e6),
        ProcessRow(4243, "svc", 1, 22 * GIB, 3 * GIB, 12.0, "python rag_worker.py --retriever faiss", "python", True, 0.0, 0.0),
        ProcessRow(5100, "alice", 1, None, 2 * GIB, 3.0, "python notebook_kernel.py", "python", True, None, 0.0),
        ProcessRow(777, "root", None, None, 512 * MIB, 1.0, "/usr/bin/dockerd -H fd://", "dockerd", False, None, 0.0),
        ProcessRow(9001, "bob", None, None, 1 * GIB, 45.0, "python train_tokenizer.py", "python", True, None, 1.5e6),
    )


def chart(pid: int = 4242, n: int = 60) -> MemorySeries:
    ages = tuple(float(n - 1 - i) for i in range(n))
    return MemorySeries(
        pid=pid,
        ages=ages,
        gpu_bytes=tuple(58 * GIB + i * 3.1e6 * 1 for i in range(n)),
        rss_bytes=tuple(9 * GIB + (i % 10) * 20 * MIB for i in range(n)),
    )


def frame(**changes) -> Frame:
    base = Frame(
        time=T0,
        hostname="gpu-node-7",
        host=HostMemory(total=512 * GIB, used=187 * GIB, available=325 * GIB),
        nvml=NvmlReading(
            status=None,
            devices=(
                Device(0, "NVIDIA H200", "GPU-0", 63 * GIB, 141 * GIB, 97, 64),
                Device(1, "NVIDIA H200", "GPU-1", 25 * GIB, 141 * GIB, 12, 41),
            ),
            driver="550.54.15",
        ),
        processes=rows(),
        focus=ProcessDetail(4242, "svc", "python -m vllm.entrypoints.openai.api_server --api-key ***", "/usr/bin/python3.11",
                            "/srv/vllm", 48, "3.11.9", "running", T0 - 3600),
        selected_pid=4242,
        chart=chart(),
    )
    return replace(base, **changes)


def no_nvml_frame() -> Frame:
    host_rows = tuple(r for r in rows() if r.gpu is None)
    return frame(
        nvml=NvmlReading(status="NVML unavailable: no NVIDIA driver on this machine (libnvidia-ml.so.1 not found)"),
        processes=host_rows, focus=None, selected_pid=None, chart=None,
    )


def leaking_evidence(pid: int = 4242, seconds: int = 60, rate: float = 6e6) -> Evidence:
    """A minute of a process whose RSS floor rises `rate` bytes/s (with a little noise)."""
    times = tuple(float(t - seconds) for t in range(seconds + 1))
    rss = tuple(200e6 + rate * (t + seconds) + (3e5 if t % 7 == 0 else 0.0) for t in times)
    return Evidence(pid=pid, command="python serve.py --api-key ***", duration_s=float(seconds),
                    rss=Series(times, rss), processes=rows(), nvml_status="NVML unavailable: no NVIDIA driver")


class FakeSource:
    """A Source that sends the frames the test gives it (each one a sample) and records what the
    console asked."""

    def __init__(self, *frames: Frame, evidence: Evidence | None = None) -> None:
        self.frames = list(frames)
        self.selected: list[int | None] = []
        self.focused: list[int | None] = []
        self.on_frame = None
        self.stopped = False
        self.evidence_asked: list[int] = []
        self._evidence = evidence

    def start(self, on_frame, on_sample=None) -> None:
        self.on_frame = on_frame
        self.on_sample = on_sample
        for f in self.frames:
            self.send(f)

    def send(self, f: Frame) -> None:
        if self.on_sample is not None:
            self.on_sample(f)
        self.on_frame(f)

    def stop(self) -> None:
        self.stopped = True

    def select(self, pid) -> None:
        self.selected.append(pid)

    def focus(self, pid) -> None:
        self.focused.append(pid)

    def evidence(self, pid, seconds):
        """The evidence the test gave (a leak by default), in place of what a node's records make."""
        self.evidence_asked.append(pid)
        return self._evidence or leaking_evidence(pid)


def live(source, *, serving=None, journal=None):
    """A live session over `source` (what the console is given), as `gpuscope` builds one; a
    FakeSource's evidence is the one its test gave."""
    from gpuscope.core.session.live import LiveSession

    if isinstance(source, FakeSource):
        return LiveSession(source, serving=serving, journal=journal,
                           evidence=lambda src, pid, seconds: src.evidence(pid, seconds))
    return LiveSession(source, serving=serving, journal=journal)


def session_frames(n: int):
    """Frames as a node produces them: RSS creeping, a process leaving and coming back, one appearing."""
    base = replace(frame(), chart=None, focus=None)
    out = []
    for i in range(n):
        procs = [replace(r, rss_bytes=r.rss_bytes + i * 4096) if r.pid == 4242 else r for r in rows()]
        if 70 <= i < 75:
            procs = procs[1:]  # 4242 gone for a while: it comes back at the end of the order
        if i >= 100:
            procs.append(replace(rows()[-1], pid=31337, command="python late.py", cpu_percent=float(i)))
        out.append(replace(base, time=T0 + i, processes=tuple(procs), selected_pid=4242 if i % 2 else None))
    return out


def recording_text(path: Path) -> str:
    """Everything in a session file, readable: its metadata and every decompressed record."""
    conn = sqlite3.connect(path)
    parts = [f"{k}={v}" for k, v in conn.execute("SELECT key, value FROM meta")]
    for table in ("frames", "serving", "events"):
        parts += [zlib.decompress(blob).decode() for (blob,) in conn.execute(f"SELECT data FROM {table}")]
    conn.close()
    return "\n".join(parts)


class FakeServing:
    def __init__(self, *snapshots):
        self.snapshots = snapshots
        self.stopped = False

    def start(self, on_snapshot):
        for s in self.snapshots:
            on_snapshot(s)

    def stop(self):
        self.stopped = True
