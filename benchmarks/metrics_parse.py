"""Cost of the serving-metrics scrape source on a big /metrics: parse, compute, and per scrape.

What it measures, and how:

A ~5 MB exposition is synthesized in the shape of a busy vLLM V1 server plus a dcgm-exporter on
a large node (families, bucket bounds and label names from tests/support/fixtures/metrics and the
research notes): vLLM histograms (TTFT, inter-token latency, e2e, queue/prefill/decode/inference,
token-count histograms), counters and gauges for `--models` x `--engines` label sets, and the
default dcgm-exporter fields for `--gpus` GPUs with their Hostname/UUID/pod labels.

1. parse:   gpuscope.core.serving.exposition.parse_exposition on the text, median of `--runs`: every
            line, and only the lines the detected profile reads (what the scrape source does: a
            cheap first pass finds the metric names, then only the wanted lines are parsed).
            Then the same at 100,000+ series (`--big-models` x `--big-engines` vLLM label sets
            plus the dcgm GPUs): gpuscope's parser (min/median/max of `--runs`) beside
            prometheus_client's own text parser on the same text (`--reference-runs`).
2. compute: a ScrapeCollector (window 30 s) holding `--window-scrapes` scrapes of it, one second
            apart (counters advancing, so rates are real): `record()` of one scrape (detection +
            keeping the profile's series) and `evaluate()` (the whole query plan with rate(),
            sum by (le) and histogram_quantile over the window), medians.
3. live:    a ServingSource (interval 1 s) scraping a child process that serves the text over
            HTTP (so serving it costs this process nothing): CPU seconds of this process
            (time.process_time: fetch + parse + record + evaluate + the source's threads) per
            scrape, and wall seconds between scrapes (a target whose reads take long is read
            less often: it rests as long as its last read took), over `--scrapes` scrapes. The same for the demo RAG service's small
            exposition, for scale.

Run:  .venv/bin/python benchmarks/metrics_parse.py [--json] [--runs 5] [--scrapes 10]
The child server is killed on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time

from _harness import ROOT, Cleanup, dump_json, install_signal_handlers, machine, print_table, run_script, spread

sys.path.insert(0, str(ROOT))

from gpuscope.core.serving.exposition import parse_exposition  # noqa: E402
from gpuscope.core.serving.profiles import BUILTIN_PROFILES, detect, kept_names  # noqa: E402
from gpuscope.core.serving.scrape import ScrapeCollector  # noqa: E402
from gpuscope.core.serving.source import ServingSource  # noqa: E402

TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": TTFT,
    "vllm:inter_token_latency_seconds": ITL,
    "vllm:request_time_per_output_token_seconds": ITL,
    "vllm:e2e_request_latency_seconds": E2E,
    "vllm:request_queue_time_seconds": E2E,
    "vllm:request_inference_time_seconds": E2E,
    "vllm:request_prefill_time_seconds": E2E,
    "vllm:request_decode_time_seconds": E2E,
    "vllm:request_prompt_tokens": TOKENS,
    "vllm:request_generation_tokens": TOKENS,
}
COUNTERS = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
DCGM = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
)

SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open(sys.argv[1], "rb").read()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print("ready", flush=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def synthesize(models: int, engines: int, gpus: int, tick: int = 0, seed: int = 1) -> str:
    """A vLLM V1 + dcgm-exporter scrape; `tick` advances every counter (one second later)."""
    rnd = random.Random(seed)
    out: list[str] = []
    label_sets = [f'engine="{e}",model_name="org/model-{m}-instruct"' for m in range(models) for e in range(engines)]
    for name, bounds in HISTOGRAMS.items():
        out.append(f"# HELP {name} Histogram of {name}.\n# TYPE {name} histogram\n")
        for labels in label_sets:
            weights = [rnd.random() for _ in bounds]
            count = 1000 + 7 * tick
            cumulative = 0.0
            total = sum(weights)
            for bound, w in zip(bounds, weights):
                cumulative += count * 0.95 * w / total
                out.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {round(cumulative)}.0\n')
            out.append(f'{name}_bucket{{{labels},le="+Inf"}} {count}.0\n')
            out.append(f"{name}_count{{{labels}}} {count}.0\n{name}_sum{{{labels}}} {count * 1.7:.6f}\n")
            out.append(f"{name}_created{{{labels}}} 1.7e+09\n")
    for name in COUNTERS:
        out.append(f"# HELP {name}_total Number of {name}.\n# TYPE {name}_total counter\n")
        for labels in label_sets:
            out.append(f"{name}_total{{{labels}}} {12345 + 40 * tick}.0\n")
    out.append("# TYPE vllm:request_success_total counter\n")
    for labels in label_sets:
        for reason in ("stop", "length", "abort", "error"):
            out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {100 + tick}.0\n')
    for name in GAUGES:
        out.append(f"# HELP {name} {name}.\n# TYPE {name} gauge\n")
        for labels in label_sets:
            out.append(f"{name}{{{labels}}} {rnd.random():.4f}\n")
    for field in DCGM:
        out.append(f"# HELP {field} {field}.\n# TYPE {field} gauge\n")
        for g in range(gpus):
            node = g // 8
            out.append(
                f'{field}{{gpu="{g % 8}",UUID="GPU-{g:08x}-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:{g:02X}:00.0",'
                f'device="nvidia{g % 8}",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-{node:03d}",'
                f'DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="llm-serving",pod="vllm-{node}-{g % 8}"}} '
                f"{rnd.randint(0, 80000)}\n"
            )
    return "".join(out)


def timings(fn, runs: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def timed(fn, runs: int) -> tuple[float, object]:
    times, result = timings(fn, runs)
    return statistics.median(times), result


def big_parse(models: int, engines: int, gpus: int, runs: int, reference_runs: int) -> dict:
    """gpuscope's parser and prometheus_client's on a 100,000-series exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    text = synthesize(models, engines, gpus)
    ours, exposition = timings(lambda: parse_exposition(text), runs)

    def theirs_once() -> int:
        return sum(len(f.samples) for f in text_string_to_metric_families(text))

    theirs, their_samples = timings(theirs_once, reference_runs)
    return {
        "bytes": len(text.encode()),
        "lines": text.count("\n"),
        "samples": exposition.sample_count,
        "reference_samples": their_samples,
        "gpuscope_s": ours,  # each run's seconds
        "prometheus_client_s": theirs,
    }


