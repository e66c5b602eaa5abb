"""How long gpuscope takes to start, headless and as a console.

What it measures, and how:

(a) Headless commands.
    - `gpuscope --help`: wall clock of `subprocess.run` (time.perf_counter around it), N=10 runs
      (`--help-runs`); median and min.
    - `gpuscope ps --json`: the same, N=5 (`--ps-runs`). Note that `ps` samples twice, 0.5 s apart
      (CPU % needs two looks), so ~0.5 s of it is a deliberate sleep.
    - Imports: a fresh interpreter runs `gpuscope.cli.main([...])` (stdout/stderr swallowed) and
      reports how many modules sys.modules holds before and after, and whether textual, rich,
      plotext, torch or gpuscope.tui were imported (target: none of them).
      Also `python -X importtime -c "import gpuscope.cli"`: cumulative import time of gpuscope.cli.

(b) Time to first frame of the console.
    A small idle Python child is spawned. For each of N=5 starts (`--console-runs`): a private tmux
    server (own socket and config: status off, remain-on-exit on) is started with a 120x40 window
    running a placeholder (`sleep`), so the tmux server's own start is not timed. Then the clock
    starts and `tmux respawn-pane -k` replaces the placeholder with `gpuscope --pid <child>`;
    `tmux capture-pane -p` is polled every 10 ms until the screen shows both the child's PID as the
    first word of a line (its row in the process table) and a line starting with `HOST` (the host
    memory line). Also recorded: the first poll at which anything at all is on screen, and how
    long `q` takes to end the console. Each run is ended with `tmux send-keys q`, then kill-server.
    Resolution is the polling period plus one `tmux capture-pane` call (a few ms).

Run:  .venv/bin/python benchmarks/startup.py [--json] [--help-runs 10] [--ps-runs 5] [--console-runs 5]
Everything started (tmux servers, the child, gpuscope) is killed on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _harness import (
    IDLER,
    Cleanup,
    dump_json,
    gpuscope_cmd,
    install_signal_handlers,
    machine,
    print_table,
    quote,
    run_script,
    summary,
    wait_until,
)

FORBIDDEN = ("textual", "rich", "plotext", "torch", "gpuscope.tui")
POLL_S = 0.010


def time_command(cmd: list[str], runs: int) -> dict[str, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
        if out.returncode != 0:
            raise RuntimeError(f"{quote(cmd)} exited {out.returncode}: {out.stderr.decode()[-500:]}")
    return summary(times)


def modules_after(argv: list[str]) -> dict[str, object]:
    """Modules a fresh interpreter holds after `gpuscope.cli.main(argv)`."""
    probe = f"""
import sys
before = len(sys.modules)
import contextlib, io, json
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        from gpuscope.cli import main
        main({argv!r})
    except SystemExit:
        pass
