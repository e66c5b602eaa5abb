"""`gpuscope check` against noise: does a service that keeps 10 MB a round fail, whatever the
scatter of its memory, and does the same service without the leak pass?

The service (a small HTTP server on a free loopback port, written to a temporary folder) holds
250 MB from its start; each request replaces a buffer of a random size from 0 to 26 MB that it
keeps until the next one (its memory at rest varies by about +-5 % from round to round, the
floors too), and, with `leak`, keeps 10 MB more for good. A round's load is one request, after
0.3 s and followed by 0.3 s. Each check is `gpuscope check --rounds N --json --load ... --
<service>` with memray tracking inside the service (through gpuscope's probe), or with
`--no-memray` (the floors alone decide), `--runs` times for each of leak and noise alone.

Printed: how many runs failed (leak) and passed (noise alone), and which criteria failed.

Run:  .venv/bin/python benchmarks/check_noise.py [--runs 10] [--rounds 3] [--no-memray] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time

from _harness import Cleanup, dump_json, free_port, gpuscope_cmd, install_signal_handlers, machine, run_script

SERVICE = """
import http.server, random, sys
leak = sys.argv[2] == "leak"
base = bytearray(250_000_000)
kept = []
held = bytearray(0)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global held
        held = bytearray(random.randint(0, 26_000_000))
        if leak:
            kept.append(bytearray(10_000_000))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def one_check(cleanup: Cleanup, kind: str, rounds: int, memray: bool) -> dict:
    service = cleanup.tmpdir / "service.py"
    service.write_text(SERVICE)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    load = (f"{sys.executable} -c \"import time, urllib.request; time.sleep(0.3); "
            f"urllib.request.urlopen('{url}').read(); time.sleep(0.3)\"")
    args = [*gpuscope_cmd(), "check", "--json", "--rounds", str(rounds), "--ready-url", url, "--load", load,
            *([] if memray else ["--no-memray"]), "--", sys.executable, str(service), str(port), kind]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    result = json.loads(done.stdout)
    return {"kind": kind, "exit": done.returncode, "wall_s": round(time.monotonic() - started, 1),
            "failed": [c["name"] for c in result["criteria"] if c["status"] == "fail"],
            "floors": [r["memory"]["rss"]["floor"] for r in result["rounds"]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-memray", action="store_true")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    install_signal_handlers()
    runs = []
    with Cleanup() as cleanup:
        for k in range(opts.runs):
            for kind in ("leak", "noise"):
                runs.append(one_check(cleanup, kind, opts.rounds, not opts.no_memray))
                if not opts.json:
                    r = runs[-1]
                    print(f"run {k + 1} {kind}: exit {r['exit']} failed {r['failed']} ({r['wall_s']} s)",
                          file=sys.stderr, flush=True)
    result = {"settings": {"runs": opts.runs, "rounds": opts.rounds, "memray": not opts.no_memray},
              "runs": runs, "machine": machine()}
    if opts.json:
        dump_json(result)
        return 0
    leak = [r for r in runs if r["kind"] == "leak"]
    noise = [r for r in runs if r["kind"] == "noise"]
    print(f"gpuscope check, {opts.rounds} rounds, {'with' if not opts.no_memray else 'without'} memray, "
          f"floors scattered +-5 %:")
    print(f"  10 MB a round kept: failed {sum(r['exit'] == 1 for r in leak)} of {len(leak)} "
          f"(criteria failed: {dict(collections.Counter(c for r in leak for c in r['failed']))})")
    print(f"  noise alone:        passed {sum(r['exit'] == 0 for r in noise)} of {len(noise)} "
          f"(criteria failed: {dict(collections.Counter(c for r in noise for c in r['failed']))})")
    return 0


if __name__ == "__main__":
    run_script(main)
