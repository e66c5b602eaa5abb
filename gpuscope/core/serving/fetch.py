"""One HTTP GET, bounded in every part: how gpuscope reads what a server on the network sends
(a service's /metrics, a Prometheus server's API).

That server may be slow, broken or hostile, and gpuscope often runs as root; so a read from it
ends in bounded time and memory whatever the server does:

- one deadline for the whole exchange (connecting, every redirect, the headers, the body): a
  watchdog shuts the connection down when it passes, which ends any read blocked on it, so a
  server that sends a byte a second cannot hold a read past the deadline;
- caps on the body, as sent and once decompressed (gzip and deflate are inflated as they arrive,
  never past the cap), on redirects, and on how much of an error answer is read;
- credentials (the Authorization and Cookie headers the caller gives) go to the URL's own origin
  only: a redirect to another scheme, host or port is followed without them;
- URLs are checked before any connection (`check_url`), and the text of every error is one
  printable line: nothing the server sends (a reason phrase, a body) reaches it raw.

Name resolution is the system resolver's, bounded by its own timeouts rather than the deadline.
Proxies come from the environment (http_proxy, https_proxy, no_proxy); a loopback target is
always reached directly.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.request
import zlib
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address
from urllib.parse import SplitResult, unquote, urljoin, urlsplit, urlunsplit

from gpuscope.core.common.printable import printable_line
from gpuscope.core.common.redact import MASK, redact_text
from gpuscope.core.serving.model import SourceError
from gpuscope.core.common.units import format_limit, whole_number

MAX_REDIRECTS = 5
MAX_ERROR_BYTES = 64 << 10  # of an answer that is not a success: enough for its message
CHUNK = 1 << 16
INFLATE_STEP = 1 << 20  # the most one step of inflating may produce (zeros inflate ~1000-fold)
REDIRECTS = frozenset({301, 302, 303, 307, 308})
CREDENTIAL_HEADERS = frozenset({"authorization", "cookie"})  # what never leaves the URL's origin
DEFAULT_PORTS = {"http": 80, "https": 443}


class FetchError(SourceError):
    """A GET that produced no answer to use, as one printable line (see SourceError).

    `timed_out`: the deadline passed (a retry would wait as long again)."""

    def __init__(self, message: str, *, unreachable: bool, timed_out: bool = False) -> None:
        super().__init__(message, unreachable=unreachable)
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class Answer:
    """The final answer of a GET (after redirects). `body` is decompressed; for a status that is
    not a success it holds at most MAX_ERROR_BYTES (enough for a message). `reason` is printable."""

    status: int
    reason: str
    headers: Mapping[str, str] = field(repr=False)
    body: bytes = field(repr=False)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")


def shown_url(url: str) -> str:
    """A URL as it may be shown: any password masked (even one redact_text cannot find, with a
    space in it), printable, one line."""
    scheme, sep, rest = url.partition("://")
    if sep:
        end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
        authority = rest[:end]
        if "@" in authority:
            userinfo, host = authority.rsplit("@", 1)
            user, colon, _ = userinfo.partition(":")
            rest = f"{user}{':' + MASK if colon else ''}@{host}{rest[end:]}"
        url = f"{scheme}://{rest}"
    return printable_line(redact_text(url))


def check_url(url: str) -> SplitResult:
    """The URL split, if gpuscope can GET it: http(s), a host, a numeric port, and nothing but
    printable ASCII without spaces (what http.client would otherwise refuse with a traceback, or
    send: a CR/LF in a URL is a header injection). ValueError with one printable line if not."""
    shown = shown_url(url)
    bad = next((c for c in url if not "!" <= c <= "~"), None)
    if bad is not None:
        what = (
            "a space" if bad == " "
            else "a control character" if bad < " " or bad == "\x7f"
            else "a character outside ASCII"
        )
        raise ValueError(f"'{shown}' holds {what}: not a usable URL (percent-encode it)")
    parts = urlsplit(url)
    if parts.scheme not in DEFAULT_PORTS:
        raise ValueError(f"not an http(s) URL: '{shown}'")
    if not parts.hostname:
        raise ValueError(f"no host in '{shown}'")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:  # `:0`, `:abc`, `:99999` (None: no port given, the scheme's own)
        raise ValueError(f"the port in '{shown}' is not a number from 1 to 65535")
    return parts


def get(
    url: str,
    *,
    where: str,
    timeout: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    started: float | None = None,
) -> Answer:
    """GET `url` (following up to MAX_REDIRECTS redirects) within `timeout` seconds in all,
    counted from `started` (time.monotonic(); now if None: earlier tries of a retry count too).

    `where` names the target in messages (shown as is: pass it redacted). `max_bytes` caps the
    body both as sent and decompressed. Raises FetchError: unreachable, timed out, too big,
    broken; an answer with an error status is returned (`ok` False), not raised."""
    try:
        parts = check_url(url)
    except ValueError as exc:
        raise FetchError(str(exc), unreachable=False) from None
    origin = _origin(parts)
    sent = {"User-Agent": "gpuscope", **(headers or {})}
    sent.update({"Accept-Encoding": "gzip", "Connection": "close"})  # the two this module decodes and needs
    deadline = _Deadline(timeout, started)
    try:
        for _ in range(MAX_REDIRECTS + 1):
            answer, location = _exchange(parts, sent, deadline, where, max_bytes)
            if location is None:
                return answer
            try:
                parts = check_url(urljoin(urlunsplit(parts), location))
            except ValueError:
                raise FetchError(f"{where} redirected to a URL gpuscope does not follow", unreachable=False) from None
            if _origin(parts) != origin:  # and never back: once sent elsewhere, credentials stay behind
                sent = {k: v for k, v in sent.items() if k.lower() not in CREDENTIAL_HEADERS}
        raise FetchError(f"{where} redirected more than {MAX_REDIRECTS} times", unreachable=False)
    except FetchError:
        raise
    except (OSError, http.client.HTTPException, ValueError, zlib.error) as exc:
        if deadline.expired or isinstance(exc, TimeoutError):
            raise deadline.error(where) from None
        raise _failure(where, exc) from None
    finally:
        deadline.close()


# -- the deadline ----------------------------------------------------------------------------------


class _Deadline:
    """The end of one exchange, and the watchdog that enforces it on the connections' sockets."""

    def __init__(self, seconds: float, started: float | None = None) -> None:
        self.seconds = seconds
        self.answered = False  # a status line came back (before the deadline passed, or not)
        self.expired = False
        self._at = (time.monotonic() if started is None else started) + seconds
        self._lock = threading.Lock()
        self._watched: list[socket.socket] = []
        self._timer = threading.Timer(max(0.0, self._at - time.monotonic()), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        """Seconds left; TimeoutError if none."""
        left = self._at - time.monotonic()
        if left <= 0 or self.expired:
            raise TimeoutError
        return left

    def watch(self, sock: socket.socket) -> None:
        # The watchdog's own descriptor of the connection: shutting it down ends a read blocked on
        # any descriptor of that connection, and since nothing else closes it, the number can
        # never belong to another file by the time the watchdog uses it.
        copy = sock.dup()
        with self._lock:
            self._watched.append(copy)
            if self.expired:
                _shut(copy)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._watched:
                _shut(sock)

    def release(self) -> None:
        """Forget the sockets of a finished hop (the connection itself is closed by its owner)."""
        with self._lock:
            for sock in self._watched:
                sock.close()
            self._watched.clear()

    def close(self) -> None:
        self._timer.cancel()
        self.release()

    def error(self, where: str) -> FetchError:
        what = "no complete answer" if self.answered else "no answer"
        return FetchError(f"{what} from {where} within {self.seconds:g} s", unreachable=True, timed_out=True)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the peer


class _Watched(http.client.HTTPConnection):
    """An http.client connection whose sockets are opened within, and watched by, a deadline."""

    def __init__(self, *args, deadline: _Deadline, **kwargs) -> None:
        kwargs["timeout"] = deadline.left()
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = self._open  # http.client's hook for opening its socket

    def _open(self, address, timeout=None, source_address=None) -> socket.socket:
        sock = socket.create_connection(address, self._deadline.left(), source_address)
        self._deadline.watch(sock)
        return sock


class _HTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


# -- one hop ---------------------------------------------------------------------------------------


def _exchange(
    parts: SplitResult, headers: dict[str, str], deadline: _Deadline, where: str, max_bytes: int
) -> tuple[Answer, str | None]:
    """One request and its answer: (answer, None), or (redirect, its Location)."""
    host, port = parts.hostname or "", parts.port or DEFAULT_PORTS[parts.scheme]
    target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    proxy = _proxy(parts)
    headers = dict(headers)
    if proxy is None:
        kind = _HTTPSConnection if parts.scheme == "https" else _HTTPConnection
        conn = kind(host, port, deadline=deadline)
    else:
        proxy_host, proxy_port, proxy_headers = proxy
        if parts.scheme == "https":
            conn = _HTTPSConnection(proxy_host, proxy_port, deadline=deadline)
            conn.set_tunnel(host, port, headers=proxy_headers)
        else:
            conn = _HTTPConnection(proxy_host, proxy_port, deadline=deadline)
            netloc = f"[{host}]" if ":" in host else host
            target = urlunsplit((parts.scheme, f"{netloc}:{port}", parts.path or "/", parts.query, ""))
            headers.update(proxy_headers)
    deadline.answered = False
    try:
        conn.request("GET", target, headers=headers)
        response = conn.getresponse()
        deadline.answered = True
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
        location = answer_headers.get("location")
        if response.status in REDIRECTS and location:
            return Answer(response.status, printable_line(response.reason, 100), answer_headers, b""), location
        ok = 200 <= response.status < 300
        body = _read_body(response, answer_headers, deadline, where, max_bytes, ok)
        return Answer(response.status, printable_line(response.reason, 100), answer_headers, body), None
    finally:
        conn.close()
        deadline.release()


def _read_body(
    response: http.client.HTTPResponse, headers: Mapping[str, str], deadline: _Deadline, where: str, max_bytes: int, ok: bool
) -> bytes:
    """The decompressed body: at most `max_bytes` (FetchError past it) of a success, the first
    MAX_ERROR_BYTES of anything else."""
    limit = max_bytes if ok else min(max_bytes, MAX_ERROR_BYTES)
    too_big = FetchError(f"{where} sent more than {format_limit(max_bytes)}: refused", unreachable=False)
    length = whole_number(headers.get("content-length"), 20)
    if ok and length is not None and length > max_bytes:
        raise too_big  # said up front: not a byte of it read
    inflater = _inflater(headers.get("content-encoding"), where)
    body = bytearray()
    sent = 0
    while chunk := response.read(CHUNK):
        sent += len(chunk)
        if sent > max_bytes:
            raise too_big
        if inflater is None:
            body += chunk
        else:
            inflater.inflate(chunk, body, limit)
        if len(body) > limit:  # (uncompressed, only an error answer gets here: its limit is lower)
            if not ok:
                return bytes(body[:limit])  # the start of an error answer is enough
            raise FetchError(f"{where} sent more than {format_limit(max_bytes)} once decompressed: refused", unreachable=False)
    # http.client ends a body cut short without a word (IncompleteRead only for a chunked one),
    # and so a body cut short by the deadline
    if deadline.expired:
        raise TimeoutError
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    if not chunked and length is not None and sent < length:
        raise http.client.IncompleteRead(bytes(body))
    if inflater is not None and not inflater.complete:
        raise FetchError(f"{where} sent a {inflater.encoding} body cut short", unreachable=False)
    return bytes(body)


class _Inflater:
    """Content-Encoding gzip or deflate, inflated a chunk at a time and never past a cap."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._wbits = 31 if encoding == "gzip" else 15  # gzip header, or zlib's (deflate)
        self._stream = zlib.decompressobj(self._wbits)
        self._started = False

    @property
    def complete(self) -> bool:
        return self._stream.eof

    def inflate(self, data: bytes, body: bytearray, limit: int) -> None:
        """Append what `data` inflates to onto `body`, a MiB at a time, stopping once `body`
        holds more than `limit` bytes (the caller sees it overflow)."""
        if not self._started:
            self._started = True
            zlib_header = data[:1] and data[0] & 0x0F == 8 and int.from_bytes(data[:2], "big") % 31 == 0
            if self.encoding == "deflate" and data and not zlib_header:
                self._wbits = -15  # a raw deflate stream, as some servers send for "deflate"
                self._stream = zlib.decompressobj(self._wbits)
        while data and len(body) <= limit:
            if self._stream.eof:  # another member of a multi-member gzip body
                self._stream = zlib.decompressobj(self._wbits)
            body += self._stream.decompress(data, min(INFLATE_STEP, limit + 1 - len(body)))
            data = self._stream.unused_data if self._stream.eof else self._stream.unconsumed_tail


def _inflater(encoding: str | None, where: str) -> _Inflater | None:
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return None
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _Inflater("deflate" if encoding == "deflate" else "gzip")
    raise FetchError(
        f"{where} sent a body encoded as '{printable_line(encoding, 40)}', which gpuscope did not ask for", unreachable=False
    )


def _origin(parts: SplitResult) -> tuple[str, str, int]:
    return parts.scheme, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS[parts.scheme]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def _proxy(parts: SplitResult) -> tuple[str, int, dict[str, str]] | None:
    """(host, port, headers for the proxy) of the environment's proxy for this URL, if any."""
    host = parts.hostname or ""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or _is_loopback(host) or urllib.request.proxy_bypass(host):
        return None
    proxy_parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if proxy_parts.scheme != "http" or not proxy_parts.hostname:
        raise FetchError(f"the {parts.scheme}_proxy setting is not an http:// proxy", unreachable=True)
    headers = {}
    if proxy_parts.username is not None:
        pair = f"{unquote(proxy_parts.username)}:{unquote(proxy_parts.password or '')}"
        headers["Proxy-Authorization"] = "Basic " + b64encode(pair.encode()).decode()
    return proxy_parts.hostname, proxy_parts.port or 80, headers


def _failure(where: str, exc: BaseException) -> FetchError:
    """An exchange's exception as one line."""
    if isinstance(exc, http.client.RemoteDisconnected):
        return FetchError(f"cannot reach {where}: it closed the connection without answering", unreachable=True)
    if isinstance(exc, http.client.IncompleteRead):
        return FetchError(f"{where} closed the connection in the middle of its answer", unreachable=False)
    if isinstance(exc, zlib.error):
        return FetchError(f"{where} sent a broken compressed body", unreachable=False)
    if isinstance(exc, ssl.SSLCertVerificationError):  # (a ValueError too)
        reason = printable_line(exc.verify_message or "not trusted", 80)
        return FetchError(f"cannot reach {where}: its TLS certificate failed verification ({reason})", unreachable=True)
    if isinstance(exc, ssl.SSLError):
        return FetchError(f"cannot reach {where}: TLS failed ({printable_line(exc.reason or 'error', 80)})", unreachable=True)
    if isinstance(exc, (http.client.HTTPException, ValueError)):
        return FetchError(f"{where} did not answer in HTTP ({type(exc).__name__})", unreachable=False)
    if isinstance(exc, socket.gaierror):
        return FetchError(f"cannot reach {where}: unknown host", unreachable=True)
    reason = exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
    return FetchError(f"cannot reach {where}: {printable_line(reason, 80)}", unreachable=True)