names = set(sys.modules)
print(json.dumps({{"before": before, "after": len(names),
                  "gpuscope_modules": sorted(n for n in names if n.startswith("gpuscope")),
                  "forbidden_loaded": [m for m in {FORBIDDEN!r} if m in names]}}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"module probe failed: {out.stderr[-500:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["added"] = data["after"] - data["before"]
    return data


def import_time_us(module: str) -> int | None:
    """Cumulative import time of `module` (µs) from -X importtime; one run, indicative only."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                         capture_output=True, text=True, timeout=120)
    for line in out.stderr.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1])
    return None


def console_first_frame(cleanup: Cleanup, runs: int, timeout: float) -> dict[str, object]:
    child = cleanup.spawn_python(IDLER)
    pid = str(child.pid)
    cmd = quote(gpuscope_cmd() + ["--pid", pid])
    first_paint, first_frame, quit_s = [], [], []
    for _ in range(runs):
        tmux = cleanup.tmux("sleep 3600")
        wait_until(lambda: tmux.pane_pid(), timeout=10, interval=POLL_S, what="the tmux placeholder")
        painted = None
        t0 = time.perf_counter()
        tmux.respawn(cmd)
        deadline = t0 + timeout
        while True:
            screen = tmux.screen()
            now = time.perf_counter() - t0
            lines = [ln.strip() for ln in screen.splitlines()]
            if painted is None and any(lines):
                painted = now
            if any(ln.split()[:1] == [pid] for ln in lines) and any(ln.startswith("HOST") for ln in lines):
                break
            if tmux.dead():
                raise RuntimeError("gpuscope exited before its first frame:\n" + screen)
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no first frame within {timeout:g} s; screen:\n{screen}")
            time.sleep(POLL_S)
        first_frame.append(now)
        first_paint.append(painted if painted is not None else now)
        q = tmux.quit("q")
        if q is not None:
            quit_s.append(q)
        tmux.close()
    return {
        "command": cmd,
        "first_paint_s": summary(first_paint),
        "first_frame_s": summary(first_frame),
        "quit_s": summary(quit_s) if quit_s else None,
        "quit_failures": runs - len(quit_s),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--help-runs", type=int, default=10, metavar="N", help="runs of `gpuscope --help` (default 10)")
    ap.add_argument("--ps-runs", type=int, default=5, metavar="N", help="runs of `gpuscope ps --json` (default 5)")
    ap.add_argument("--console-runs", type=int, default=5, metavar="N", help="console starts (default 5)")
    ap.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds to wait for one first frame")
    args = ap.parse_args(argv)
    install_signal_handlers()

    gp = gpuscope_cmd()
    result: dict[str, object] = {"machine": machine(), "gpuscope": quote(gp)}
    with Cleanup() as cleanup:
        result["help"] = time_command(gp + ["--help"], args.help_runs)
        result["ps_json"] = time_command(gp + ["ps", "--json"], args.ps_runs)
        result["python_bare"] = time_command([sys.executable, "-c", "pass"], args.help_runs)
        result["imports_help"] = modules_after(["--help"])
        result["imports_ps_json"] = modules_after(["ps", "--json"])
        result["import_gpuscope_cli_us"] = import_time_us("gpuscope.cli")
        result["console"] = console_first_frame(cleanup, args.console_runs, args.timeout)

    if args.json:
        dump_json(result)
        return 0

    def ms(s: dict[str, float]) -> list[str]:
        return [f"{1000 * s['median']:.0f}", f"{1000 * s['min']:.0f}", f"{1000 * s['max']:.0f}", str(s["n"])]

    c = result["console"]
    rows = [
        ["python -c pass (baseline)", *ms(result["python_bare"])],
        ["gpuscope --help", *ms(result["help"])],
        ["gpuscope ps --json (incl. 0.5 s sample gap)", *ms(result["ps_json"])],
        ["console: first paint", *ms(c["first_paint_s"])],
        ["console: first frame (child row + HOST line)", *ms(c["first_frame_s"])],
    ]
    if c["quit_s"]:
        rows.append(["console: q to exit", *ms(c["quit_s"])])
    print_table("Startup (wall clock, ms)", ["", "median", "min", "max", "N"], rows)
    print()
    irows = []
    for label, key in (("gpuscope --help", "imports_help"), ("gpuscope ps --json", "imports_ps_json")):
        d = result[key]
        irows.append([label, d["before"], d["after"], d["added"], len(d["gpuscope_modules"]),
                      ",".join(d["forbidden_loaded"]) or "none"])
    print_table("Modules (sys.modules after gpuscope.cli.main(argv))",
                ["", "at start", "after", "added", "gpuscope.*", "textual/rich/plotext/torch/tui"], irows)
    print()
    us = result["import_gpuscope_cli_us"]
    print(f"import gpuscope.cli (-X importtime, cumulative): {us / 1000:.1f} ms" if us else "import time: n/a")
    if c["quit_failures"]:
        print(f"warning: {c['quit_failures']} console run(s) did not exit on q within 10 s (killed)")
    m = result["machine"]
    print(f"machine: {m['cpus']} CPUs, Python {m['python']}, textual {m['textual']}, kernel {m.get('kernel')}")
    return 0


if __name__ == "__main__":
    run_script(main)
