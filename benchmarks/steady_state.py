"""CPU and terminal traffic of the console at steady state, beside htop at the same refresh.

What it measures, and how:

For each tool (gpuscope, then htop, one after the other in the same invocation; `--only` picks one)
a private tmux server (own socket and config: status off, remain-on-exit on) opens a 120x40 window
running the tool under util-linux `script -q -f -c "<command>" <typescript>`, which copies every
byte the tool writes to its terminal into the typescript file (flushed at each write):

    gpuscope:  gpuscope --refresh 1 --pid <child>   (child: a Python process that leaks ~1 MB/s,
                                                     bounded at --leak-mb, default 300 MB)
    htop:      htop -d 10                           (tenths of a second: 1 s, as gpuscope's refresh)

The same leaking child runs (a fresh one per tool) while htop is measured, so both see the same
machine. htop runs with HTOPRC pointing at an empty temporary file: default settings, and the
user's ~/.config/htop/htoprc is neither read nor written. Both see TERM=xterm-256color and no
COLORTERM (256 colours).

After a warm-up (`--warmup`, default 10 s) the window starts (`--seconds`, default 30 s):
  - terminal bytes: growth of the typescript file over the window;
  - CPU seconds: growth of utime+stime of the measured process (the tool itself, found below
    `script`), plus its reaped children (cutime+cstime) and its live descendants, from psutil;
    CPU % is CPU seconds / wall seconds (100 % = one core);
  - RSS of the measured process at the end of the window.
Also reported, for context: CPU seconds of the `script` relay and of the tmux server over the window
(both grow with the bytes written).

`--rows` adds a rough breakdown of the window's bytes by screen row (cursor-positioning sequences
are followed; approximate), with a sample of the text written there, to see what is repainted.
`--keep DIR` keeps the typescripts, with `script -T` timing files (the delay and size of each write):
`scriptreplay -t DIR/gpuscope.timing DIR/gpuscope.typescript` replays the session.

Run:  .venv/bin/python benchmarks/steady_state.py [--json] [--seconds 30] [--warmup 10]
                                                  [--only gpuscope|htop] [--rows] [--keep DIR]
Everything started (tmux servers, script, the tools, the children) is killed on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import re
import shutil
import time
from collections import defaultdict
from pathlib import Path

import psutil

from _harness import (
    HEIGHT,
    LEAKER,
    Cleanup,
    dump_json,
    gpuscope_cmd,
    install_signal_handlers,
    machine,
    print_table,
    quote,
    run_script,
    require_tool,
    wait_until,
)

TOOLS = ("gpuscope", "htop")


def cpu_total(proc: psutil.Process) -> float:
    """utime+stime of proc, of its reaped children, and of its live descendants (seconds)."""
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def own_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.NoSuchProcess:
        return 0.0


def find_measured(script_pid: int, tool: str) -> psutil.Process:
    """The tool's own process: the topmost descendant of `script` that is the tool."""

    def match() -> psutil.Process | None:
        try:
            for p in psutil.Process(script_pid).children(recursive=True):  # breadth first
                try:
                    cmd = p.cmdline()
                    name = p.name()
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    continue
                if tool == "htop" and name == "htop":
                    return p
                if tool == "gpuscope" and any(Path(a).name == "gpuscope" or a == "gpuscope" for a in cmd[:3]):
                    return p
                if tool == "nvitop" and any(Path(a).name == "nvitop" or a == "nvitop" for a in cmd[:3]):
                    return p
        except psutil.NoSuchProcess:
            raise RuntimeError(f"`script` (PID {script_pid}) exited: is util-linux script installed?") from None
        return None

    return wait_until(match, timeout=30, interval=0.05, what=f"the {tool} process under script")


CSI = re.compile(rb"\x1b\[([0-9;?<=>]*)([ -/]*)([@-~])")


