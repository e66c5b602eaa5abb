"""Parsing a /metrics endpoint (Prometheus text 0.0.4 or OpenMetrics 1.0); `scrape` fetches it.

Samples are indexed by the sample name as exposed, as a Prometheus server stores series (a
counter declared without `_total`, as TGI and Triton do, keeps its bare name; callers look
counters up under both spellings, see `profiles.counter_names`).

Parsing is one pass over the lines. A line in the usual shape (`name{l="v",...} value
[timestamp] [# exemplar]`) is read by two regular expressions (a few microseconds: a 100,000-line
scrape in well under a second); any other line goes to prometheus_client's own parser, alone
(with its family's metadata for OpenMetrics), which settles whether it is a sample. Real servers
send imperfect text (doc samples with `...` elisions, a stray `curl` line, a bad escape): a bad
line costs itself, counted in `malformed`, never the rest of the scrape (and past
MAX_SLOW_LINES such lines, or MAX_SLOW_CHARS of them, not even a parse).

Names are read across the escapings of the Prometheus spec: a `U__` name (value escaping) is
decoded, and dot escaping is undone when the Content-Type declares it. prometheus_client 0.26,
asked for OpenMetrics, writes `vllm:x` as `vllm_x` in its sample lines but not in its `# TYPE`
lines (client_python#1177): such samples are read under their family's name. Underscore
escaping in general is lossy (`vllm:x` and `vllm_x` read the same), so it is matched where names
are looked up (see `profiles.spellings`): a Prometheus server that scraped such a client holds
`vllm_x`.
"""

from __future__ import annotations

import base64
import re
import sys
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from gpuscope.core.common.redact import redact_text
from gpuscope.core.serving.model import SourceError

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: hashable, one per series

# Only the classic text format: every server serves it, and serves its names as registered.
# prometheus_client picks the first OpenMetrics entry of an Accept header whatever its q, and
# its OpenMetrics output mangles `vllm:` names (client_python#1177), so none is offered.
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
# Lines of an unusual shape given to prometheus_client's parser (~30 µs each) in one text; the
# rest of them count as malformed: 64 MB of garbage costs seconds of regular expressions, not
# minutes of parsing.
MAX_SLOW_LINES = 1000
# ... and the text those lines (with their family's metadata) add up to: that parser reads a
# character at a time (~0.4 µs each), so 16 MiB of long unusual lines would cost seconds.
MAX_SLOW_CHARS = 256 << 10

OPENMETRICS_TYPE = "application/openmetrics-text"
TEXT_TYPE = "text/plain"


@dataclass(frozen=True, slots=True)
class Exposition:
    """One parsed scrape.

    `series` maps a sample name (`x_bucket`, `x_total`, `x`) to its samples, one (labels, value)
    pair per series. `names` holds every sample and family name in the text, which is what
    profile detection looks at. `malformed` counts the lines that could not be parsed (among
    those parsed: see parse_exposition) and were skipped; `skipped` the sample lines that were
    not wanted, so not parsed. `format` is the format read: the media type with its version and
    escaping, as the server declared them (e.g. "text/plain; version=0.0.4").
    """

    series: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    names: frozenset[str] = frozenset()
    malformed: int = 0
    openmetrics: bool = False
    skipped: int = 0
    format: str = TEXT_TYPE

    @property
    def sample_count(self) -> int:
        return sum(len(v) for v in self.series.values())


def _media_type(content_type: str | None) -> tuple[str, dict[str, str]]:
    """("type/subtype", {param: value}) of a Content-Type, lower-cased; ("", {}) when absent."""
    if not content_type:
        return "", {}
    media, *params = content_type.split(";")
    pairs = (p.split("=", 1) for p in params if "=" in p)
    return media.strip().lower(), {k.strip().lower(): v.strip().strip('"') for k, v in pairs}


def is_openmetrics(content_type: str | None, text: str) -> bool:
    media, _ = _media_type(content_type)
    if media:
        return media == OPENMETRICS_TYPE
    return text.rstrip().endswith("# EOF")


