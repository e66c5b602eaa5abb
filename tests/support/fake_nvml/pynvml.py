"""A stand-in for NVIDIA's `pynvml` (nvidia-ml-py) on machines without a GPU.

This module *is* the installed nvidia-ml-py binding (its source is executed here, under the name
`pynvml`), with one part replaced: instead of loading the driver library libnvidia-ml.so.1, it
loads a fake library whose entry points (nvmlDeviceGetMemoryInfo, nvmlDeviceGetHandleByIndex_v2,
...) take the same ctypes arguments, fill the same structures and return the same NVML_ERROR_*
codes, playing a scenario. Everything above the driver is the real code: the wrappers, the
structures, the NVMLError classes (`except pynvml.NVMLError_GpuIsLost` means what it means in
production), `nvmlExceptionClass`, `_nvmlGetFunctionPointer`. So other NVML consumers (nvitop,
gpustat) run on it unchanged. An entry point the fake does not play answers NotSupported, as a
current driver does for a feature the GPU lacks (fans, clocks, ...); a device's "missing" entry
points answer FunctionNotFound, as on an older driver.

The scenario:

    {"init_error": null | "LibraryNotFound" | "DriverNotLoaded" | ...,
     "driver": "550.54.15",
     "devices": [{"name": "NVIDIA H200", "uuid": "GPU-0", "total": 150000000000, "used": 1000,
                  "util": 40, "mem_util": 10, "temp": 50,
                  "errors": {"nvmlDeviceGetTemperature": "NotSupported"},   # by entry point
                  "missing": ["nvmlDeviceGetComputeRunningProcesses_v3"],  # FunctionNotFound
                  "compute": [{"pid": 123, "used": 1000}],     # "used": null -> N/A;
                  "graphics": []}]}                              # "used": "rss" -> the pid's RSS

Entry points are the driver's names (nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, ...).
The scenario comes from `configure(dict)` in-process, or from the JSON file named by the
environment variable GPUSCOPE_FAKE_NVML (read again whenever the file changes, so a test can
change it live). `CALLS` lists the entry points called, in order, and each load of the library
(`LOAD`).
"""

import collections
import ctypes
import importlib.machinery
import json
import os
import sys


def _real_code():
    """The installed binding's code, from its bytecode cache as a plain import of it would have it:
    compiling its source at each import holds the interpreter's lock for tens of milliseconds, which
    a consumer that imports NVML in a thread (gpuscope, nvitop) would pay at start and the real
    binding does not make it pay."""
    here = os.path.abspath(__file__)
    for entry in sys.path:
        candidate = os.path.abspath(os.path.join(entry or ".", "pynvml.py"))
        if candidate != here and os.path.isfile(candidate):
            return importlib.machinery.SourceFileLoader("pynvml", candidate).get_code("pynvml"), candidate
    raise ImportError("the fake pynvml needs nvidia-ml-py installed (it runs the real binding over a fake driver)")


_code_object, _REAL_PATH = _real_code()
exec(_code_object, globals())  # noqa: S102 - the real binding's own code, compiled as its import would
del _code_object

_SCENARIO = None
_FILE_CACHE = {"key": None, "scenario": None}
LOAD = "load libnvidia-ml.so.1"  # in CALLS: each time the binding loads the library
CALLS = collections.deque(maxlen=10_000)  # bounded: a benchmark runs consumers on it for minutes


def configure(scenario):
    global _SCENARIO
    _SCENARIO = scenario
    CALLS.clear()


def _scenario():
    if _SCENARIO is not None:
        return _SCENARIO
    path = os.environ.get("GPUSCOPE_FAKE_NVML")
    if not path:
        return {"init_error": "LibraryNotFound"}
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if _FILE_CACHE["key"] != key:  # parse once per change, not once per call (a node has many calls)
        with open(path, encoding="utf-8") as f:
            _FILE_CACHE["scenario"] = json.load(f)
        _FILE_CACHE["key"] = key
    return _FILE_CACHE["scenario"]


def _code(error_name):
    """The NVML_ERROR_* code of an error named like its class (GpuIsLost -> NVML_ERROR_GPU_IS_LOST)."""
    return globals()[f"NVMLError_{error_name}"]().value


