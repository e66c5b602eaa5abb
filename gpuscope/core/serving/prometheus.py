"""The Prometheus source: the same signals as the scrape source, asked of a Prometheus server.

Through prometheus-api-client (`PrometheusConnect`). Each read is at most two HTTP requests:
the metric names under the --job/--instance filters (refreshed every `names_refresh_s`, for
profile detection), and ONE instant query that carries the whole plan of the detected profile
(gpuscope.core.serving.profiles.plan), each part tagged with `label_replace(..., "gpuscope_query", KEY)`
and joined with `or`, so a remote Prometheus costs one round trip a tick, not twenty.

Also in that query, the fleet view: the GPUs whose memory grows fastest across everything the
server scrapes from dcgm-exporter (`topk(N, deriv(DCGM_FI_DEV_FB_USED[5m]))`, not limited by
--job/--instance: it is there to say which node to SSH into).

Credentials: a bearer token (GPUSCOPE_PROMETHEUS_TOKEN) or basic auth (GPUSCOPE_PROMETHEUS_USER +
GPUSCOPE_PROMETHEUS_PASSWORD), from the environment, else from the configuration file, else from
the URL's `user:password@`. They are taken out of the URL, never shown, never logged; every
message passes through redact_text.

The client's requests travel through gpuscope.core.serving.fetch (a requests transport adapter,
`_BoundedTransport`), not urllib3: each request has one deadline for the whole exchange, retries
included (a bounded retry with backoff when the server refuses or answers 502/503/504), a capped
body, and credentials that never follow a redirect to another origin. An answer is checked
before it is parsed: JSON nested deeper than the API ever nests is refused (json's parser recurses
once a level), and so are more names or series than gpuscope reads. The source itself keeps
retrying on its own tick.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlunsplit

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers

from gpuscope.core.settings import PrometheusConfig
from gpuscope.core.serving import fetch
from gpuscope.core.serving.profiles import (
    Answer,
    CounterSum,
    GaugeAggregate,
    MetricRef,
    Profile,
    Quantile,
    Query,
    assemble,
    counter_names,
    detect,
    plan,
    resolve,
)
from gpuscope.core.common.json_depth import too_large
from gpuscope.core.common.printable import printable_line
from gpuscope.core.serving.promql import Matcher
from gpuscope.core.common.redact import redact_text
from gpuscope.core.serving.model import Evaluation, FleetRow, Signals, SourceError

ENV_TOKEN = "GPUSCOPE_PROMETHEUS_TOKEN"
ENV_USER = "GPUSCOPE_PROMETHEUS_USER"
ENV_PASSWORD = "GPUSCOPE_PROMETHEUS_PASSWORD"
TAG = "gpuscope_query"  # the label that says which part of the combined query a result answers
FLEET_METRIC = "DCGM_FI_DEV_FB_USED"  # dcgm-exporter: framebuffer memory used, MiB
MAX_REPLY_BYTES = 8 << 20  # one answer, decompressed: the metric names of a large server fit
MAX_JSON_DEPTH = 16  # the API nests 5 deep
MAX_NAMES = 100_000  # metric names under the filters
MAX_RESULTS = 10_000  # series in the answer to the combined query (a plan yields tens)
RETRY_STATUSES = frozenset({502, 503, 504})  # a proxy in front of a restarting Prometheus


@dataclass(frozen=True, slots=True)
class PrometheusAuth:
    """How to authenticate to Prometheus. Never printed: the secrets are out of the repr."""

    token: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def resolve(
        cls, url: str, env: Mapping[str, str] = os.environ, config: PrometheusConfig | None = None
    ) -> tuple[str, PrometheusAuth]:
        """(URL without credentials, auth): environment, then config file, then the URL.

        Raises ValueError (one line, no secret in it) on an unusable combination."""
        config = config or PrometheusConfig()
        try:
            parts = fetch.check_url(url)
        except ValueError as exc:
            raise ValueError(f"--prometheus: {exc}") from None
        netloc, url_user, url_password = parts.netloc, None, None
        if "@" in netloc:
            userinfo, netloc = netloc.rsplit("@", 1)
            quoted_user, _, quoted_password = userinfo.partition(":")
            url_user, url_password = unquote(quoted_user) or None, unquote(quoted_password) or None
        clean = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))

        token = env.get(ENV_TOKEN) or config.token
        user = env.get(ENV_USER) or config.user
        password = env.get(ENV_PASSWORD) or config.password
        if token and not all(" " <= c <= "~" for c in token):  # it goes into a header as it is
            raise ValueError("the Prometheus token holds a character that cannot go in an HTTP header")
        if token:
            return clean, cls(token=token)
        if user or password:
            if not (user and password):
                missing = ENV_PASSWORD if user else ENV_USER
                raise ValueError(f"basic auth for Prometheus needs both a user and a password: set {missing}")
            return clean, cls(user=user, password=password)
        if url_user:
            return clean, cls(user=url_user, password=url_password or "")
        return clean, cls()

    def headers(self) -> dict[str, str] | None:
        return {"Authorization": f"Bearer {self.token}"} if self.token else None

    def basic(self) -> tuple[str, str] | None:
        return (self.user, self.password or "") if self.user else None


def _range(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class PromQL:
    """PromQL for a plan's queries, with the --job/--instance matchers on every selector."""

    def __init__(self, filters: Sequence[Matcher]) -> None:
        self.filters = tuple(filters)

    def selector(self, ref: MetricRef, kind: str) -> str:
        s = ref.selector
        if kind == "counter" and s.name is not None:
            # `x` and `x_total` both: exposed names differ between servers (see exposition.py).
            name = Matcher("__name__", "=~", "|".join(counter_names(s.name)))
            inner = ",".join(m.promql() for m in (name, *s.label_matchers, *self.filters))
            return f"{{{inner}}}"
        if kind == "histogram":
            s = s.renamed(f"{s.name}_bucket")
        return s.promql(self.filters)

    def query(self, query: Query, window_s: float) -> str:
        def over_window(selector: str) -> str:
            return f"rate({selector}[{_range(window_s)}])" if window_s > 0 else selector

        if isinstance(query, Quantile):
            by = "le" if query.by is None else f"le, {query.by}"
            inner = over_window(self.selector(query.histogram, "histogram"))
            return f"histogram_quantile({query.q!r}, sum by ({by}) ({inner}))"
        if isinstance(query, CounterSum):
            by = f" by ({query.by})" if query.by else ""
            return f"sum{by} ({over_window(self.selector(query.counter, 'counter'))})"
        assert isinstance(query, GaugeAggregate)
        return f"{query.how}({self.selector(query.gauge, 'gauge')})"


