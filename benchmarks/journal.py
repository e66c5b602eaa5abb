"""What recording a session costs: journal bytes per hour and CPU per sample, on a big node.

What it measures, and how:

A node with `--gpus` GPUs and `--processes` processes is synthesized at 1 sample/s, shaped like a
busy inference node: two serving processes per GPU whose GPU memory, RSS, CPU and growth change
every second; the other processes are mostly idle (each second about 10 % of them change CPU %,
5 % their RSS), their commands long and realistic. `--seconds` samples (default 600, ten minutes)
go through a real `Journal` into a file:

1. bytes/hour:  the file's size after the session is closed (WAL folded in), per hour of samples;
                and the same for an export of it (the snapshot format is the same).
2. CPU/sample:  CPU seconds of this process (time.process_time) to encode, compress and commit
                one sample, each committed on its own as the console does once a second; as a
                percentage of one core at a 1 s refresh.
3. replay:      seconds to open the file for replay (decode every sample once to index the
                series) and to rebuild one frame in the middle.

Run:  .venv/bin/python benchmarks/journal.py [--json] [--gpus 8] [--processes 200] [--seconds 600]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from _harness import dump_json, machine, print_table, run_script

from gpuscope.core.session.export import export_file
from gpuscope.core.session.format import session_meta
from gpuscope.core.session.journal import Journal
from gpuscope.core.node.model import Device, Frame, HostMemory, NvmlReading, ProcessRow
from gpuscope.core.session.recording import open_recording

GIB = 2**30


def node(gpus: int, processes: int, seconds: int, seed: int = 1):
    """The synthetic node's frames, one a second."""
    rng = random.Random(seed)
    serving = 2 * gpus
    rows = []
    for i in range(processes):
        if i < serving:
            cmd = (f"python -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-70B-Instruct "
                   f"--tensor-parallel-size 1 --port {8000 + i} --gpu-memory-utilization 0.45 --api-key ***")
            rows.append(ProcessRow(1000 + i, "svc", i // 2, 60 * GIB, 8 * GIB, 95.0, cmd, "python", True, 0.0, 0.0))
        else:
            cmd = rng.choice([
                "/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id {h} -address /run/containerd/containerd.sock",
                "/usr/lib/systemd/systemd-journald", "sshd: alice@pts/{n}", "python /opt/exporter/node_exporter.py --port {n}",
                "/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/dcp-metrics-included.csv", "bash -l",
            ]).format(h=f"{rng.getrandbits(64):016x}", n=i)
            rows.append(ProcessRow(1000 + i, rng.choice(["root", "alice", "bob"]), None, None,
                                   rng.randint(2, 2000) * 2**20, 0.0, cmd, cmd.split()[0].rsplit("/", 1)[-1], False, None, 0.0))
    devices = [Device(g, "NVIDIA H200", f"GPU-{g:08x}-1111-2222-3333-444455556666", 120 * GIB, 141 * GIB, 90, 60)
               for g in range(gpus)]
    t0 = 1_767_000_000.0
    for s in range(seconds):
        for i, r in enumerate(rows):
            if i < serving:
                rows[i] = replace(r, gpu_memory_bytes=r.gpu_memory_bytes + rng.randint(0, 4) * 2**20,
                                  rss_bytes=r.rss_bytes + rng.randint(-64, 512) * 1024, cpu_percent=round(rng.uniform(80, 100), 1),
                                  gpu_growth_bytes_per_s=round(rng.uniform(0, 3e6)), rss_growth_bytes_per_s=round(rng.uniform(0, 2e5)))
            else:
                if rng.random() < 0.10:
                    rows[i] = r = replace(r, cpu_percent=round(rng.uniform(0, 5), 1))
                if rng.random() < 0.05:
                    rows[i] = replace(r, rss_bytes=r.rss_bytes + rng.randint(-16, 16) * 4096)
        devices = [replace(d, memory_used=d.memory_used + rng.randint(0, 8) * 2**20, utilization=rng.randint(85, 100),
                           temperature=rng.randint(58, 66)) for d in devices]
        yield Frame(time=t0 + s, hostname="gpu-node-7", host=HostMemory(2048 * GIB, 900 * GIB + s * 2**20, 1148 * GIB),
                    nvml=NvmlReading(None, tuple(devices), (), "560.35.03"), processes=tuple(rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    frames = list(node(args.gpus, args.processes, args.seconds))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.gpuscope"
        journal = Journal(path, meta=session_meta("journal"))
        cpu = []
        for frame in frames:
            # One sample, one transaction: what the console's writer does each second.
            start = time.process_time()
            journal._commit([("frame", frame)])
            cpu.append(time.process_time() - start)
        journal.close()
        size = path.stat().st_size
        exported = journal_export_size(path, Path(tmp) / "snapshot.gpuscope")
        started = time.perf_counter()
        rec = open_recording(path)
        open_s = time.perf_counter() - started
        started = time.perf_counter()
        rec.frame(len(rec) // 2 + 7)
        frame_s = time.perf_counter() - started

    hours = args.seconds / 3600
    cpu_ms = 1000 * sorted(cpu)[len(cpu) // 2]
    result = {
        "machine": machine(),
        "node": {"gpus": args.gpus, "processes": args.processes, "samples": args.seconds, "refresh_s": 1.0},
        "journal_mb_per_hour": round(size / hours / 1e6, 2),
        "snapshot_mb_per_hour": round(exported / hours / 1e6, 2),
        "bytes_per_sample": round(size / args.seconds),
        "cpu_ms_per_sample_median": round(cpu_ms, 2),
        "cpu_ms_per_sample_mean": round(1000 * sum(cpu) / len(cpu), 2),
        "cpu_percent_of_one_core": round(cpu_ms / 10, 2),
        "replay_open_s": round(open_s, 2),
        "replay_frame_ms": round(1000 * frame_s, 1),
    }
    if args.json:
        dump_json(result)
        return 0
    print_table(
        f"journal: {args.gpus} GPUs, {args.processes} processes, {args.seconds} samples at 1 s",
        ["measure", "value"],
        [
            ["journal MB per hour", result["journal_mb_per_hour"]],
            ["snapshot MB per hour", result["snapshot_mb_per_hour"]],
            ["bytes per sample", result["bytes_per_sample"]],
            ["CPU ms per sample (median / mean)", f"{result['cpu_ms_per_sample_median']} / {result['cpu_ms_per_sample_mean']}"],
            ["CPU % of one core at 1 s", result["cpu_percent_of_one_core"]],
            ["replay: open (s) / one frame (ms)", f"{result['replay_open_s']} / {result['replay_frame_ms']}"],
        ],
    )
    return 0


def journal_export_size(path: Path, target: Path) -> int:
    """The size of the snapshot `e` would export of the whole session."""
    return export_file(path, target).stat().st_size


if __name__ == "__main__":
    run_script(main)
