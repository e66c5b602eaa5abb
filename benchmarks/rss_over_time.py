"""The console's own RSS over a long run: it should stay flat.

What it measures, and how:

gpuscope runs in a private 120x40 tmux window at `--refresh 0.5` (twice the default rate, so a
leak per tick shows twice as fast), on the fake NVML's big node (8 GPUs x 25 processes: the
leaking child and 199 idle `sleep` processes, as in side_by_side.py; `--node churn`: one GPU, 300
idle processes and ten new ones a second, every one watched), attached to the leaking child. Its
RSS (psutil, the gpuscope process itself) is printed at each of `--at` minutes (default 1, 5 and
10), with the growth since the first reading and the load average.

Run:  .venv/bin/python benchmarks/rss_over_time.py [--at 1,5,10] [--refresh 0.5] [--node small|big|churn]
Everything started is killed on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import time

import psutil

from _harness import Cleanup, install_signal_handlers, quote, run_script, wait_until
from side_by_side import on_fake_nvml, start_node


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--at", default="1,5,10", help="minutes at which to read the RSS (default 1,5,10)")
    ap.add_argument("--refresh", type=float, default=0.5, help="the console's refresh in seconds (default 0.5)")
    ap.add_argument("--node", choices=("small", "big", "churn"), default="big")
    args = ap.parse_args(argv)
    marks = sorted(float(m) for m in args.at.split(","))
    install_signal_handlers()
    with Cleanup() as cleanup:
        leaker = start_node(args.node, cleanup)
        command = quote([*on_fake_nvml(cleanup), sys.executable, "-m", "gpuscope",
                         "--refresh", str(args.refresh), "--pid", str(leaker.pid)])
        tmux = cleanup.tmux(command, name="rss")
        started = time.perf_counter()
        pane = psutil.Process(wait_until(lambda: tmux.pane_pid(), timeout=10, interval=0.05, what="the pane"))
        # `env` becomes the console (exec): the pane's own process, once its command line says so
        wait_until(lambda: "gpuscope" in pane.cmdline(), timeout=30, interval=0.05, what="gpuscope to start")
        proc = pane
        print(f"gpuscope --refresh {args.refresh:g} on the {args.node} node; RSS of the console itself", flush=True)
        first = None
        for minute in marks:
            time.sleep(max(0.0, started + 60 * minute - time.perf_counter()))
            if not proc.is_running() or tmux.dead():
                raise RuntimeError(f"gpuscope exited; screen:\n{tmux.screen()}")
            rss = proc.memory_info().rss / 2**20
            first = rss if first is None else first
            print(f"  {minute:g} min: RSS {rss:.1f} MiB ({rss - first:+.1f} MiB since {marks[0]:g} min); "
                  f"load avg {psutil.getloadavg()[0]:.2f}", flush=True)
        tmux.quit("q")
    return 0


if __name__ == "__main__":
    run_script(main)