def rows_breakdown(data: bytes, height: int = HEIGHT) -> dict[str, object]:
    """Bytes written per screen row (approximate: follows CUP/VPA/CUU/CUD and newlines)."""
    per_row: dict[int, int] = defaultdict(int)
    text: dict[int, list[str]] = defaultdict(list)
    row, i, n = 1, 0, len(data)
    sync_frames = data.count(b"\x1b[?2026h")
    while i < n:
        b = data[i]
        if b == 0x1B:
            m = CSI.match(data, i)
            if m:
                params, final = m.group(1), m.group(3)
                nums = [int(x) if x.isdigit() else 0 for x in params.split(b";")] if params and params[:1].isdigit() else []
                first = nums[0] if nums and nums[0] else 1
                if final in (b"H", b"f"):
                    row = first
                elif final == b"d":
                    row = first
                elif final in (b"A", b"F"):
                    row = max(1, row - first)
                elif final in (b"B", b"E"):
                    row = min(height, row + first)
                per_row[row] += m.end() - i
                i = m.end()
                continue
            per_row[row] += 1
            i += 1
            continue
        if b == 0x0A:
            row = min(height, row + 1)
        per_row[row] += 1
        if b >= 0x20:
            # decode a run of printable bytes for the sample text
            j = i
            while j < n and data[j] >= 0x20 and data[j] != 0x7F:
                j += 1
            chunk = data[i:j].decode("utf-8", "replace")
            text[row].append(chunk)
            per_row[row] += j - i - 1
            i = j
            continue
        i += 1
    rows = sorted(per_row.items(), key=lambda kv: -kv[1])
    return {
        "sync_frames": sync_frames,
        "rows": [{"row": r, "bytes": b, "text": " ".join("".join(text[r]).split())[:70]} for r, b in rows],
    }