def live_cpu_per_scrape(cleanup: Cleanup, text: str, scrapes: int, name: str) -> dict:
    path = cleanup.tmpdir / f"{name}.prom"
    path.write_text(text)
    proc = cleanup.spawn_python(SERVER, str(path))
    port = int(proc.stdout.readline())
    collector = ScrapeCollector([f"http://127.0.0.1:{port}/metrics"], window_s=30.0, profiles=BUILTIN_PROFILES, timeout=30)
    source = ServingSource(collector, interval=1.0)
    seen: list[tuple[float, float]] = []
    done = threading.Event()

    def on_snapshot(snapshot) -> None:
        seen.append((time.process_time(), time.perf_counter()))
        if len(seen) > scrapes:
            done.set()

    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    source.start(on_snapshot)
    done.wait(scrapes * 10 + 30)
    source.stop()
    if len(seen) <= scrapes:
        raise RuntimeError(f"only {len(seen)} scrapes of {name} arrived")
    # from the first snapshot to the last: steady state (the first includes thread start-up)
    return {
        "name": name,
        "bytes": len(text.encode()),
        "scrapes": scrapes,
        "cpu_s_per_scrape": (seen[scrapes][0] - seen[0][0]) / scrapes,
        "wall_s_per_scrape": (seen[scrapes][1] - seen[0][1]) / scrapes,
        "cpu_s_total": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - wall0,
    }