def format_of(content_type: str | None, openmetrics: bool) -> str:
    """What `Exposition.format` says: the media type, and its version and escaping if declared."""
    media, params = _media_type(content_type)
    if not media:
        media = OPENMETRICS_TYPE if openmetrics else TEXT_TYPE
    return "; ".join([media, *(f"{k}={params[k]}" for k in ("version", "escaping") if k in params)])


# -- names across escapings --------------------------------------------------------------------------


def unescape_values(name: str) -> str:
    """A `U__` name (the spec's value escaping: `__` for `_`, `_3a_` for `:`) decoded; any other
    name, or one that does not decode, as it is."""
    if not name.startswith("U__"):
        return name
    body, out, i = name[3:], [], 0
    while i < len(body):
        c = body[i]
        if c != "_":
            out.append(c)
            i += 1
        elif body.startswith("_", i + 1):
            out.append("_")
            i += 2
        else:
            end = body.find("_", i + 1)
            code = body[i + 1 : end] if end > 0 else ""
            if not 0 < len(code) <= 6 or any(h not in "0123456789abcdefABCDEF" for h in code):
                return name
            try:
                out.append(chr(int(code, 16)))
            except (ValueError, OverflowError):
                return name
            i = end + 1
    return "".join(out)


_DOTS = re.compile(r"_dot_|__")


def unescape_dots(name: str) -> str:
    """A name under the spec's dot escaping (`_dot_` for `.`, `__` for `_`) decoded."""
    return _DOTS.sub(lambda m: "." if m.group() == "_dot_" else "_", name)


# -- parsing -----------------------------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# Possessive where Python has it (3.11): the engine then keeps no state per escape or per label
# to go back to (a value of 4 million escapes took 550 MB and a second, now 70 ms and nothing).
# Nothing is lost: a value ends at its first unescaped quote, whatever follows.
_ONCE = "*+" if sys.version_info >= (3, 11) else "*"
_VALUE = rf'"[^"\\]*(?:\\.[^"\\]*){_ONCE}"'
_LABEL = rf"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*({_VALUE})[ \t]*"  # name, quoted value
_ANY_LABEL = rf"[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*{_VALUE}"
# name, label set (no braces inside: else the slow way), value, then a timestamp and an
# OpenMetrics exemplar, both ignored.
_SAMPLE = re.compile(rf"[ \t]*({_NAME})(?:\{{([^{{}}]*)\}})?[ \t]+([^ \t]+)(?:[ \t]+[^ \t#]+)?(?:[ \t]+#[ \t].*)?[ \t]*")
# A trailing comma is allowed. Each run of blanks has one place in the pattern: where two could
# share it, a line that fails to match is tried every way of splitting it (quadratic in its length).
_LABEL_SET = re.compile(rf"[ \t]*(?:{_ANY_LABEL}[ \t]*,[ \t]*){_ONCE}(?:{_ANY_LABEL}[ \t]*)?")
_LABEL_PAIRS = re.compile(_LABEL)
# The cheap first pass: the name at the start of every sample line, and of every metadata line.
_LINE_NAMES = re.compile(rf"^[ \t]*({_NAME})", re.M)
_FIRST_TOKEN = re.compile(r"[^{\s]*")  # what an unusual line names, roughly (for `wanted`)
_META_NAMES = re.compile(r"^[ \t]*#[ \t]+(?:HELP|TYPE|UNIT)[ \t]+(\S+)", re.M)


_UNSEEN: Labels = (("", ""),)  # a label set no text parses to: "not parsed yet", told apart by identity


def _unescape(value: str) -> str:
    """A label value's escapes (`\\\\`, `\\"`, `\\n`) undone, any other kept as it is: by
    splitting on escaped backslashes, without a call per escape (a value may hold millions)."""
    return "\\".join(part.replace('\\"', '"').replace("\\n", "\n") for part in value.split("\\\\"))