def measure(tool: str, cleanup: Cleanup, args: argparse.Namespace) -> dict[str, object]:
    leaker = cleanup.spawn_python(LEAKER, str(args.leak_mb))
    typescript = cleanup.tmpdir / f"{tool}.typescript"
    if tool == "gpuscope":
        inner = quote(gpuscope_cmd() + ["--refresh", "1", "--pid", str(leaker.pid)])
        prefix: list[str] = []
    else:
        inner = quote([require_tool("htop"), "-d", "10"])
        htoprc = cleanup.tmpdir / "htoprc"
        htoprc.write_text("")
        prefix = ["env", f"HTOPRC={htoprc}"]
    timing = cleanup.tmpdir / f"{tool}.timing"
    # with --keep, also a timing file (`script -T`: delay and size of each write) to replay or split by tick
    log_timing = ["-T", str(timing)] if args.keep else []
    pane = quote(prefix + [require_tool("script"), "-q", "-f", *log_timing, "-c", inner, str(typescript)])
    tmux = cleanup.tmux(pane, name=tool)
    try:
        script_pid = wait_until(lambda: tmux.pane_pid(), timeout=10, interval=0.05, what="the pane")
        proc = find_measured(script_pid, tool)
        wait_until(lambda: typescript.exists() and typescript.stat().st_size > 0, timeout=30, interval=0.05,
                 what=f"{tool} to write to the terminal")
        time.sleep(args.warmup)
        if not proc.is_running() or tmux.dead():
            raise RuntimeError(f"{tool} exited during warm-up; screen:\n{tmux.screen()}")

        size0, cpu0, t0 = typescript.stat().st_size, cpu_total(proc), time.perf_counter()
        relay0, server0 = own_cpu(script_pid), own_cpu(tmux.server_pid)
        time.sleep(args.seconds)
        size1, cpu1, t1 = typescript.stat().st_size, cpu_total(proc), time.perf_counter()
        relay1, server1 = own_cpu(script_pid), own_cpu(tmux.server_pid)
        rss = proc.memory_info().rss
        if not proc.is_running() or tmux.dead():
            raise RuntimeError(f"{tool} exited during the window; screen:\n{tmux.screen()}")
        screen = tmux.screen()
        wall = t1 - t0
        result: dict[str, object] = {
            "command": inner,
            "pid": proc.pid,
            "wall_s": wall,
            "cpu_s": cpu1 - cpu0,
            "cpu_percent": 100 * (cpu1 - cpu0) / wall,
            "bytes": size1 - size0,
            "bytes_per_s": (size1 - size0) / wall,
            "rss_bytes": rss,
            "script_cpu_s": relay1 - relay0,
            "tmux_server_cpu_s": server1 - server0,
            "leaker_rss_bytes": psutil.Process(leaker.pid).memory_info().rss,
            "screen_ok": (any(ln.strip().startswith("HOST") for ln in screen.splitlines())
                          and str(leaker.pid) in screen) if tool == "gpuscope" else bool(screen.strip()),
        }
        if args.rows:
            with typescript.open("rb") as f:
                f.seek(size0)
                result["rows"] = rows_breakdown(f.read(size1 - size0))
        result["quit_s"] = tmux.quit("q")
        return result
    finally:
        tmux.close()
        if args.keep:
            keep = Path(args.keep)
            keep.mkdir(parents=True, exist_ok=True)
            for path in (typescript, timing):
                if path.exists():
                    shutil.copy(path, keep / path.name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the measured window (default 30)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before the window starts (default 10)")
    ap.add_argument("--only", choices=TOOLS, help="measure only this tool")
    ap.add_argument("--leak-mb", type=int, default=300, help="the child's leak stops at this many MB (default 300)")
    ap.add_argument("--rows", action="store_true", help="also break the window's bytes down by screen row")
    ap.add_argument("--keep", metavar="DIR", help="copy the typescripts (and timing files) into DIR")
    args = ap.parse_args(argv)
    install_signal_handlers()
    require_tool("tmux")
    require_tool("script")
    tools = [args.only] if args.only else list(TOOLS)
    if "htop" in tools:
        require_tool("htop")

    result: dict[str, object] = {"machine": machine(), "warmup_s": args.warmup, "seconds": args.seconds,
                                 "load_before": list(psutil.getloadavg())}
    with Cleanup() as cleanup:
        for tool in tools:
            result[tool] = measure(tool, cleanup, args)
    result["load_after"] = list(psutil.getloadavg())
    g, h = result.get("gpuscope"), result.get("htop")
    if g and h:
        result["ratio"] = {
            "cpu": g["cpu_s"] / h["cpu_s"] if h["cpu_s"] else None,
            "bytes": g["bytes"] / h["bytes"] if h["bytes"] else None,
        }

    if args.json:
        dump_json(result)
        return 0

    rows = []
    for tool in tools:
        r = result[tool]
        rows.append([tool, f"{r['cpu_s']:.2f}", f"{r['cpu_percent']:.1f}", f"{r['bytes']:,}",
                     f"{r['bytes_per_s']:,.0f}", f"{r['rss_bytes'] / 2**20:.1f}",
                     f"{r['script_cpu_s'] + r['tmux_server_cpu_s']:.2f}"])
    if "ratio" in result:
        ratio = result["ratio"]
        fmt = lambda v: "n/a" if v is None else f"{v:.2f}x"  # noqa: E731
        rows.append(["gpuscope/htop", fmt(ratio["cpu"]), fmt(ratio["cpu"]), fmt(ratio["bytes"]),
                     fmt(ratio["bytes"]), "", ""])
    print_table(f"Steady state, 120x40, refresh 1 s, {args.seconds:g} s window after {args.warmup:g} s warm-up",
                ["", "CPU s", "CPU %", "term bytes", "bytes/s", "RSS MiB", "script+tmux CPU s"], rows)
    for tool in tools:
        r = result[tool]
        if not r["screen_ok"]:
            print(f"warning: {tool}'s screen did not look right at the end of the window")
        if r.get("quit_s") is None:
            print(f"warning: {tool} did not exit on q within 10 s (killed)")
    if args.rows:
        for tool in tools:
            rb = result[tool]["rows"]
            print()
            extra = f", {rb['sync_frames']} synchronized-output frames" if rb["sync_frames"] else ""
            print_table(f"{tool}: bytes by screen row (approximate{extra})", ["row", "bytes", "text written there"],
                        [[r["row"], f"{r['bytes']:,}", r["text"]] for r in rb["rows"][:12]])
    m = result["machine"]
    print()
    print(f"machine: {m['cpus']} CPUs, Python {m['python']}, textual {m['textual']}, kernel {m.get('kernel')}; "
          f"load avg before/after {result['load_before'][0]:.2f}/{result['load_after'][0]:.2f}")
    return 0


if __name__ == "__main__":
    run_script(main)
