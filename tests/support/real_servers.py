"""Servers built as vLLM V1 and SGLang build their /metrics: prometheus_client (the version
installed), its own registry and HTTP exposition, their metric names, types, label names and
buckets. Run as a real child process:

    with llm_server("vllm", rate=10) as base:
        base + "/metrics"                      # what the client serves for the caller's Accept
        base + "/as/prometheus-2"              # what it serves to a Prometheus 2.x scraper
        base + "/as/openmetrics-values"        # ... asked for OpenMetrics with value escaping

Every path is prometheus_client's own WSGI app; `/as/NAME` only replaces the request's Accept
header with ACCEPTS[NAME] first, so each answer is exactly what that client would be sent.

The child records a fixed set of finished requests at start; with `rate` > 0 a thread then
finishes `rate` requests a second (each 40 generated tokens, the same latencies cycling), so
tokens/s is 40 x rate and requests/s is rate.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ACCEPTS = {
    # Prometheus 2.x (2.42, Debian's) asks for OpenMetrics first
    "prometheus-2": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "openmetrics-utf8": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "openmetrics-values": "application/openmetrics-text;version=1.0.0;escaping=values",
    "text-1.0.0": "text/plain;version=1.0.0;escaping=underscores",
}
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TOKENS_PER_REQUEST = 40
# (e2e, ttft, inter-token) seconds of the requests, cycled
LATENCIES = ((0.9, 0.05, 0.02), (1.4, 0.12, 0.03), (2.2, 0.3, 0.04), (0.7, 0.04, 0.015), (6.0, 0.9, 0.09))
VLLM_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0)
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0)
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200,
              0.400, 0.600, 0.800, 1, 2, 4, 6, 8)
SGLANG_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
STARTING_REQUESTS = 50


class VllmV1:
    """vllm/v1/metrics/loggers.py's PrometheusStatLogger: labels model_name and engine."""

    def __init__(self, registry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = ["model_name", "engine"]
        self.values = (MODEL, "0")
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=registry)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=registry)
        self.prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=registry)
        self.generation = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=registry)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=registry)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels,
                              buckets=VLLM_TTFT, registry=registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels,
                             buckets=VLLM_ITL, registry=registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels,
                             buckets=VLLM_E2E, registry=registry)
        self.phases = {
            phase: Histogram(f"vllm:request_{phase}_time_seconds", f"Histogram of time spent in {phase.upper()} phase.",
                             labels, buckets=VLLM_E2E, registry=registry)
            for phase in ("queue", "inference", "prefill", "decode")
        }
        self.iteration = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", labels,
                                   buckets=(1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), registry=registry)
        for reason in ("stop", "length", "abort"):
            self.success.labels(*self.values, reason)  # vLLM creates every finished_reason series at start
        self.running.labels(*self.values).set(8)
        self.waiting.labels(*self.values).set(3)
        self.kv.labels(*self.values).set(0.42)

    def finish(self, i: int) -> None:
        e2e, ttft, itl = LATENCIES[i % len(LATENCIES)]
        v = self.values
        self.success.labels(*v, "abort" if i % 10 == 9 else "length" if i % 3 else "stop").inc()
        self.prompt.labels(*v).inc(100)
        self.generation.labels(*v).inc(TOKENS_PER_REQUEST)
        self.ttft.labels(*v).observe(ttft)
        self.itl.labels(*v).observe(itl)
        self.e2e.labels(*v).observe(e2e)
        self.phases["queue"].labels(*v).observe(e2e * 0.1)
        self.phases["prefill"].labels(*v).observe(ttft)
        self.phases["decode"].labels(*v).observe(e2e * 0.9 - ttft)
        self.phases["inference"].labels(*v).observe(e2e * 0.9)
        self.iteration.labels(*v).observe(TOKENS_PER_REQUEST)


class SGLang:
    """sglang/srt/metrics/collector.py: tokenizer-side {model_name}, scheduler-side
    {model_name, engine_type, tp_rank, pp_rank}."""

    def __init__(self, registry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        scheduler = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        self.sched = (MODEL, "unified", "0", "0")
        self.running = Gauge("sglang:num_running_reqs", "The number of running requests.", scheduler, registry=registry)
        self.queue = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", scheduler, registry=registry)
        self.usage = Gauge("sglang:token_usage", "The token usage.", scheduler, registry=registry)
        self.prompt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", ["model_name"], registry=registry)
        self.generation = Counter("sglang:generation_tokens", "Number of generation tokens processed.", ["model_name"],
                                  registry=registry)
        self.requests = Counter("sglang:num_requests", "The number of requests.", ["model_name"], registry=registry)
        self.aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.", ["model_name"], registry=registry)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              ["model_name"], buckets=SGLANG_TTFT, registry=registry)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ["model_name"], buckets=SGLANG_ITL, registry=registry)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             ["model_name"], buckets=SGLANG_E2E, registry=registry)
        self.stages = Histogram("sglang:per_stage_req_latency_seconds", "The latency of each stage of requests.",
                                [*scheduler, "stage"], buckets=tuple(0.001 * 1.62**k for k in range(30)), registry=registry)
        self.running.labels(*self.sched).set(8)
        self.queue.labels(*self.sched).set(3)
        self.usage.labels(*self.sched).set(0.42)

    def finish(self, i: int) -> None:
        e2e, ttft, itl = LATENCIES[i % len(LATENCIES)]
        self.requests.labels(MODEL).inc()
        if i % 10 == 9:
            self.aborted.labels(MODEL).inc()
        self.prompt.labels(MODEL).inc(100)
        self.generation.labels(MODEL).inc(TOKENS_PER_REQUEST)
        self.ttft.labels(MODEL).observe(ttft)
        self.itl.labels(MODEL).observe(itl)
        self.e2e.labels(MODEL).observe(e2e)
        for stage, seconds in (("prefill_waiting", e2e * 0.1), ("prefill_forward", ttft), ("decode_forward", e2e * 0.8)):
            self.stages.labels(*self.sched, stage).observe(seconds)


def serve(kind: str, rate: float) -> None:
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry()
    server_metrics = {"vllm": VllmV1, "sglang": SGLang}[kind](registry)
    for i in range(STARTING_REQUESTS):
        server_metrics.finish(i)
    app = make_wsgi_app(registry)

    def routed(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path.startswith("/as/"):
            environ["HTTP_ACCEPT"] = ACCEPTS[path.removeprefix("/as/")]
        return app(environ, start_response)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    httpd = make_server("127.0.0.1", 0, routed, handler_class=Quiet)
    if rate > 0:
        def finish_requests() -> None:
            i, started = STARTING_REQUESTS, time.monotonic()
            while True:
                due = STARTING_REQUESTS + int((time.monotonic() - started) * rate)
                while i < due:
                    server_metrics.finish(i)
                    i += 1
                time.sleep(0.01)

        threading.Thread(target=finish_requests, daemon=True).start()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(f"http://127.0.0.1:{httpd.server_port}", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or dies)


@contextlib.contextmanager
def llm_server(kind: str, rate: float = 0.0) -> Iterator[str]:
    """The server as a child process; yields its base URL, kills it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), kind, str(rate)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline().strip() if ready else "nothing within 30 s"
        assert line.startswith("http://127.0.0.1:"), f"the {kind} server said {line!r}"
        yield line
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdin.close()
        proc.stdout.close()


if __name__ == "__main__":
    serve(sys.argv[1], float(sys.argv[2]))