def parse_exposition(
    text: str,
    content_type: str | None = None,
    wanted: Callable[[frozenset[str]], Container[str] | None] | None = None,
) -> Exposition:
    """Parse an exposition; never raises on bad input (bad lines are skipped and counted).

    `wanted(names)`, given every metric name in the text (a cheap first pass: family names
    from `# TYPE`/`# HELP`, sample names from the start of each line), may return the sample
    names to keep: only those lines are parsed. None: all. `malformed` counts bad lines among
    those parsed.
    """
    openmetrics = is_openmetrics(content_type, text)
    _, params = _media_type(content_type)
    rename = _renamer(text, dots=params.get("escaping") == "dots")
    names = {rename(n) for n in _LINE_NAMES.findall(text)}
    names.update(rename(n.strip('"')) for n in _META_NAMES.findall(text))
    keep = wanted(frozenset(names)) if wanted is not None else None
    series: dict[str, list[tuple[Labels, float]]] = {}
    label_sets: dict[str, Labels | None] = {}  # the same label text recurs (same labels, same buckets)
    malformed = skipped = slow_lines = slow_chars = 0
    pairs_left = MAX_LABEL_PAIRS
    header: list[str] = []  # the current family's metadata (for OpenMetrics' slow way)
    family = ""  # the current family's name ("" before any) ...
    alias: str | None = None  # ... and its mangled spelling (see _restore)
    after_sample = False
    for line in text.splitlines():
        m = _SAMPLE.fullmatch(line)
        if m is not None:
            name, label_text, value_text = m.groups()
            if rename is not _same:
                name = rename(name)
            wanted_as = name
            if alias is not None and name.startswith(alias) and name[len(alias) :] in _SUFFIXES:
                name = family + name[len(alias) :]  # see _mangled
                names.add(name)
            if keep is not None and name not in keep and wanted_as not in keep:
                skipped += 1
                continue
            labels: Labels | None
            if not label_text:
                labels = ()
            elif (labels := label_sets.get(label_text, _UNSEEN)) is _UNSEEN:
                pairs_left -= label_text.count("=")  # at least its labels
                labels = label_sets[label_text] = _labels(label_text, rename) if pairs_left >= 0 else None
            if labels is not None and "_" not in value_text:
                try:
                    value = float(value_text)
                except ValueError:
                    pass
                else:
                    found = series.get(name)
                    if found is None:
                        series[name] = [(labels, value)]
                    else:
                        found.append((labels, value))
                    after_sample = True
                    continue
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[0] == "#":
            if stripped.startswith(("# HELP ", "# TYPE ", "# UNIT ")):
                if after_sample:
                    header, after_sample = [], False
                header.append(stripped)
                del header[:-3]  # a family's HELP, TYPE and UNIT: a run of metadata keeps its last
                parts = stripped.split(None, 3)
                family = rename(parts[2].strip('"')) if len(parts) > 2 else ""
                alias = _mangled(family) if family else None
            continue  # a comment, or the closing # EOF
        after_sample = True
        first_token = _FIRST_TOKEN.match(stripped)
        assert first_token is not None  # the pattern matches any string
        if keep is not None and rename(first_token.group()) not in keep:
            skipped += 1
            continue
        cost = len(stripped) + sum(map(len, header))
        samples = None
        if slow_lines < MAX_SLOW_LINES and slow_chars + cost <= MAX_SLOW_CHARS:
            samples = _parse_slowly(stripped, header, openmetrics)
            slow_chars += cost
        slow_lines += 1
        if samples is None:
            malformed += 1
            continue
        for name, label_map, value in samples:
            name = wanted_as = rename(name)
            if alias is not None and name.startswith(alias) and name[len(alias) :] in _SUFFIXES:
                name = family + name[len(alias) :]
            names.add(name)
            if keep is None or name in keep or wanted_as in keep:
                series.setdefault(name, []).append((tuple(sorted((rename(k), v) for k, v in label_map.items())), value))
    return Exposition(series, frozenset(names), malformed, openmetrics, skipped, format_of(content_type, openmetrics))


