"""How long a leak takes to raise an alert: Prometheus running `gpuscope rules`, beside gpuscope's
own leak watch, on the same leaks.

Set-up, all on loopback: a real `gpuscope exporter` on the fake NVML (tests/support/fake_nvml),
one real Prometheus (Debian's `prometheus`) scraping it and evaluating the rules every
`--interval` seconds, loaded with the file `gpuscope rules -o` writes (the shipped horizons; or
rules rendered for `--horizons`). The GPU processes are real (`sleep` children, so the exporter
reads their command lines and start times as on a node); their GPU memory is the fake NVML's,
written to its scenario file every 0.5 s: each leaking process appears with 2 GB and grows at its
rate from then on; each bounded cache appears with 2 GB, fills `--cache-mb` over `--cache-fill`
seconds, then stays (a KV cache warming up: it must never fire); each flat process with big
temporaries holds 2 GB and, in 30 % of the 2-second slots (at random), `--temporary-mb` more
(a batch's activations: it must never fire).

Rounds overlap: every round starts one process per rate, one cache and one flat process with
temporaries, `--stagger` seconds after
the round before, so their leaks meet the rule evaluations at different phases. Per leak, from
the moment its memory starts growing:
- console: the exporter's own leak watch (the console's LeakWatch, the same code) raising its
  alert, `gpuscope_process_leak{memory="gpu"} == 1`, read from the exporter every 0.5 s;
- pending / firing: the first `gpuscope` leak alert on that PID in Prometheus' /api/v1/alerts in
  the state pending, then firing, read every 0.5 s.
Printed: median (min-max) over the rounds per rate; for the caches and the temporaries, whether
anything fired.

Run:  .venv/bin/python benchmarks/alert_firing.py [--rates 2,10,50] [--rounds 3] [--stagger 15]
          [--interval 1] [--horizons 300,1800] [--cache-mb 1500] [--cache-fill 60]
          [--temporary-mb 800] [--watch 360] [--max-wait 480] [--json]
The fleet's target: --rates 4 --interval 5 --cache-mb 300 (a 4 MB/s leak firing within 120 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request

from _harness import (Cleanup, dump_json, free_port, gpuscope_cmd, install_signal_handlers, machine, print_table,
                      require_tool, run_script, spread)
from helpers import answers, fake_nvml_env, wait_until

MB = 1_000_000
BASE = 2_000_000_000  # each process's GPU memory when it appears
POLL_S = 0.5
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only: no proxy


def get(url: str, timeout: float = 5.0) -> bytes:
    with _DIRECT.open(url, timeout=timeout) as r:
        return r.read()


class Gpu:
    """The fake NVML's scenario: the GPU memory of each process as a function of time."""

    def __init__(self, path) -> None:
        self.path = path
        self.shapes: dict[int, tuple[float, float, float | None, float]] = {}  # pid -> (start, rate, cap, temporary)
        self.write(time.time())

    def add(self, pid: int, start: float, rate: float, cap: float | None = None, temporary: float = 0.0) -> None:
        self.shapes[pid] = (start, rate, cap, temporary)

    def used(self, pid: int, now: float) -> int:
        start, rate, cap, temporary = self.shapes[pid]
        grown = rate * max(0.0, now - start)
        held = min(grown, cap) if cap is not None else grown
        if temporary and random.Random(int(now // 2) * 1_000_003 + pid).random() < 0.3:
            held += temporary  # this 2-second slot's temporaries
        return int(BASE + held)

    def write(self, now: float) -> None:
        scenario = {"devices": [{"name": "NVIDIA H200", "uuid": "GPU-bench0", "total": 150_000_000_000,
                                 "compute": [{"pid": pid, "used": self.used(pid, now)} for pid in self.shapes]}]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(scenario))
        os.replace(tmp, self.path)  # whole files only: the exporter never reads half a scenario


def exporter_alerts(url: str) -> set[int]:
    """PIDs whose GPU series the exporter's leak watch alerts on now."""
    from prometheus_client.parser import text_string_to_metric_families

    pids = set()
    for family in text_string_to_metric_families(get(url).decode()):
        if family.name == "gpuscope_process_leak":
            pids.update(int(s.labels["pid"]) for s in family.samples
                        if s.value == 1 and s.labels.get("memory") == "gpu")
    return pids


def prometheus_alerts(base: str) -> dict[int, str]:
    """PID -> the most advanced state (firing over pending) of gpuscope's leak alerts on it."""
    states: dict[int, str] = {}
    for alert in json.loads(get(f"{base}/api/v1/alerts"))["data"]["alerts"]:
        labels = alert["labels"]
        if labels.get("alertname", "").startswith("GpuscopeLeakProcess") and labels.get("pid", "").isdigit():
            pid = int(labels["pid"])
            if states.get(pid) != "firing":
                states[pid] = alert["state"]
    return states


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="2,10,50", help="leak rates, MB/s (default 2,10,50)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stagger", type=float, default=15.0, help="seconds between the rounds' starts")
    parser.add_argument("--interval", type=float, default=1.0, help="Prometheus' scrape and evaluation interval, s")
    parser.add_argument("--refresh", type=float, default=1.0, help="the exporter's sampling interval, s")
    parser.add_argument("--horizons", default="", help="render the rules for these horizons (s); default: as shipped")
    parser.add_argument("--cache-mb", type=float, default=1500.0)
    parser.add_argument("--cache-fill", type=float, default=60.0, help="seconds the cache takes to fill")
    parser.add_argument("--temporary-mb", type=float, default=800.0, help="the flat process's temporaries")
    parser.add_argument("--watch", type=float, default=360.0,
                        help="watch the caches and temporaries this long at least, s (the 5-minute horizon's reach)")
    parser.add_argument("--max-wait", type=float, default=480.0, help="give a leak this long to fire, s")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    rates = [float(r) * MB for r in opts.rates.split(",")]
    install_signal_handlers()
    with Cleanup() as cleanup:
        result = measure(cleanup, opts, rates)
    result["machine"] = machine()
    if opts.json:
        dump_json(result)
    else:
        report(result)
    return 0


def rules_file(cleanup: Cleanup, horizons: str):
    path = cleanup.tmpdir / "gpuscope.rules.yml"
    if horizons:
        from gpuscope.core.leak import LeakThresholds
        from gpuscope.core.fleet.rules import render_rules

        hs = tuple(int(h) for h in horizons.split(","))
        path.write_text(render_rules(LeakThresholds(), ttft_p95_s=0.8, e2e_latency_p95_s=4.0, horizons_s=hs))
    else:
        subprocess.run([*gpuscope_cmd(), "rules", "-o", str(path)], check=True, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60, env={**os.environ, "XDG_CONFIG_HOME": str(cleanup.tmpdir)})
    return path


def measure(cleanup: Cleanup, opts, rates: list[float]) -> dict:
    prometheus = require_tool("prometheus")
    tmp = cleanup.tmpdir
    gpu = Gpu(tmp / "nvml.json")
    port = free_port()
    env = {**fake_nvml_env(gpu.path), "XDG_CONFIG_HOME": str(tmp / "config")}
    cleanup.procs.append(subprocess.Popen(
        [*gpuscope_cmd(), "--refresh", str(opts.refresh), "exporter", "--listen", f"127.0.0.1:{port}",
         "--node-name", "bench"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL))
    metrics = f"http://127.0.0.1:{port}/metrics"
    wait_until(lambda: answers(metrics), timeout=60, what="the exporter")
    rules = rules_file(cleanup, opts.horizons)
    every = f"{opts.interval:g}s"
    (tmp / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {every}\n  scrape_timeout: {every}\n  evaluation_interval: {every}\n"
        f"rule_files: ['{rules}']\n"
        f"scrape_configs:\n  - job_name: gpuscope\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    prom_port = free_port()
    cleanup.procs.append(subprocess.Popen(
        [prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    base = f"http://127.0.0.1:{prom_port}"
    wait_until(lambda: answers(f"{base}/-/ready"), timeout=60, what="Prometheus")
    rule_groups = json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
    if not any(r.get("name", "").startswith("GpuscopeLeak") for g in rule_groups for r in g["rules"]):
        raise SystemExit("Prometheus did not load gpuscope's leak rules")

    t0 = time.time()
    plan = [(t0 + k * opts.stagger, k, kind, rate) for k in range(opts.rounds)
            for kind, rate in [*(("leak", r) for r in rates), ("cache", opts.cache_mb * MB / opts.cache_fill),
                               ("temporaries", 0.0)]]
    runs: dict[int, dict] = {}
    pending_plan = sorted(plan)
    deadline = t0 + (opts.rounds - 1) * opts.stagger + opts.max_wait
    said = t0
    # the caches and the temporaries: a minute of plateau, and at least --watch seconds in all
    cache_watch_until = t0 + (opts.rounds - 1) * opts.stagger + max(opts.cache_fill + 60, opts.watch)
    while True:
        now = time.time()
        while pending_plan and pending_plan[0][0] <= now:
            start, k, kind, rate = pending_plan.pop(0)
            proc = cleanup.popen(["sleep", "86400"])
            cap = opts.cache_mb * MB if kind == "cache" else None
            gpu.add(proc.pid, now, rate, cap, opts.temporary_mb * MB if kind == "temporaries" else 0.0)
            runs[proc.pid] = {"round": k, "kind": kind, "rate": rate, "start": now, "console": None,
                              "console_cleared": None, "pending": None, "firing": None}
        gpu.write(now)
        try:
            console = exporter_alerts(metrics)
            states = prometheus_alerts(base)
        except OSError:
            console, states = set(), {}
        now = time.time()
        for pid, run in runs.items():
            since = round(now - run["start"], 1)
            if pid in console and run["console"] is None:
                run["console"] = since
            if pid not in console and run["console"] is not None and run["console_cleared"] is None:
                run["console_cleared"] = since
            state = states.get(pid)
            if state in ("pending", "firing") and run["pending"] is None:
                run["pending"] = since
            if state == "firing" and run["firing"] is None:
                run["firing"] = since
        leaks_done = all(r["firing"] is not None for r in runs.values() if r["kind"] == "leak")
        if not pending_plan and ((leaks_done and now >= cache_watch_until) or now >= deadline):
            break
        if not opts.json and now >= said + 30:
            said = now
            fired = sum(r["firing"] is not None for r in runs.values() if r["kind"] == "leak")
            print(f"{now - t0:5.0f} s: {fired}/{len(rates) * opts.rounds} leaks firing in Prometheus",
                  file=sys.stderr, flush=True)
        time.sleep(max(0.0, POLL_S - (time.time() - now)))
    return {
        "settings": {"rates_mb_s": [r / MB for r in rates], "rounds": opts.rounds, "stagger_s": opts.stagger,
                     "interval_s": opts.interval, "exporter_refresh_s": opts.refresh,
                     "horizons": opts.horizons or "shipped", "cache_mb": opts.cache_mb,
                     "cache_fill_s": opts.cache_fill, "temporary_mb": opts.temporary_mb, "max_wait_s": opts.max_wait},
        "wall_s": round(time.time() - t0, 1),
        "runs": sorted(runs.values(), key=lambda r: (r["kind"], r["rate"], r["round"])),
    }


def seconds_or_never(values: list) -> str:
    """The spread of the rounds that saw the alert, and how many never did."""
    got = [v for v in values if v is not None]
    missed = len(values) - len(got)
    if not got:
        return f"never ({missed} of {len(values)})"
    return spread(got, ".1f") + (f", {missed} never" if missed else "")


def report(result: dict) -> None:
    runs, s = result["runs"], result["settings"]
    print(f"Seconds from the leak's start to the alert, median (min-max) over {s['rounds']} rounds; "
          f"Prometheus every {s['interval_s']:g} s, rules: {s['horizons']}, exporter every {s['exporter_refresh_s']:g} s")
    rows = []
    for rate in s["rates_mb_s"]:
        mine = [r for r in runs if r["kind"] == "leak" and r["rate"] == rate * MB]
        rows.append([f"leak {rate:g} MB/s", seconds_or_never([r["console"] for r in mine]),
                     seconds_or_never([r["pending"] for r in mine]), seconds_or_never([r["firing"] for r in mine])])
    caches = [r for r in runs if r["kind"] == "cache"]
    rows.append([f"cache {s['cache_mb']:g} MB in {s['cache_fill_s']:g} s, then flat",
                 seconds_or_never([r["console"] for r in caches]), seconds_or_never([r["pending"] for r in caches]),
                 seconds_or_never([r["firing"] for r in caches])])
    flat = [r for r in runs if r["kind"] == "temporaries"]
    rows.append([f"flat, {s['temporary_mb']:g} MB temporaries", seconds_or_never([r["console"] for r in flat]),
                 seconds_or_never([r["pending"] for r in flat]), seconds_or_never([r["firing"] for r in flat])])
    print_table("", ["process", "console alert s", "Prometheus pending s", "Prometheus firing s"], rows)
    cleared = [r["console_cleared"] for r in caches if r["console"] is not None]
    if cleared:
        print(f"  the console's alert on the caches cleared at {seconds_or_never(cleared)} s")
    print(f"  wall time {result['wall_s']:.0f} s")


if __name__ == "__main__":
    run_script(main)
