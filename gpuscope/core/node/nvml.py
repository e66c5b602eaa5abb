"""GPU devices and per-process GPU memory from NVML (NVIDIA's `nvidia-ml-py`, module `pynvml`).

NVML is initialised once for the life of the collector (re-initialising costs seconds per GPU
without persistence mode). Every failure becomes a value: NVML missing altogether is a status
line, a lost or forbidden GPU is an error on that device, a field a GPU does not support is None,
and a GPU that refuses to list its processes is one notice (its processes' GPU memory is unknown,
which an empty list would hide).
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Protocol

from gpuscope.core.node.model import Device, GpuUse, NvmlReading
from gpuscope.errors import GpuscopeError

# Process queries newest first; a driver that lacks a version answers FunctionNotFound.
_PROCESS_QUERIES = (
    ("C", "nvmlDeviceGetComputeRunningProcesses"),
    ("G", "nvmlDeviceGetGraphicsRunningProcesses"),
)
_VERSIONS = ("_v3", "_v2", "")
_GPU_LOST = "GPU is lost: it fell off the bus (check dmesg; a reset or reboot is needed)"
# How long the number of GPUs is taken as known: it changes only when a GPU is added or removed
# (a lost GPU is still counted, and answers GpuIsLost), so it is not asked every read.
COUNT_KEPT_S = 30.0


class DeviceFailed(GpuscopeError):
    """A device-wide failure (GPU lost, no permission) that ends the read of that device."""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlReader(Protocol):
    """What reads the GPUs for a source: `NvmlCollector`, or a wrapper around one."""

    def read(self) -> NvmlReading: ...

    def close(self) -> None: ...


class NvmlCollector:
    def __init__(self, module: Any = None) -> None:
        self._module = module  # injected by tests; otherwise imported on first read
        self._nvml: Any = None
        self._status: str | None = None
        self._initialised = False
        self._driver: str | None = None
        # index -> (handle, name, UUID): the name and UUID never change, so they are read with the handle
        self._handles: dict[int, tuple[Any, Any, Any]] = {}
        self._count: tuple[int, float] | None = None  # (GPUs, when asked), see COUNT_KEPT_S
        self._queries: dict[str, Any] = {}  # kind -> the process-query function that works here
        self._refusals: dict[int, str] = {}  # this read's GPUs whose process list was refused, and why

    @property
    def status(self) -> str | None:
        return self._status

    def _init(self) -> None:
        self._initialised = True
        try:
            nvml = self._module if self._module is not None else importlib.import_module("pynvml")
        except ImportError:
            self._status = "NVML unavailable: the pynvml module (package nvidia-ml-py) is not installed"
            return
        if not callable(getattr(nvml, "nvmlInitWithFlags", None)):
            self._status = (
                "NVML unavailable: the installed `pynvml` module is not NVIDIA's nvidia-ml-py "
                "(pip uninstall pynvml nvidia-ml-py3; pip install nvidia-ml-py)"
            )
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound:
            self._status = "NVML unavailable: no NVIDIA driver on this machine (libnvidia-ml.so.1 not found)"
            return
        except nvml.NVMLError_DriverNotLoaded:
            self._status = "NVML unavailable: the NVIDIA driver is not loaded (nvidia-smi would fail too)"
            return
        except nvml.NVMLError_NoPermission:
            self._status = "NVML unavailable: no permission to open the NVIDIA devices (/dev/nvidia*)"
            return
        except nvml.NVMLError as exc:
            self._status = f"NVML unavailable: {exc}"
            return
        self._nvml = nvml
        try:
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            self._driver = None

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None

    def read(self) -> NvmlReading:
        if not self._initialised:
            self._init()
        nvml = self._nvml
        if nvml is None:
            return NvmlReading(status=self._status)
        now = time.monotonic()
        if self._count is None or now - self._count[1] >= COUNT_KEPT_S:
            try:
                self._count = (nvml.nvmlDeviceGetCount(), now)
            except nvml.NVMLError as exc:
                self._count = None
                return NvmlReading(status=f"NVML error listing GPUs: {exc}", driver=self._driver)
        count = self._count[0]
        devices: list[Device] = []
        uses: list[GpuUse] = []
        self._refusals = {}
        for index in range(count):
            device, device_uses = self._read_device(index)
            devices.append(device)
            uses.extend(device_uses)
        notices = tuple(
            f"GPU {index}: NVML refused to list its processes ({why}); their GPU memory is not shown"
            for index, why in sorted(self._refusals.items())
        )
        return NvmlReading(status=None, devices=tuple(devices), uses=tuple(uses), driver=self._driver, notices=notices)

    # -- one device -----------------------------------------------------------------------------

    def _call(self, fn: Any, *args: Any) -> Any:
        """Call an NVML function: None where unsupported or refused; DeviceFailed if the GPU is gone."""
        nvml = self._nvml
        try:
            return fn(*args)
        except nvml.NVMLError_GpuIsLost:
            raise DeviceFailed(_GPU_LOST) from None
        except nvml.NVMLError_NoPermission:
            if fn is nvml.nvmlDeviceGetMemoryInfo:  # without memory there is nothing to show
                raise DeviceFailed("no permission to read this GPU's memory") from None
            return None
        except nvml.NVMLError:  # NotSupported, FunctionNotFound, ...: this field is N/A here
            return None

    def _read_device(self, index: int) -> tuple[Device, list[GpuUse]]:
        nvml = self._nvml
        known = self._handles.get(index)
        name = f"GPU {index}"
        try:
            if known is None:
                handle = self._call(nvml.nvmlDeviceGetHandleByIndex, index)
                if handle is None:
                    return Device(index=index, name=name, error="NVML returned no handle for this GPU"), []
                known = self._handles[index] = (handle, self._call(nvml.nvmlDeviceGetName, handle),
                                                self._call(nvml.nvmlDeviceGetUUID, handle))
            handle, raw_name, uuid = known
            name = _text(raw_name) if raw_name is not None else name
            memory = self._call(nvml.nvmlDeviceGetMemoryInfo, handle)
            rates = self._call(nvml.nvmlDeviceGetUtilizationRates, handle)
            temperature = self._call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            uses = self._read_processes(index, handle)
        except DeviceFailed as failed:
            # A lost GPU's handle is stale; look it up afresh next time (it may come back after a reset,
            # perhaps as another GPU: its name and UUID are read again with the handle).
            self._handles.pop(index, None)
            self._count = None
            return Device(index=index, name=name, error=str(failed)), []
        device = Device(
            index=index,
            name=name,
            uuid=_text(uuid) if uuid is not None else None,
            memory_used=int(memory.used) if memory is not None else None,
            memory_total=int(memory.total) if memory is not None else None,
            utilization=int(rates.gpu) if rates is not None else None,
            temperature=int(temperature) if temperature is not None else None,
        )
        return device, uses

    def _read_processes(self, index: int, handle: Any) -> list[GpuUse]:
        found: dict[int, GpuUse] = {}
        for kind, base in _PROCESS_QUERIES:
            for proc in self._query_processes(index, kind, base, handle):
                memory = proc.usedGpuMemory if isinstance(proc.usedGpuMemory, int) else None
                prior = found.get(proc.pid)
                if prior is not None:
                    kinds = prior.kind if kind in prior.kind else prior.kind + "+" + kind
                    known = [m for m in (prior.memory, memory) if m is not None]
                    found[proc.pid] = GpuUse(proc.pid, index, max(known) if known else None, kinds)
                else:
                    found[proc.pid] = GpuUse(proc.pid, index, memory, kind)
        return list(found.values())

    def _query_processes(self, index: int, kind: str, base: str, handle: Any) -> list[Any]:
        nvml = self._nvml
        chosen = self._queries.get(kind)
        candidates = [chosen] if chosen is not None else [
            getattr(nvml, base + v) for v in _VERSIONS if callable(getattr(nvml, base + v, None))
        ]
        for fn in candidates:
            try:
                procs = fn(handle)
            except nvml.NVMLError_FunctionNotFound:
                continue  # an older driver: try the previous version of the query
            except nvml.NVMLError_GpuIsLost:
                raise DeviceFailed(_GPU_LOST) from None
            except nvml.NVMLError_NotSupported:
                if kind == "C":  # a GPU without graphics may well not list graphics processes
                    self._refusals.setdefault(index, "not supported")
                return []
            except nvml.NVMLError_NoPermission:
                self._refusals.setdefault(index, "no permission")
                return []
            except nvml.NVMLError as exc:
                self._refusals.setdefault(index, _text(exc))
                return []
            self._queries[kind] = fn
            return list(procs or [])
        return []