_NOT_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
_SUFFIXES = frozenset(("", "_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info"))


def _mangled(family: str) -> str | None:
    """How prometheus_client 0.26 spells the samples of `family` in OpenMetrics, if not as the
    family: every character outside `[a-zA-Z0-9_]`, `:` included, as `_` (client_python#1177).
    Its samples (that name plus a sample suffix) are read under the family's name."""
    mangled = _NOT_LABEL_NAME.sub("_", family)
    return mangled if mangled != family else None


def _same(name: str) -> str:
    return name


def _renamer(text: str, dots: bool) -> Callable[[str], str]:
    """How names of this text are decoded: not at all (the usual case, and the fast one), or
    `U__` names, or dot escaping as declared; decoded names are remembered."""
    if not dots and "U__" not in text:
        return _same
    decode = (lambda n: unescape_dots(unescape_values(n))) if dots else unescape_values
    memo: dict[str, str] = {}

    def rename(name: str) -> str:
        found = memo.get(name)
        if found is None:
            found = memo[name] = decode(name)
        return found

    return rename


MAX_LABEL_SET_CHARS = 64 << 10  # of one series: real ones are a few hundred characters
# Labels read in one text (each costs about 0.4 µs): 16 MiB of real series holds fewer (a label
# takes more than 16 bytes), 16 MiB of `a="",` five times as many.
MAX_LABEL_PAIRS = 1_000_000


def _labels(text: str, rename: Callable[[str], str]) -> Labels | None:
    """The label set of `{...}` text, sorted; None when it is not exactly a label set (or longer
    than MAX_LABEL_SET_CHARS)."""
    if len(text) > MAX_LABEL_SET_CHARS or not _LABEL_SET.fullmatch(text):
        return None
    pairs = _LABEL_PAIRS.findall(text)
    if rename is not _same:
        pairs = [(rename(k), v) for k, v in pairs]
    found = {k: _unescape(v[1:-1]) if "\\" in v else v[1:-1] for k, v in pairs}
    if len(found) != len(pairs):
        return None  # a label twice
    return tuple(sorted(found.items()))


def _parse_slowly(line: str, header: list[str], openmetrics: bool) -> list[tuple[str, dict[str, str], float]] | None:
    """A line of an unusual shape (quoted UTF-8 names, braces in values, odd spacing), by
    prometheus_client's parser: its samples, or None when it is not a sample line. Alone, so
    that the text parser does not rename a counter's samples; OpenMetrics with its family's
    metadata (an exemplar needs its family's type), then without it."""
    attempts = ([*header, line], [line]) if openmetrics and header else ([line],)
    for lines in attempts:
        text = "\n".join(lines) + ("\n# EOF\n" if openmetrics else "\n")
        try:
            families = list((parse_openmetrics if openmetrics else parse_text)(text))
            samples = [(s.name, s.labels, float(s.value)) for f in families for s in f.samples]
        except Exception:  # noqa: BLE001, S112 - any parser complaint: not a sample line, so far
            continue
        if samples and all(name and "\n" not in name and " " not in name for name, _, _ in samples):
            return samples
    return None


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


def not_metrics(text: str, exposition: Exposition) -> str | None:
    """Why a 200 answer is not an exposition, or None when it is one: an HTML (or XML) page, or
    a text without a single sample in it (what parses to nothing is not a service to watch)."""
    if text.lstrip()[:1] == "<":
        return "an HTML page"
    if exposition.sample_count or exposition.skipped:
        return None
    if _MARKUP.search(text):
        return "an HTML page"
    if exposition.malformed:
        lines = "line" if exposition.malformed == 1 else "lines"
        return f"{exposition.malformed} unparseable {lines}, no sample"
    return "an empty answer" if not text.strip() else "no sample in it"


_MARKUP = re.compile(r"^[ \t]*<", re.M)  # no exposition line starts with "<"
