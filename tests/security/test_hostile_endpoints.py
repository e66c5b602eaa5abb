"""Hostile HTTP servers against everything gpuscope reads from the network.

`gpuscope metrics --metrics-url`, `gpuscope metrics --prometheus`, and the readers the console
runs (a ServingSource) meet real servers on loopback ports that misbehave on purpose: a gzip bomb,
a byte a second in the headers or in the body, a redirect to another origin that records the
credentials it receives, control characters in the reason phrase and the body, 100,000 series,
100,000 nested `[`. Each must end in bounded time (wall time asserted) and memory (the child's
peak RSS, from wait4, under an address-space limit so a regression fails instead of eating the
node), with one printable line and a non-zero exit status. Bad URLs are refused before any
connection.
"""

from __future__ import annotations

import gzip
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from gpuscope.core.serving import fetch
from gpuscope.core.serving.profiles import BUILTIN_PROFILES
from gpuscope.core.common.json_depth import nests_deeper
from gpuscope.core.serving.prometheus import MAX_JSON_DEPTH, MAX_REPLY_BYTES, PrometheusCollector
from gpuscope.core.serving.scrape import MAX_BYTES, ScrapeCollector
from gpuscope.core.serving.source import ServingSource
from helpers import gpuscope_cmd, require_tool, wait_until
from metrics_server import RawServer, drip, gzip_bomb

TOKEN = "tok-Zq81-very-secret"
PASSWORD = "pa55-w0rd-secret"
EXPOSITION = b'# TYPE rag_request_total counter\nrag_request_total{status="ok"} 7\n'
NAMES = b'{"status":"success","data":["rag_request_total"]}'
EMPTY_QUERY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
COMMAND_TIMEOUT_S = 5.0  # what `gpuscope metrics` gives a read (make_collector's default)
LIMIT_AS = 2 << 30  # the child's address space: an 8 GB inflate fails fast instead of swapping
MAX_RSS_MB = 150  # gpuscope metrics peaks at ~30 MB; ~45 MB refusing a bomb, ~75 MB a 16 MiB line


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_mb: float


def run_gpuscope(*args: str, env: dict[str, str] | None = None, timeout: float = 40.0) -> Run:
    """`gpuscope ARGS` in a child under LIMIT_AS, killed after `timeout`; its own peak RSS."""
    return _measured([sys.executable, "-c", LIMITED, *gpuscope_cmd(), *args], env, timeout)


LIMITED = (  # the command, exec'd under the limit: same process, so its peak RSS is the command's
    "import os, resource, sys\n"
    f"resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_AS}, {LIMIT_AS}))\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)

# Linux keeps a process's peak RSS across exec, and a child forked from pytest starts with
# pytest's pages (hundreds of MB late in a run): so a small launcher forks the measured command
# (its pages are the launcher's few), waits for it, and writes its peak RSS in kB and its exit
# status to argv[1].
LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "with open(sys.argv[1], 'w') as f:\n"
    "    f.write('%d %d' % (usage.ru_maxrss, os.waitstatus_to_exitcode(status)))\n"
)


def _measured(cmd: list[str], env: dict[str, str] | None, timeout: float) -> Run:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, peak.name, *cmd], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        killer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
        killer.start()
        try:
            proc.wait()
        finally:
            killer.cancel()
        wall = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode(errors="replace") for f in (out, err))
        said = peak.read().split()
        if not said:  # killed at the timeout, launcher and all
            return Run(-signal.SIGKILL, stdout, stderr, wall, float("nan"))
        return Run(int(said[1]), stdout, stderr, wall, int(said[0]) / 1024)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_PROMETHEUS_")}
    env.update(extra)
    return env


def metrics(kind: str, url: str, **env: str) -> Run:
    option = "--metrics-url" if kind == "scrape" else "--prometheus"
    return run_gpuscope("metrics", option, url, "--window", "0", env=clean_env(**env))


def assert_printable(text: str) -> None:
    bad = sorted({c for c in text if c != "\n" and not c.isprintable()})
    assert not bad, f"unprintable characters reach the terminal: {bad!r} in {text!r}"


def assert_refused(run: Run, first_line: str, max_wall_s: float) -> None:
    """Exit status 1, one line saying why (the command adds a hint line), printable, bounded."""
    assert run.returncode == 1, run
    assert run.stdout == "" and "Traceback" not in run.stderr, run.stderr
    assert_printable(run.stderr)
    lines = run.stderr.rstrip("\n").split("\n")
    assert len(lines) == 2, run.stderr  # the reason, then the command's hint
    assert re.fullmatch(first_line, lines[0]), lines[0]
    assert run.wall_s < max_wall_s, f"took {run.wall_s:.1f} s"
    assert run.peak_rss_mb < MAX_RSS_MB, f"peak RSS {run.peak_rss_mb:.0f} MB"