def demo_text() -> str:
    from prometheus_client import generate_latest

    from gpuscope.demo.service import Metrics

    metrics = Metrics()
    rnd = random.Random(3)
    for _ in range(500):  # a service that has answered 500 requests
        metrics.request_latency.observe(rnd.uniform(0.05, 0.8))
        for stage in ("retriever", "reranker", "llm"):
            metrics.stage_latency.labels(stage=stage).observe(rnd.uniform(0.001, 0.5))
        metrics.requests.labels(status="ok").inc()
        metrics.tokens.inc(40)
    return generate_latest(metrics.registry).decode()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--runs", type=int, default=5, help="repetitions of each in-process timing (median)")
    p.add_argument("--scrapes", type=int, default=10, help="scrapes of the live measurement")
    p.add_argument("--window-scrapes", type=int, default=30, help="scrapes in the compute window")
    p.add_argument("--models", type=int, default=8)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--gpus", type=int, default=576)
    p.add_argument("--big-models", type=int, default=20, help="label sets of the 100k-series text: models ...")
    p.add_argument("--big-engines", type=int, default=20, help="... x engines")
    p.add_argument("--reference-runs", type=int, default=3, help="runs of prometheus_client's parser (slow)")
    args = p.parse_args()
    install_signal_handlers()

    text = synthesize(args.models, args.engines, args.gpus)
    size = len(text.encode())
    parse_s, exposition = timed(lambda: parse_exposition(text), args.runs)

    def wanted(names):
        profile = detect(BUILTIN_PROFILES, names)
        return kept_names(profile, names) if profile else None

    parse_wanted_s, read = timed(lambda: parse_exposition(text, wanted=wanted), args.runs)

    ticks = [parse_exposition(synthesize(args.models, args.engines, args.gpus, tick=i), wanted=wanted) for i in range(args.window_scrapes)]
    collector = ScrapeCollector(["http://127.0.0.1:1/metrics"], window_s=30.0, profiles=BUILTIN_PROFILES)
    t0 = time.time()
    record_times = []
    for i, e in enumerate(ticks):
        started = time.perf_counter()
        collector.record(0, (t0 + i, e))
        record_times.append(time.perf_counter() - started)
    evaluate_s, evaluation = timed(collector.evaluate, args.runs)

    big = big_parse(args.big_models, args.big_engines, args.gpus, args.runs, args.reference_runs)

    with Cleanup() as cleanup:
        live = [
            live_cpu_per_scrape(cleanup, demo_text(), args.scrapes, "demo rag"),
            live_cpu_per_scrape(cleanup, text, args.scrapes, "vllm+dcgm"),
        ]

    result = {
        "machine": machine(),
        "exposition": {
            "bytes": size,
            "lines": text.count("\n"),
            "samples": exposition.sample_count,
            "label_sets": args.models * args.engines,
            "gpus": args.gpus,
        },
        "parse_s": parse_s,
        "parse_wanted_s": parse_wanted_s,
        "samples_read": read.sample_count,
        "record_s": statistics.median(record_times),
        "evaluate_s": evaluate_s,
        "window_scrapes": args.window_scrapes,
        "profile": evaluation.profile,
        "big": big,
        "live": live,
    }
    if args.json:
        dump_json(result)
        return 0
    ex = result["exposition"]
    print(f"exposition: {ex['bytes'] / 1e6:.1f} MB, {ex['lines']:,} lines, {ex['samples']:,} samples "
          f"({ex['label_sets']} vLLM label sets, {ex['gpus']} GPUs); profile detected: {evaluation.profile}\n")
    print_table(
        "In process (median)",
        ["step", "seconds", "MB/s"],
        [
            ["parse_exposition, every line", f"{parse_s:.3f}", f"{size / 1e6 / parse_s:.1f}"],
            [f"parse_exposition, the profile's lines ({read.sample_count:,} samples)", f"{parse_wanted_s:.3f}",
             f"{size / 1e6 / parse_wanted_s:.1f}"],
            ["record (detect + keep the profile's series)", f"{result['record_s']:.4f}", ""],
            [f"evaluate ({args.window_scrapes} scrapes in a 30 s window)", f"{evaluate_s:.4f}", ""],
        ],
    )
    print()

    print_table(
        f"{big['samples']:,} series ({big['bytes'] / 1e6:.1f} MB): every line parsed, seconds median (min-max)",
        ["parser", "runs", "seconds", "µs / line"],
        [
            [name, str(len(big[key])), spread(big[key], ".3f"), f"{statistics.median(big[key]) / big['lines'] * 1e6:.1f}"]
            for name, key in (("gpuscope.core.serving.exposition.parse_exposition", "gpuscope_s"),
                              ("prometheus_client.parser.text_string_to_metric_families", "prometheus_client_s"))
        ],
    )
    print()
    print_table(
        "ServingSource, scraping over HTTP at 1 s (this process's CPU)",
        ["exposition", "bytes", "scrapes", "CPU s / scrape", "wall s / scrape", "CPU %"],
        [
            [r["name"], f"{r['bytes']:,}", r["scrapes"], f"{r['cpu_s_per_scrape']:.4f}",
             f"{r['wall_s_per_scrape']:.2f}", f"{100 * r['cpu_s_per_scrape'] / r['wall_s_per_scrape']:.0f}"]
            for r in live
        ],
    )
    return 0


if __name__ == "__main__":
    run_script(main)
