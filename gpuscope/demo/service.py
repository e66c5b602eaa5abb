"""A small RAG service that leaks: the patient `gpuscope demo` attaches the console to.

    python -m gpuscope.demo.service --port 0 [--host 127.0.0.1] [--leak-kb N] [--cuda] [--no-leak]
                                    [--workers N --service-ms MS]

A real HTTP server whose `/query` runs retriever -> reranker -> llm, each doing real CPU work
with realistic timings, and exposes Prometheus metrics on `/metrics`. The bug to find: the
retriever caches every query's candidate block in an unbounded dict, and queries are unique, so
the process's memory (and, with --cuda, its GPU memory) grows for as long as it serves.
With --no-leak the cache is never filled: the same service, healthy.

With --workers N --service-ms MS the service has a known capacity: a pool of N workers, each
serving one query at a time for MS milliseconds (the llm stage paces its tokens to end then), so it
serves at most N * 1000 / MS queries a second while its own work fits in MS; past that, queries
wait for a worker and their latency grows with the queue. Without them, every query runs at once.

It starts gpuscope's probe (`gpuscope.probe`) at start-up, as a service that opts in would, so the
console can ask it for allocation sites without injecting anything (`--no-probe` leaves it out).

Standard library + prometheus_client only; torch is imported only with --cuda.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import os
import random
import socket
import socketserver
import sys
import threading
import time
from array import array
from collections import Counter as TermCounts
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from operator import mul
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gpuscope import probe
from gpuscope.demo.lifecycle import stop_on_signals, watch_parent

DIM = 64  # embedding width: small enough for a pure-Python brute-force search
CORPUS_SIZE = 4000  # documents; a search then takes ~5-30 ms of pure Python
TOP_K = 20  # candidates handed from the retriever to the reranker
CONTEXT_DOCS = 4  # reranked documents the llm stage reads
# Default leak per query: a top-k block of 768-wide float32 embeddings, 64 x 768 x 4 B = 192 KiB.
# At the demo's ~10 requests/s that is ~2 MB/s of RSS, plain in the console within seconds.
DEFAULT_LEAK_KB = 192
DEFAULT_CUDA_LEAK_KB = 1024
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25)
STAGES = ("retriever", "reranker", "llm")

VOCABULARY = (
    "gpu memory kernel tensor batch cache token latency throughput model layer attention "
    "embedding vector index shard replica node cluster queue request response stream decode "
    "prefill context window prompt answer retrieval rerank score document corpus query search "
    "nearest neighbour cosine distance quantize precision float half bfloat int8 weights "
    "gradient inference serving scheduler allocator fragment block page paged kv store "
    "eviction policy warmup steady leak growth trace profile sample stack thread process "
    "driver cuda nvml device host transfer pinned copy async sync barrier collective allreduce "
    "pipeline stage retriever reranker generator encoder decoder transformer head norm "
    "activation softmax logits sampling temperature topk nucleus beam greedy length budget "
    "timeout retry backoff circuit breaker health probe metric histogram bucket quantile rate "
    "incident alert pager runbook dashboard console snapshot replay report evidence verdict"
).split()


# -- embeddings ----------------------------------------------------------------------------------


def token_vector(token: str) -> list[float]:
    """A deterministic pseudo-embedding of one token: 64 bytes of BLAKE2b mapped to [-1, 1)."""
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=DIM).digest()
    return [(b - 128) / 128.0 for b in digest]


_VOCAB_VECTORS = {w: token_vector(w) for w in VOCABULARY}


def embed(tokens: list[str]) -> array:
    """Unit-length sum of token vectors. Unknown tokens are hashed on the fly, never memoised
    (queries carry unique tokens; memoising them would be a second, unintended leak)."""
    acc = [0.0] * DIM
    for tok in tokens:
        vec = _VOCAB_VECTORS.get(tok) or token_vector(tok)
        acc = [a + b for a, b in zip(acc, vec)]
    norm = math.sqrt(sum(a * a for a in acc)) or 1.0
    return array("d", (a / norm for a in acc))


def tokenize(text: str) -> list[str]:
    return [t for t in "".join(c.lower() if c.isalnum() else " " for c in text).split() if t]


# -- the pipeline --------------------------------------------------------------------------------


class Corpus:
    """Synthetic documents with precomputed embeddings, term counts and IDF (built once, ~0.5 s)."""

    def __init__(self, size: int = CORPUS_SIZE, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.texts: list[str] = []
        self.terms: list[TermCounts] = []
        self.vectors: list[array] = []
        doc_freq: TermCounts = TermCounts()
        for _ in range(size):
            # A topical skew (a few words repeated) so searches have real winners.
            topic = rng.sample(VOCABULARY, 3)
            words = [rng.choice(VOCABULARY) for _ in range(rng.randint(18, 36))] + topic * 2
            rng.shuffle(words)
            self.texts.append(" ".join(words))
            counts = TermCounts(words)
            self.terms.append(counts)
            doc_freq.update(counts.keys())
            self.vectors.append(embed(words))
        self.idf = {w: math.log(1 + (size - n + 0.5) / (n + 0.5)) for w, n in doc_freq.items()}
        self.avg_len = sum(sum(c.values()) for c in self.terms) / max(1, size)


class Retriever:
    """Brute-force dot-product search. Holds THE LEAK: an unbounded per-query cache."""

    def __init__(self, corpus: Corpus, leak_kb: int, cuda_leak_kb: int, torch_mod: Any = None) -> None:
        self.corpus = corpus
        self.leak_bytes = max(0, leak_kb) * 1024
        self.cuda_leak_bytes = max(0, cuda_leak_kb) * 1024
        self.torch = torch_mod  # set only when --cuda found a working CUDA device
        self.leak_enabled = True
        self.cache: dict[str, tuple[list[int], Any, Any]] = {}
        self.cache_bytes = 0
        self.cache_cuda_bytes = 0
        self._lock = threading.Lock()

    def search(self, query: str, tokens: list[str]) -> list[int]:
        hit = self.cache.get(query)
        if hit is not None:
            return hit[0]
        q = embed(tokens)
        vectors = self.corpus.vectors
        scores = ((sum(map(mul, q, vectors[i])), i) for i in range(len(vectors)))
        top = [i for _, i in heapq.nlargest(TOP_K, scores)]
        if self.leak_enabled:
            self._remember(query, q, top)
        return top

    def _remember(self, query: str, q: array, top: list[int]) -> None:
        # The bug: "cache the candidate block so a repeated query skips the search" -- but
        # nothing ever evicts, and real queries are almost never repeated. The block is written
        # out in full (array repetition touches every page), so it is resident memory, not a
        # lazily-mapped reservation.
        block = array("f", q) * max(1, self.leak_bytes // (DIM * 4)) if self.leak_bytes else None
        held = len(block) * block.itemsize if block is not None else 0
        gpu = None
        if self.torch is not None and self.cuda_leak_bytes:
            gpu = self.torch.full((self.cuda_leak_bytes // 4,), float(q[0]), device="cuda")
        with self._lock:
            if query not in self.cache:
                self.cache[query] = (top, block, gpu)
                self.cache_bytes += held
                self.cache_cuda_bytes += self.cuda_leak_bytes if gpu is not None else 0

    def clear(self) -> None:
        with self._lock:
            self.cache = {}
            self.cache_bytes = 0
            self.cache_cuda_bytes = 0
        if self.torch is not None:
            self.torch.cuda.empty_cache()  # hand the freed blocks back so NVML sees the drop


def rerank(corpus: Corpus, tokens: list[str], candidates: list[int]) -> list[tuple[float, int]]:
    """BM25 over the candidates plus a pairwise "cross-encoder" term (hash of each token pair):
    a few ms of work that scales with candidates x query length x document length."""
    k1, b = 1.2, 0.75
    scored = []
    for i in candidates:
        counts = corpus.terms[i]
        length = sum(counts.values())
        bm25 = 0.0
        for t in tokens:
            tf = counts.get(t, 0)
            if tf:
                bm25 += corpus.idf.get(t, 0.0) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / corpus.avg_len))
        cross = 0
        for t in tokens:
            for w in counts:
                cross += hashlib.blake2b(f"{t}|{w}".encode(), digest_size=2).digest()[0]
        scored.append((bm25 + cross / (255.0 * max(1, len(tokens) * len(counts))), i))
    scored.sort(reverse=True)
    return scored


class Generator:
    """A toy decoder: a prefill pass over the context, then one small mat-vec per token plus a
    short sleep standing in for the accelerator, so TTFT and TPOT look like a real server's."""

    def __init__(self, seed: int = 11) -> None:
        rng = random.Random(seed)
        self.weights = [array("d", (rng.uniform(-1, 1) / DIM for _ in range(DIM))) for _ in range(DIM)]

    def _step(self, h: array) -> array:
        out = array("d", (math.tanh(sum(map(mul, row, h))) for row in self.weights))
        return out

    def generate(self, context: list[str], n_tokens: int, on_first_token: Any, deadline: float | None = None) -> list[str]:
        """`deadline` (time.perf_counter()): the tokens are paced to end then (a worker's service time)."""
        rng = random.Random(hash(tuple(context[:8])))
        h = embed(context[:16])
        for tok in context[:48]:  # prefill: one step per context token
            h = self._step(array("d", (a + b for a, b in zip(h, _VOCAB_VECTORS.get(tok) or h))))
        out: list[str] = []
        for n in range(n_tokens):
            h = self._step(h)
            pause = rng.uniform(0.004, 0.012) if deadline is None else (deadline - time.perf_counter()) / (n_tokens - n)
            time.sleep(max(0.0, pause))
            word = context[int(abs(h[n % DIM]) * 1e6) % len(context)] if context else rng.choice(VOCABULARY)
            out.append(word)
            if n == 0:
                on_first_token()
        return out


