"""Serving /metrics where any local user (and, on 0.0.0.0, any pod) may connect.

One request per connection, each on a thread of its own, as prometheus_client's own server does,
with three bounds it lacks: every read (the request, and the TLS handshake, which is done on that
thread rather than in the accepting loop) waits at most `READ_TIMEOUT_S`; a connection lives at
most `CONNECTION_DEADLINE_S`; and at most `MAX_CONNECTIONS` are open at once. A new connection
past the bound closes the oldest one: connections that say nothing cannot pile up until the
process runs out of descriptors or threads and stops accepting, and a scrape, which sends its
request at once and is answered within milliseconds, is never the oldest for long.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

READ_TIMEOUT_S = 5.0  # one read of a request or of the TLS handshake
CONNECTION_DEADLINE_S = 15.0  # a connection's whole life: its request read and answered
MAX_CONNECTIONS = 64  # open at once (each holds a thread and a descriptor)
BACKLOG = 128  # connections the kernel queues until they are accepted


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_S  # StreamRequestHandler sets it on the connection

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        """No line per scrape on standard error."""


class MetricsServer(WSGIServer):
    """A WSGI server with a thread per connection, bounded as the module says."""

    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily, tls: ssl.SSLContext | None) -> None:
        self.address_family = family
        self._tls = tls
        self._open: dict[socket.socket, float] = {}  # by age: the oldest first
        self._open_lock = threading.Lock()
        super().__init__(address, _QuietHandler)

    def server_bind(self) -> None:
        # As HTTPServer's, without its reverse DNS lookup of the address (a node may have no DNS).
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()

    def get_request(self) -> tuple[socket.socket, object]:
        conn, address = self.socket.accept()
        conn.settimeout(READ_TIMEOUT_S)
        if self._tls is not None:
            # The handshake waits for the client: on the connection's own thread, not here.
            conn = self._tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, address

    def process_request(self, request, client_address) -> None:
        now = time.monotonic()
        with self._open_lock:
            for conn, since in list(self._open.items()):
                if len(self._open) < MAX_CONNECTIONS and now - since <= CONNECTION_DEADLINE_S:
                    break
                _cut(conn)
                del self._open[conn]
            self._open[request] = now
        thread = threading.Thread(target=self._serve_one, args=(request, client_address), daemon=True,
                                  name="gpuscope-metrics-request")
        try:
            thread.start()
        except RuntimeError:  # no thread can be started now: this connection is closed, the next one tried
            self._forget(request)
            self.shutdown_request(request)

    def _serve_one(self, request: socket.socket, client_address: object) -> None:
        try:
            if isinstance(request, ssl.SSLSocket):
                request.do_handshake()
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 -- a client that sends garbage, stalls or is cut: its connection only
            pass
        finally:
            self._forget(request)
            self.shutdown_request(request)

    def _forget(self, request: socket.socket) -> None:
        # Under the lock, before the connection is closed: `_cut` never reaches a closed descriptor.
        with self._open_lock:
            self._open.pop(request, None)

    def open_connections(self) -> int:
        with self._open_lock:
            return len(self._open)

    def handle_error(self, request, client_address) -> None:
        """Nothing on standard error for a client's fault."""


def _cut(conn: socket.socket) -> None:
    """End a connection whose thread may be waiting on it: the wait returns at once."""
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)  # under TLS too: the TCP connection itself
    except OSError:
        pass


def tls_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """A server context for `cert` and `key`; with `client_ca`, a client certificate signed by it
    is required. Raises OSError, ssl.SSLError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=cert, keyfile=key)
    if client_ca:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def serve_metrics(host: str, port: int, registry: CollectorRegistry, *,
                  tls: ssl.SSLContext | None = None) -> tuple[MetricsServer, threading.Thread]:
    """Serve `registry` on host:port (on a thread of its own, started here). Raises OSError."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server = MetricsServer((str(sockaddr[0]), port), family, tls)
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="gpuscope-metrics-server", daemon=True)
    thread.start()
    return server, thread
