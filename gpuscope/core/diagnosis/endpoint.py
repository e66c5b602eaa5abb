"""Whether a process is the service whose signals a diagnosis reads.

The service's signals (its latency, tokens per second, stage latencies) bear on a process only if
that process serves them: the API server that listens on the metrics endpoint's port, or a process
of its tree (vLLM's workers hold the GPU memory, their parent listens). On a busy node the process
diagnosed may be another program altogether; steps 3 and 5 then say so instead of judging it by a
service it has nothing to do with.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import psutil

MAX_TREE = 64  # processes of the tree looked at: a service's workers, not a whole node
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}


def serves_endpoint(pid: int, target: str) -> bool | None:
    """True: `pid`, its parent or one of its descendants listens on the port of a URL in `target`
    (URLs joined by ","); False: none of them does, and all could be read; None: not known (no URL
    on this host, e.g. a Prometheus server's target, or their sockets may not be read)."""
    ports = _local_ports(target)
    if not ports:
        return None
    try:
        proc = psutil.Process(pid)
        tree = [proc, *proc.children(recursive=True)[: MAX_TREE - 2]]
        parent = proc.parent()
        if parent is not None and parent.pid > 1:
            tree.append(parent)
    except psutil.Error:
        return None
    unknown = False
    for member in tree:
        try:
            listening = {c.laddr.port for c in member.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            continue
        except psutil.Error:
            unknown = True
            continue
        if listening & ports:
            return True
    return None if unknown else False


def _local_ports(target: str) -> set[int]:
    """The ports of the http(s) URLs in `target` whose host is this machine."""
    local = set(LOCAL_HOSTS) | {socket.gethostname().lower()}
    ports = set()
    for url in target.split(",")[:16]:
        try:
            parts = urlsplit(url.strip())
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        except ValueError:
            continue
        host = (parts.hostname or "").lower()
        if port is not None and parts.scheme in ("http", "https") and (host in local or host.startswith("127.")):
            ports.add(port)
    return ports