# -- what the hostile servers answer ---------------------------------------------------------------


def answer(status: str, body: bytes, content_type: str = "text/plain; version=0.0.4", **headers: str):
    """A whole answer at once; `headers` (Content_Length=...) add to or replace the usual ones."""
    fields = {"Content-Type": content_type, "Content-Length": str(len(body)), "Connection": "close"}
    fields.update({k.replace("_", "-"): v for k, v in headers.items()})

    def respond(request, conn, closing) -> None:
        head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
        conn.sendall(head.encode("latin-1") + b"\r\n" + body)

    return respond


def prometheus_api(names: bytes = NAMES, query: bytes = EMPTY_QUERY):
    def respond(request, conn, closing) -> None:
        body = names if request.path.startswith("/api/v1/label/") else query
        answer("200 OK", body, "application/json")(request, conn, closing)

    return respond


def bomb(request, conn, closing) -> None:
    gzip_bomb(conn, closing)  # 10 GiB of zeros once inflated, ~10 MB on the wire, made as sent


def headers_drip(every: float):
    def respond(request, conn, closing) -> None:
        drip(conn, closing, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Slow: " + b"a" * 10_000, every)

    return respond


def body_drip(every: float, content_type: str = "text/plain; version=0.0.4"):
    def respond(request, conn, closing) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: 100000\r\n\r\n".encode())
        drip(conn, closing, b"#" * 100_000, every)

    return respond


def redirect(to: str, status: str = "302 Found"):
    def respond(request, conn, closing) -> None:
        answer(status, b"", Location=to + request.path)(request, conn, closing)

    return respond


# -- URLs: refused before any connection -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["scrape", "prometheus"])
@pytest.mark.parametrize(
    "url, problem",
    [
        ("http://127.0.0.1:{port}x/metrics", r"the port in 'http://127\.0\.0\.1:\d+x/metrics' is not a number from 1 to 65535"),
        ("http://127.0.0.1:99999/metrics", r"the port in 'http://127\.0\.0\.1:99999/metrics' is not a number from 1 to 65535"),
        ("http://127.0.0.1:{port}/met rics", r"'http://127\.0\.0\.1:\d+/met rics' holds a space: not a usable URL \(percent-encode it\)"),
        ("http://127.0.0.1:{port}/metrics\r\nX-Injected: 1", r"'http://127\.0\.0\.1:\d+/metrics␍␊X-Injected: 1' holds a control character: .*"),
        ("http://127.0.0.1:{port}/\x1b[2Jmetrics", r"'http://127\.0\.0\.1:\d+/␛\[2Jmetrics' holds a control character: .*"),
        ("gopher://127.0.0.1:{port}/metrics", r"not an http\(s\) URL: 'gopher://127\.0\.0\.1:\d+/metrics'"),
        ("http://scraper:s3 cret@127.0.0.1:{port}/metrics", r"'http://scraper:\*\*\*@127\.0\.0\.1:\d+/metrics' holds a space: .*"),
    ],
    ids=["port-not-a-number", "port-out-of-range", "space", "crlf", "escape", "scheme", "secret-with-space"],
)
def test_bad_urls_are_one_line_before_any_connection(kind, url, problem):
    with RawServer(answer("200 OK", EXPOSITION)) as server:
        run = metrics(kind, url.format(port=server.port))
        assert server.connections == 0  # refused before connecting
    assert run.returncode == 2, run
    assert "Traceback" not in run.stderr and "s3 cret" not in run.stderr
    assert_printable(run.stderr)
    prefix = "--prometheus: " if kind == "prometheus" else ""
    assert re.fullmatch(f"gpuscope: {re.escape(prefix)}{problem}\n", run.stderr), run.stderr


# -- a gzip bomb --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["scrape", "prometheus"])
def test_gzip_bomb_is_refused_at_the_decompressed_cap(kind):
    with RawServer(bomb) as server:
        run = metrics(kind, server.url("/metrics" if kind == "scrape" else ""))
    where = re.escape(server.url()) if kind == "scrape" else rf"Prometheus at {re.escape(server.url(''))}"
    cap = f"{(MAX_BYTES if kind == 'scrape' else MAX_REPLY_BYTES) >> 20} MiB"
    assert_refused(run, rf"gpuscope: {where} sent more than {cap} once decompressed: refused", max_wall_s=20)


def test_console_readers_survive_a_gzip_bomb_refresh_after_refresh(tmp_path):
    """The console's ServingSource reads the bomb again and again: each read is refused at the
    cap and its memory is given back, so the peak stays that of one read."""
    script = tmp_path / "console_readers.py"
    script.write_text(CONSOLE_READERS)
    with RawServer(bomb) as server:
        run = _measured([sys.executable, str(script), server.url()], clean_env(), timeout=60)
        reads = len(server.seen)
    assert run.returncode == 0, run.stderr
    count, state = run.stdout.splitlines()
    assert int(count) >= 4 and reads >= 4
    assert re.fullmatch(rf"{re.escape(server.url())} sent more than {MAX_BYTES >> 20} MiB once decompressed: refused", state)
    assert run.peak_rss_mb < MAX_RSS_MB, f"peak RSS {run.peak_rss_mb:.0f} MB"


CONSOLE_READERS = """
import sys, time
from gpuscope.core.serving.source import ServingSource, make_collector

source = ServingSource(make_collector(window_s=30.0, metrics_urls=[sys.argv[1]]), interval=0.2)
states = []
source.start(lambda snapshot: states.append(snapshot.state))
deadline = time.monotonic() + 40
while len(states) < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
source.stop()
print(len(states))
print(states[-1] if states else "")
"""


# -- a byte a second ----------------------------------------------------------------------------------


def test_a_byte_a_second_ends_at_the_deadline():
    """In the headers or in the body, with --metrics-url or --prometheus: each a byte a second,
    which no timeout per socket operation ever stops. The four commands run side by side."""
    cases = [
        ("scrape", headers_drip(1.0), "no answer from {where} within 5 s"),
        ("scrape", body_drip(1.0), "no complete answer from {where} within 5 s"),
        ("prometheus", headers_drip(1.0), "no answer from Prometheus at {where} within 5 s"),
        ("prometheus", body_drip(1.0, "application/json"), "no complete answer from Prometheus at {where} within 5 s"),
    ]
    servers = [RawServer(respond) for _, respond, _ in cases]
    for server in servers:
        server.__enter__()
    try:
        urls = [s.url("/metrics" if kind == "scrape" else "") for s, (kind, _, _) in zip(servers, cases)]
        with ThreadPoolExecutor(len(cases)) as pool:
            runs = list(pool.map(metrics, [kind for kind, _, _ in cases], urls))
    finally:
        for server in servers:
            server.__exit__(None, None, None)
    for (kind, _, message), url, run in zip(cases, urls, runs):
        expected = re.escape("gpuscope: " + message.format(where=url))
        assert_refused(run, expected, max_wall_s=COMMAND_TIMEOUT_S + 10)
        assert run.wall_s > COMMAND_TIMEOUT_S - 0.5  # it did wait for the deadline, not fail early


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_dripping_server_does_not_outlive_the_deadline(where):
    """A byte every 0.05 s, against a 0.5 s deadline: every socket read succeeds, the exchange
    as a whole does not."""
    respond = headers_drip(0.05) if where == "headers" else body_drip(0.05)
    with RawServer(respond) as server:
        started = time.monotonic()
        with pytest.raises(fetch.FetchError, match=r"answer from .* within 0\.5 s") as caught:
            fetch.get(server.url(), where=server.url(), timeout=0.5, max_bytes=1 << 20)
        took = time.monotonic() - started
    # The drip would last 500 s: ending within a tenth of that is the deadline's doing on any machine.
    assert 0.45 < took < 50 and caught.value.unreachable and caught.value.timed_out


def test_endless_informational_answers_end_at_the_deadline():
    def continues(request, conn, closing) -> None:
        while not closing.wait(0.01):
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

    with RawServer(continues) as server:
        started = time.monotonic()
        with pytest.raises(fetch.FetchError, match="no answer from .* within 0.5 s"):
            fetch.get(server.url(), where=server.url(), timeout=0.5, max_bytes=1 << 20)
        assert time.monotonic() - started < 3


@pytest.mark.parametrize("kind", ["scrape", "prometheus"])
def test_the_console_panel_recovers_from_a_dripping_server(kind):
    """The live source's read ends at its deadline with an error, the next refresh asks again,
    and once the server answers properly the panel is current again."""
    good = answer("200 OK", EXPOSITION) if kind == "scrape" else prometheus_api()
    with RawServer(body_drip(0.05)) as server:
        if kind == "scrape":
            collector = ScrapeCollector([server.url()], window_s=0, profiles=BUILTIN_PROFILES, timeout=0.5)
        else:
            collector = PrometheusCollector(server.url(""), window_s=0, profiles=BUILTIN_PROFILES, timeout=0.5, retries=0)
        source = ServingSource(collector, interval=0.1, read_timeout=5.0)
        states: list[str] = []
        source.start(lambda snapshot: states.append(snapshot.state))
        try:
            wait_until(lambda: len(states) >= 2, timeout=10, what="two failed reads")
            assert all(re.fullmatch(r"unreachable since .*, retrying \(no complete answer from .* within 0\.5 s\)", s) for s in states), states
            server.respond = good
            wait_until(lambda: states[-1] == "ok", timeout=10, what="the panel to recover")
        finally:
            source.stop()


# -- credentials and redirects ----------------------------------------------------------------------


def test_basic_credentials_from_the_url_stay_with_their_origin():
    """--metrics-url http://user:pw@A/ redirected to B (same host, another port): B serves the
    metrics and gets no credentials; a redirect within A keeps them."""
    with RawServer(answer("200 OK", EXPOSITION)) as other, RawServer(redirect(other.url(""))) as first:
        run = metrics("scrape", first.url().replace("http://", f"http://scraper:{PASSWORD}@"))
        assert first.seen[0].headers["authorization"].startswith("Basic ")
        assert [r.path for r in other.seen] == ["/metrics"]
        assert "authorization" not in other.seen[0].headers and "cookie" not in other.seen[0].headers
    assert run.returncode == 0, run.stderr  # the other origin's metrics, fetched without them
    assert PASSWORD not in run.stdout + run.stderr

    def same_origin(request, conn, closing) -> None:
        if request.path == "/old":
            answer("301 Moved Permanently", b"", Location="/metrics")(request, conn, closing)
        else:
            answer("200 OK", EXPOSITION)(request, conn, closing)

    with RawServer(same_origin) as server:
        run = metrics("scrape", server.url("/old").replace("http://", f"http://scraper:{PASSWORD}@"))
        assert [r.path for r in server.seen] == ["/old", "/metrics"]
        assert all(r.headers["authorization"].startswith("Basic ") for r in server.seen)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("credentials", ["token", "basic"])
def test_prometheus_credentials_never_reach_another_origin(credentials):
    env = {"GPUSCOPE_PROMETHEUS_TOKEN": TOKEN} if credentials == "token" else {}
    with RawServer(prometheus_api()) as other, RawServer(redirect(other.url(""), "307 Temporary Redirect")) as first:
        url = first.url("") if credentials == "token" else first.url("").replace("http://", f"http://ops:{PASSWORD}@")
        run = metrics("prometheus", url, **env)
        sent = first.seen[0].headers["authorization"]
        assert sent == f"Bearer {TOKEN}" if credentials == "token" else sent.startswith("Basic ")
        assert len(other.seen) == 2  # the names, then the query: both followed ...
        assert all("authorization" not in r.headers for r in other.seen)  # ... without credentials
    assert run.returncode == 0, run.stderr
    assert TOKEN not in run.stdout + run.stderr and PASSWORD not in run.stdout + run.stderr


def test_redirects_are_bounded():
    def loop(request, conn, closing) -> None:
        answer("302 Found", b"", Location=request.path + "x")(request, conn, closing)

    with RawServer(loop) as server:
        run = metrics("scrape", server.url())
        assert len(server.seen) == fetch.MAX_REDIRECTS + 1
    assert_refused(run, rf"gpuscope: {re.escape(server.url())} redirected more than 5 times", max_wall_s=15)


# -- what a server says reaches the terminal printable -------------------------------------------------

EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x9b\u202e"


@pytest.mark.parametrize(
    "kind, respond, first_line",
    [
        ("scrape", answer(f"500 Oops{EVIL}".encode("utf-8").decode("latin-1"), b"\x1b[2J" * 100),
         r"gpuscope: http://127\.0\.0\.1:\d+/metrics answered HTTP 500 Oops[␛␇\ufffd\[\]0-9;JmA-Za-z]+.*"),
        ("scrape", answer("302 Found", b"", Location="http://127.0.0.1:1/\x1b[2J"),
         r"gpuscope: http://127\.0\.0\.1:\d+/metrics redirected to a URL gpuscope does not follow"),
        ("scrape", answer("200 OK", b"\x1b[2J\x1b]0;owned\x07\n" * 3, content_type="text/plain"),
         r"gpuscope: http://127\.0\.0\.1:\d+/metrics: not metrics \(3 unparseable lines, no sample\)"),
        ("prometheus", answer(f"400 Bad{EVIL}".encode().decode("latin-1"), ('{"status":"error","error":"' + EVIL + '\\u001b[2J"}').encode(), "application/json"),
         r"gpuscope: Prometheus at http://127\.0\.0\.1:\d+ rejected the query \(HTTP 400\): .*"),
        ("prometheus", answer("200 OK", b"\x1b[2J not json \x07", "application/json"),
         r"gpuscope: http://127\.0\.0\.1:\d+ does not answer like a Prometheus server \(not its JSON API\)"),
    ],
    ids=["reason-phrase", "location", "scrape-body", "prometheus-error", "prometheus-body"],
)
def test_control_characters_from_the_server_never_reach_the_terminal(kind, respond, first_line):
    with RawServer(respond) as server:
        run = metrics(kind, server.url("/metrics" if kind == "scrape" else ""))
    assert_refused(run, first_line, max_wall_s=15)


# -- sheer size -------------------------------------------------------------------------------------


def test_100k_series_are_refused_before_parsing():
    body = b"# TYPE rag_request_total counter\n" + b"".join(
        b'rag_request_total{status="ok",pod="p%d"} 1\n' % i for i in range(100_000)
    )
    with RawServer(answer("200 OK", body)) as server:
        run = metrics("scrape", server.url())
    assert_refused(run, rf"gpuscope: {re.escape(server.url())} sent 100,001 lines; gpuscope reads at most 50,000: refused", 15)


def test_a_16_mib_line_is_refused_before_parsing():
    """One unparseable line just under the byte cap: parsing it would cost seconds and copies of
    it (~450 MB); refused by its length."""

    def one_line(request, conn, closing) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n")
        conn.sendall(gzip.compress(b'rag_request_total{a="' + b"a" * (MAX_BYTES - 100)))

    with RawServer(one_line) as server:
        run = metrics("scrape", server.url())
    assert_refused(run, rf"gpuscope: {re.escape(server.url())} sent a line of over 65,536 characters: refused", 15)


@pytest.mark.parametrize("where", ["names", "query"])
def test_100k_nested_brackets_from_prometheus(where):
    nested = b"[" * 100_000 + b"]" * 100_000
    respond = prometheus_api(names=nested) if where == "names" else prometheus_api(query=b'{"data":{"result":' + nested + b"}}")
    with RawServer(respond) as server:
        run = metrics("prometheus", server.url(""))
    assert "RecursionError" not in run.stderr
    assert_refused(
        run, rf"gpuscope: {re.escape(server.url(''))} does not answer like a Prometheus server \(not its JSON API\)", 15
    )


def test_a_declared_length_over_the_cap_is_refused_unread():
    def huge(request, conn, closing) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n")
        drip(conn, closing, b"#" * 1000, 0.05)

    with RawServer(huge) as server:
        started = time.monotonic()
        with pytest.raises(fetch.FetchError, match=r"sent more than 1 MiB: refused"):
            fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=1 << 20)
        assert time.monotonic() - started < 3  # the 1,000 bytes would take 50 s


