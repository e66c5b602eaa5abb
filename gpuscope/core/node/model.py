"""Immutable values that flow from the collectors to whatever renders them.

A `Frame` is everything the console shows at one instant. Sources (live or replay) build frames;
the TUI only renders them. Nothing here imports a UI library.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.core.node.cgroup import Cgroup


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU as NVML reported it. A field NVML could not give is None (shown as N/A)."""

    index: int
    name: str
    uuid: str | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    utilization: int | None = None  # percent
    temperature: int | None = None  # degrees Celsius
    error: str | None = None  # why this device could not be read (GPU lost, no permission, ...)


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One process's memory on one device. `memory` is None where NVML says "not available"."""

    pid: int
    device: int
    memory: int | None
    kind: str = "C"  # "C" compute, "G" graphics, "C+G" both


@dataclass(frozen=True, slots=True)
class NvmlReading:
    """What the NVML collector saw in one read. `status` is None when NVML works, else why not."""

    status: str | None
    devices: tuple[Device, ...] = ()
    uses: tuple[GpuUse, ...] = ()
    driver: str | None = None
    notices: tuple[str, ...] = ()  # one line per GPU whose process list NVML refused


@dataclass(frozen=True, slots=True)
class HostMemory:
    """The host's memory in bytes (`used` is `total` less what the kernel says is available)."""

    total: int
    used: int
    available: int


@dataclass(frozen=True, slots=True)
class HostProcess:
    """A host process as psutil saw it. `command` is already redacted."""

    pid: int
    create_time: float
    user: str | None
    name: str
    command: str
    rss_bytes: int | None
    cpu_percent: float | None
    is_python: bool
    private_bytes: int | None = None  # resident less shared pages (None: unknown, the RSS stands for it)
    cgroup: Cgroup = Cgroup()  # where it runs: its systemd unit or container


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One row of the process table: a process on one GPU (gpu is None for host-only rows)."""

    pid: int
    user: str | None
    gpu: int | None
    gpu_memory_bytes: int | None
    rss_bytes: int | None
    cpu_percent: float | None
    command: str
    name: str = ""
    is_python: bool = False
    gpu_growth_bytes_per_s: float | None = None
    rss_growth_bytes_per_s: float | None = None
    runs_in: str = ""  # its systemd unit or container, short (`Cgroup.name`): "vllm.service", "docker:0123456789ab"

    @property
    def key(self) -> str:
        return f"{self.pid}:{'-' if self.gpu is None else self.gpu}"

    @property
    def growth_bytes_per_s(self) -> float | None:
        """The growth that matters for this row: GPU memory on a GPU row, RSS otherwise."""
        if self.gpu is not None and self.gpu_memory_bytes is not None:
            return self.gpu_growth_bytes_per_s
        return self.rss_growth_bytes_per_s

    def to_json(self) -> dict:
        """The `gpuscope ps --json` object (a stable contract: keep the keys)."""
        return {
            "pid": self.pid,
            "user": self.user,
            "gpu": self.gpu,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "rss_bytes": self.rss_bytes,
            "cpu_percent": self.cpu_percent,
            "command": self.command,
            "runs_in": self.runs_in,
        }


@dataclass(frozen=True, slots=True)
class ProcessDetail:
    """What the console shows about the process it is attached to."""

    pid: int
    user: str | None
    command: str
    exe: str | None
    cwd: str | None
    threads: int | None
    python_version: str | None
    status: str | None
    create_time: float | None
    exited: bool = False
    runs_in: str = ""  # its systemd unit or container, short (`Cgroup.name`)


@dataclass(frozen=True, slots=True)
class MemorySeries:
    """A process's memory over time: `ages` are seconds before the frame (0 = now, positive).

    `allocated_bytes` / `reserved_bytes`: PyTorch's allocator at the same times, for a process
    with a probe (empty otherwise)."""

    pid: int
    ages: tuple[float, ...]
    gpu_bytes: tuple[float | None, ...]
    rss_bytes: tuple[float | None, ...]
    allocated_bytes: tuple[float | None, ...] = ()
    reserved_bytes: tuple[float | None, ...] = ()
    started: float | None = None  # wall-clock time the process started, where known


@dataclass(frozen=True, slots=True)
class TorchMemory:
    """What PyTorch's caching allocator holds in one process (all its devices), read through the
    process's probe: `allocated` is in live tensors, `reserved` what the allocator took from CUDA
    (allocated + its cache). NVML's per-process number is reserved + the CUDA context + the rest."""

    pid: int
    allocated_bytes: int | None
    reserved_bytes: int | None
    devices: int = 1


@dataclass(frozen=True, slots=True)
class Alert:
    """A memory series the leak detector currently calls a leak."""

    kind: str  # "device" (a GPU's used memory), "gpu" (a process on a GPU) or "rss"
    pid: int | None
    device: int | None
    label: str  # what is growing, for a person: "PID 123 python serve.py (RSS)", "GPU0 NVIDIA H200"
    growth_bytes_per_s: float
    since: float | None  # wall-clock time the growth started
    time_to_full_s: float | None  # device memory only
    confidence: float
    reason: str
    ended: bool = False  # its process has exited: kept a while, listed after the live ones

    def subject(self, processes: tuple[ProcessRow, ...]) -> int | None:
        """The process to diagnose: the alert's own, or for a filling GPU its fastest grower."""
        if self.pid is not None:
            return self.pid
        rows = [(r.gpu_growth_bytes_per_s, r.pid) for r in processes
                if r.gpu == self.device and r.gpu_growth_bytes_per_s is not None]
        return max(rows, key=lambda row: row[0])[1] if rows else None


@dataclass(frozen=True, slots=True)
class ReplayPosition:
    """Where a replay's time cursor stands (frames from a replay carry it; live ones do not)."""

    index: int
    count: int
    start: float  # wall-clock time of the recording's first and last frames
    end: float
    playing: bool
    speed: float
    file: str
    damage: str | None = None  # what could not be read of the file, if anything


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything the console shows at one instant."""

    time: float  # wall clock, seconds since the epoch
    hostname: str
    host: HostMemory | None
    nvml: NvmlReading
    processes: tuple[ProcessRow, ...]
    notices: tuple[str, ...] = ()  # one-line banners: container PID namespace, a stalled source
    focus: ProcessDetail | None = None
    selected_pid: int | None = None
    chart: MemorySeries | None = None
    source: str = "live"  # "live" or "replay"
    alerts: tuple[Alert, ...] = ()  # fastest growth first
    replay: ReplayPosition | None = None
    torch: tuple[TorchMemory, ...] = ()  # processes with a probe, by PID
