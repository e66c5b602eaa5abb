"""Fetching and parsing a /metrics endpoint (Prometheus text 0.0.4 or OpenMetrics 1.0).

Parsing goes through prometheus_client's own parsers, one family (metadata block) at a time.
Real servers send imperfect text (doc samples with `...` elisions, a stray `curl` line, a bad
escape), and those parsers give up on the whole text at the first bad line; so a block that fails
is parsed again one line at a time: a bad line costs itself (it is counted in `malformed`), never
the rest of the scrape.

Samples are indexed by the sample name, as Prometheus stores series. Beware prometheus_client's
text parser: for a counter declared WITHOUT `_total` (TGI, Triton) it renames the samples to
`<name>_total`, while a Prometheus server stores them as exposed; so callers look counters up
under both spellings (see `profiles.counter_names`).
"""

from __future__ import annotations

import base64
import gzip
import io
import re
import socket
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from ipaddress import ip_address
from urllib.parse import unquote, urlsplit, urlunsplit

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from gpuscope.core.redact import redact_text
from gpuscope.core.serving_model import SourceError

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: hashable, one per series

# What Prometheus itself asks for, most preferred first: Python servers answer OpenMetrics when
# asked (prometheus_client), anything else answers the text format.
ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.9,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
MAX_BYTES = 64 << 20  # a /metrics body larger than this is not a metrics endpoint
_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class Exposition:
    """One parsed scrape.

    `series` maps a sample name (`x_bucket`, `x_total`, `x`) to its samples, one (labels, value)
    pair per series. `names` holds every sample and family name in the text, which is what
    profile detection looks at. `malformed` counts the lines that could not be parsed (among
    those parsed: see parse_exposition) and were skipped.
    """

    series: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    names: frozenset[str] = frozenset()
    malformed: int = 0
    openmetrics: bool = False

    @property
    def sample_count(self) -> int:
        return sum(len(v) for v in self.series.values())


def is_openmetrics(content_type: str | None, text: str) -> bool:
    if content_type:
        return content_type.split(";", 1)[0].strip().lower() == "application/openmetrics-text"
    return text.rstrip().endswith("# EOF")


def parse_exposition(
    text: str,
    content_type: str | None = None,
    wanted: Callable[[frozenset[str]], Container[str] | None] | None = None,
) -> Exposition:
    """Parse an exposition; never raises on bad input (bad lines are skipped and counted).

    `wanted(names)`, given every metric name in the text (a cheap first pass: family names
    from `# TYPE`/`# HELP`, sample names from the start of each line), may return the sample
    names to keep: only those lines then go through prometheus_client's parser, which costs
    tens of microseconds a line (a 5 MB vLLM + dcgm-exporter scrape: seconds). None: all.
    `malformed` counts bad lines among those parsed.
    """
    openmetrics = is_openmetrics(content_type, text)
    parser = _openmetrics_block if openmetrics else parse_text
    blocks = list(_blocks(text.splitlines()))
    names = {name for meta, samples in blocks for name in (*_meta_names(meta), *(n for n, _ in samples))}
    keep = wanted(frozenset(names)) if wanted is not None else None
    series: dict[str, list[tuple[Labels, float]]] = {}
    malformed = 0
    for meta, samples in blocks:
        lines = [line for name, line in samples if keep is None or name in keep]
        if lines:
            malformed += _parse_block(parser, meta, lines, series, names)
    return Exposition(series, frozenset(names), malformed, openmetrics)


def _openmetrics_block(text: str):
    # The OpenMetrics parser insists on the closing `# EOF`; a block cut out of a text has none.
    return parse_openmetrics(text.rstrip("\n") + "\n# EOF\n")


_SAMPLE_NAME = re.compile(r"[^{\s]*")


def _meta_names(meta: list[str]) -> Iterator[str]:
    for line in meta:
        parts = line.split(None, 3)
        if len(parts) >= 3:
            yield parts[2]


def _blocks(lines: list[str]) -> Iterator[tuple[list[str], list[tuple[str, str]]]]:
    """(metadata lines, (sample name, line) pairs) per family: a block starts at the
    `# HELP`/`# TYPE`/`# UNIT` lines that follow a sample. Comments and blank lines go."""
    meta: list[str] = []
    samples: list[tuple[str, str]] = []
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[0] == "#":
            if stripped.startswith(("# HELP ", "# TYPE ", "# UNIT ")):
                if samples:
                    yield meta, samples
                    meta, samples = [], []
                meta.append(stripped)
            continue  # a comment, or the closing # EOF
        samples.append((_SAMPLE_NAME.match(stripped).group(), stripped))
    if meta or samples:
        yield meta, samples