def test_inflating_never_runs_past_the_cap():
    """64 KiB of a bomb inflate to 64 MiB: inflating stops at the cap, not a read later."""
    with RawServer(bomb) as server:
        tracemalloc.start()
        try:
            with pytest.raises(fetch.FetchError, match=r"sent more than 1 MiB once decompressed: refused"):
                fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=1 << 20)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 8 << 20, f"{peak >> 20} MiB allocated at the peak"


def test_concatenated_gzip_members_count_against_one_cap():
    """A body of many small gzip members (valid gzip: they are one stream) adds up to the cap."""
    member = gzip.compress(bytes(1 << 20))

    def members(request, conn, closing) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n")
        for _ in range(100):
            conn.sendall(member)

    with RawServer(members) as server:
        with pytest.raises(fetch.FetchError, match=r"sent more than 8 MiB once decompressed: refused"):
            fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=8 << 20)
        fine = gzip.compress(b"a" * 1000) * 3
        server.respond = answer("200 OK", fine, Content_Encoding="gzip")
        assert fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=8 << 20).body == b"a" * 3000


def test_json_nesting_is_measured_without_parsing():
    api = b'{"data":{"result":[{"metric":{"a":"[[[[\\"{{"},"value":[1,"2"]}]}}'  # depth 5, brackets in a string
    assert not nests_deeper(api, 5) and nests_deeper(api, 4)
    assert nests_deeper(b'["]]]]]]]]]]", [[[]]]]', 3)  # closers in a string hide no depth
    assert nests_deeper(b"[" * 100_000, 16) and not nests_deeper(b"[]" * 100_000, 1)
    for worst in (b"[" * MAX_REPLY_BYTES, b'"' * MAX_REPLY_BYTES, b"[{" * (MAX_REPLY_BYTES // 2)):
        started = time.process_time()
        nests_deeper(worst, MAX_JSON_DEPTH)
        assert time.process_time() - started < 3  # ~0.5 s here: bounded by the reply's cap


def test_resource_limit_in_children_is_real():
    """The address-space limit the commands run under does stop a runaway allocation."""
    run = _measured(
        [sys.executable, "-c", f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_AS}, {LIMIT_AS})); bytearray(4 << 30)"],
        None, 30,
    )
    assert run.returncode == 1 and "MemoryError" in run.stderr


