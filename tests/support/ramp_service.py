"""A small real HTTP service with a known limit, for the load ramp's tests and benchmark.

    python ramp_service.py --port P [--workers N --service-ms MS] [--error-above R] [--keep-kb K] [--vllm [--kv-requests N]]

- `--workers N --service-ms MS`: a pool of N workers, each holding a request MS ms: latency
  breaks at N * 1000 / MS requests/s (queries wait for a worker beyond it);
- `--error-above R`: answers 503 at once to what passes R requests/s (a token bucket): it
  errors instead of slowing down;
- `--keep-kb K`: every request (every chat turn) keeps K KiB in `remember_request`, for ever;
- `--vllm` (with `--workers`): vLLM's metric names instead of the `rag` ones, with the requests
  waiting for a worker as its queue (`vllm:num_requests_waiting`) and a KV-cache that holds every
  request from its arrival to its answer (`vllm:kv_cache_usage_perc`: the requests held over
  `--kv-requests`, at most 1), so the cache fills as the queue grows past the capacity;
- `POST /v1/chat/completions`: an OpenAI-compatible answer that counts the turns it was sent
  (`ramp_test_chat_turns_total{turn}`) and whether the conversation it was sent is the one it
  answered (`ramp_test_chat_context_total{kept}`: every user message i says "turn i", every
  answer i is its own "turn i answered");
- any other POST: counts the bodies and their bytes, and how many were different
  (`ramp_test_bodies_total`, `ramp_test_body_bytes_total`, `ramp_test_bodies_distinct`).

It exposes its latency and time-to-first-token histograms on /metrics (the `rag` names gpuscope
knows; the first token comes a quarter of the service time after a worker takes the request) and
starts gpuscope's probe, as a service that opts in does.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from gpuscope import probe

REGISTRY = CollectorRegistry()
BUCKETS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5)
TOKENS_PER_ANSWER = 8
TURNS = Counter("ramp_test_chat_turns", "chat requests by their turn", ["turn"], registry=REGISTRY)
CONTEXT = Counter("ramp_test_chat_context", "chat requests by whether their context was kept", ["kept"],
                  registry=REGISTRY)
BODIES = Counter("ramp_test_bodies", "bodies posted", registry=REGISTRY)
BODY_BYTES = Counter("ramp_test_body_bytes", "bytes of the bodies posted", registry=REGISTRY)
DISTINCT = Gauge("ramp_test_bodies_distinct", "different bodies posted", registry=REGISTRY)
SEEN: set[bytes] = set()
KEPT: list[bytearray] = []


def remember_request(kib: int) -> None:
    """The leak: a block per request, written so that it is resident."""
    KEPT.append(bytearray(b"x" * (kib * 1024)))


class Pool:
    """N workers whose time is kept by the clock: a query gets the worker free soonest, from when
    it is free, so a thread that wakes late (a busy machine) delays its own answer, never the pool.
    The first token comes a quarter of the service time after the worker takes the query."""

    def __init__(self, workers: int, service_s: float) -> None:
        self.free_at, self.service_s = [0.0] * workers, service_s
        self.lock = threading.Lock()
        self.held: dict[int, float] = {}  # the queries in the pool, by when a worker takes each
        self.ids = 0

    def serve(self, first_token) -> None:
        with self.lock:
            worker = min(range(len(self.free_at)), key=self.free_at.__getitem__)
            start = max(time.monotonic(), self.free_at[worker])
            self.free_at[worker] = end = start + self.service_s
            self.ids += 1
            query = self.ids
            self.held[query] = start
        try:
            time.sleep(max(0.0, start + self.service_s / 4 - time.monotonic()))
            first_token()
            time.sleep(max(0.0, end - time.monotonic()))
        finally:
            with self.lock:
                del self.held[query]

    def occupancy(self) -> tuple[int, int]:
        """(queries waiting for a worker, queries held), read together."""
        with self.lock:
            now = time.monotonic()
            return sum(1 for start in self.held.values() if start > now), len(self.held)


class Served:
    """The service's own metrics: the `rag` names gpuscope's demo uses, or vLLM's."""

    def __init__(self, pool: Pool | None, vllm: bool, kv_requests: int) -> None:
        if vllm:
            self.latency = Histogram("vllm:e2e_request_latency_seconds", "latency", registry=REGISTRY, buckets=BUCKETS)
            self.ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", registry=REGISTRY, buckets=BUCKETS)
            self.finished = Counter("vllm:request_success", "finished requests", ["finished_reason"], registry=REGISTRY)
            self.tokens = Counter("vllm:generation_tokens", "tokens", registry=REGISTRY)
            self.ok, self.error = self.finished.labels("stop"), self.finished.labels("abort")
            self.in_flight = None
            REGISTRY.register(_Occupancy(pool, kv_requests))
        else:
            self.latency = Histogram("rag_request_latency_seconds", "latency", registry=REGISTRY, buckets=BUCKETS)
            self.ttft = Histogram("rag_time_to_first_token_seconds", "ttft", registry=REGISTRY, buckets=BUCKETS)
            self.finished = Counter("rag_request_total", "requests", ["status"], registry=REGISTRY)
            self.tokens = Counter("rag_token_output_total", "tokens", registry=REGISTRY)
            self.ok, self.error = self.finished.labels("ok"), self.finished.labels("error")
            self.in_flight = Gauge("rag_requests_in_flight", "in flight", registry=REGISTRY)


