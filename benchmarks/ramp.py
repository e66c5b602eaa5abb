"""`gpuscope ramp` on the demo service: the knee it finds beside the capacity the service is built
with, the ramp's time, and memory per request beside what the service keeps.

1. The knee: the demo RAG service with a pool of `--workers` workers of `--service-ms` ms (default
   6 x 300 ms: a capacity of 20 queries/s; a query then takes ~300 ms, well inside the latency
   histogram's 250-500 ms bucket, so a busy machine's slower queries do not cross a bucket) and its
   leak off; `gpuscope ramp` with the stop rule's
   defaults (a P99 every 5 s, a 12-point baseline, 3.2 sd, drift 0.5, 3 breaks then a 30 s watch),
   from `--start-rps` by `--step-rps` every `--step-seconds`. Reported: the critical throughput
   and its uncertainty, its error against the capacity (target: within 5 %), and the ramp's time
   from its first request to its stop (target: under 3 minutes). Beside them, the service's own
   CPU a query and the machine's load average: the pool's capacity is the service's only while
   it gets the CPU its queries need (at 20 queries/s, over 0.4 of a core); short of it, the
   service's capacity is lower and the knee the ramp finds is that one.
2. Memory per request: the demo service with its leak on (every unique query keeps a block of
   `--leak-kb` KiB in the retriever's cache), ramped from 4 to 12 queries/s with 1 s intervals,
   unique queries from a template; `--pid` gives the ramp the service's memory. Reported: the
   ramp's memory kept per request (the slope of RSS over requests served) beside what the service
   says it keeps per query (its /admin/state: cache bytes over cache entries; target: within 10 %),
   and the top allocation site memray named with its bytes per request.

    .venv/bin/python benchmarks/ramp.py [--workers 6] [--service-ms 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request

import psutil

from _harness import gpuscope_cmd

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def start_demo(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "gpuscope.demo.service", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"the demo service did not start: {line!r}")
    return proc, line.split()[-1].rstrip("/")


def ramp(*args: str) -> dict:
    done = subprocess.run([*gpuscope_cmd(), "ramp", *args, "--json"], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"gpuscope ramp failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def knee(args: argparse.Namespace) -> dict:
    capacity = args.workers * 1000 / args.service_ms
    proc, url = start_demo("--no-leak", "--no-probe", "--workers", str(args.workers), "--service-ms", str(args.service_ms))
    load_before = os.getloadavg()[0]
    try:
        cpu_before = sum(psutil.Process(proc.pid).cpu_times()[:2])
        result = ramp("--target", f"{url}/query?q=gpu+memory+growth", "--metrics-url", f"{url}/metrics",
                      "--start-rps", str(args.start_rps), "--step-rps", str(args.step_rps),
                      "--step-seconds", str(args.step_seconds), "--max-rps", str(3 * capacity))
        cpu = sum(psutil.Process(proc.pid).cpu_times()[:2]) - cpu_before
        with _OPENER.open(f"{url}/admin/state", timeout=10) as answer:
            served = json.load(answer)["requests_served"]
    finally:
        proc.terminate()
        proc.wait(10)
    found = result["knee"] or {}
    critical = found.get("critical_rps")
    cpu_per_query = cpu / max(1, served)
    return {"capacity_rps": capacity, "critical_rps": critical, "uncertainty_rps": found.get("uncertainty_rps"),
            "error_pct": None if critical is None else 100 * (critical - capacity) / capacity,
            "ramp_s": result["duration_s"], "stopped_by": result["stopped_by"], "steps": len(result["steps"]),
            "service_cpu_ms_per_query": 1000 * cpu_per_query, "cores_at_capacity": cpu_per_query * capacity,
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)]}


def memory(args: argparse.Namespace) -> dict:
    proc, url = start_demo("--leak-kb", str(args.leak_kb))
    try:
        result = ramp("--target", f"{url}/query", "--template", "q=why+is+gpu+memory+growing+{n}",
                      "--metrics-url", f"{url}/metrics", "--pid", str(proc.pid), "--start-rps", "4", "--step-rps", "4",
                      "--max-rps", "12", "--interval", "1", "--baseline-points", "8", "--step-seconds", "5")
        with _OPENER.open(f"{url}/admin/state", timeout=10) as answer:
            state = json.load(answer)
    finally:
        proc.terminate()
        proc.wait(10)
    kept = state["cache_bytes"] / max(1, state["cache_entries"])
    per = result["memory"]["per_request_bytes"]
    top = (result["memory"]["sites"] or [{}])[0]
    return {"service_keeps_bytes": kept, "per_request_bytes": per,
            "error_pct": None if per is None else 100 * (per - kept) / kept,
            "top_site": top.get("function"), "top_site_bytes_per_request": top.get("bytes_per_request")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--service-ms", type=float, default=300.0)
    p.add_argument("--start-rps", type=float, default=5.0)
    p.add_argument("--step-rps", type=float, default=2.0)
    p.add_argument("--step-seconds", type=float, default=10.0)
    p.add_argument("--leak-kb", type=int, default=192)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    figures = {"knee": knee(args), "memory": memory(args)}
    if args.json:
        print(json.dumps(figures))
        return 0
    k, m = figures["knee"], figures["memory"]
    crit = "none found" if k["critical_rps"] is None else f"{k['critical_rps']:.2f} ± {k['uncertainty_rps']:.2f}/s"
    err = "" if k["error_pct"] is None else f" ({k['error_pct']:+.1f} % of the capacity; target within ±5 %)"
    print(f"knee: capacity {k['capacity_rps']:g}/s, critical throughput {crit}{err}")
    print(f"      ramp {k['ramp_s']:.0f} s over {k['steps']} steps, stopped by {k['stopped_by']} (target under 180 s)")
    print(f"      the service's CPU: {k['service_cpu_ms_per_query']:.1f} ms a query, {k['cores_at_capacity']:.2f} of a core "
          f"at its capacity; load average {k['load_average'][0]:g} before, {k['load_average'][1]:g} after")
    per = "N/A" if m["per_request_bytes"] is None else f"{m['per_request_bytes'] / 1024:.1f} KiB"
    err = "" if m["error_pct"] is None else f" ({m['error_pct']:+.1f} %; target within ±10 %)"
    print(f"memory: the service keeps {m['service_keeps_bytes'] / 1024:.1f} KiB a query; the ramp found {per} a request{err}")
    if m["top_site"]:
        site = m["top_site_bytes_per_request"]
        print(f"        top allocation site {m['top_site']}: "
              f"{'N/A' if site is None else f'{site / 1024:.1f} KiB'} a request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