@pytest.mark.parametrize(
    "respond, message",
    [
        (answer("200 OK", gzip.compress(EXPOSITION)[:-20], Content_Encoding="gzip"), "sent a gzip body cut short"),
        (answer("200 OK", b"\x1f\x8b" + b"\xff" * 100, Content_Encoding="gzip"), "sent a broken compressed body"),
        (answer("200 OK", EXPOSITION, Content_Encoding="br"), "sent a body encoded as 'br', which gpuscope did not ask for"),
        (answer("200 OK", EXPOSITION, Content_Length="999"), "closed the connection in the middle of its answer"),
        (lambda r, conn, c: conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n"), r"did not answer in HTTP \(BadStatusLine\)"),
        (lambda r, conn, c: None, "cannot reach .*: it closed the connection without answering"),
    ],
    ids=["gzip-cut-short", "gzip-broken", "unasked-encoding", "short-body", "not-http", "closed"],
)
def test_broken_answers_are_one_line(respond, message):
    with RawServer(respond) as server:
        with pytest.raises(fetch.FetchError, match=message) as caught:
            fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=1 << 20)
    assert "\n" not in str(caught.value)


def test_deflate_is_read_with_or_without_its_zlib_header():
    with RawServer(answer("200 OK", zlib.compress(EXPOSITION), Content_Encoding="deflate")) as server:
        assert fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=1 << 20).body == EXPOSITION
        raw = zlib.compressobj(wbits=-15)
        server.respond = answer("200 OK", raw.compress(EXPOSITION) + raw.flush(), Content_Encoding="deflate")
        assert fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=1 << 20).body == EXPOSITION


