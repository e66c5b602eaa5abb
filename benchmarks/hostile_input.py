"""What hostile input of each kind costs gpuscope: CPU seconds and peak Python memory.

What it measures, and how:

Each case builds up to 16 MiB of what another user's process or a network endpoint could send
(the caps gpuscope reads at), then hands it to the code that reads it, in a child process of its
own under a 2 GiB address-space limit (a case that ran away would end there, not take the
machine). The child reports the CPU time of the read (time.process_time, best of `--runs`), then
its peak of Python memory in a separate run under tracemalloc (which slows what it watches), and
what the read answered (a result, or the refusal's first words).

Cases: a probe's held bytes at 20,000 and 1,000,000 times (the trend, the progress check), a
tracker reply of 400,000 times, a reply nested 200,000 deep; a Prometheus answer of escaped
quotes (the depth check), 16 MiB of empty strings (the depth and value checks), a probe's 16 MiB
reply of empty objects, and the answers' shape check on 100,000 series; 16 MiB expositions of
label values followed by blanks, of escapes, of many labels and of long unusual lines; a baseline
of 20,000 rounds, one of 16 MiB of empty objects and one of the 10,000 rounds a baseline may
hold; a settings file of 1 MiB (its cap) of inline tables.

Run:  .venv/bin/python benchmarks/hostile_input.py [--json] [--runs 3] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

LIMIT_AS = 2 << 30

HARNESS = """
import json, resource, sys, time, tracemalloc
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
{setup}
def attempt():
    try:
        return repr(work())[:60]
    except Exception as exc:
        return type(exc).__name__ + ": " + str(exc)[:60]