# -- metrics -------------------------------------------------------------------------------------


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_latency = Histogram(
            "rag_request_latency_seconds", "End-to-end /query latency", buckets=LATENCY_BUCKETS, registry=r
        )
        self.stage_latency = Histogram(
            "rag_stage_latency_seconds", "Latency of one pipeline stage", ["stage"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.requests = Counter("rag_request_total", "Finished /query requests", ["status"], registry=r)
        self.tokens = Counter("rag_token_output_total", "Tokens generated by the llm stage", registry=r)
        self.vector_search = Histogram(
            "vector_search_latency_seconds", "Brute-force vector search latency", buckets=LATENCY_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            "rag_time_to_first_token_seconds", "Request start to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "rag_time_per_output_token_seconds", "Mean time per output token after the first",
            buckets=TOKEN_BUCKETS, registry=r,
        )
        self.in_flight = Gauge("rag_requests_in_flight", "Requests being served now", registry=r)
        self.cache_entries = Gauge("rag_retriever_cache_entries", "Entries in the retriever cache", registry=r)
        # Every label value exists from the start, so a scrape of an idle service already shows
        # the stages (with zero counts) instead of missing series.
        for stage in STAGES:
            self.stage_latency.labels(stage=stage)
        for status in ("ok", "error"):
            self.requests.labels(status=status)


# -- the service ---------------------------------------------------------------------------------


class WorkerPool:
    """N workers, each serving one query at a time for `service_s`. A query is given the worker
    free soonest, from when it is free; the workers' time is kept by the clock, so a thread that
    wakes late (a busy interpreter) delays its own answer, never the next query's start: the pool
    serves N / service_s queries a second when it is kept busy, whatever the machine."""

    def __init__(self, workers: int, service_s: float) -> None:
        self.service_s = service_s
        self._free_at = [0.0] * workers
        self._lock = threading.Lock()

    def reserve(self) -> tuple[float, float]:
        """When this query's service begins and ends (time.perf_counter())."""
        with self._lock:
            worker = min(range(len(self._free_at)), key=self._free_at.__getitem__)
            begin = max(time.perf_counter(), self._free_at[worker])
            self._free_at[worker] = begin + self.service_s
        return begin, begin + self.service_s


class RagService:
    def __init__(self, leak_kb: int = DEFAULT_LEAK_KB, cuda_leak_kb: int = DEFAULT_CUDA_LEAK_KB, torch_mod: Any = None,
                 workers: int | None = None, service_ms: float | None = None):
        self.corpus = Corpus()
        self.retriever = Retriever(self.corpus, leak_kb, cuda_leak_kb, torch_mod)
        self.generator = Generator()
        self.metrics = Metrics()
        self.cuda = torch_mod is not None
        self._served = 0
        self._lock = threading.Lock()
        # the worker pool of a known capacity (None: every query runs at once)
        self.pool = WorkerPool(workers, (service_ms or 200.0) / 1000) if workers else None

    @property
    def requests_served(self) -> int:
        return self._served

    def query(self, text: str) -> dict:
        m = self.metrics
        start = time.perf_counter()
        m.in_flight.inc()  # waiting for a worker counts: it is the queue
        if self.pool is None:
            try:
                return self._serve(text, start, None)
            finally:
                m.in_flight.dec()
        begin, deadline = self.pool.reserve()
        try:
            time.sleep(max(0.0, begin - time.perf_counter()))  # in the queue, until its worker is free
            return self._serve(text, start, deadline)
        finally:
            time.sleep(max(0.0, deadline - time.perf_counter()))
            m.in_flight.dec()

    def _serve(self, text: str, start: float, deadline: float | None) -> dict:
        m = self.metrics
        status = "error"
        try:
            tokens = tokenize(text)
            if not tokens:
                raise ValueError("empty query: pass q=some words")
            timings: dict[str, float] = {}

            t = time.perf_counter()
            candidates = self.retriever.search(text, tokens)
            timings["retriever"] = time.perf_counter() - t
            m.vector_search.observe(timings["retriever"])

            t = time.perf_counter()
            ranked = rerank(self.corpus, tokens, candidates)
            timings["reranker"] = time.perf_counter() - t

            t = time.perf_counter()
            context = " ".join(self.corpus.texts[i] for _, i in ranked[:CONTEXT_DOCS]).split()
            first: list[float] = []
            n_tokens = random.randint(16, 64)
            words = self.generator.generate(context, n_tokens, lambda: first.append(time.perf_counter()), deadline)
            done = time.perf_counter()
            timings["llm"] = done - t
            m.tokens.inc(len(words))
            if first:
                m.ttft.observe(first[0] - start)
                if len(words) > 1:
                    m.tpot.observe((done - first[0]) / (len(words) - 1))

            for stage in STAGES:
                m.stage_latency.labels(stage=stage).observe(timings[stage])
            status = "ok"
            return {
                "query": text,
                "answer": " ".join(words),
                "tokens": len(words),
                "documents": [i for _, i in ranked[:CONTEXT_DOCS]],
                "timings_s": {**{k: round(v, 6) for k, v in timings.items()}, "total": round(done - start, 6)},
            }
        finally:
            m.requests.labels(status=status).inc()
            m.request_latency.observe(time.perf_counter() - start)
            m.cache_entries.set(len(self.retriever.cache))
            with self._lock:
                self._served += 1

    def state(self) -> dict:
        r = self.retriever
        return {
            "pid": os.getpid(),
            "leak_enabled": r.leak_enabled,
            "cache_entries": len(r.cache),
            "cache_bytes": r.cache_bytes,
            "cache_cuda_bytes": r.cache_cuda_bytes,
            "cuda": self.cuda,
            "requests_served": self._served,
        }


def _flag(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("1", "true", "on", "yes"):
        return True
    if v in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"expected 0 or 1, not {value!r}")


class Handler(BaseHTTPRequestHandler):
    server_version = "gpuscope-demo-rag/1"
    service: RagService  # set on the subclass made by make_server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # ~10 requests/s of access log would drown the terminal; metrics tell the story

    def _params(self) -> dict[str, str]:
        """Query-string parameters, plus form or JSON body parameters on POST (body wins)."""
        params = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
        if self.command == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 1 << 20)) if length > 0 else b""
            if body:
                if "json" in (self.headers.get("Content-Type") or ""):
                    data = json.loads(body)
                    if isinstance(data, dict):
                        params.update({k: str(v) for k, v in data.items()})
                else:
                    params.update({k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()})
        return params

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode() + b"\n", "application/json")

    def _route(self) -> None:
        path = urlsplit(self.path).path
        svc = self.service
        try:
            params = self._params()
        except (ValueError, UnicodeDecodeError) as exc:
            self._json(400, {"error": f"bad request body: {exc}"})
            return
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/metrics" and self.command == "GET":
            self._send(200, generate_latest(svc.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/query":
            try:
                self._json(200, svc.query(params.get("q", "")))
            except ValueError as exc:
                self._json(400, {"error": str(exc)})
            except Exception as exc:  # a failed request is a 500 and an error count, not a dead server
                self._json(500, {"error": f"{type(exc).__name__}: {exc}"})
        elif path == "/admin/state" and self.command == "GET":
            self._json(200, svc.state())
        elif path == "/admin/leak" and self.command == "POST":
            try:
                enabled, clear = _flag(params.get("enabled")), _flag(params.get("clear"))
            except ValueError as exc:
                self._json(400, {"error": str(exc)})
                return
            if enabled is not None:
                svc.retriever.leak_enabled = enabled
            if clear:
                svc.retriever.clear()
                svc.metrics.cache_entries.set(0)
            self._json(200, svc.state())
        else:
            self._json(404, {"error": f"no route for {self.command} {path}"})

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()


class Server(ThreadingHTTPServer):
    daemon_threads = True  # in-flight requests never hold up shutdown
    request_queue_size = 64

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the FQDN of the host (a DNS lookup that can hang for
        # seconds on a node without DNS); the name is never used here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


def make_server(service: RagService, host: str = "127.0.0.1", port: int = 0) -> Server:
    handler = type("BoundHandler", (Handler,), {"service": service})
    server_class: type[Server] = Server
    if ":" in host:  # an IPv6 literal such as ::1
        server_class = type("Server6", (Server,), {"address_family": socket.AF_INET6})
    return server_class((host, port), handler)


def load_cuda() -> tuple[Any, str | None]:
    """torch when it can put tensors on a GPU, else (None, why not). Imported only on --cuda."""
    try:
        import torch  # noqa: PLC0415 - optional, and costly: only when asked for
    except ImportError:
        return None, "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return None, "torch sees no CUDA device"
        torch.zeros(1, device="cuda")  # create the context now, before the port is announced
    except Exception as exc:  # a broken driver must not stop the CPU demo
        return None, f"{type(exc).__name__}: {exc}"
    return torch, None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gpuscope.demo.service", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: any free port, announced on stdout)")
    p.add_argument("--leak-kb", type=int, default=DEFAULT_LEAK_KB, help="host memory kept per unique query (KiB)")
    p.add_argument("--cuda", action="store_true", help="also keep a CUDA tensor per query (needs torch + CUDA)")
    p.add_argument("--cuda-leak-kb", type=int, default=DEFAULT_CUDA_LEAK_KB, help="GPU memory kept per query (KiB)")
    p.add_argument("--no-probe", action="store_true", help="do not start gpuscope's probe (the service opts in by default)")
    p.add_argument("--no-leak", action="store_true", help="serve without the leak (the retriever caches nothing): a healthy service")
    p.add_argument("--workers", type=int, help="a pool of N workers: a known capacity of N * 1000 / --service-ms queries/s")
    p.add_argument("--service-ms", type=float, default=200.0, help="with --workers: each query holds a worker this long (default 200)")
    args = p.parse_args(argv)
    if args.workers is not None and not 1 <= args.workers <= 256:
        p.error(f"--workers must be 1-256, not {args.workers}")
    if not 1 <= args.service_ms <= 60_000:
        p.error(f"--service-ms must be 1-60000, not {args.service_ms:g}")
    if not 0 <= args.port <= 65535:
        p.error(f"--port must be 0-65535, not {args.port}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    stop_on_signals(stop)
    watch_parent(stop)

    torch_mod = None
    if args.cuda:
        torch_mod, why = load_cuda()
        if torch_mod is None:
            print(f"demo service: CUDA unavailable ({why}); leaking host memory only", file=sys.stderr, flush=True)

    service = RagService(leak_kb=args.leak_kb, cuda_leak_kb=args.cuda_leak_kb, torch_mod=torch_mod,
                         workers=args.workers, service_ms=args.service_ms)
    service.retriever.leak_enabled = not args.no_leak
    try:
        server = make_server(service, args.host, args.port)
    except OSError as exc:
        print(f"demo service: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if not args.no_probe:
        probe.start()  # idle until gpuscope asks; a failure is one line on stderr, never fatal
    host, port = server.server_address[:2]
    host = host.decode() if isinstance(host, bytes) else host  # a socket address is bytes only for AF_UNIX
    shown = f"[{host}]" if ":" in host else host
    # The one line on stdout: the parent reads the port from it.
    print(f"listening on http://{shown}:{port}", flush=True)

    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.25}, name="http", daemon=True)
    thread.start()
    try:
        while not stop.wait(0.5):  # a timed wait keeps the main thread responsive to signals
            pass
    finally:
        server.shutdown()
        server.server_close()
        probe.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
