"""What gpuscope's probe (`gpuscope.probe`) costs the service it lives in.

1. Idle: CPU seconds of an idle process over a window, with the probe started and without (the
   probe blocks in accept(); it should cost nothing until asked).
2. Round trip of `hello` (and of `stats` where torch has CUDA here) from a client, over N
   requests on one connection: median and 99th percentile.
3. The slowdown of a request loop (JSON in and out, keeping one request in a hundred) while the
   probe runs memray's tracker in process (`memray_track`, what the memray rung uses when the
   service has a probe): requests per second alone, and during a capture.
4. With torch on CUDA (skipped otherwise): the cost per allocation+free of a small tensor with
   the allocator's history recording on (`history_start`), against off.

    .venv/bin/python benchmarks/probe.py [--requests N] [--seconds S] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import psutil
from _harness import Cleanup, dump_json, install_signal_handlers, machine, print_table, run_script

from gpuscope.core.target import probe_client

WITH_PROBE = """
import time
{start}
print("ready", flush=True)
while True:
    time.sleep(1)
"""

REQUESTS = """
import json, time
from gpuscope import probe
probe.start()
kept = []
def handle(i):
    body = json.dumps({"query": f"q{i}", "docs": [str(j) * 8 for j in range(50)]})
    doc = json.loads(body)
    if i % 100 == 0:
        kept.append(doc)
    return len(doc["docs"])
print("ready", flush=True)
i = 0
window_end = time.perf_counter() + 0.5
done = 0
while True:
    handle(i); i += 1; done += 1
    now = time.perf_counter()
    if now >= window_end:
        print(done * 2, flush=True)
        done = 0
        window_end = now + 0.5
"""

CUDA_TIMING = """
import os, sys, time
try:
    import torch
    ok = torch.cuda.is_available()
except Exception:
    ok = False
if not ok:
    print("ready", flush=True); print("no-cuda", flush=True); time.sleep(600)
torch.empty(1, device="cuda")
from gpuscope import probe
probe.start()
print("ready", flush=True)
print("cuda", flush=True)
def timed(n=20000):
    started = time.perf_counter()
    for _ in range(n):
        x = torch.empty(256, device="cuda")
        del x
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / n * 1e6
for flag in sys.argv[1:]:
    while not os.path.exists(flag):
        time.sleep(0.02)
    print("%.3f" % timed(), flush=True)
time.sleep(600)
"""


def idle_cost(cleanup: Cleanup, seconds: float) -> dict:
    out = {}
    for name, start in (("without", ""), ("with probe", "from gpuscope import probe\nprobe.start()")):
        proc = psutil.Process(cleanup.spawn_python(WITH_PROBE.format(start=start)).pid)
        time.sleep(0.5)
        before = sum(proc.cpu_times()[:2])
        time.sleep(seconds)
        out[name] = sum(proc.cpu_times()[:2]) - before
    return out


def round_trips(cleanup: Cleanup, n: int) -> dict:
    proc = cleanup.spawn_python(WITH_PROBE.format(start="from gpuscope import probe\nprobe.start()"))
    with probe_client.probe_for(proc.pid) as client:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            client.hello()
            times.append((time.perf_counter() - t) * 1e6)
    times.sort()
    return {"median_us": statistics.median(times), "p99_us": times[int(0.99 * (len(times) - 1))]}


def rate(proc, reports: int) -> float:
    proc.stdout.readline()
    return statistics.median(float(proc.stdout.readline()) for _ in range(reports))


def memray_cost(cleanup: Cleanup, seconds: int) -> dict:
    proc = cleanup.spawn_python(REQUESTS)
    alone = rate(proc, seconds * 2)
    result = {}
    client = probe_client.probe_for(proc.pid)
    track = threading.Thread(target=lambda: result.setdefault("reply", client.memray_track(seconds + 2.0)), daemon=True)
    track.start()
    time.sleep(0.5)
    tracked = rate(proc, seconds * 2)
    track.join(seconds + 60)
    client.close()
    reply = result.get("reply") or {}
    return {"alone_per_s": alone, "tracked_per_s": tracked, "slowdown": alone / tracked,
            "still_alive_bytes": reply.get("bytes"), "records": len(reply.get("records") or ())}


def cuda_cost(cleanup: Cleanup) -> dict | None:
    off, on = cleanup.tmpdir / "off", cleanup.tmpdir / "on"
    proc = cleanup.spawn_python(CUDA_TIMING, str(off), str(on))
    if proc.stdout.readline().strip() != "cuda":
        return None
    off.touch()
    without = float(proc.stdout.readline())
    with probe_client.probe_for(proc.pid, timeout=30) as client:
        client.history_start()
        on.touch()
        with_history = float(proc.stdout.readline())
        client.history_stop()
    return {"without_us": without, "with_history_us": with_history}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="hello round trips")
    parser.add_argument("--seconds", type=int, default=3, help="seconds per idle / request-rate measurement")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    install_signal_handlers()
    with Cleanup() as cleanup:
        idle = idle_cost(cleanup, args.seconds)
        trips = round_trips(cleanup, args.requests)
        memray = memray_cost(cleanup, args.seconds)
        cuda = cuda_cost(cleanup)
    if args.json:
        dump_json({"idle_cpu_s": idle, "hello": trips, "memray_track": memray, "cuda_history": cuda, "machine": machine()})
        return 0
    print_table(f"Idle process, CPU seconds over {args.seconds} s", ("process", "CPU s"),
                [(k, f"{v:.3f}") for k, v in idle.items()])
    print()
    print(f"hello round trip over {args.requests} requests: median {trips['median_us']:.0f} us, "
          f"p99 {trips['p99_us']:.0f} us")
    print()
    print("Request loop while the probe runs memray's tracker in process")
    print(f"  alone: {memray['alone_per_s']:.0f} requests/s")
    print(f"  during memray_track: {memray['tracked_per_s']:.0f} requests/s ({memray['slowdown']:.2f}x slower); "
          f"{memray['records']} stacks still holding {memray['still_alive_bytes']} bytes at the end")
    print()
    if cuda is None:
        print("CUDA allocation cost with history on: skipped (torch with CUDA is not available here)")
    else:
        print(f"allocation+free of a small CUDA tensor: {cuda['without_us']:.2f} us without history, "
              f"{cuda['with_history_us']:.2f} us with history (+{cuda['with_history_us'] - cuda['without_us']:.2f} us)")
    m = machine()
    print(f"\nmachine: {m['cpus']} CPUs, Python {m['python']}, kernel {m.get('kernel')}")
    return 0


if __name__ == "__main__":
    run_script(main)
