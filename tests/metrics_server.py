"""A loopback HTTP server the serving-metrics tests scrape: each path answers what the test set.

    with MetricsServer() as server:
        server.route("/metrics", Reply(text))
        url = server.url("/metrics")

A reply's body may be a callable (evaluated per request: time-dependent expositions), it may be
slow (`delay`, cut short when the server closes, so no test waits on a sleeper) or gzipped, and
`status` may be an error. `server.seen` records the headers of every request.

Also `demo_service()`: gpuscope's demo RAG service as a real child process, and `ask()` to query it.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlencode

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass
class Reply:
    body: str | bytes | Callable[[], str] = ""
    status: int = 200
    content_type: str = TEXT
    delay: float = 0.0
    gzip: bool = False


class MetricsServer:
    def __init__(self) -> None:
        self.routes: dict[str, Reply] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server.seen.append((self.path, dict(self.headers)))
                reply = server.routes.get(self.path.split("?")[0])
                if reply is None:
                    self.send_error(404)
                    return
                if reply.delay:
                    server._closing.wait(reply.delay)
                    if server._closing.is_set():
                        return
                body = reply.body() if callable(reply.body) else reply.body
                data = body.encode() if isinstance(body, str) else body
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                if reply.gzip:
                    data = gzip.compress(data)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def route(self, path: str, reply: Reply) -> None:
        self.routes[path] = reply

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> MetricsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()


# -- the demo RAG service, as a real child process -------------------------------------------------

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@contextlib.contextmanager
def demo_service() -> Iterator[str]:
    """`python -m gpuscope.demo.service --port 0`; yields its base URL, kills it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuscope.demo.service", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://"), f"demo service said {line!r}"
        yield line.removeprefix("listening on ")
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def ask(base_url: str, words: str) -> dict:
    """One /query to the demo service (a real request through its whole pipeline)."""
    with _DIRECT.open(f"{base_url}/query?{urlencode({'q': words})}", timeout=30) as response:
        return json.loads(response.read())


def linear_exposition(slope: float = 10.0, start: float | None = None) -> Callable[[], str]:
    """A RAG-profile exposition whose counters grow at a steady `slope` requests/s from the moment
    it is made: rate() of it is exactly known (requests/s = 1.1 x slope, tokens/s = 40 x slope,
    error_rate = 1/11), and its buckets keep one shape (p50 = 0.1 s, p95 = p99 = 0.5 s)."""
    t0 = time.time() if start is None else start

    def body() -> str:
        n = 1000.0 + slope * (time.time() - t0)
        return (
            "# TYPE rag_request_total counter\n"
            f'rag_request_total{{status="ok"}} {n!r}\n'
            f'rag_request_total{{status="error"}} {n / 10!r}\n'
            "# TYPE rag_token_output_total counter\n"
            f"rag_token_output_total {n * 40!r}\n"
            "# TYPE rag_request_latency_seconds histogram\n"
            f'rag_request_latency_seconds_bucket{{le="0.1"}} {n * 0.5!r}\n'
            f'rag_request_latency_seconds_bucket{{le="0.5"}} {n * 0.9!r}\n'
            f'rag_request_latency_seconds_bucket{{le="+Inf"}} {n!r}\n'
            f"rag_request_latency_seconds_sum {n * 0.2!r}\n"
            f"rag_request_latency_seconds_count {n!r}\n"
        )

    return body