def _parse_block(parser: Callable, meta: list[str], lines: list[str], series: dict, names: set) -> int:
    """Parse one family's lines into `series`; the malformed lines it skipped."""
    found: dict = {}
    found_names: set = set()
    malformed = 0
    try:
        _collect(parser("\n".join(meta + lines) + "\n"), found, found_names)
    except Exception:  # noqa: BLE001 - any parser complaint: narrow the damage down to single lines
        found.clear()
        found_names.clear()
        header = meta
        try:
            list(parser("\n".join(meta) + "\n"))
        except Exception:  # noqa: BLE001 - the metadata itself is bad: the samples go untyped
            malformed += len(meta)
            header = []
        for line in lines:
            try:
                _collect(parser("\n".join([*header, line]) + "\n"), found, found_names)
            except Exception:  # noqa: BLE001
                malformed += 1
    for name, values in found.items():
        series.setdefault(name, []).extend(values)
    names |= found_names  # e.g. the `_total` name prometheus_client gives a bare counter
    return malformed


def _collect(families, series: dict, names: set) -> None:
    for family in families:
        names.add(family.name)
        for sample in family.samples:
            names.add(sample.name)
            labels = tuple(sorted(sample.labels.items())) if sample.labels else ()
            series.setdefault(sample.name, []).append((labels, float(sample.value)))


# -- fetching --------------------------------------------------------------------------------------


class ScrapeError(SourceError):
    """A scrape that produced no exposition (see SourceError for `unreachable`)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A scrape URL split into what is shown (`display`, credentials masked) and what is sent."""

    url: str  # without user:password
    display: str
    authorization: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {redact_text(url)!r}")
        authorization = None
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, netloc = netloc.rsplit("@", 1)
            user, _, password = userinfo.partition(":")
            token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
            authorization = f"Basic {token}"
        clean = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        return cls(clean, redact_text(url), authorization)


def _is_loopback(host: str | None) -> bool:
    if host in (None, "localhost"):
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


# A loopback target is never reached through an http_proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_DEFAULT = urllib.request.build_opener()


def fetch(endpoint: Endpoint, timeout: float, max_bytes: int = MAX_BYTES) -> tuple[str, str | None]:
    """GET the exposition: (text, content type). Raises ScrapeError; `timeout` bounds the whole
    exchange, not just each socket operation, so a server that drips bytes cannot hang a read."""
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "gpuscope"}
    if endpoint.authorization:
        headers["Authorization"] = endpoint.authorization
    request = urllib.request.Request(endpoint.url, headers=headers)
    opener = _DIRECT if _is_loopback(urlsplit(endpoint.url).hostname) else _DEFAULT
    deadline = time.monotonic() + timeout
    where = endpoint.display
    try:
        with opener.open(request, timeout=timeout) as response:
            body = io.BytesIO()
            while True:
                chunk = response.read(_CHUNK)
                if not chunk:
                    break
                body.write(chunk)
                if body.tell() > max_bytes:
                    raise ScrapeError(f"{where} sent more than {max_bytes >> 20} MiB: not a metrics endpoint", unreachable=False)
                if time.monotonic() > deadline:
                    raise ScrapeError(f"no complete answer from {where} within {timeout:g} s", unreachable=True)
            content_type = response.headers.get("Content-Type")
            raw = body.getvalue()
            if (response.headers.get("Content-Encoding") or "").lower() == "gzip":
                try:
                    raw = gzip.decompress(raw)
                except (OSError, EOFError, zlib.error) as exc:
                    raise ScrapeError(f"{where} sent a broken gzip body: {exc}", unreachable=False) from None
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"{where} answered HTTP {exc.code} {exc.reason}", unreachable=False) from None
    except urllib.error.URLError as exc:
        raise ScrapeError(f"cannot reach {where}: {_reason(exc.reason)}", unreachable=True) from None
    except (TimeoutError, socket.timeout):
        raise ScrapeError(f"no answer from {where} within {timeout:g} s", unreachable=True) from None
    except (ConnectionError, OSError) as exc:
        raise ScrapeError(f"cannot reach {where}: {_reason(exc)}", unreachable=True) from None
    return raw.decode("utf-8", errors="replace"), content_type


def _reason(reason: object) -> str:
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return redact_text(str(reason)) or type(reason).__name__


def scrape(
    endpoint: Endpoint, timeout: float, wanted: Callable[[frozenset[str]], Container[str] | None] | None = None
) -> Exposition:
    """Fetch and parse (see parse_exposition for `wanted`). Raises ScrapeError when the answer
    holds no metrics at all."""
    text, content_type = fetch(endpoint, timeout)
    exposition = parse_exposition(text, content_type, wanted)
    if not exposition.series and exposition.malformed:
        raise ScrapeError(
            f"{endpoint.display} answered, but not with metrics ({exposition.malformed} unparseable lines)",
            unreachable=False,
        )
    return exposition