class _Occupancy:
    """vLLM's queue and KV-cache gauges, from one reading of the pool (so a scrape never shows more
    waiting than held)."""

    def __init__(self, pool: Pool, kv_requests: int) -> None:
        self.pool, self.kv_requests = pool, kv_requests

    def collect(self):
        waiting, held = self.pool.occupancy()
        yield GaugeMetricFamily("vllm:num_requests_waiting", "requests waiting", value=waiting)
        yield GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage, 0-1",
                                value=min(1.0, held / self.kv_requests))


class Bucket:
    def __init__(self, rate: float) -> None:
        self.rate, self.tokens, self.at = rate, rate, time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            return False


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--workers", type=int)
    p.add_argument("--service-ms", type=float, default=50.0)
    p.add_argument("--error-above", type=float)
    p.add_argument("--keep-kb", type=int, default=0)
    p.add_argument("--vllm", action="store_true")
    p.add_argument("--kv-requests", type=int, default=16)
    args = p.parse_args()
    if args.vllm and not args.workers:
        p.error("--vllm needs --workers: its queue is the pool's")
    pool = Pool(args.workers, args.service_ms / 1000) if args.workers else None
    bucket = Bucket(args.error_above) if args.error_above else None
    served = Served(pool, args.vllm, args.kv_requests)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _serve(self, answer) -> None:
            start = time.perf_counter()
            if bucket is not None and not bucket.take():
                served.error.inc()
                self._send(503, b'{"error": "over capacity"}')
                return
            if served.in_flight is not None:
                served.in_flight.inc()
            try:
                if pool is not None:
                    pool.serve(lambda: served.ttft.observe(time.perf_counter() - start))
                if args.keep_kb:
                    remember_request(args.keep_kb)
                body = answer()
            finally:
                if served.in_flight is not None:
                    served.in_flight.dec()
            if pool is None:
                served.ttft.observe(time.perf_counter() - start)
            served.latency.observe(time.perf_counter() - start)
            served.ok.inc()
            served.tokens.inc(TOKENS_PER_ANSWER)
            self._send(200, body)

        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            else:
                self._serve(lambda: b'{"ok": true}')

        def do_POST(self) -> None:
            length = min(int(self.headers.get("Content-Length") or 0), 1 << 20)
            data = self.rfile.read(length)

            def chat() -> bytes:
                messages = json.loads(data)["messages"]
                turns = sum(1 for m in messages if m.get("role") == "user")
                TURNS.labels(str(turns)).inc()
                expected = [("user", f"turn {k // 2 + 1})") if k % 2 == 0 else ("assistant", f"turn {k // 2 + 1} answered")
                            for k in range(len(messages))]
                kept = len(messages) % 2 == 1 and all(
                    m.get("role") == role and (m.get("content", "").endswith(text) if role == "user" else m.get("content") == text)
                    for m, (role, text) in zip(messages, expected))
                CONTEXT.labels("yes" if kept else "no").inc()
                return json.dumps({"choices": [{"message": {"role": "assistant", "content": f"turn {turns} answered"}}],
                                   "usage": {"completion_tokens": TOKENS_PER_ANSWER}}).encode()

            if not self.path.startswith("/v1/chat/completions"):
                BODIES.inc()
                BODY_BYTES.inc(len(data))
                if len(SEEN) < 100_000:
                    SEEN.add(data)
                DISTINCT.set(len(SEEN))
            self._serve(chat if self.path.startswith("/v1/chat/completions") else (lambda: b'{"ok": true}'))

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    probe.start()
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
