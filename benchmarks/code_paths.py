"""What reading a process's code paths costs that process.

1. The pause a py-spy dump imposes on a busy target: the target's main thread runs a tight loop
   and reports, every 50 ms, the longest gap it saw between two iterations. Dumps are taken one at
   a time; for each, the longest gap reported while it ran is its pause. Blocking and nonblocking
   dumps, with 4 and with 200 idle threads in the target. Baseline: the same statistic with no dump.
2. The slowdown of a target's request loop while memray tracks it: requests per second of a small
   handler (parse, build, keep a little) alone, and while memray is attached (`memray attach`, as
   gpuscope's allocation-site rung does). Where memray cannot be attached safely, the reason is
   printed and the same loop is measured under `memray run` instead (the same tracking hooks,
   installed at start rather than by injection).

    .venv/bin/python benchmarks/code_paths.py [--dumps N] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time

from _harness import Cleanup, dump_json, install_signal_handlers, machine, print_table, run_script

from gpuscope.core.diagnosis import ladder as allocations

from gpuscope.core.target import pyspy

GAPS = """
import sys, threading, time
for _ in range({threads}):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
print("ready", flush=True)
window_end = time.perf_counter() + 0.05
last = time.perf_counter()
worst = 0.0
while True:
    x = sum(range(200))           # ~10 us of work per iteration
    now = time.perf_counter()
    worst = max(worst, now - last)
    last = now
    if now >= window_end:
        print(f"{{now:.6f}} {{worst * 1000:.3f}}", flush=True)
        worst = 0.0
        window_end = now + 0.05
"""

REQUESTS = """
import json, sys, time
kept = []
def handle(i):
    body = json.dumps({{"query": f"q{{i}}", "docs": [str(j) * 8 for j in range(50)]}})
    doc = json.loads(body)
    if i % 100 == 0:
        kept.append(doc)
    return len(doc["docs"])
print("ready", flush=True)
i = 0
window_end = time.perf_counter() + 1.0
done = 0
while True:
    handle(i); i += 1; done += 1
    now = time.perf_counter()
    if now >= window_end:
        print(done, flush=True)
        done = 0
        window_end = now + 1.0
"""


class Gaps:
    """Reads the target's (time, worst gap in ms) lines in the background."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, float]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            t, gap = line.split()
            self.lines.append((float(t), float(gap)))

    def worst_between(self, t0: float, t1: float) -> float:
        # A window is reported at its end; the one that contains t1 ends up to 50 ms later.
        return max((g for t, g in self.lines if t0 <= t <= t1 + 0.06), default=0.0)


def measure_pauses(cleanup: Cleanup, threads: int, dumps: int) -> dict:
    proc = cleanup.spawn_python(GAPS.format(threads=threads))
    gaps = Gaps(proc)
    time.sleep(1.0)
    t0 = time.perf_counter()
    time.sleep(1.0)
    baseline = sorted(g for t, g in gaps.lines if t >= t0)
    result: dict = {"threads": threads, "baseline_ms": {"median": statistics.median(baseline), "max": max(baseline)}}
    for mode in ("blocking", "nonblocking"):
        pauses, walls = [], []
        for _ in range(dumps):
            start = time.perf_counter()
            pyspy.dump(proc.pid, nonblocking=mode == "nonblocking")
            end = time.perf_counter()
            walls.append((end - start) * 1000)
            time.sleep(0.15)  # let the window that holds the dump be reported
            pauses.append(gaps.worst_between(start, end))
        result[mode] = {
            "pause_ms_median": statistics.median(pauses),
            "pause_ms_max": max(pauses),
            "pyspy_ms_median": statistics.median(walls),
        }
    return result


def rate(proc: subprocess.Popen, seconds: int) -> float:
    """Requests per second over the next `seconds` one-second reports (after one to settle)."""
    proc.stdout.readline()
    return statistics.median(float(proc.stdout.readline()) for _ in range(seconds))


def measure_memray(cleanup: Cleanup, seconds: int) -> dict:
    plain = cleanup.spawn_python(REQUESTS.format())
    alone = rate(plain, seconds)
    result: dict = {"alone_per_s": alone}
    try:
        allocations.check_attach(plain.pid)
    except allocations.AttachRefused as exc:
        result["attach"] = f"refused: {exc}"
        script = cleanup.tmpdir / "requests.py"
        script.write_text(REQUESTS.format())
        tracked = subprocess.Popen(
            [sys.executable, "-m", "memray", "run", "-q", "--aggregate", "-f", "-o", str(cleanup.tmpdir / "run.bin"), str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        cleanup.procs.append(tracked)
        while tracked.stdout.readline().strip() != "ready":
            pass
        result["under_memray_run_per_s"] = rate(tracked, seconds)
        result["slowdown"] = alone / result["under_memray_run_per_s"]
        return result
    memray = threading.Thread(target=allocations.memray_suspects, args=(plain.pid, seconds + 3), daemon=True)
    memray.start()
    time.sleep(1.5)  # attaching takes a moment
    result["attach"] = "attached"
    result["attached_per_s"] = rate(plain, seconds)
    result["slowdown"] = alone / result["attached_per_s"]
    memray.join(60)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dumps", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=3, help="seconds of request rate per measurement")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    install_signal_handlers()
    with Cleanup() as cleanup:
        pauses = [measure_pauses(cleanup, threads, args.dumps) for threads in (4, 200)]
        memray = measure_memray(cleanup, args.seconds)
    if args.json:
        dump_json({"pauses": pauses, "memray": memray, "machine": machine()})
        return 0
    rows = []
    for p in pauses:
        for mode in ("blocking", "nonblocking"):
            m = p[mode]
            rows.append((f"{p['threads']} threads, {mode}", f"{m['pause_ms_median']:.1f}", f"{m['pause_ms_max']:.1f}",
                         f"{p['baseline_ms']['median']:.1f} / {p['baseline_ms']['max']:.1f}", f"{m['pyspy_ms_median']:.0f}"))
    print_table("Pause a py-spy dump imposes on a busy target (longest gap in its loop, ms)",
                ("target", "median", "max", "baseline median / max", "py-spy ms"), rows)
    print()
    print("Request loop while memray tracks it")
    print(f"  alone: {memray['alone_per_s']:.0f} requests/s")
    print(f"  memray attach: {memray['attach']}")
    if "attached_per_s" in memray:
        print(f"  attached: {memray['attached_per_s']:.0f} requests/s ({memray['slowdown']:.2f}x slower)")
    else:
        print(f"  under memray run instead: {memray['under_memray_run_per_s']:.0f} requests/s ({memray['slowdown']:.2f}x slower)")
    m = machine()
    print(f"\nmachine: {m['cpus']} CPUs, Python {m['python']}, kernel {m.get('kernel')}")
    return 0


if __name__ == "__main__":
    run_script(main)
