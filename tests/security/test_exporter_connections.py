"""`gpuscope exporter` answers Prometheus while another local user holds connections open to it.

The exporter runs as a service would (1024 descriptors, systemd's default); the other user opens
1,100 connections and sends nothing on them, or starts a TLS connection and never says hello.
Scrapes are still answered, and a silent connection is closed by the exporter.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import ssl
import subprocess
import time
import urllib.request

import pytest

from conftest import SYSTEM_PYTHON
from gpuscope.core.fleet import serving
from gpuscope.core.target import privilege
from helpers import free_port, gpuscope_cmd, require_tool, wait_until

IDLE_CONNECTIONS = 1100
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# The other user's connections: opened one after another, nothing ever sent, held until killed.
HOLD = """
import select, socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
pending, held = {}, []
for _ in range(count):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    pending[s.fileno()] = s
poll = select.poll()
for fd in pending:
    poll.register(fd, select.POLLOUT)
deadline = time.monotonic() + 60
while pending and time.monotonic() < deadline:
    for fd, _ in poll.poll(1000):
        s = pending.pop(fd)
        poll.unregister(fd)
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            held.append(s)
print("held", len(held), flush=True)
time.sleep(600)
"""


def service_limits() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@contextlib.contextmanager
def exporter(*args: str):
    port = free_port()
    proc = subprocess.Popen([*gpuscope_cmd(), "--refresh", "0.5", "exporter", "--listen", f"127.0.0.1:{port}",
                             "--node-name", "n", *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=service_limits)
    try:
        wait_until(lambda: proc.poll() is not None or _listening(port), timeout=30, what="the exporter")
        assert proc.poll() is None, proc.stderr.read()
        yield proc, port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def scrape(url: str, context: ssl.SSLContext | None = None) -> str:
    opener = _DIRECT if context is None else urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(url, timeout=10) as r:
        return r.read().decode()


def hold_connections(other_user, port: int, count: int) -> subprocess.Popen:
    def more_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, max(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))

    holder = other_user.popen([SYSTEM_PYTHON, "-c", HOLD, str(port), str(count)], stdout=subprocess.PIPE, text=True,
                              preexec_fn=more_files)
    said = privilege.read_until(holder.stdout, time.monotonic() + 120, line=True).split()
    assert said[:1] == ["held"], said
    assert int(said[1]) >= count * 0.9, said  # nearly all of them: the kernel's queue holds the rest
    return holder


def open_sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def test_eleven_hundred_idle_connections_of_another_user_do_not_stop_scrapes(other_user):
    with exporter() as (proc, port):
        holder = hold_connections(other_user, port, IDLE_CONNECTIONS)
        # For a while (the queued ones keep arriving): every scrape is answered, and the exporter
        # holds at most its bound of connections (each one a descriptor and a thread); the rest
        # were closed, or wait in the kernel's queue, where they cost the exporter nothing.
        until = time.monotonic() + 10
        while time.monotonic() < until:
            assert "gpuscope_exporter_" in scrape(f"http://127.0.0.1:{port}/metrics")
            assert open_sockets(proc.pid) <= serving.MAX_CONNECTIONS + 8
            time.sleep(0.5)
        assert holder.poll() is None and proc.poll() is None


def test_a_connection_that_says_nothing_is_closed_by_the_exporter(other_user):
    with exporter() as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=serving.READ_TIMEOUT_S * 4) as idle:
            started = time.monotonic()
            assert idle.recv(1) == b""  # closed by the exporter (a timeout here raises instead)
            assert time.monotonic() - started < serving.CONNECTION_DEADLINE_S * 2


@pytest.fixture
def certificate(tmp_path):
    openssl = require_tool("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def test_a_tls_connection_that_never_says_hello_does_not_stop_https_scrapes(other_user, certificate):
    cert, key = certificate
    with exporter("--tls-cert", str(cert), "--tls-key", str(key)) as (proc, port):
        holder = hold_connections(other_user, port, 50)
        context = ssl.create_default_context(cafile=str(cert))
        for _ in range(3):
            assert "gpuscope_exporter_" in scrape(f"https://127.0.0.1:{port}/metrics", context)
        assert holder.poll() is None and proc.poll() is None
