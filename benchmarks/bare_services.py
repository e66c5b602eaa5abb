"""The diagnosis of services started bare, as in production: right verdicts, the leaking function
first, no false leak, fast leaks decided within 10 s, and what it costs the service.

Each service (the set `tests/integration/test_diagnose_bare.py` defines: a full LRU cache, a
neighbour building and dropping ~40 MB a second with and without a leak beside it, a slow leak
among big temporaries, FAISS leaking and fixed, 5 MB/s leaks) runs from an environment without
memray or gpuscope, and is diagnosed by PID with `gpuscope diagnose --pid P --json`, two at a
time: at the default duration, then the fast leaks at `--duration 10`. gpuscope brings its
probe in (sys.remote_exec on 3.14+, gdb after the throwaway check before); where this machine
refuses that (the throwaway check fails), the services start with the probe instead
(`gpuscope run`), said in the output.

Then a busy service that does not leak (each request allocates and frees ~2 MB; glibc's mmap
threshold raised at its start, as a first free of a big buffer raises it, so that the tracker
does not change its allocator's behaviour mid-run), with its libraries loaded (asyncio,
http.server, numpy, faiss, tokenizers, langchain-core), counts its requests: its requests/s
undisturbed, while diagnosed at the default duration, and its RSS floor (the least of 5 s of
samples) before and after: what the diagnosis left in it. The same service importing nothing else
is measured beside it: there the probe's and memray's own imports are the service's first.

    .venv/bin/python benchmarks/bare_services.py [--json]

Targets: every verdict right and the leaking function first at the default duration, no false
leak; every leak of 5 MB/s or more named at --duration 10; requests/s while diagnosed >= 75 % of
before; <= 2 MB left in the service afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import venv
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from _harness import print_table, run_script  # noqa: E402
from test_diagnose_bare import SERVICES  # noqa: E402

from gpuscope.core.target import privilege  # noqa: E402
from gpuscope.core.target.interpreter import Interpreter, injection_debugger  # noqa: E402

GPUSCOPE = [sys.executable, "-m", "gpuscope"]
DEFAULT = ["lru-cache", "slow-leak", "neighbour", "neighbour-and-leak", "faiss", "faiss-fixed"]
SHORT = ["fast-leak", "faiss-untracked"]

BUSY = """
import os, sys, time
counter = sys.argv[1]
warm = bytearray(2_000_000); del warm  # glibc's mmap threshold raised now, not by the first tracker
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


def bare_python(folder: Path) -> Path:
    """A venv whose site-packages links this one's packages, except memray and gpuscope."""
    venv.create(folder, with_pip=False)
    python = folder / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=30, check=True)
    theirs = Path(out.stdout.strip())
    hidden = ("memray", "gpuscope", "_editable_impl_gpuscope")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if entry.suffix == ".pth" or name.startswith(hidden) or name == "__pycache__" or (theirs / entry.name).exists():
            continue
        (theirs / entry.name).symlink_to(entry)
    return python


