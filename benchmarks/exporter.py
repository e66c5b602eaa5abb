"""The exporter's cost on a big node: 8 GPUs x 200 processes (the fake NVML plays the GPUs; the
processes are real, 200 `sleep`s, 25 a GPU, each with a fixed share of GPU memory).

Measured in this process (the exporter's `NodeAgent` and its prometheus_client registry, as
`gpuscope exporter` runs them):
1. sampling: CPU seconds (all threads: NVML, host scan, leak watch) per sampling tick at
   `--refresh` seconds, over `--seconds` of running;
2. a scrape: CPU seconds to build the exposition (median and max over 50 scrapes), its size, and
   the number of series (sample lines), against the bound: 3 x TOP_PER_CRITERION processes plus
   alerts, whatever the node holds.

Run:  .venv/bin/python benchmarks/exporter.py [--json] [--seconds 30] [--refresh 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _harness import FAKE_NVML_DIR, ROOT, Cleanup, dump_json, machine, print_table, run_script

GPUS, PER_GPU = 8, 25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--refresh", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    with Cleanup() as cleanup:
        sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(GPUS * PER_GPU)]
        cleanup.procs.extend(sleepers)
        scenario = cleanup.tmpdir / "nvml.json"
        scenario.write_text(json.dumps({"devices": [
            {"name": "NVIDIA H200", "uuid": f"GPU-{g}", "total": 150_000_000_000,
             "compute": [{"pid": p.pid, "used": 500_000_000 + 1_000_000 * i}
                         for i, p in enumerate(sleepers[g * PER_GPU:(g + 1) * PER_GPU])]}
            for g in range(GPUS)]}))
        os.environ["GPUSCOPE_FAKE_NVML"] = str(scenario)
        sys.path[:0] = [str(FAKE_NVML_DIR), str(ROOT)]
        result = measure(opts.seconds, opts.refresh)
    result["machine"] = machine()
    if opts.json:
        dump_json(result)
    else:
        print_table("gpuscope exporter, 8 GPUs x 200 processes", ["measure", "value"],
                    [[k, v] for k, v in result.items() if k != "machine"])
    return 0


def measure(seconds: float, refresh: float) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuscope.core.fleet.exporter import TOP_PER_CRITERION, NodeAgent

    agent = NodeAgent("bench", interval=refresh)
    registry = CollectorRegistry()
    registry.register(agent.collector)
    ticks = []
    agent.source.start(lambda frame: (ticks.append(time.monotonic()), agent._on_frame(frame)))
    time.sleep(3 * refresh)  # first reads (command lines, NVML init) out of the way
    first, cpu0 = len(ticks), time.process_time()
    time.sleep(seconds)
    sampling_cpu = (time.process_time() - cpu0) / max(1, len(ticks) - first)
    scrape_cpu, size = [], 0
    for _ in range(50):
        c0 = time.process_time()
        body = generate_latest(registry)
        scrape_cpu.append(time.process_time() - c0)
        size = len(body)
    agent.stop()
    lines = [ln for ln in body.decode().splitlines() if ln and not ln.startswith("#")]
    exported = next(float(ln.split()[-1]) for ln in lines if 'state="exported"' in ln)
    return {
        "processes_with_gpu": GPUS * PER_GPU,
        "sampling_ticks": len(ticks) - first,
        "cpu_per_sampling_tick_ms": round(1000 * sampling_cpu, 2),
        "cpu_per_scrape_ms_median": round(1000 * statistics.median(scrape_cpu), 2),
        "cpu_per_scrape_ms_max": round(1000 * max(scrape_cpu), 2),
        "scrape_bytes": size,
        "series": len(lines),
        "processes_exported": int(exported),
        "process_bound": 3 * TOP_PER_CRITERION,
        "leak_watch_series": len(agent.watch),
    }


if __name__ == "__main__":
    run_script(main)