def combined(parts: Mapping[str, str]) -> str:
    """One query answering every part, each result tagged with its key."""
    return " or ".join(f'label_replace({expr}, "{TAG}", "{key}", "", "")' for key, expr in parts.items())


def fleet_queries(limit: int, window_s: float) -> dict[str, str]:
    growth = f"topk({limit}, deriv({FLEET_METRIC}[{_range(window_s)}]))"
    # `and` keeps the used-memory series of those GPUs only (vector matching ignores the name).
    return {"fleet.growth": growth, "fleet.used": f"{FLEET_METRIC} and {growth}"}


def fleet_rows(growth: Sequence[dict], used: Sequence[dict]) -> tuple[FleetRow, ...]:
    """Rows from the two fleet results (`{"metric": labels, "value": [t, "v"]}`), fastest first."""

    def key(labels: Mapping[str, str]) -> tuple:
        return tuple(sorted((k, v) for k, v in labels.items() if k not in ("__name__", TAG)))

    def first(labels: Mapping[str, str], *names: str) -> str | None:
        return next((labels[n] for n in names if labels.get(n)), None)

    used_by_key = {key(r["metric"]): _number(r["value"][1]) for r in used}
    rows = []
    for r in growth:
        labels = r["metric"]
        rows.append(
            FleetRow(
                host=first(labels, "Hostname", "hostname", "instance"),
                gpu=first(labels, "gpu"),
                uuid=first(labels, "UUID", "gpu_uuid"),
                pod=first(labels, "pod", "pod_name"),
                namespace=first(labels, "namespace", "pod_namespace"),
                used_mib=used_by_key.get(key(labels)),
                growth_mib_per_s=_number(r["value"][1]),
            )
        )
    rows.sort(key=lambda row: -(row.growth_mib_per_s if row.growth_mib_per_s is not None else float("-inf")))
    return tuple(rows)


