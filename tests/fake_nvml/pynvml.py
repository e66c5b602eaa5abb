"""A stand-in for NVIDIA's `pynvml` (nvidia-ml-py) for machines without a GPU.

It exposes the real binding's constants and NVMLError classes (loaded from the installed
nvidia-ml-py under another name, so `except pynvml.NVMLError_GpuIsLost` means exactly what it
means in production) and replaces only the calls into the driver with functions of the same
names that play a scenario:

    {"init_error": null | "LibraryNotFound" | "DriverNotLoaded" | ...,
     "driver": "550.54.15",
     "devices": [{"name": "NVIDIA H200", "uuid": "GPU-0", "total": 150000000000, "used": 1000,
                  "util": 40, "temp": 50,
                  "errors": {"nvmlDeviceGetTemperature": "NotSupported"},
                  "missing": ["nvmlDeviceGetComputeRunningProcesses_v3"],
                  "compute": [{"pid": 123, "used": 1000}],     # "used": null -> N/A;
                  "graphics": []}]}                              # "used": "rss" -> the pid's RSS

The scenario comes from `configure(dict)` in-process, or from the JSON file named by the
environment variable GPUSCOPE_FAKE_NVML (re-read on every call, so a test can change it live).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from types import SimpleNamespace


def _load_real():
    here = os.path.abspath(__file__)
    for entry in sys.path:
        candidate = os.path.abspath(os.path.join(entry or ".", "pynvml.py"))
        if candidate != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_nvidia_pynvml", candidate)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # the binding looks itself up while it loads
            spec.loader.exec_module(module)
            return module
    raise ImportError("the fake pynvml needs nvidia-ml-py installed (for its constants and error classes)")


_real = _load_real()
for _name in dir(_real):
    if _name.startswith("NVML"):  # constants and NVMLError* classes, never the driver calls
        globals()[_name] = getattr(_real, _name)

_SCENARIO: dict | None = None
CALLS: list[str] = []


def configure(scenario: dict | None) -> None:
    global _SCENARIO
    _SCENARIO = scenario
    CALLS.clear()


def _scenario() -> dict:
    if _SCENARIO is not None:
        return _SCENARIO
    path = os.environ.get("GPUSCOPE_FAKE_NVML")
    if not path:
        return {"init_error": "LibraryNotFound"}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _error(name: str):
    return getattr(_real, f"NVMLError_{name}")()


def _enter(fn: str, device: dict | None = None) -> None:
    CALLS.append(fn)
    if device is not None:
        if fn in device.get("missing", ()):
            raise _error("FunctionNotFound")
        err = device.get("errors", {}).get(fn)
        if err:
            raise _error(err)


def _device(handle) -> dict:
    return _scenario()["devices"][handle.index]


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _used(entry: dict):
    used = entry.get("used")
    return _rss(entry["pid"]) if used == "rss" else used


def nvmlInitWithFlags(flags):
    CALLS.append("nvmlInitWithFlags")
    err = _scenario().get("init_error")
    if err:
        raise _error(err)


def nvmlInit():
    nvmlInitWithFlags(0)


def nvmlShutdown():
    CALLS.append("nvmlShutdown")


def nvmlSystemGetDriverVersion():
    CALLS.append("nvmlSystemGetDriverVersion")
    return _scenario().get("driver", "550.54.15")


def nvmlDeviceGetCount():
    CALLS.append("nvmlDeviceGetCount")
    return len(_scenario().get("devices", []))


def nvmlDeviceGetHandleByIndex(index):
    devices = _scenario().get("devices", [])
    _enter("nvmlDeviceGetHandleByIndex", devices[index] if index < len(devices) else None)
    if index >= len(devices):
        raise _error("InvalidArgument")
    return SimpleNamespace(index=index)


def nvmlDeviceGetName(handle):
    d = _device(handle)
    _enter("nvmlDeviceGetName", d)
    return d.get("name", "NVIDIA H200")


def nvmlDeviceGetUUID(handle):
    d = _device(handle)
    _enter("nvmlDeviceGetUUID", d)
    return d.get("uuid", f"GPU-{handle.index:08d}")


def nvmlDeviceGetMemoryInfo(handle, version=None):
    d = _device(handle)
    _enter("nvmlDeviceGetMemoryInfo", d)
    used = d.get("used")
    if used is None:
        used = sum(_used(p) or 0 for p in d.get("compute", []) + d.get("graphics", []))
    total = d.get("total", 150_000_000_000)
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle):
    d = _device(handle)
    _enter("nvmlDeviceGetUtilizationRates", d)
    return SimpleNamespace(gpu=d.get("util", 0), memory=d.get("mem_util", 0))


def nvmlDeviceGetTemperature(handle, sensor):
    d = _device(handle)
    _enter("nvmlDeviceGetTemperature", d)
    return d.get("temp", 40)


def _processes(fn: str, kind: str, handle):
    d = _device(handle)
    _enter(fn, d)
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=_used(p), gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for p in d.get(kind, [])]


def nvmlDeviceGetComputeRunningProcesses_v3(handle):
    return _processes("nvmlDeviceGetComputeRunningProcesses_v3", "compute", handle)


def nvmlDeviceGetComputeRunningProcesses_v2(handle):
    return _processes("nvmlDeviceGetComputeRunningProcesses_v2", "compute", handle)


def nvmlDeviceGetComputeRunningProcesses(handle):
    return nvmlDeviceGetComputeRunningProcesses_v3(handle)


def nvmlDeviceGetGraphicsRunningProcesses_v3(handle):
    return _processes("nvmlDeviceGetGraphicsRunningProcesses_v3", "graphics", handle)


def nvmlDeviceGetGraphicsRunningProcesses_v2(handle):
    return _processes("nvmlDeviceGetGraphicsRunningProcesses_v2", "graphics", handle)


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return nvmlDeviceGetGraphicsRunningProcesses_v3(handle)
