"""PyTorch's allocator in every process that has a probe: the numbers NVML cannot give.

NVML sees one number per process (CUDA context + the caching allocator's whole pool + other
libraries). A process started with `gpuscope run` (or `probe.start()`, or `run --inject`) has a
probe that reads `torch.cuda.memory_stats`; this collector keeps track of the probes (listing them
again only when their folders change) and asks each for its totals on each read, so the console
can show allocated vs reserved beside NVML's figure.

A probe is a socket any user's process may serve, and one that accepts and never answers must not
slow the node's sampling: the probes are asked all at once, on threads of their own, and a read
waits for them at most `READ_WAIT_S` in all. An answer that comes later is used by the next read;
a probe still asked is not asked again meanwhile, so a silent one holds one thread, not more.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait

from gpuscope.core.node.model import TorchMemory
from gpuscope.core.target.probe_client import DeviceMemory, ProbeInfo, ProbeWatch, torch_memory

MAX_PROBES = 32  # a read asks at most this many probes (one short request each)
READ_TIMEOUT_S = 1.0  # one probe's connect and reply
READ_WAIT_S = 0.25  # what one read waits for all the probes together


class TorchMemoryCollector:
    def __init__(self) -> None:
        self._probes = ProbeWatch()
        self._pool = ThreadPoolExecutor(max_workers=MAX_PROBES, thread_name_prefix="gpuscope-torch")
        self._asked: dict[ProbeInfo, Future[tuple[DeviceMemory, ...] | None]] = {}
        self._lock = threading.Lock()

    def read(self) -> tuple[TorchMemory, ...]:
        with self._lock:
            probes = self._probes.probes()[:MAX_PROBES]
            for info in probes:
                if info not in self._asked:
                    self._asked[info] = self._pool.submit(torch_memory, info.pid, timeout=READ_TIMEOUT_S,
                                                          path=info.path)
            wait([self._asked[info] for info in probes], timeout=READ_WAIT_S)
            out = []
            for info in probes:
                asked = self._asked[info]
                if not asked.done():
                    continue  # still asked: its answer is the next read's
                del self._asked[info]
                devices = asked.result() if asked.exception() is None else None
                if not devices:
                    continue  # no CUDA in that process (or it did not answer): nothing to show
                allocated = [d.allocated for d in devices if d.allocated is not None]
                reserved = [d.reserved for d in devices if d.reserved is not None]
                out.append(TorchMemory(
                    pid=info.pid,
                    allocated_bytes=sum(allocated) if allocated else None,
                    reserved_bytes=sum(reserved) if reserved else None,
                    devices=len(devices),
                ))
            listed = set(probes)
            for gone in [info for info, asked in self._asked.items() if info not in listed and asked.done()]:
                del self._asked[gone]
            return tuple(out)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
