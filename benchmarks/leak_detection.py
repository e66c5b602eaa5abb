"""The leak detector (gpuscope/core/leak.py): how fast it calls a leak, how often it is wrong,
and what it costs.

What it measures, and how:

Synthetic memory series, one sample a second, `--hours` long (default 2), `--runs` seeded runs per
kind (default 50; run i of every kind uses seed i). Every series has a base of 2-40 GB, Gaussian
noise with a standard deviation of 2-20 MB (drawn per run), and bursts: 1-5 s long, 50 MB-1 GB
high, starting with probability 0.005 per second (about one every 3 minutes).

1. Detection latency. A leak of 50, 5, 1, 0.5, 0.2 or 0.1 MB/s (`--rates`) starts after a flat
   lead-in of 0-10 minutes (drawn per run). The series is fed one sample at a time to a
   `LeakWatch` (defaults: thresholds of `LeakThresholds()`, 6 h window) with `update()` after
   every sample, as the console does every tick; the latency is the seconds of data from the
   leak's start to the first "leak" verdict. Reported: median, 90th percentile and maximum over
   the runs that were detected, and the share detected within the series; beside them, the
   growth duration after which the rate reaches 0.9 x `alert_rate()` (the rule's own latency).
2. False alarms. Series that do not leak, of five kinds:
     flat      noise only (no bursts);
     bursts    noise and bursts twice as often (0.01 per second);
     step      a one-time step of 0.5-4 GB at 1-60 minutes (a model load);
     sawtooth  a buffer filled linearly and freed, period 5-60 s, swing 100-800 MB;
     warm-up   a ramp of 0.5-3 GB over the first 1-10 minutes, then flat (KV cache warming);
   fed the same way. Reported: the share of runs with any "leak" verdict at any tick; the share
   with one after the first 15 minutes (past warm-ups and first sawtooth cycles, which are leaks
   while they climb: growth that has not yet stopped cannot be told from a leak); and the share
   whose one-shot `assess()` over the whole series says "leak".
3. CPU: one `assess()` of a 2 h series (7201 samples; median of 20), and one console tick of a
   `LeakWatch` holding 50 series (each fed 2 h first, one of five kinds above, so that every
   horizon is in play): `add()` of 50 samples + `update()`, mean, 95th percentile and maximum
   over 600 ticks (a horizon of length h is recomputed every h/20 s, so ticks differ).

Runs are spread over the CPUs (`--jobs`, default all). Everything is seeded: the same options
give the same detection figures on any machine; only the CPU figures vary.

Run:  .venv/bin/python benchmarks/leak_detection.py [--json] [--runs 50] [--hours 2]
                                                     [--rates 50,5,1,0.5,0.2,0.1] [--jobs N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import statistics
import sys
import time

from _harness import ROOT, dump_json, install_signal_handlers, machine, print_table, run_script

sys.path.insert(0, str(ROOT))

from gpuscope.core.leak import LeakThresholds, LeakWatch, assess  # noqa: E402

MB = 1e6
GB = 1e9
KINDS = ("flat", "bursts", "step", "sawtooth", "warm-up")
LATE_S = 15 * 60  # "after the first 15 minutes"


def make_series(kind: str, seed: int, seconds: int, rate: float = 0.0) -> tuple[list[float], list[float], float]:
    """(times, values, leak start) of one seeded run of a kind ("leak" with `rate` bytes/s)."""
    rng = random.Random(f"{kind}-{rate}-{seed}")
    base = rng.uniform(2 * GB, 40 * GB)
    noise = rng.uniform(2 * MB, 20 * MB)
    burst_p = 0.0 if kind == "flat" else 0.01 if kind == "bursts" else 0.005
    start = rng.uniform(0, 600) if kind == "leak" else 0.0
    step_at, step = rng.uniform(60, 3600), rng.uniform(0.5 * GB, 4 * GB)
    period, swing = rng.uniform(5, 60), rng.uniform(100 * MB, 800 * MB)
    ramp_s, ramp = rng.uniform(60, 600), rng.uniform(0.5 * GB, 3 * GB)
    times, values = [], []
    burst_left, height = 0, 0.0
    for i in range(seconds + 1):
        t = float(i)
        v = base + rng.gauss(0, noise)
        if burst_p:
            if burst_left == 0 and rng.random() < burst_p:
                burst_left, height = rng.randint(1, 5), rng.uniform(50 * MB, 1 * GB)
            if burst_left:
                v += height
                burst_left -= 1
        if kind == "leak" and t > start:
            v += rate * (t - start)
        elif kind == "step" and t >= step_at:
            v += step
        elif kind == "sawtooth":
            v += swing * ((t % period) / period)
        elif kind == "warm-up":
            v += ramp * min(t, ramp_s) / ramp_s
        times.append(t)
        values.append(v)
    return times, values, start


def quiet_worker() -> None:
    """Workers leave Ctrl-C to the parent (which terminates them) and die plainly on SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def watch_run(task: tuple[str, float, int, int]) -> dict:
    """Feed one run to a LeakWatch tick by tick; when it first said "leak" (and, for leaks, stop
    there), and whether it said so after the first 15 minutes."""
    kind, rate, seed, seconds = task
    times, values, start = make_series(kind, seed, seconds, rate)
    watch = LeakWatch()
    first = late = None
    for t, v in zip(times, values):
        watch.add("s", t, v)
        if watch.update():
            if first is None:
                first = t
                if kind == "leak":
                    break
            if t >= LATE_S:
                late = t
                break
    out = {"kind": kind, "rate": rate, "seed": seed, "start": start, "first_leak_at": first, "late_leak_at": late}
    if kind != "leak":
        out["final_verdict"] = assess(times, values).verdict
    return out


