"""PyTorch's allocator in every process that has a probe: the numbers NVML cannot give.

NVML sees one number per process (CUDA context + the caching allocator's whole pool + other
libraries). A process started with `gpuscope run` (or `probe.start()`, or `run --inject`) has a
probe that reads `torch.cuda.memory_stats`; this collector keeps track of the probes (listing them
again only when their folders change) and asks each for its totals on each read, so the console
can show allocated vs reserved beside NVML's figure.
"""

from __future__ import annotations

from gpuscope.core.node.model import TorchMemory
from gpuscope.core.target.probe_client import ProbeWatch, torch_memory

MAX_PROBES = 32  # a read asks at most this many probes (one short request each)
READ_TIMEOUT_S = 1.0


class TorchMemoryCollector:
    def __init__(self) -> None:
        self._probes = ProbeWatch()

    def read(self) -> tuple[TorchMemory, ...]:
        out = []
        for info in self._probes.probes()[:MAX_PROBES]:
            devices = torch_memory(info.pid, timeout=READ_TIMEOUT_S, path=info.path)
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
        return tuple(out)
