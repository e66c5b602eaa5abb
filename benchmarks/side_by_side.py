"""gpuscope beside nvitop and htop: CPU and terminal bytes from the first second, on three node shapes.

What it measures, and how:

Each tool runs in its own private tmux window of 120x40 under util-linux `script` (as in
steady_state.py: every byte the tool writes to its terminal lands in a typescript file), at a 1 s
refresh, on a node played by the project's fake `pynvml` (tests/support/fake_nvml: the real nvidia-ml-py
binding over a fake driver library), which gpuscope and nvitop both load unchanged:

    gpuscope:  python -m gpuscope --refresh 1 --pid <leaking child>
    nvitop:    python -m nvitop --interval 1          (monitor mode, its defaults otherwise)
    htop:      htop -d 10                             (HTOPRC: an empty file, default settings)

Node shapes (`--node`):
    small   1 GPU; its only process is the leaking child (GPU memory = its RSS)
    big     8 GPUs x 25 processes = 200 GPU processes: the leaking child on GPU 0 and 199 idle
            `sleep` processes, each with a fixed share of GPU memory
    churn   a busy node: 1 GPU (the leaking child), 300 idle `sleep` processes beside it, and
            ~10 short-lived processes a second (a shell starting ten `sleep 0.2` each second, as
            a test suite or a build does): every one of them is a new process to each tool

Rounds are interleaved (round 1: gpuscope, nvitop, htop; round 2: the same ...), so a change in
the machine's load spreads over all tools. For each run:
    first frame: seconds from the pane's start until the screen shows the node (gpuscope: its
                 HOST line and the child's PID; nvitop: the child's PID; htop: its CPU meters);
    start:       CPU % and terminal bytes over the first `--start` seconds (default 30);
    steady:      CPU % and terminal bytes over `--seconds` (default 30) after `--warmup` (default
                 40) seconds from the start;
    RSS at the end, and the 1-minute load average before and after the run.
Each figure is printed as the median and the range over the rounds: on a shared machine the
spread is part of the answer. CPU % is the tool's own utime+stime (and its children's) over wall
time (100 % = one core).

Run:  .venv/bin/python benchmarks/side_by_side.py [--node small|big|churn|all] [--rounds 3]
          [--warmup 40] [--seconds 30] [--start 30] [--only gpuscope,nvitop] [--json]
Everything started is killed on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import psutil

from _harness import (
    FAKE_NVML_DIR,
    LEAKER,
    ROOT,
    Cleanup,
    dump_json,
    install_signal_handlers,
    machine,
    print_table,
    quote,
    require_tool,
    run_script,
    spread,
    wait_until,
)
from steady_state import cpu_total, find_measured

FAKE_NVML = FAKE_NVML_DIR
TOOLS = ("gpuscope", "nvitop", "htop")
NODES = ("small", "big", "churn")
CHURN_IDLE = 300
# Ten processes of 0.2 s started each second, for as long as the benchmark runs.
CHURN_LOOP = "while :; do for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.2 & done; sleep 1; wait; done"
GIB = 1 << 30


def scenario(node: str, leaker: int, idlers: list[int]) -> dict:
    gpu = {"name": "NVIDIA H200", "total": 141 * GIB, "util": 37, "temp": 51, "graphics": []}
    if node in ("small", "churn"):
        return {"devices": [dict(gpu, uuid="GPU-0", compute=[{"pid": leaker, "used": "rss"}])]}
    pids = [leaker, *idlers]
    per_gpu = len(pids) // 8
    devices = []
    for index in range(8):
        mine = pids[index * per_gpu:(index + 1) * per_gpu]
        devices.append(dict(gpu, uuid=f"GPU-{index}", util=10 * index, compute=[
            {"pid": pid, "used": "rss" if pid == leaker else (1 + n % 7) * GIB // 4} for n, pid in enumerate(mine)]))
    return {"devices": devices}


def start_node(node: str, cleanup: Cleanup, leak_mb: int = 300) -> subprocess.Popen:
    """The node's processes (the leaking child; on the big node 199 idle ones beside it, on the
    churning node 300 and a stream of short-lived ones) and the fake NVML's scenario for them
    (`cleanup.tmpdir / "nvml.json"`); returns the leaking child."""
    leaker = cleanup.spawn_python(LEAKER, str(leak_mb))
    idlers = [cleanup.popen(["sleep", "100000"]).pid for _ in range(199)] if node == "big" else []
    if node == "churn":
        for _ in range(CHURN_IDLE):
            cleanup.popen(["sleep", "100000"])
        cleanup.popen(["sh", "-c", CHURN_LOOP])
    (cleanup.tmpdir / "nvml.json").write_text(json.dumps(scenario(node, leaker.pid, idlers)))
    return leaker


def on_fake_nvml(cleanup: Cleanup) -> list[str]:
    """`env` with the fake binding first, then this tree's gpuscope (so a copy of the tree measures
    itself), reading the scenario `start_node` wrote."""
    path = os.pathsep.join([str(FAKE_NVML), str(ROOT)])
    return ["env", f"PYTHONPATH={path}", f"GPUSCOPE_FAKE_NVML={cleanup.tmpdir / 'nvml.json'}"]


def command(tool: str, leaker: int, cleanup: Cleanup) -> str:
    if tool == "htop":
        htoprc = cleanup.tmpdir / "htoprc"
        htoprc.write_text("")
        return quote(["env", f"HTOPRC={htoprc}", require_tool("htop"), "-d", "10"])
    if tool == "gpuscope":
        args = [sys.executable, "-m", "gpuscope", "--refresh", "1", "--pid", str(leaker)]
    else:
        args = [sys.executable, "-m", "nvitop", "--interval", "1"]
    return quote([*on_fake_nvml(cleanup), *args])


def node_shown(tool: str, screen: str, leaker: int) -> bool:
    lines = screen.splitlines()
    if tool == "gpuscope":
        return any(ln.strip().startswith("HOST") for ln in lines) and str(leaker) in screen
    if tool == "nvitop":
        return str(leaker) in screen
    return "Load average" in screen


def run_once(tool: str, node: str, cleanup: Cleanup, args: argparse.Namespace, leaker: int) -> dict:
    typescript = cleanup.tmpdir / f"{tool}-{node}-{time.monotonic_ns()}.typescript"
    pane = quote([require_tool("script"), "-q", "-f", "-c", command(tool, leaker, cleanup), str(typescript)])
    load_before = psutil.getloadavg()[0]
    started = time.perf_counter()
    tmux = cleanup.tmux(pane, name=tool)
    try:
        script_pid = wait_until(lambda: tmux.pane_pid(), timeout=10, interval=0.02, what="the pane")
        proc = find_measured(script_pid, tool)
        wait_until(lambda: node_shown(tool, tmux.screen(), leaker), timeout=60, interval=0.05,
                 what=f"{tool} to show the node")
        first_frame = time.perf_counter() - started

        def at(seconds: float) -> tuple[float, int]:
            time.sleep(max(0.0, started + seconds - time.perf_counter()))
            if not proc.is_running() or tmux.dead():
                raise RuntimeError(f"{tool} exited; screen:\n{tmux.screen()}")
            return cpu_total(proc), typescript.stat().st_size

        cpu_start, bytes_start = at(args.start)
        cpu0, bytes0 = at(args.warmup)
        cpu1, bytes1 = at(args.warmup + args.seconds)
        rss = proc.memory_info().rss
        return {
            "first_frame_s": first_frame,
            "start_cpu_percent": 100 * cpu_start / args.start,  # from 0: the process started with the pane
            "start_bytes": bytes_start,
            "cpu_percent": 100 * (cpu1 - cpu0) / args.seconds,
            "bytes": bytes1 - bytes0,
            "rss_mib": rss / 2**20,
            "load_before": load_before,
            "load_after": psutil.getloadavg()[0],
        }
    finally:
        tmux.quit("q", timeout=5)
        tmux.close()
        typescript.unlink(missing_ok=True)


def measure_node(node: str, tools: list[str], cleanup: Cleanup, args: argparse.Namespace) -> dict:
    leaker = start_node(node, cleanup, args.leak_mb)
    runs: dict[str, list[dict]] = {tool: [] for tool in tools}
    for round_ in range(args.rounds):
        for tool in tools:
            print(f"  {node} node, round {round_ + 1}/{args.rounds}: {tool} ...", file=sys.stderr, flush=True)
            runs[tool].append(run_once(tool, node, cleanup, args, leaker.pid))
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--node", choices=(*NODES, "all"), default="all")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per tool (default 3)")
    ap.add_argument("--warmup", type=float, default=40.0, help="seconds before the steady window (default 40)")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the steady window (default 30)")
    ap.add_argument("--start", type=float, default=30.0, help="length of the start window (default 30)")
    ap.add_argument("--only", help="comma-separated tools among gpuscope,nvitop,htop (default: all)")
    ap.add_argument("--leak-mb", type=int, default=300, help="the child's leak stops at this many MB (default 300)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args(argv)
    if args.start > args.warmup:
        ap.error("--start must not be longer than --warmup")
    tools = args.only.split(",") if args.only else list(TOOLS)
    if unknown := set(tools) - set(TOOLS):
        ap.error(f"unknown tool(s): {', '.join(sorted(unknown))}")
    install_signal_handlers()
    for tool in ("tmux", "script", *(["htop"] if "htop" in tools else [])):
        require_tool(tool)
    if "nvitop" in tools:
        try:
            import nvitop  # noqa: F401, PLC0415
        except ImportError:
            raise SystemExit("benchmark needs nvitop in this interpreter (pip install nvitop)") from None

    nodes = list(NODES) if args.node == "all" else [args.node]
    result: dict[str, object] = {"machine": machine(), "rounds": args.rounds, "warmup_s": args.warmup,
                                 "seconds": args.seconds, "start_s": args.start, "nodes": {}}
    with Cleanup() as cleanup:
        for node in nodes:
            result["nodes"][node] = measure_node(node, tools, cleanup, args)
    if args.json:
        dump_json(result)
        return 0
    for node in nodes:
        runs = result["nodes"][node]
        rows = []
        for tool in tools:
            r = runs[tool]
            rows.append([
                tool,
                spread([x["first_frame_s"] for x in r], ".2f"),
                spread([x["start_cpu_percent"] for x in r], ".1f"),
                spread([x["start_bytes"] / 1000 for x in r], ".1f"),
                spread([x["cpu_percent"] for x in r], ".1f"),
                spread([x["bytes"] / 1000 for x in r], ".1f"),
                spread([x["rss_mib"] for x in r], ".0f"),
                spread([x["load_before"] for x in r], ".2f"),
            ])
        shape = {"small": "1 GPU, the leaking child", "big": "8 GPUs x 25 processes",
                 "churn": f"1 GPU, {CHURN_IDLE} idle processes, ~10 new ones a second"}[node]
        print_table(f"{node} node ({shape}); 120x40, 1 s refresh; median (min-max) of {args.rounds} interleaved rounds",
                    ["", "first frame s", f"CPU % first {args.start:g} s", f"KB first {args.start:g} s",
                     "CPU % steady", f"KB / {args.seconds:g} s steady", "RSS MiB", "load avg"], rows)
        print()
    m = result["machine"]
    print(f"machine: {m['cpus']} CPUs, Python {m['python']}, textual {m['textual']}, kernel {m.get('kernel')}; "
          f"steady window {args.seconds:g} s after a {args.warmup:g} s warm-up; 'load avg' is the 1-minute "
          f"load average when each run started")
    return 0


if __name__ == "__main__":
    run_script(main)
