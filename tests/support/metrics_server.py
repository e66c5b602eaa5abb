"""A loopback HTTP server the serving-metrics tests scrape: each path answers what the test set.

    with MetricsServer() as server:
        server.route("/metrics", Reply(text))
        url = server.url("/metrics")

A reply's body may be a callable (evaluated per request: time-dependent expositions), it may be
slow (`delay`, cut short when the server closes, so no test waits on a sleeper) or gzipped, and
`status` may be an error. `server.seen` records the headers of every request.

`RawServer` is the hostile kind: it writes whatever bytes its `respond` function writes, as slowly
as it likes (a byte a second, a gzip bomb made as it is sent, a status line no server would send).

Also `demo_service()`: gpuscope's demo RAG service as a real child process, and `ask()` to query it.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
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


# -- hostile servers --------------------------------------------------------------------------------


@dataclass
class Request:
    path: str
    headers: dict[str, str]  # names lowercased


class RawServer:
    """A loopback TCP server answering every request with `respond(request, conn, closing)`.

    `respond` writes raw bytes to `conn` and returns; it must give up once `closing` is set (wait
    on it rather than sleep), so that closing the server never waits for a slow answer.
    `seen` records every request (path, headers), whatever is then answered.
    """

    def __init__(
        self, respond: Callable[[Request, socket.socket, threading.Event], None], tls: ssl.SSLContext | None = None
    ) -> None:
        self.respond = respond
        self.tls = tls  # answer over TLS with this server context
        self.seen: list[Request] = []
        self.connections = 0
        self.closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def url(self, path: str = "/metrics") -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            with conn:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    data = conn.recv(4096)
                    if not data:
                        return
                    head += data
                lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                request = Request(path, headers)
                self.seen.append(request)
                self.respond(request, conn, self.closing)
        except OSError:
            conn.close()  # the client gave up (or failed the handshake): what a hostile server expects


def drip(conn: socket.socket, closing: threading.Event, data: bytes, every: float = 1.0) -> None:
    """Send `data` one byte every `every` seconds (until the client leaves or the server closes)."""
    for i in range(len(data)):
        conn.sendall(data[i : i + 1])
        if closing.wait(every):
            return


def gzip_bomb(conn: socket.socket, closing: threading.Event, inflated: int = 10 << 30, status: int = 200) -> int:
    """A gzip body that inflates to `inflated` bytes of zeros (~1/1000 of that on the wire),
    compressed as it is sent: the server never holds more than a MiB of it. Returns the
    compressed bytes the client took before it hung up."""
    conn.sendall(
        f"HTTP/1.1 {status} OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
        "Content-Encoding: gzip\r\nConnection: close\r\n\r\n".encode()
    )
    stream = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    sent = 0
    for _ in range(inflated >> 20):
        if closing.is_set():
            break
        data = stream.compress(zeros)
        if data:
            conn.sendall(data)
            sent += len(data)
    conn.sendall(stream.flush())
    return sent


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
