"""PyTorch's allocator in every process that has a probe: the numbers NVML cannot give.

NVML sees one number per process (CUDA context + the caching allocator's whole pool + other
libraries). A process started with `gpuscope run` (or `probe.start()`, or `run --inject`) has a
probe that reads `torch.cuda.memory_stats`; this collector keeps track of the probes (listing them
again only when their folders change) and asks each for its totals on each read, so the console
can show allocated vs reserved beside NVML's figure.

A probe is a socket any user's process may serve, and one that accepts and never answers must not
slow the node's sampling: the probes are asked all at once, on threads of their own, and a read
waits for them at most `READ_WAIT_S` in all. An answer that comes later is used by the next read;
a probe still asked is not asked again meanwhile, so a silent one holds one thread, not more. A
probe that did not answer its last question is asked after those that did: silent ones, however
many, take none of the `MAX_PROBES` places from a probe that answers.
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
        self._silent: set[ProbeInfo] = set()  # did not answer their last question
        self._lock = threading.Lock()

    def read(self) -> tuple[TorchMemory, ...]:
        with self._lock:
            listed = self._probes.probes()
            self._silent.intersection_update(listed)
            probes = sorted(listed, key=lambda info: info in self._silent)[:MAX_PROBES]  # by PID otherwise
            for info in probes:
                if info not in self._asked:
                    self._asked[info] = self._pool.submit(torch_memory, info.pid, timeout=READ_TIMEOUT_S,
                                                          path=info.path)
            wait([self._asked[info] for info in probes], timeout=READ_WAIT_S)
            # Every answer that came is taken, of the probes asked now or before (a probe asked
            # after the others may have answered since): none is dropped unread.
            out = []
            listed_now = set(listed)
            for info, asked in list(self._asked.items()):
                if not asked.done():
                    self._silent.add(info)
                    continue  # still asked: its answer is the next read's
                del self._asked[info]
                devices = asked.result() if asked.exception() is None else None
                if info not in listed_now:
                    continue  # gone meanwhile
                if devices is None:  # no answer (no CUDA device is an answer: an empty one)
                    self._silent.add(info)
                else:
                    self._silent.discard(info)
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
            return tuple(sorted(out, key=lambda t: t.pid))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
