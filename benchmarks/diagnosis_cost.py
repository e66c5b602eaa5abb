"""What a diagnosis costs the service it diagnoses: throughput and RSS, per rung and overall.

A service that counts its requests (each allocates and frees ~2 MB in 30 small and large pieces,
the allocation-heavy kind) runs under `gpuscope run` (so it has gpuscope's probe). Its request
rate is read from a counter file it rewrites every 0.25 s:

- undisturbed, for `--baseline` seconds;
- while each tracking rung runs through the probe for `--track` seconds (memray with held bytes
  read every second, tracemalloc with a snapshot every second) and while the stack-sampling rung
  runs (py-spy, nonblocking, 5 dumps a second);
- over a whole `gpuscope diagnose --duration D` (the default schedule: 30 % watched, at most
  40 % tracked, the rest watched again), averaged over the diagnosis;
- undisturbed again, then `--rounds` interleaved pairs of whole diagnoses in process: the
  tracker running its full time, and stopping as soon as its trend is clear (the default), with
  how long each tracked and why it stopped.

RSS is read before and after each rung (after: once the tracker's memory was given back). The
service's allocator thresholds are pinned (GLIBC_TUNABLES), so that no tracker changes how it
allocates: unpinned, the first tracker raised glibc's mmap threshold for good and the service ran
16 times faster after it than before.

    .venv/bin/python benchmarks/diagnosis_cost.py [--baseline S] [--track S] [--duration S] [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuscope.core.diagnosis import ladder as allocations  # noqa: E402
from gpuscope.core.target import probe_client  # noqa: E402
from gpuscope.core.diagnosis.steps import diagnose  # noqa: E402
from gpuscope.core.diagnosis.investigation import investigate  # noqa: E402

PINNED_ALLOCATOR = "glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=8388608"

SERVICE = """
import os, sys, time
counter = sys.argv[1]
def request():
    parts = [bytearray(1000) for _ in range(25)] + [bytearray(500_000) for _ in range(4)]
    return sum(len(p) for p in parts)
print("ready", flush=True)
done = 0
last = time.monotonic()
while True:
    request(); done += 1
    if time.monotonic() - last > 0.25:
        with open(counter + ".tmp", "w") as f:
            f.write("%d %f" % (done, time.monotonic()))
        os.replace(counter + ".tmp", counter)
        last = time.monotonic()
"""


def read_count(path: str) -> tuple[int, float]:
    while True:
        try:
            done, at = open(path).read().split()
            return int(done), float(at)
        except (OSError, ValueError):
            time.sleep(0.05)


def rate_during(path: str, action) -> float:
    """Requests per second while `action()` runs."""
    n0, t0 = read_count(path)
    action()
    n1, t1 = read_count(path)
    return (n1 - n0) / (t1 - t0) if t1 > t0 else float("nan")


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=float, default=6.0)
    parser.add_argument("--track", type=float, default=8.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of whole diagnoses, full tracking and stopped early")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="gpuscope-bench-")
    script = os.path.join(folder, "service.py")
    counter = os.path.join(folder, "count")
    Path(script).write_text(textwrap.dedent(SERVICE))
    # glibc raises its mmap threshold the first time a large block is freed, and a tracker's own
    # large buffers raise it far above the service's 500 kB ones, which then stop being mapped and
    # unmapped on every request: the service after the first tracker is faster than before it, and
    # a slowdown measured across that change means nothing. Pinned (as a long-running service's
    # threshold ends up anyway), the service allocates the same way throughout.
    env = dict(os.environ, GLIBC_TUNABLES=PINNED_ALLOCATOR)
    proc = subprocess.Popen([sys.executable, "-m", "gpuscope", "run", "--", sys.executable, script, counter],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(ROOT), env=env)
    rows = []
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while probe_client.probe_path(proc.pid) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        base = rate_during(counter, lambda: time.sleep(args.baseline))
        rows.append({"phase": "undisturbed", "requests_per_s": round(base, 1), "slowdown": 0.0,
                     "rss_before_mb": None, "rss_after_mb": round(rss(proc.pid) / 1e6, 1)})

        def rung(name, action, **extra):
            before = rss(proc.pid)
            r = rate_during(counter, action)
            time.sleep(1.0)
            rows.append({"phase": name, "requests_per_s": round(r, 1), "slowdown": round(1 - r / base, 3),
                         "rss_before_mb": round(before / 1e6, 1), "rss_after_mb": round(rss(proc.pid) / 1e6, 1),
                         **extra})

        with probe_client.probe_for(proc.pid) as client:
            hello = client.hello()
            rung("memray (probe, held bytes every 1 s)",
                 lambda: allocations.probe_memray_suspects(client, proc.pid, args.track, hello=hello))
            rung("tracemalloc (probe, snapshot every 1 s)",
                 lambda: allocations.probe_tracemalloc_suspects(client, proc.pid, args.track))
        rung("stack sampling (py-spy, 5 dumps/s)", lambda: allocations.sample_growth(proc.pid, args.track))
        diag = [sys.executable, "-m", "gpuscope", "diagnose", "--pid", str(proc.pid), "--duration",
                str(args.duration), "--json"]
        out: list = []
        rung(f"whole diagnosis (--duration {args.duration:g})",
             lambda: out.append(subprocess.run(diag, capture_output=True, text=True, timeout=args.duration + 60)))
        base = rate_during(counter, lambda: time.sleep(args.baseline))  # the service as the trackers left it
        rows.append({"phase": "undisturbed, after the trackers", "requests_per_s": round(base, 1), "slowdown": 0.0,
                     "rss_before_mb": None, "rss_after_mb": round(rss(proc.pid) / 1e6, 1)})
        for i in range(args.rounds):
            for settle in ((False, True) if i % 2 == 0 else (True, False)):
                found: list = []
                rung(f"diagnosis, tracking {'stopped when clear' if settle else 'its full time'} ({i + 1})",
                     lambda settle=settle: found.append(diagnose(investigate(proc.pid, args.duration, settle=settle))))
                cost = found[0].instrument if found else None
                rows[-1].update(tracked_s=cost.seconds if cost else None,
                                stopped=(cost.stopped_because or "-") if cost else None)
    finally:
        proc.kill()
        proc.wait()
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'phase':42} {'req/s':>8} {'slowdown':>9} {'RSS before':>11} {'RSS after':>10}")
        for r in rows:
            before = f"{r['rss_before_mb']:.1f} MB" if r["rss_before_mb"] is not None else "-"
            tracked = f"  tracked {r['tracked_s']:.1f} s, stopped: {r['stopped']}" if r.get("tracked_s") else ""
            print(f"{r['phase']:42} {r['requests_per_s']:8.1f} {r['slowdown'] * 100:8.0f}% {before:>11} "
                  f"{r['rss_after_mb']:8.1f} MB{tracked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