def _target(arg):
    """What a ctypes argument points at: byref(x) -> x, pointer(x) -> x, anything else as is."""
    obj = getattr(arg, "_obj", None)  # the CArgObject of byref()
    if obj is not None:
        return obj
    if isinstance(arg, ctypes._Pointer) and arg:
        return arg.contents
    return arg


_HANDLE_BASE = 0x6E766D6C0000  # handles are opaque pointers: the device index above a base


def _device_index(handle):
    value = ctypes.cast(handle, ctypes.c_void_p).value or 0
    return value - _HANDLE_BASE


def _rss(pid):
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _used(entry):
    used = entry.get("used")
    return _rss(entry["pid"]) if used == "rss" else used


def _not_supported(*args):
    return NVML_ERROR_NOT_SUPPORTED


class _FakeDriver:
    """The entry points of libnvidia-ml.so.1 that the fake plays; any other answers NotSupported."""

    # -- plumbing --------------------------------------------------------------------------------

    def __getattribute__(self, name):
        if not name.startswith("nvml"):
            return object.__getattribute__(self, name)
        try:
            attr = object.__getattribute__(self, name)
        except AttributeError:
            # A current driver exports every entry point and answers NotSupported for what a GPU
            # lacks (fans, power, clocks, ...); FunctionNotFound is an older driver's ("missing").
            attr = _not_supported

        def entry_point(*args):  # the binding caches what it looks up: record each call here
            CALLS.append(name)
            return attr(*args)

        return entry_point

    @staticmethod
    def _device(name, handle):
        """(device dict, None) or (None, error code) for an entry point called on handle."""
        devices = _scenario().get("devices", [])
        index = _device_index(handle)
        if not 0 <= index < len(devices):
            return None, NVML_ERROR_INVALID_ARGUMENT
        device = devices[index]
        if name in device.get("missing", ()):
            return None, NVML_ERROR_FUNCTION_NOT_FOUND
        error = device.get("errors", {}).get(name)
        if error:
            return None, _code(error)
        return device, None

    @staticmethod
    def _string(buffer, size, text):
        data = text.encode()
        if len(data) + 1 > int(getattr(size, "value", size)):
            return NVML_ERROR_INSUFFICIENT_SIZE
        buffer.value = data
        return NVML_SUCCESS

    # -- system ----------------------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags):
        error = _scenario().get("init_error")
        return _code(error) if error else NVML_SUCCESS

    def nvmlInit_v2(self):
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self):
        return NVML_SUCCESS

    def nvmlErrorString(self, result):
        return NVMLError._errcode_to_string.get(int(getattr(result, "value", result)), "Unknown Error").encode()

    def nvmlSystemGetDriverVersion(self, buffer, size):
        return self._string(buffer, size, _scenario().get("driver", "550.54.15"))

    def nvmlSystemGetNVMLVersion(self, buffer, size):
        return self._string(buffer, size, "12." + _scenario().get("driver", "550.54.15"))

    def nvmlSystemGetCudaDriverVersion(self, version):
        _target(version).value = _scenario().get("cuda", 12040)
        return NVML_SUCCESS

    def nvmlSystemGetCudaDriverVersion_v2(self, version):
        return self.nvmlSystemGetCudaDriverVersion(version)

    def nvmlDeviceGetCount_v2(self, count):
        _target(count).value = len(_scenario().get("devices", []))
        return NVML_SUCCESS

    # -- handles ---------------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex_v2(self, index, device):
        index = int(getattr(index, "value", index))
        devices = _scenario().get("devices", [])
        if not 0 <= index < len(devices):
            return NVML_ERROR_INVALID_ARGUMENT
        if "nvmlDeviceGetHandleByIndex_v2" in devices[index].get("missing", ()):
            return NVML_ERROR_FUNCTION_NOT_FOUND
        error = devices[index].get("errors", {}).get("nvmlDeviceGetHandleByIndex_v2")
        if error:
            return _code(error)
        ctypes.c_void_p.from_buffer(_target(device)).value = _HANDLE_BASE + index
        return NVML_SUCCESS

    def nvmlDeviceGetHandleByUUID(self, uuid, device):
        wanted = (uuid.value if hasattr(uuid, "value") else uuid).decode()
        for index, d in enumerate(_scenario().get("devices", [])):
            if d.get("uuid", f"GPU-{index:08d}") == wanted:
                return self.nvmlDeviceGetHandleByIndex_v2(index, device)
        return NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetIndex(self, handle, index):
        d, error = self._device("nvmlDeviceGetIndex", handle)
        if error:
            return error
        _target(index).value = _device_index(handle)
        return NVML_SUCCESS

    # -- one device ------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle, buffer, size):
        d, error = self._device("nvmlDeviceGetName", handle)
        return error or self._string(buffer, size, d.get("name", "NVIDIA H200"))

    def nvmlDeviceGetUUID(self, handle, buffer, size):
        d, error = self._device("nvmlDeviceGetUUID", handle)
        return error or self._string(buffer, size, d.get("uuid", f"GPU-{_device_index(handle):08d}"))

    def _memory(self, name, handle, memory):
        d, error = self._device(name, handle)
        if error:
            return error
        used = d.get("used")
        if used is None:
            used = sum(_used(p) or 0 for p in d.get("compute", []) + d.get("graphics", []))
        total = d.get("total", 150_000_000_000)
        info = _target(memory)
        info.total, info.used, info.free = total, used, total - used
        return NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle, memory):
        return self._memory("nvmlDeviceGetMemoryInfo", handle, memory)

    def nvmlDeviceGetMemoryInfo_v2(self, handle, memory):
        return self._memory("nvmlDeviceGetMemoryInfo_v2", handle, memory)

    def nvmlDeviceGetUtilizationRates(self, handle, utilization):
        d, error = self._device("nvmlDeviceGetUtilizationRates", handle)
        if error:
            return error
        rates = _target(utilization)
        rates.gpu, rates.memory = d.get("util", 0), d.get("mem_util", 0)
        return NVML_SUCCESS

    def nvmlDeviceGetTemperature(self, handle, sensor, temperature):
        d, error = self._device("nvmlDeviceGetTemperature", handle)
        if error:
            return error
        _target(temperature).value = d.get("temp", 40)
        return NVML_SUCCESS

    def nvmlDeviceGetTemperatureV(self, handle, temperature):
        d, error = self._device("nvmlDeviceGetTemperatureV", handle)
        if error:
            return error
        _target(temperature).temperature = d.get("temp", 40)
        return NVML_SUCCESS

    def _processes(self, name, kind, handle, count, infos):
        d, error = self._device(name, handle)
        if error:
            return error
        entries = d.get(kind, [])
        count = _target(count)
        if infos is None or count.value < len(entries):  # the binding asks for the size first
            count.value = len(entries)
            return NVML_ERROR_INSUFFICIENT_SIZE if entries else NVML_SUCCESS
        for slot, entry in zip(infos, entries):
            used = _used(entry)
            slot.pid = entry["pid"]
            slot.usedGpuMemory = NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
            for field in ("gpuInstanceId", "computeInstanceId"):  # not in the oldest structure
                if hasattr(slot, field):
                    setattr(slot, field, 0xFFFFFFFF)
        count.value = len(entries)
        return NVML_SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, infos):
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", "compute", handle, count, infos)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle, count, infos):
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", "compute", handle, count, infos)

    def nvmlDeviceGetComputeRunningProcesses(self, handle, count, infos):
        return self._processes("nvmlDeviceGetComputeRunningProcesses", "compute", handle, count, infos)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle, count, infos):
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v3", "graphics", handle, count, infos)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle, count, infos):
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v2", "graphics", handle, count, infos)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle, count, infos):
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", "graphics", handle, count, infos)


def _LoadNvmlLibrary():  # noqa: N802 - replaces the binding's function of this name
    """The binding's library loader, loading the fake driver (or finding none, if the scenario says so)."""
    global nvmlLib
    CALLS.append(LOAD)
    if _scenario().get("init_error") == "LibraryNotFound":
        _nvmlCheckReturn(NVML_ERROR_LIBRARY_NOT_FOUND)
    with libLoadLock:
        if nvmlLib is None:
            nvmlLib = _FakeDriver()
