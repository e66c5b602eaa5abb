"""`gpuscope exporter [--listen ADDR] [--node-name N]`: this node's processes as Prometheus metrics.

Headless: neither the console nor torch is imported. The node is sampled every --refresh seconds
(console.refresh_s) with the leak thresholds of the settings' [alerts]; each scrape answers from
the latest sample. Listens on 127.0.0.1:9835 unless told otherwise; with --tls-cert and
--tls-key it serves HTTPS, and with --tls-client-ca as well it requires a client certificate
signed by that CA. Reads, connections and their number are bounded (`core.fleet.serving`).
"""

from __future__ import annotations

import argparse
import signal
import socket
import ssl
import sys
import threading

from gpuscope.config import Settings
from gpuscope.errors import Failure, UsageError

DEFAULT_LISTEN = "127.0.0.1:9835"


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT -> (host, port); UsageError with one line otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise UsageError(f"--listen expects HOST:PORT (e.g. {DEFAULT_LISTEN}), not {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"--listen: the port must be a whole number, not {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"--listen: the port must be from 0 to 65535, not {port}")
    return host, port


def _check_tls(args: argparse.Namespace) -> None:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise UsageError("--tls-client-ca needs --tls-cert and --tls-key (client certificates need TLS)")



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve this node's GPUs and processes as Prometheus metrics: per-process GPU memory, RSS, growth and "
        "the leak detector's verdict, sampled every --refresh seconds with the [alerts] thresholds. "
        "Listens on loopback unless told otherwise."
    )
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="ADDR",
                        help="HOST:PORT to serve /metrics on (default 127.0.0.1:9835; 0.0.0.0:9835 for every interface)")
    parser.add_argument("--node-name", metavar="N", help="the node label (default: this host's name)")
    parser.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM) ...")
    parser.add_argument("--tls-key", metavar="FILE", help="... and this private key (PEM)")
    parser.add_argument("--tls-client-ca", metavar="FILE",
                        help="with --tls-cert: require a client certificate signed by this CA (mutual TLS)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    host, port = parse_listen(args.listen)
    _check_tls(args)
    node = args.node_name or socket.gethostname()
    if not node or len(node) > 253 or not node.isprintable():
        raise UsageError("--node-name must be 1 to 253 printable characters")

    from prometheus_client import CollectorRegistry
    from prometheus_client.process_collector import ProcessCollector

    from gpuscope.core.fleet.exporter import NodeAgent
    from gpuscope.core.fleet.serving import serve_metrics, tls_context

    try:
        tls = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    except (OSError, ssl.SSLError) as exc:
        raise Failure(f"cannot serve on {args.listen}: {exc.strerror or exc}") from None
    agent = NodeAgent(node, interval=settings.refresh_s, thresholds=settings.thresholds)
    registry = CollectorRegistry()
    registry.register(agent.collector)
    ProcessCollector(namespace="gpuscope_exporter", registry=registry)  # its own CPU and memory
    try:
        server, thread = serve_metrics(host, port, registry, tls=tls)
    except OSError as exc:
        raise Failure(f"cannot serve on {args.listen}: {exc.strerror or exc}") from None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    agent.start()
    bound_host, bound_port = str(server.server_address[0]), server.server_address[1]
    scheme = "https" if args.tls_cert else "http"
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"gpuscope exporter: serving {scheme}://{shown}:{bound_port}/metrics for node {node}", file=sys.stderr,
          flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5.0)
        agent.stop()
    return 0
