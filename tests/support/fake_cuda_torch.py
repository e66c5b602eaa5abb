"""A stand-in for `torch` with an initialised CUDA, for child processes of the probe tests.

Importing it registers it as `sys.modules["torch"]`. Its "caching allocator" keeps blocks in a
dict; `empty(nbytes)` allocates one (with the caller's Python stack, innermost first, while
history is recorded, as PyTorch does), `free(block)` releases it (it stays cached: "inactive").
`memory_stats`, `_record_memory_history` and `_snapshot` answer in PyTorch's documented formats,
so the probe and the torch-history rung run end to end on a machine without a GPU.
"""

import itertools
import sys
import threading
import traceback
import types

__version__ = "2.99.0+fake"

_lock = threading.Lock()
_blocks = {}  # address -> [size, state, frames]
_addresses = itertools.count(0x7F0000000000, 1 << 21)
_recording = {"on": False, "calls": []}
_peak = {"allocated": 0}


def _stack():
    frames = traceback.extract_stack()[:-2]  # leave out _stack and empty
    return [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in reversed(frames)]


def empty(nbytes):
    frames = _stack() if _recording["on"] else []
    with _lock:
        address = next(_addresses)
        _blocks[address] = [nbytes, "active_allocated", frames]
        _peak["allocated"] = max(_peak["allocated"], _allocated())
    return address


def free(address):
    with _lock:
        _blocks[address][1] = "inactive"
        _blocks[address][2] = []


def _allocated():
    return sum(b[0] for b in _blocks.values() if b[1] == "active_allocated")


class _Props:
    name = "Fake GPU"
    total_memory = 80 << 30


def _memory_stats(device=None):
    with _lock:
        allocated = _allocated()
        reserved = sum(b[0] for b in _blocks.values())
        return {
            "allocated_bytes.all.current": allocated,
            "allocated_bytes.all.peak": _peak["allocated"],
            "reserved_bytes.all.current": reserved,
            "active_bytes.all.current": allocated,
            "allocation.all.current": sum(1 for b in _blocks.values() if b[1] == "active_allocated"),
            "num_alloc_retries": 0,
            "num_ooms": 0,
            # no reserved peak, no inactive_split: keys a version may lack read as null
        }


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, **kwargs):
    _recording["calls"].append({"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries})
    _recording["on"] = enabled is not None


def _snapshot(device=None):
    with _lock:
        blocks = [
            {"address": a, "size": b[0], "requested_size": b[0], "state": b[1], "frames": list(b[2])}
            for a, b in _blocks.items()
        ]
    return {
        "segments": [{"device": 0, "address": 0, "total_size": sum(b["size"] for b in blocks), "stream": 0,
                      "segment_type": "large", "allocated_size": 0, "active_size": 0, "blocks": blocks}],
        "device_traces": [[]],
    }


cuda = types.SimpleNamespace(
    is_initialized=lambda: True,
    is_available=lambda: True,
    device_count=lambda: 1,
    get_device_properties=lambda i: _Props(),
    memory_stats=_memory_stats,
    memory=types.SimpleNamespace(_record_memory_history=_record_memory_history, _snapshot=_snapshot),
)

sys.modules["torch"] = sys.modules[__name__]