def start(folder: Path, python: Path, name: str, code: str, with_probe: bool, *args: str) -> subprocess.Popen:
    script = folder / f"service_{name.replace('-', '_')}.py"
    script.write_text(textwrap.dedent(code))
    command = [str(python), str(script), *args]
    proc = subprocess.Popen(GPUSCOPE + ["run", "--", *command] if with_probe else command,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if proc.stdout is None or proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise SystemExit(f"service {name} did not start")
    return proc


def diagnose(pid: int, *extra: str) -> dict:
    out = subprocess.run(GPUSCOPE + ["diagnose", "--pid", str(pid), "--json", *extra],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return {"verdict": "error", "error": out.stderr.strip()[-300:], "suspects": []}
    return json.loads(out.stdout)


def diagnose_pair(folder: Path, python: Path, names: list[str], with_probe: bool, *extra: str) -> dict:
    import threading

    procs = {n: start(folder, python, n, SERVICES[n][0], with_probe) for n in names}
    results: dict = {}
    try:
        threads = [threading.Thread(target=lambda n=n, p=p: results.__setitem__(n, diagnose(p.pid, *extra)))
                   for n, p in procs.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    return results


def judged(name: str, d: dict) -> dict:
    _, leaks, function = SERVICES[name]
    first = d["suspects"][0]["function"] if d.get("suspects") else None
    right = d["verdict"] == ("leak" if leaks else "no-leak")
    named = None if not leaks or function is None else first == function
    return {"service": name, "verdict": d["verdict"], "pattern": d.get("pattern"), "first_suspect": first,
            "right": right, "named_first": named, "false_leak": not leaks and d["verdict"] == "leak",
            "decided_by": (d.get("evidence") or {}).get("decided_by"),
            "site_rule": ((d.get("evidence") or {}).get("site_rule") or {}).get("rule")}


def read_count(path: str) -> tuple[int, float]:
    while True:
        try:
            done, at = open(path).read().split()
            return int(done), float(at)
        except (OSError, ValueError):
            time.sleep(0.05)


def rss_floor(pid: int, seconds: float) -> int:
    process = psutil.Process(pid)
    end = time.monotonic() + seconds
    low = process.memory_info().rss
    while time.monotonic() < end:
        low = min(low, process.memory_info().rss)
        time.sleep(0.1)
    return low


# The same requests in a service of the kind the targets are for: one that has loaded its libraries
# (and with them most of the standard library that the probe and memray import). A service that
# imports nothing else pays for those modules itself: measured beside it.
BUSY_OF_THE_KIND = "import asyncio, http.server, numpy, faiss, tokenizers, langchain_core.documents\n" + BUSY


def cost(folder: Path, python: Path, with_probe: bool, code: str = BUSY_OF_THE_KIND) -> dict:
    counter = str(folder / "busy.count")
    proc = start(folder, python, "busy", code, with_probe, counter)
    try:
        time.sleep(3)  # its allocator's warm-up
        before_rss = rss_floor(proc.pid, 5)
        n0, t0 = read_count(counter)
        time.sleep(10)
        n1, t1 = read_count(counter)
        d = diagnose(proc.pid)
        n2, t2 = read_count(counter)
        after_rss = rss_floor(proc.pid, 5)
    finally:
        proc.kill()
        proc.wait()
    before = (n1 - n0) / (t1 - t0)
    during = (n2 - n1) / (t2 - t1)
    return {"requests_per_s_before": round(before, 1), "requests_per_s_diagnosed": round(during, 1),
            "share": round(during / before, 3), "rss_floor_before": before_rss, "rss_floor_after": after_rss,
            "left_bytes": after_rss - before_rss, "verdict": d["verdict"],
            "instrument_left_bytes": (d.get("instrument") or {}).get("left_bytes")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuscope-bare-") as tmp:
        python = bare_python(Path(tmp) / "env")
        folder = Path(tmp) / "services"  # not above the environment: its packages are not the services' code
        folder.mkdir()
        problem = None
        if sys.version_info < (3, 14):
            problem = injection_debugger(Interpreter(str(python), dict(os.environ), privilege.owner_of(os.getpid())))[1]
        with_probe = problem is not None
        how = ("the probe brought in by gpuscope diagnose" if not with_probe
               else f"started with the probe (gpuscope run): this machine refuses to bring it in ({problem})")
        print(f"services: bare environment (no memray, no gpuscope); {how}", flush=True)
        rows = []
        for i in range(0, len(DEFAULT), 2):
            pair = DEFAULT[i:i + 2]
            found = diagnose_pair(folder, python, pair, with_probe)
            rows += [dict(judged(n, found[n]), duration=30) for n in pair]
        found = diagnose_pair(folder, python, SHORT, with_probe, "--duration", "10")
        rows += [dict(judged(n, found[n]), duration=10) for n in SHORT]
        spent = cost(folder, python, with_probe)
        bare_minimum = cost(folder, python, with_probe, BUSY)
    default = [r for r in rows if r["duration"] == 30]
    short = [r for r in rows if r["duration"] == 10]
    totals = {
        "default_right": f"{sum(r['right'] for r in default)}/{len(default)}",
        "default_named_first": f"{sum(bool(r['named_first']) for r in default if r['named_first'] is not None)}/"
                               f"{sum(r['named_first'] is not None for r in default)}",
        "false_leaks": sum(r["false_leak"] for r in rows),
        "short_leaks_named": f"{sum(r['right'] for r in short)}/{len(short)}",
        **spent,
        "left_bytes_importing_nothing": bare_minimum["left_bytes"],
        "share_importing_nothing": bare_minimum["share"],
    }
    if args.json:
        print(json.dumps({"rows": rows, "totals": totals}, indent=1))
        return 0
    print_table("verdicts", ["service", "--duration", "verdict", "first suspect", "right", "named first",
                             "decided by", "site rule"],
                [[r["service"], r["duration"], f"{r['verdict']} ({r['pattern']})", r["first_suspect"] or "-",
                  r["right"], "-" if r["named_first"] is None else r["named_first"], r["decided_by"],
                  r["site_rule"] or "-"] for r in rows])
    print(f"\ndefault duration: {totals['default_right']} verdicts right, leaking function first in "
          f"{totals['default_named_first']}, false leaks: {totals['false_leaks']}")
    print(f"--duration 10: {totals['short_leaks_named']} leaks of 5 MB/s or more found")
    print(f"requests/s: {spent['requests_per_s_before']} before, {spent['requests_per_s_diagnosed']} while diagnosed "
          f"({spent['share']:.0%}; target >= 75%)")
    print(f"left in the service: {spent['left_bytes'] / 1e6:+.1f} MB RSS floor after vs before (target <= 2 MB); "
          f"the diagnosis said {((spent['instrument_left_bytes'] or 0) / 1e6):.1f} MB")
    print(f"the same service importing nothing but os, sys and time: {bare_minimum['left_bytes'] / 1e6:+.1f} MB left "
          f"(the modules the probe and memray import, which it had not loaded), requests/s while diagnosed "
          f"{bare_minimum['share']:.0%} of before")
    return 0


if __name__ == "__main__":
    run_script(main)