MAX_LABELS = 256  # labels of one series
MAX_SAMPLES = 100_000  # samples of one series (a range query's steps: Prometheus refuses 11,000)
MAX_TIME = 1e10  # seconds since the epoch, the year 2286: a later sample time is not one


def checked_results(results: object, *, max_series: int = MAX_RESULTS, max_samples: int = MAX_SAMPLES) -> list[dict]:
    """A query answer's `result`, each series checked to be shaped as Prometheus shapes it before
    anything reads it: an object of string labels, and a `value` [time, "number"] or `values`
    list of them, each time a finite number of seconds since 1970. Raises ValueError (a message
    for the log, not the person) for anything else, and for more series or samples than asked."""
    if not isinstance(results, list):
        raise ValueError("the result is not a list")
    if len(results) > max_series:
        raise ValueError(f"{len(results):,} series")
    for r in results:
        if not isinstance(r, dict):
            raise ValueError("a series is not an object")
        labels = r.get("metric")
        if (not isinstance(labels, dict) or len(labels) > MAX_LABELS
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
            raise ValueError("a series' labels are not an object of strings")
        if "value" in r:
            _check_sample(r["value"])
        if "values" in r:
            values = r["values"]
            if not isinstance(values, list) or len(values) > max_samples:
                raise ValueError(f"a series' values are not a list of at most {max_samples:,}")
            for sample in values:
                _check_sample(sample)
        if "value" not in r and "values" not in r:
            raise ValueError("a series without a value")
    return results


def _check_sample(sample: object) -> None:
    if not (isinstance(sample, list) and len(sample) == 2):
        raise ValueError("a sample is not [time, value]")
    t, value = sample
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TIME:  # NaN fails too
        raise ValueError("a sample's time is not a time")
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError("a sample's value is not a number's text")


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None


@dataclass(frozen=True, slots=True)
class PrometheusReading:
    """One read: Prometheus evaluated the plan, so the reading is already an evaluation."""

    time: float
    evaluation: Evaluation
    fleet: tuple[FleetRow, ...]


class PrometheusCollector:
    """One Prometheus server (with optional job/instance filters) as a serving source."""

    source = "prometheus"
    format = None  # Prometheus parsed the scrapes; gpuscope reads its query answers

    def __init__(
        self,
        url: str,
        *,
        window_s: float,
        profiles: Sequence[Profile],
        job: str | None = None,
        instance: str | None = None,
        auth: PrometheusAuth | None = None,
        timeout: float = 5.0,
        retries: int = 2,
        fleet_limit: int = 10,
        fleet_window_s: float = 300.0,
        names_refresh_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        clean, url_auth = PrometheusAuth.resolve(url, env={})
        self.url = clean
        self.window_s = window_s
        self.timeout = timeout
        self._profiles = tuple(profiles)
        self._filters = tuple(Matcher(k, "=", v) for k, v in (("job", job), ("instance", instance)) if v)
        self._promql = PromQL(self._filters)
        self._fleet = fleet_queries(fleet_limit, fleet_window_s)
        self._names_refresh_s = names_refresh_s
        self._clock = clock
        self._names: list[str] | None = None
        self._names_at = 0.0
        self._lock = threading.Lock()
        self._last: PrometheusReading | None = None
        auth = auth if auth is not None and (auth.token or auth.user) else url_auth
        shown = ",".join(m.promql() for m in self._filters)
        self.target = redact_text(clean) + (f"{{{shown}}}" if shown else "")
        session = requests.Session()
        session.trust_env = False  # fetch reads the proxy settings; no ~/.netrc credentials
        # The client annotates `headers: dict = None`, `auth: tuple = None`, `timeout: int`; it takes
        # None and float seconds.
        self._client = PrometheusConnect(
            url=clean, headers=auth.headers(), auth=auth.basic(), timeout=timeout, session=session  # type: ignore[arg-type]
        )
        transport = _BoundedTransport(f"Prometheus at {self.target}", timeout=timeout, retries=retries)
        for prefix in ("http://", "https://", clean):  # `clean`: the client mounted its own adapter there
            session.mount(prefix, transport)

    @property
    def target_names(self) -> list[str]:
        return [self.target]

    def readers(self) -> list[Callable[[], PrometheusReading]]:
        return [self.read]

    def close(self) -> None:
        self._client.close()

    # -- one read ---------------------------------------------------------------------------------

    def read(self) -> PrometheusReading:
        """Ask Prometheus for everything. Raises SourceError (redacted, one line)."""
        now = self._clock()
        names = self._call(self._metric_names, now)
        profile = detect(self._profiles, names)
        resolved = resolve(profile, names) if profile else None
        queries = plan(resolved, self.window_s) if resolved else {}
        parts = {key: self._promql.query(q, self.window_s) for key, q in queries.items()}
        results = self._call(self._client.custom_query, combined({**parts, **self._fleet}))
        if isinstance(results, list) and len(results) > MAX_RESULTS:
            raise SourceError(
                f"Prometheus at {self.target} answered {len(results):,} series; gpuscope reads at most {MAX_RESULTS:,}",
                unreachable=False,
            )
        try:
            answers, fleet = _split(checked_results(results), queries)
        except (KeyError, TypeError, ValueError, IndexError):
            raise self._not_prometheus() from None
        if resolved is None:
            return PrometheusReading(now, Evaluation(None, Signals()), fleet)
        signals, stages = assemble(resolved, self.window_s, answers)
        return PrometheusReading(now, Evaluation(resolved.profile.name, signals, stages), fleet)

    def _call(self, request: Callable, *args):
        """One HTTP exchange with Prometheus, its failures turned into SourceError."""
        try:
            return request(*args)
        except SourceError:
            raise  # from the transport (fetch.FetchError), or a cap below: one line already
        except (ValueError, KeyError, TypeError):  # a 200 answer that is not the JSON API
            raise self._not_prometheus() from None  # (requests' JSONDecodeError is a ValueError)
        except requests.exceptions.RequestException as exc:
            raise SourceError(f"Prometheus at {self.target}: {type(exc).__name__}", unreachable=True) from None
        except PrometheusApiClientException as exc:
            raise SourceError(self._http_error(str(exc)), unreachable=False) from None

    def _not_prometheus(self) -> SourceError:
        return SourceError(f"{self.target} does not answer like a Prometheus server (not its JSON API)", unreachable=False)

    def _metric_names(self, now: float) -> list[str]:
        if self._names is None or now - self._names_at >= self._names_refresh_s:
            params = {"match[]": "{" + ",".join(m.promql() for m in self._filters) + "}"} if self._filters else None
            names = self._client.get_label_values("__name__", params=params or {})
            if not isinstance(names, list):
                raise ValueError("label values are not a list")
            if len(names) > MAX_NAMES:
                raise SourceError(
                    f"Prometheus at {self.target} has {len(names):,} metric names; gpuscope reads at most "
                    f"{MAX_NAMES:,}: narrow them with --job or --instance",
                    unreachable=False,
                )
            self._names, self._names_at = [str(n) for n in names], now
        return self._names

    def _http_error(self, text: str) -> str:
        m = re.match(r"HTTP Status Code (\d+)", text)
        status = int(m[1]) if m else None
        detail = re.search(r'"error"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
        if status in (401, 403):
            return (
                f"Prometheus at {self.target} refused the credentials (HTTP {status}): "
                f"set {ENV_TOKEN}, or {ENV_USER} and {ENV_PASSWORD}"
            )
        what = f": {printable_line(redact_text(detail[1]), 300)}" if detail else ""
        if status in (400, 422):
            return f"Prometheus at {self.target} rejected the query (HTTP {status}){what}"
        return f"Prometheus at {self.target} answered HTTP {status if status else '?'}{what}"

    # -- the source interface -------------------------------------------------------------------------

    def record(self, index: int, reading: PrometheusReading) -> None:
        with self._lock:
            self._last = reading

    def record_failure(self, index: int) -> None:
        pass  # the last good answer stays the answer; the state says it is not current

    @property
    def malformed_lines(self) -> int:
        return 0  # Prometheus parsed the scrapes; gpuscope never sees their text

    @property
    def fleet(self) -> tuple[FleetRow, ...]:
        with self._lock:
            return self._last.fleet if self._last else ()

    def evaluate(self) -> Evaluation:
        with self._lock:
            last = self._last
        return last.evaluation if last else Evaluation(None, Signals())


def _split(results: Sequence[dict], queries: Mapping[str, Query]) -> tuple[dict[str, Answer], tuple[FleetRow, ...]]:
    answers: dict[str, Answer] = {}
    growth: list[dict] = []
    used: list[dict] = []
    for r in results:
        labels = dict(r["metric"])
        key = labels.pop(TAG, None)
        if key == "fleet.growth":
            growth.append(r)
        elif key == "fleet.used":
            used.append(r)
        elif key in queries:
            by = getattr(queries[key], "by", None)
            group = labels.get(by, "") if by else None
            answers.setdefault(key, {})[group] = float(r["value"][1])
    return answers, fleet_rows(growth, used)


class _BoundedTransport(BaseAdapter):
    """requests' transport for the client: every request one gpuscope.core.serving.fetch GET (the whole
    exchange, retries included, within `timeout`), its JSON answer checked before it is parsed."""

    def __init__(self, where: str, *, timeout: float, retries: int) -> None:
        super().__init__()
        self.where = where
        self.timeout = timeout
        self.retries = retries

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None) -> requests.Response:
        if request.method != "GET":
            raise ValueError(f"only GET goes to Prometheus, not {request.method}")
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("accept", "authorization")}
        started = time.monotonic()
        for attempt in range(self.retries + 1):
            backoff = 0.25 * 2**attempt  # 0.25 s, 0.5 s ...
            may_retry = attempt < self.retries and time.monotonic() + backoff < started + self.timeout
            try:
                answer = fetch.get(
                    request.url, where=self.where, timeout=self.timeout, started=started,
                    max_bytes=MAX_REPLY_BYTES, headers=headers,
                )
            except fetch.FetchError as exc:
                if not (may_retry and exc.unreachable and not exc.timed_out):  # refused, reset: again
                    raise
            else:
                if not (may_retry and answer.status in RETRY_STATUSES):
                    break
            time.sleep(backoff)
        if answer.ok and (problem := too_large(answer.body, MAX_JSON_DEPTH)) is not None:
            raise ValueError(f"JSON {problem}")  # never handed to json
        response = requests.Response()
        response.status_code = answer.status
        response.reason = answer.reason
        response.headers = CaseInsensitiveDict(answer.headers)
        response.encoding = get_encoding_from_headers(response.headers)
        response._content = answer.body  # what requests' own adapter leaves there once read
        response.url = request.url
        response.request = request
        response.connection = self  # type: ignore[assignment]  # requests annotates its own HTTPAdapter
        return response

    def close(self) -> None:
        pass  # no connection outlives its request