# -- over TLS ---------------------------------------------------------------------------------------


@pytest.fixture
def tls_server_context(tmp_path, monkeypatch):
    """A certificate for 127.0.0.1 that this process (only) trusts."""
    openssl = require_tool("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_tls_is_verified_and_bounded_like_plain_http(tls_server_context, monkeypatch):
    with RawServer(answer("200 OK", EXPOSITION), tls=tls_server_context) as server:
        assert fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=1 << 20).body == EXPOSITION
        server.respond = body_drip(0.05)
        started = time.monotonic()
        with pytest.raises(fetch.FetchError, match=r"no complete answer from .* within 0\.5 s"):
            fetch.get(server.url(), where=server.url(), timeout=0.5, max_bytes=1 << 20)
        assert time.monotonic() - started < 3
        monkeypatch.delenv("SSL_CERT_FILE")  # the certificate is no longer trusted
        with pytest.raises(fetch.FetchError, match=r"cannot reach .*: its TLS certificate failed verification"):
            fetch.get(server.url(), where=server.url(), timeout=5, max_bytes=1 << 20)


def test_a_dripping_tls_handshake_ends_at_the_deadline():
    """The server's side of the handshake a byte at a time: a record header that announces 16 kB,
    then its bytes, slowly."""
    with RawServer(None) as server:
        server._answer = lambda conn: drip(conn, server.closing, b"\x16\x03\x03\x40\x00" + b"\x00" * 1000, 0.05)
        url = server.url().replace("http://", "https://")
        started = time.monotonic()
        with pytest.raises(fetch.FetchError, match=r"no answer from .* within 0\.5 s"):
            fetch.get(url, where=url, timeout=0.5, max_bytes=1 << 20)
        assert time.monotonic() - started < 3