def rule_latency(rate: float, th: LeakThresholds) -> float | None:
    """Growth duration after which `rate` reaches rate_margin x alert_rate (None: never)."""
    d = th.fast_duration_s
    while d < 1e7:
        if rate >= th.rate_margin * th.alert_rate(d):
            return d
        d *= 1.01
    return None


def cpu_assess(seconds: int, repeats: int = 20) -> dict:
    times, values, _ = make_series("leak", 0, seconds, 0.2 * MB)
    costs = []
    for _ in range(repeats):
        t0 = time.process_time()
        assess(times, values)
        costs.append(time.process_time() - t0)
    return {"samples": len(times), "median_ms": statistics.median(costs) * 1e3, "max_ms": max(costs) * 1e3}


def cpu_watch(seconds: int, series: int = 50, ticks: int = 600) -> dict:
    feeds = [make_series(KINDS[k % len(KINDS)], k, seconds + ticks) for k in range(series)]
    watch = LeakWatch()
    for i in range(seconds):
        for k, (times, values, _) in enumerate(feeds):
            watch.add(k, times[i], values[i])
        watch.update()
    costs = []
    for i in range(seconds, seconds + ticks):
        t0 = time.process_time()
        for k, (times, values, _) in enumerate(feeds):
            watch.add(k, times[i], values[i])
        watch.update()
        costs.append(time.process_time() - t0)
    costs.sort()
    return {"series": series, "ticks": ticks, "mean_ms": statistics.fmean(costs) * 1e3,
            "p95_ms": costs[int(0.95 * len(costs))] * 1e3, "max_ms": costs[-1] * 1e3,
            "buckets_held": watch.footprint()}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f} s" if x < 120 else f"{x / 60:.1f} min"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="seeded runs per leak rate and per kind (50)")
    parser.add_argument("--hours", type=float, default=2.0, help="length of every series (2)")
    parser.add_argument("--rates", default="50,5,1,0.5,0.2,0.1", help="leak rates in MB/s (50,5,1,0.5,0.2,0.1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (all CPUs)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    args = parser.parse_args()
    install_signal_handlers()
    seconds = int(args.hours * 3600)
    rates = [float(r) * MB for r in args.rates.split(",")]
    th = LeakThresholds()
    tasks = [("leak", r, s, seconds) for r in rates for s in range(args.runs)]
    tasks += [(k, 0.0, s, seconds) for k in KINDS for s in range(args.runs)]
    wall = time.perf_counter()
    pool = multiprocessing.get_context("fork").Pool(max(1, args.jobs), initializer=quiet_worker)
    try:
        results = pool.map(watch_run, tasks, chunksize=4)
        pool.close()
    finally:
        pool.terminate()  # on Ctrl-C, SIGTERM or an error too: no worker is left running
        pool.join()
    detection_wall = time.perf_counter() - wall

    latency = []
    for r in rates:
        runs = [x for x in results if x["kind"] == "leak" and x["rate"] == r]
        lat = [x["first_leak_at"] - x["start"] for x in runs if x["first_leak_at"] is not None]
        latency.append({
            "rate_mb_s": r / MB, "runs": len(runs), "detected": len(lat),
            "median_s": statistics.median(lat) if lat else None, "p90_s": pct(lat, 0.9) if lat else None,
            "max_s": max(lat) if lat else None, "early_alarms": sum(1 for x in lat if x < 0),
            "rule_s": rule_latency(r, th),
        })
    alarms = []
    for k in KINDS:
        runs = [x for x in results if x["kind"] == k]
        alarms.append({
            "kind": k, "runs": len(runs),
            "any": sum(1 for x in runs if x["first_leak_at"] is not None) / len(runs),
            "after_15_min": sum(1 for x in runs if x["late_leak_at"] is not None) / len(runs),
            "final": sum(1 for x in runs if x["final_verdict"] == "leak") / len(runs),
            "median_first_s": (statistics.median(f) if (f := [x["first_leak_at"] for x in runs
                                                              if x["first_leak_at"] is not None]) else None),
        })
    cost = {"assess_2h": cpu_assess(7200), "watch_tick": cpu_watch(7200)}
    report = {"machine": machine(), "runs": args.runs, "hours": args.hours, "latency": latency,
              "false_alarms": alarms, "cpu": cost, "detection_wall_s": detection_wall}
    if args.json:
        dump_json(report)
        return 0
    print(f"Leak detection: {args.runs} seeded runs per row, {args.hours:g} h at 1 sample/s, "
          f"noise sd 2-20 MB, bursts; LeakWatch updated every sample")
    print()
    print_table(
        "Detection latency (seconds of data from the leak's start to the first \"leak\" verdict)",
        ["leak rate", "detected", "median", "p90", "max", "rule alone"],
        [[f"{x['rate_mb_s']:g} MB/s", f"{x['detected']}/{x['runs']}", fmt_s(x["median_s"]), fmt_s(x["p90_s"]),
          fmt_s(x["max_s"]), fmt_s(x["rule_s"])] for x in latency],
    )
    print()
    print_table(
        "False alarms (share of runs with a \"leak\" verdict)",
        ["series", "any time", "after 15 min", "final assess()", "median first alarm"],
        [[x["kind"], f"{x['any']:.0%}", f"{x['after_15_min']:.0%}", f"{x['final']:.0%}", fmt_s(x["median_first_s"])]
         for x in alarms],
    )
    print()
    a, w = cost["assess_2h"], cost["watch_tick"]
    print("CPU (process time)")
    print(f"  assess() of a 2 h series ({a['samples']} samples): median {a['median_ms']:.1f} ms, "
          f"max {a['max_ms']:.1f} ms")
    print(f"  LeakWatch tick, {w['series']} series (add + update): mean {w['mean_ms']:.2f} ms, "
          f"p95 {w['p95_ms']:.2f} ms, max {w['max_ms']:.2f} ms over {w['ticks']} ticks "
          f"({w['buckets_held']} buckets held)")
    print(f"  (detection runs took {detection_wall:.0f} s of wall time on {args.jobs} worker(s))")
    return 0


if __name__ == "__main__":
    run_script(main)
