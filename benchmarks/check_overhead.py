"""`gpuscope check`: what the gate adds to the wall time of the rounds it watches, and whether its own
memory stays flat across rounds.

What it measures, and how:

The service is the demo RAG service with its leak switched off (`python -m gpuscope.demo.service
--no-leak`, on a free loopback port). A round's load is a fixed amount of work, not a fixed time:
`--requests` requests (default 60) from `--concurrency` threads (default 6), sent as fast as the
service answers, by a small load script written to a temporary folder; so whatever slows the
service (memray tracking inside it, gpuscope's sampling beside it) lengthens the round.

1. Wall time of the rounds, three ways, `--repeats` times each (default 3), interleaved:
     plain        the service without gpuscope (and without its probe: `--no-probe`); the load
                  script is run 1 + `--rounds` times in a row (as many runs as a check drives:
                  one warm-up round and the judged ones); the figure is the sum of the runs'
                  wall times (each timed from its start to its exit);
     check        `gpuscope check --rounds N --load <the same script> --metrics-url ... --json
                  -- <the service>`; the figure is the time from the check's "warm-up round:
                  running the load command" line to its "round N/N: ..." line on stderr (read
                  as they come): every round whole, with the quiet part after each load run,
                  memray tracking in the service (through the probe), RSS sampled every 0.1 s,
                  /metrics scraped at both ends of every round;
     no-memray    the same with `--no-memray`.
   Overhead = check / plain - 1 for each repeat (plain and check of the same repeat run back to
   back); reported: the median and the range over the repeats. Also reported: the whole
   command's wall time (service start, readiness, memray's first start, rounds, stop), and the
   CPU of the `gpuscope check` process itself (not its children) per second of a judged round.
2. The check's own memory: one check of `--long-rounds` rounds (default 30) of a short load (a
   fifth of the requests); the RSS of the `gpuscope check` process is read (psutil) each time it
   reports a round done on stderr. Reported: its RSS after the first and the last round, and the
   growth per round (Theil-Sen slope through all rounds).

Run:  .venv/bin/python benchmarks/check_overhead.py [--json] [--rounds 3] [--requests 60]
                                                    [--concurrency 6] [--repeats 3] [--long-rounds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import psutil

from _harness import (
    ROOT,
    Cleanup,
    dump_json,
    free_port,
    gpuscope_cmd,
    install_signal_handlers,
    kill_popen,
    machine,
    print_table,
    run_script,
    spread,
)

sys.path.insert(0, str(ROOT))

from gpuscope.core.leak.growth import theil_sen  # noqa: E402

LOAD = """
import sys, threading, urllib.request
from urllib.parse import quote
url, total, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
lock, sent, failed = threading.Lock(), [0], []
def work():
    while True:
        with lock:
            if sent[0] >= total:
                return
            sent[0] += 1
            n = sent[0]
        try:
            with opener.open(f"{url}/query?q=" + quote(f"why is gpu memory growing {n}"), timeout=30) as r:
                r.read()
        except OSError as exc:
            failed.append(exc)
