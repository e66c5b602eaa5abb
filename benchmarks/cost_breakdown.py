"""Where the console's CPU goes, part by part, on the fake NVML's node shapes.

What it measures, and how:

The console runs as in side_by_side.py (a private 120x40 tmux window, a real terminal; the fake
NVML's small or big node; attached to the leaking child; `--refresh 1`), but inside this script,
which wraps the console's parts in timers before it starts it. After `--warmup` seconds (default
40) it measures for `--window` seconds (default 30):

- the CPU time of the whole process and of each of its threads (the main thread lays out and draws;
  the host and NVML pollers read; the journal's writer records), from their CPU clocks;
- the CPU time of its thread spent inside each named part (the /proc scan, the leak watch, each
  panel's update, Textual's compositor), timed at the part's entry and exit. Parts nest (the scan
  is inside the host read, the panels inside "frame shown"): they do not add up to their thread;
- the garbage collector's passes, by generation.

Each round starts a fresh console (`--rounds`, default 3); the table gives each figure's median and
range over the rounds in ms of CPU per second, and the load average before each round. The timers
cost a little themselves (two clock reads a call, about fifteen calls a second). The NVML thread
reads the fake driver library (tests/support/fake_nvml), as in side_by_side.py: its figure is not
real NVML's.

Run:  .venv/bin/python benchmarks/cost_breakdown.py [--node small|big] [--rounds 3] [--warmup 40] [--window 30] [--json]
Everything started is killed on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import psutil

from _harness import (Cleanup, dump_json, install_signal_handlers, machine, print_table, quote, run_script, spread, summary,
                      wait_until)
from side_by_side import on_fake_nvml, start_node

# (module, class, method, what it is): timed while the console runs. Private names are the
# console's own; a part that is renamed fails the run with its name, not a wrong table.
PARTS = [
    ("gpuscope.core.node.live", "NodeSource", "_read_host", "host: read (memory, scan, rows, followed)"),
    ("gpuscope.core.node.host", "HostCollector", "memory", "host:   memory"),
    ("gpuscope.core.node.host", "HostCollector", "scan", "host:   /proc scan"),
    ("gpuscope.core.node.host", "HostCollector", "complete", "host:   table rows"),
    ("gpuscope.core.node.host", "HostCollector", "detail", "host:   followed process"),
    ("gpuscope.core.node.live", "NodeSource", "_record", "host: series and watch fed"),
    ("gpuscope.core.leak", "LeakWatch", "update", "host: leak watch judged"),
    ("gpuscope.core.node.live", "NodeSource", "_frame", "host: frame built"),
    ("gpuscope.tui.app", "GpuScopeApp", "on_frame_ready", "main: frame shown (all panels)"),
    ("gpuscope.tui.devices", "DevicesPanel", "show", "main:   devices panel"),
    ("gpuscope.tui.processes", "ProcessTable", "show", "main:   process table"),
    ("gpuscope.tui.detail", "ProcessPanel", "show", "main:   process panel"),
    ("gpuscope.tui.chart", "MemoryChart", "show", "main:   chart"),
    ("textual.screen", "Screen", "_compositor_refresh", "main: compositor (rows rendered)"),
    ("gpuscope.tui.terminal_cells", "TerminalCells", "render", "main: cells changed, sent"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--node", choices=("small", "big"), default="small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=40.0, help="seconds before the window (default 40)")
    ap.add_argument("--window", type=float, default=30.0, help="seconds measured (default 30)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--inside", metavar="RESULT", help=argparse.SUPPRESS)  # the console's side
    args, console_args = ap.parse_known_args(argv)
    if args.inside:
        return inside(args.inside, args.warmup, args.window, console_args)
    install_signal_handlers()
    rounds = []
    for n in range(args.rounds):
        load = psutil.getloadavg()[0]
        result = one_round(args.node, args.warmup, args.window)
        result["load"] = load
        rounds.append(result)
        print(f"round {n + 1}: process {result['process']:.2f} ms/s, load average {load:.2f}", file=sys.stderr, flush=True)
    report(args, rounds)
    return 0


def one_round(node: str, warmup: float, window: float) -> dict:
    with Cleanup() as cleanup:
        leaker = start_node(node, cleanup)
        result = cleanup.tmpdir / "result.json"
        tmux = cleanup.tmux(quote([
            *on_fake_nvml(cleanup), sys.executable, __file__,
            "--inside", str(result), "--warmup", str(warmup), "--window", str(window),
            "--refresh", "1", "--pid", str(leaker.pid),
        ]), name="costs")

        def done() -> bool:
            if tmux.dead() and not result.exists():
                raise RuntimeError(f"the console ended before its window; screen:\n{tmux.screen()}")
            return result.exists()

        wait_until(done, timeout=warmup + window + 60, interval=0.5, what="the measured window")
        return json.loads(result.read_text())


def report(args: argparse.Namespace, rounds: list[dict]) -> None:
    rows = [["process (all threads)", spread([r["process"] for r in rounds]), ""]]
    for name in sorted({t for r in rounds for t in r["threads"]}):
        rows.append([f"thread {name}", spread([r["threads"].get(name, 0.0) for r in rounds]), ""])
    for _, _, _, label in PARTS:
        rows.append([label, spread([r["parts"][label][0] for r in rounds]),
                     f"{summary([r['parts'][label][1] for r in rounds])['median']:.1f}"])
    for gen in ("0", "1", "2"):
        rows.append([f"gc generation {gen}", spread([r["gc"].get(gen, [0.0, 0])[0] for r in rounds]),
                     f"{summary([r['gc'].get(gen, [0.0, 0])[1] / args.window for r in rounds])['median']:.2f}"])
    if args.json:
        dump_json({"node": args.node, "warmup_s": args.warmup, "window_s": args.window, "rounds": rounds,
                   "machine": machine()})
        return
    print_table(f"gpuscope's CPU by part, {args.node} node, {args.rounds} rounds, {args.window:g} s after "
                f"{args.warmup:g} s; ms of CPU per second, median (range)",
                ["part", "ms/s", "calls/s"], rows)
    print("load average before each round: " + ", ".join(f"{r['load']:.2f}" for r in rounds))
    print("machine: " + ", ".join(f"{k} {v}" for k, v in machine().items()))


# -- inside the console's process -----------------------------------------------------------------

def inside(result_path: str, warmup: float, window: float, console_args: list[str]) -> int:
    import gc
    import threading

    spent: dict[str, list[float]] = {label: [0.0, 0] for *_, label in PARTS}
    measuring = threading.Event()

    def timed(function, label):
        def part(*args, **kwargs):
            if not measuring.is_set():
                return function(*args, **kwargs)
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                record = spent[label]
                record[0] += time.thread_time() - started
                record[1] += 1
        return part

    for module, cls, method, label in PARTS:
        owner = getattr(importlib.import_module(module), cls)
        if method not in vars(owner):
            raise SystemExit(f"{module}.{cls}.{method} is gone: update PARTS in {__file__}")
        setattr(owner, method, timed(vars(owner)[method], label))

    collected: dict[str, list[float]] = {}
    gc_started = [0.0]

    def gc_pass(phase, info):
        if not measuring.is_set():
            return
        if phase == "start":
            gc_started[0] = time.thread_time()
        else:
            record = collected.setdefault(str(info["generation"]), [0.0, 0])
            record[0] += time.thread_time() - gc_started[0]
            record[1] += 1

    gc.callbacks.append(gc_pass)

    def thread_times() -> dict[str, float]:
        times = {}
        for thread in threading.enumerate():
            try:
                times[thread.name] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, TypeError):
                pass  # ended meanwhile
        return times

    from gpuscope import cli
    from gpuscope.tui.app import GpuScopeApp

    run = GpuScopeApp.run

    def run_measured(self, **kwargs):
        async def measure(pilot):  # noqa: ARG001 - Textual's auto pilot signature
            import asyncio

            await asyncio.sleep(warmup)
            threads0, process0 = thread_times(), time.process_time()
            measuring.set()
            await asyncio.sleep(window)
            measuring.clear()
            process, threads1 = time.process_time() - process0, thread_times()
            per_s = 1000.0 / window
            figures = {
                "process": process * per_s,
                "threads": {name: (t - threads0[name]) * per_s for name, t in threads1.items() if name in threads0},
                "parts": {label: [s * per_s, n / window] for label, (s, n) in spent.items()},
                "gc": {gen: [s * per_s, n] for gen, (s, n) in collected.items()},
            }
            partial = result_path + ".part"
            with open(partial, "w") as out:
                json.dump(figures, out)
            os.replace(partial, result_path)
            self.exit()

        return run(self, auto_pilot=measure, **kwargs)

    GpuScopeApp.run = run_measured
    return cli.main(console_args)


if __name__ == "__main__":
    run_script(main)