best = float("inf")
for _ in range({runs}):
    started = time.process_time()
    result = attempt()
    best = min(best, time.process_time() - started)
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
attempt()
peak = tracemalloc.get_traced_memory()[1] - base
print(json.dumps({{"cpu_s": best, "peak_mb": peak / 2**20, "result": result}}))
"""

MiB16 = 16 << 20

CASES = {
    "probe-held-20k": """
        from gpuscope.core.leak import held_trend
        times = [float(i) for i in range(20_000)]
        held = [float(i * 100_000 + (i % 7) * 30_000) for i in range(20_000)]
        def work():
            return held_trend(times, held).kind
    """,
    "probe-progress-1M": """
        from gpuscope.core.diagnosis._probe_trackers import settled_of
        n = 1_000_000
        progress = {"tracking": True, "times": [i / 1000 for i in range(n)], "rss": [float(i) for i in range(n)],
                    "heap": [float(i) for i in range(n)], "sites": [{"held": [float(i) for i in range(n)]}] * 10}
        def work():
            return settled_of(progress)
    """,
    "probe-tracker-400k": """
        import os
        from gpuscope.core.diagnosis._probe_trackers import _tracked
        times = [i / 1000 for i in range(400_000)]
        reply = {"times": times, "records": [{"frames": [["f", "/srv/app.py", 1]], "size": 1, "held": times}]}
        def work():
            return _tracked(reply, os.getpid(), "tracemalloc", "all")
    """,
    "probe-nested-200k": """
        import json
        from gpuscope.core.common.json_depth import nests_deeper
        raw = b'{"ok":true,"result":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
        def work():
            return nests_deeper(raw, 16)
    """,
    "prometheus-escaped-quotes-8MiB": """
        from gpuscope.core.common.json_depth import nests_deeper
        body = b'"' + b'\\\\"' * (8 << 19)
        def work():
            return nests_deeper(body, 16)
    """,
    "prometheus-100k-series": """
        from gpuscope.core.serving.prometheus import checked_results
        results = [{"metric": {"node": "n", "pid": str(i), "start_time": "1"}, "value": [1.0, "2"]}
                   for i in range(100_000)]
        def work():
            return len(checked_results(results, max_series=100_000))
    """,
    **{
        f"exposition-{name}-16MiB": f"""
        from gpuscope.core.serving.exposition import parse_exposition
        line = {line!r}
        text = "".join(line % i for i in range({MiB16} // len(line)))
        def work():
            return parse_exposition(text).malformed
    """
        for name, line in (
            ("blanks", 'm{i="%d",a="b"' + " " * 32_000 + "x} 1\n"),
            ("escapes", 'm{i="%d",a="' + '\\"' * 32_000 + '"} 1\n'),
            ("labels", 'm{i="%d",' + 'a="",' * 13_000 + "} 1\n"),
            ("unusual", "m{i=%d" + "a" * 32_000 + " 1\n"),
        )
    },
    "baseline-20k-rounds": """
        import json, tempfile
        from gpuscope.core.gate.verdict import load_baseline
        rounds = [{"round": i, "duration_s": 1.0, "memory": {"rss": {"floor": 1000 + 10 * i}}} for i in range(20_000)]
        path = tempfile.mktemp()
        open(path, "w").write(json.dumps({"schema": "gpuscope.check-baseline/1", "rounds": rounds}))
        def work():
            return load_baseline(path)
    """,
    "probe-empty-objects-16MiB": """
        import socket, threading
        from gpuscope.core.target.probe_client import MAX_REPLY, ProbeClient
        path = "probe.sock"
        body = b'{"ok":true,"result":{"x":[' + b"{}," * ((MAX_REPLY - 64) // 3) + b'0]}}\\n'
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen(8)
        def serve():
            while True:
                conn = server.accept()[0]
                conn.recv(65536)
                conn.sendall(body)
                conn.close()
        threading.Thread(target=serve, daemon=True).start()
        def work():
            with ProbeClient(path, timeout=60) as client:
                return len(client.stats()["x"])
    """,
    "json-checks-empty-strings-16MiB": """
        from gpuscope.core.common.json_depth import nests_deeper, values_in
        raw = b"[" + b'"",' * ((16 << 20) // 3) + b"0]"
        def work():
            return nests_deeper(raw, 16), values_in(raw)
    """,
    "baseline-empty-objects-16MiB": """
        import tempfile
        from gpuscope.core.gate.verdict import load_baseline
        path = tempfile.mktemp()
        open(path, "wb").write(b'{"schema":"gpuscope.check-baseline/1","rounds":[' + b"{}," * ((16 << 20) // 3 - 20) + b"0]}")
        def work():
            return load_baseline(path)
    """,
    "settings-1MiB-inline-tables": """
        from gpuscope.core.common.toml_text import parse_toml
        text = "a = [" + "{}," * ((1 << 20) // 3 - 4) + "]\\n"
        def work():
            return len(parse_toml(text)["a"])
    """,
    "baseline-growth-10k-rounds": """
        from gpuscope.core.gate.verdict import MAX_BASELINE_ROUNDS, Round, growth_of
        rounds = [Round.from_json({"round": i, "duration_s": 1.0, "memory": {"rss": {"floor": 1000 + 10 * i}}})
                  for i in range(MAX_BASELINE_ROUNDS)]
        def work():
            return growth_of(rounds, "rss").per_round
    """,
}


def run_case(setup: str, runs: int) -> dict:
    code = HARNESS.format(limit=LIMIT_AS, runs=runs, setup=textwrap.dedent(setup))
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=folder,
                              env={**os.environ, "TMPDIR": folder})
    if done.returncode != 0 or not done.stdout.strip():
        return {"cpu_s": None, "peak_mb": None, "result": (done.stderr.strip().splitlines() or ["?"])[-1][:80]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=sorted(CASES))
    args = parser.parse_args()
    figures = {name: run_case(setup, args.runs) for name, setup in CASES.items() if args.only in (None, name)}
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(f"{'case':34} {'CPU s':>7} {'peak MB':>8}  answer")
    for name, f in figures.items():
        cpu = f"{f['cpu_s']:.3f}" if f["cpu_s"] is not None else "-"
        peak = f"{f['peak_mb']:.1f}" if f["peak_mb"] is not None else "-"
        print(f"{name:34} {cpu:>7} {peak:>8}  {f['result']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