threads = [threading.Thread(target=work) for _ in range(concurrency)]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.exit(1 if failed else 0)
"""
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def service_cmd(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gpuscope.demo.service", "--port", str(port), "--no-leak", *extra]


def load_cmd(script: str, url: str, requests: int, concurrency: int) -> list[str]:
    return [sys.executable, script, url, str(requests), str(concurrency)]


def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with _OPENER.open(f"{url}/healthz", timeout=2) as resp:
                resp.read()
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the demo service at {url} did not answer within {timeout:g} s")


def plain(cleanup: Cleanup, script: str, args: argparse.Namespace) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    service = subprocess.Popen(service_cmd(port, "--no-probe"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               stdin=subprocess.DEVNULL)
    cleanup.procs.append(service)
    try:
        wait_ready(url)
        rounds = []
        for _ in range(1 + args.rounds):
            t0 = time.perf_counter()
            done = subprocess.run(load_cmd(script, url, args.requests, args.concurrency), timeout=600,
                                  stdin=subprocess.DEVNULL)
            rounds.append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise RuntimeError("the load script failed against the plain service")
    finally:
        kill_popen(service)
    return {"rounds_s": sum(rounds), "total_s": time.perf_counter() - started}


def check(cleanup: Cleanup, script: str, args: argparse.Namespace, *extra: str, rounds: int | None = None,
          requests: int | None = None) -> dict:
    """One `gpuscope check`; its JSON, its wall time and its own RSS after each round."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    load = " ".join(load_cmd(script, url, requests or args.requests, args.concurrency))
    cmd = [*gpuscope_cmd(), "check", "--rounds", str(rounds or args.rounds), "--load", load,
           "--metrics-url", f"{url}/metrics", "--json", *extra, "--", *service_cmd(port)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    cleanup.procs.append(proc)
    own_rss: list[int] = []
    own_cpu: list[float] = []
    marks: list[float] = []  # when the first round started, and when each round was reported done

    def watch_stderr() -> None:
        for line in proc.stderr:
            if line.startswith("gpuscope check: warm-up round: running") and not marks:
                marks.append(time.perf_counter())
            if line.startswith("gpuscope check: round ") and "running" not in line:
                marks.append(time.perf_counter())
                try:
                    me = psutil.Process(proc.pid)
                    own_rss.append(me.memory_info().rss)
                    times = me.cpu_times()
                    own_cpu.append(times.user + times.system)  # its own, not its children's
                except psutil.Error:
                    pass

    reader = threading.Thread(target=watch_stderr, daemon=True)
    reader.start()
    out = proc.stdout.read()  # stderr is the reader's alone (communicate() would read it too)
    proc.wait(timeout=60)
    reader.join(5)
    total = time.perf_counter() - started
    result = json.loads(out)
    if result["verdict"] != "pass":
        raise RuntimeError(f"the check of the healthy demo service failed: {result['criteria']}")
    judged = [r["duration_s"] for r in result["rounds"] if r["round"] > 0]
    cpu_per_round = (own_cpu[-1] - own_cpu[0]) / (len(own_cpu) - 1) if len(own_cpu) >= 2 else None
    return {"rounds_s": marks[-1] - marks[0], "total_s": total, "own_rss": own_rss,
            "own_cpu_share": cpu_per_round / statistics.mean(judged[1:]) if cpu_per_round is not None else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    install_signal_handlers()
    figures: dict[str, list] = {"plain": [], "check": [], "no-memray": []}
    with Cleanup() as cleanup:
        script = str(cleanup.tmpdir / "load.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(LOAD))
        for i in range(args.repeats):
            print(f"repeat {i + 1}/{args.repeats}…", file=sys.stderr, flush=True)
            figures["plain"].append(plain(cleanup, script, args))
            figures["check"].append(check(cleanup, script, args))
            figures["no-memray"].append(check(cleanup, script, args, "--no-memray"))
        print("the check's own memory over a long run…", file=sys.stderr, flush=True)
        long = check(cleanup, script, args, rounds=args.long_rounds, requests=max(1, args.requests // 5))
    rss = long["own_rss"]
    slope = theil_sen(list(enumerate(rss))) if len(rss) >= 2 else None
    overhead = {k: [c["rounds_s"] / p["rounds_s"] - 1 for c, p in zip(figures[k], figures["plain"])]
                for k in ("check", "no-memray")}
    report = {
        "machine": machine(),
        "settings": vars(args),
        "rounds_wall_s": {k: [round(v["rounds_s"], 3) for v in vs] for k, vs in figures.items()},
        "total_wall_s": {k: [round(v["total_s"], 3) for v in vs] for k, vs in figures.items()},
        "overhead": {k: [round(v, 4) for v in vs] for k, vs in overhead.items()},
        "own_cpu_share": {k: [v.get("own_cpu_share") for v in vs] for k, vs in figures.items() if k != "plain"},
        "own_rss_bytes": rss,
        "own_rss_growth_per_round_bytes": None if slope is None else round(slope),
    }
    if args.json:
        dump_json(report)
        return 0
    rows = []
    for k, vs in figures.items():
        cpu = [100 * v["own_cpu_share"] for v in vs if v.get("own_cpu_share") is not None]
        rows.append([k, spread([v["rounds_s"] for v in vs], ".2f"), spread([v["total_s"] for v in vs], ".2f"),
                     spread([100 * o for o in overhead[k]], "+.1f") if k in overhead else "—",
                     spread(cpu, ".1f") if cpu else "—"])
    print_table(f"Wall time of 1 + {args.rounds} rounds of {args.requests} requests ({args.concurrency} at a time), "
                f"median (min-max) of {args.repeats}",
                ["", "rounds s", "whole command s", "rounds overhead %", "check's CPU % of a core"], rows)
    print()
    if rss:
        print(f"The check's own RSS over {len(rss)} rounds: {rss[0] / 2**20:.1f} MiB after the first, "
              f"{rss[-1] / 2**20:.1f} MiB after the last; growth {slope / 1024:+.1f} KiB per round (Theil-Sen)")
    return 0


if __name__ == "__main__":
    run_script(main)
