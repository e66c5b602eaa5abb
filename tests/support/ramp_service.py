"""A small real HTTP service with a known limit, for the load ramp's tests and benchmark.

    python ramp_service.py --port P [--workers N --service-ms MS] [--error-above R] [--keep-kb K]

- `--workers N --service-ms MS`: a pool of N workers, each holding a request MS ms: latency
  breaks at N * 1000 / MS requests/s (queries wait for a worker beyond it);
- `--error-above R`: answers 503 at once to what passes R requests/s (a token bucket): it
  errors instead of slowing down;
- `--keep-kb K`: every request (every chat turn) keeps K KiB in `remember_request`, for ever;
- `POST /v1/chat/completions`: an OpenAI-compatible answer that counts the turns it was sent
  (`ramp_test_chat_turns_total{turn}`) and whether the conversation it was sent is the one it
  answered (`ramp_test_chat_context_total{kept}`: every user message i says "turn i", every
  answer i is its own "turn i answered");
- any other POST: counts the bodies and their bytes, and how many were different
  (`ramp_test_bodies_total`, `ramp_test_body_bytes_total`, `ramp_test_bodies_distinct`).

It exposes its latency histogram on /metrics (the `rag` names gpuscope knows) and starts
gpuscope's probe, as a service that opts in does.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gpuscope import probe

REGISTRY = CollectorRegistry()
LATENCY = Histogram("rag_request_latency_seconds", "latency", registry=REGISTRY,
                    buckets=(0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5))
REQUESTS = Counter("rag_request_total", "requests", ["status"], registry=REGISTRY)
TOKENS = Counter("rag_token_output_total", "tokens", registry=REGISTRY)
IN_FLIGHT = Gauge("rag_requests_in_flight", "in flight", registry=REGISTRY)
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
    it is free, so a thread that wakes late (a busy machine) delays its own answer, never the pool."""

    def __init__(self, workers: int, service_s: float) -> None:
        self.free_at, self.service_s = [0.0] * workers, service_s
        self.lock = threading.Lock()

    def serve(self) -> None:
        with self.lock:
            worker = min(range(len(self.free_at)), key=self.free_at.__getitem__)
            end = max(time.monotonic(), self.free_at[worker]) + self.service_s
            self.free_at[worker] = end
        time.sleep(max(0.0, end - time.monotonic()))


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
    args = p.parse_args()
    pool = Pool(args.workers, args.service_ms / 1000) if args.workers else None
    bucket = Bucket(args.error_above) if args.error_above else None

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
                REQUESTS.labels("error").inc()
                self._send(503, b'{"error": "over capacity"}')
                return
            IN_FLIGHT.inc()
            try:
                if pool is not None:
                    pool.serve()
                if args.keep_kb:
                    remember_request(args.keep_kb)
                body = answer()
            finally:
                IN_FLIGHT.dec()
            LATENCY.observe(time.perf_counter() - start)
            REQUESTS.labels("ok").inc()
            TOKENS.inc(8)
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
                                   "usage": {"completion_tokens": 8}}).encode()

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
