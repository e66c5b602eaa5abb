"""Which metrics mean what, per serving stack, and the queries that turn them into signals.

A `Profile` maps the ten signals of `gpuscope metrics` (and the pipeline stages) to the metric
names one kind of server exports: vLLM (V0 and V1 names), SGLang, TGI, Triton, llama.cpp, the
generic RAG profile of gpuscope's demo service, and dcgm-exporter (GPU metrics only: every serving
signal is None). The profile is detected from the metric names a scrape (or Prometheus) holds.

Each signal has a tuple of alternatives, first present wins: servers rename metrics between
releases (vLLM's `inter_token_latency_seconds` replaced `time_per_output_token_seconds`,
`kv_cache_usage_perc` replaced `gpu_cache_usage_perc`). A signal with no present alternative is
None. The same metric in several series (models, engines, tp ranks, targets) is summed, as
PromQL's `sum by (le)` does; `kv_cache_usage` is averaged (one fraction per engine).

The signals are computed by one plan of queries (`plan`) that both sources evaluate, the scrape
source locally (gpuscope.core.serving.scrape) and the Prometheus source as PromQL
(gpuscope.core.serving.prometheus); `assemble` turns the answers into Signals and StageStats:

- latency quantiles: `histogram_quantile(q, sum by (le) (rate(h_bucket[w])))`; with a window of 0,
  over the raw cumulative `h_bucket` series;
- tokens_per_s, requests_per_s: `sum(rate(counter[w]))`; None with a window of 0;
- error_rate: errors / requests, both as rates (window 0: both as cumulative counts). When the
  errors metric exists but no series matches its labels (no error seen yet) that is 0 errors;
- queue_depth: `sum(gauge)`, kv_cache_usage: `avg(gauge)` (the latest values);
- stages: quantiles per stage as above, share = stage `_sum` rate / sum of all stages' `_sum` rates.

A metric is found under its name or under that name underscore-escaped (`vllm:x` as `vllm_x`,
see `spellings`): prometheus_client 0.26 writes it so in OpenMetrics, and a Prometheus server
that scraped it in OpenMetrics stores it so. The resolved profile names the spelling found, so
both sources then ask for the series that are there.

The configuration file can override any slot of a built-in profile or add a profile
(`[profiles.NAME]`, keys `SLOT_KEYS` plus `detect`, `stages`, `stage_label`). A metric is a PromQL
selector string (`"name"`, `"name{label=\\"v\\"}"`), a table `{metric = "...", scale = 0.001}`
(scale converts units, e.g. milliseconds to seconds), or a list of those (alternatives).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

from gpuscope.core.settings import Config
from gpuscope.core.serving.promql import Selector
from gpuscope.core.serving.model import Signals, StageStats, finite_or_none

HISTOGRAM_SLOTS = ("e2e", "ttft", "tpot")
COUNTER_SLOTS = ("tokens", "requests", "errors")
GAUGE_SLOTS = ("queue", "kv_cache")
SLOT_KEYS = HISTOGRAM_SLOTS + COUNTER_SLOTS + GAUGE_SLOTS
PROFILE_KEYS = ("detect", *SLOT_KEYS, "stages", "stage_label")
QUANTILES = {"p50_s": 0.5, "p95_s": 0.95, "p99_s": 0.99}


@dataclass(frozen=True, slots=True)
class MetricRef:
    """A metric a profile reads: a selector, and a factor that converts its unit (ms -> s)."""

    selector: Selector
    scale: float = 1.0

    @classmethod
    def of(cls, text: str, scale: float = 1.0) -> MetricRef:
        return cls(Selector.parse(text), scale)

    def sum_series(self) -> MetricRef:
        """A histogram's `_sum` series (a counter), same labels and unit."""
        return MetricRef(self.selector.renamed(f"{self.selector.name}_sum"), self.scale)

    def __str__(self) -> str:
        return str(self.selector) + (f" (x{self.scale:g})" if self.scale != 1.0 else "")


@dataclass(frozen=True, slots=True)
class StageSource:
    """Stages from a histogram: one per value of `label`, or the single stage `name`."""

    histogram: MetricRef
    label: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    detect: tuple[str, ...]  # metric names; shell-style patterns allowed ("vllm:*")
    e2e: tuple[MetricRef, ...] = ()  # histograms
    ttft: tuple[MetricRef, ...] = ()
    tpot: tuple[MetricRef, ...] = ()
    tokens: tuple[MetricRef, ...] = ()  # counters: generated tokens
    requests: tuple[MetricRef, ...] = ()  # counters: finished requests, errors included
    errors: tuple[MetricRef, ...] = ()  # counters: failed requests
    queue: tuple[MetricRef, ...] = ()  # gauges: requests waiting
    kv_cache: tuple[MetricRef, ...] = ()  # gauges: KV-cache usage, 0-1
    stages: tuple[StageSource, ...] = ()  # all present sources contribute; the first wins a name
    stage_order: tuple[str, ...] = ()  # how to list known stages (pipeline order); others sorted
    model_stages: tuple[str, ...] = ()  # the stages that are the model at work (shell patterns)

    def refs(self) -> Iterable[tuple[str, MetricRef]]:
        """(kind, ref) of every metric this profile may read; kind: histogram/counter/gauge."""
        for slot in SLOT_KEYS:
            kind = "histogram" if slot in HISTOGRAM_SLOTS else "counter" if slot in COUNTER_SLOTS else "gauge"
            for ref in getattr(self, slot):
                yield kind, ref
        for source in self.stages:
            yield "histogram", source.histogram


def _refs(*texts: str, scale: float = 1.0) -> tuple[MetricRef, ...]:
    return tuple(MetricRef.of(t, scale) for t in texts)


def _named(*pairs: tuple[str, str]) -> tuple[StageSource, ...]:
    return tuple(StageSource(MetricRef.of(metric), name=name) for name, metric in pairs)


BUILTIN_PROFILES: tuple[Profile, ...] = (
    Profile(
        "vllm",
        detect=("vllm:*",),
        e2e=_refs("vllm:e2e_request_latency_seconds"),
        ttft=_refs("vllm:time_to_first_token_seconds"),
        tpot=_refs("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        tokens=_refs("vllm:generation_tokens_total"),
        # request_success counts every finished request, by finished_reason (a misnomer).
        requests=_refs("vllm:request_success_total"),
        errors=_refs('vllm:request_success_total{finished_reason=~"abort|error"}'),
        queue=_refs("vllm:num_requests_waiting"),
        kv_cache=_refs("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        stages=_named(
            ("queue", "vllm:request_queue_time_seconds"),
            ("prefill", "vllm:request_prefill_time_seconds"),
            ("decode", "vllm:request_decode_time_seconds"),
        ),
        stage_order=("queue", "prefill", "decode"),
        model_stages=("prefill", "decode"),
    ),
    Profile(
        "sglang",
        detect=("sglang:*",),
        e2e=_refs("sglang:e2e_request_latency_seconds"),
        ttft=_refs("sglang:time_to_first_token_seconds"),
        tpot=_refs("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        tokens=_refs("sglang:generation_tokens_total"),
        requests=_refs("sglang:num_requests_total"),
        errors=_refs("sglang:num_aborted_requests_total"),
        queue=_refs("sglang:num_queue_reqs"),
        kv_cache=_refs("sglang:token_usage"),
        stages=(StageSource(MetricRef.of("sglang:per_stage_req_latency_seconds"), label="stage"),),
        # The stage label names the scheduler's phases: the forward passes are the model's.
        model_stages=("*forward*", "prefill", "decode"),
    ),
    Profile(
        "tgi",
        detect=("tgi_*",),
        e2e=_refs("tgi_request_duration"),
        tpot=_refs("tgi_request_mean_time_per_token_duration"),
        # TGI has no generated-token counter; the token-count histogram's _sum is one.
        tokens=_refs("tgi_request_generated_tokens_sum"),
        requests=_refs("tgi_request_count"),
        errors=_refs("tgi_request_failure"),
        queue=_refs("tgi_queue_size"),
        stages=_named(
            ("validation", "tgi_request_validation_duration"),
            ("queue", "tgi_request_queue_duration"),
            ("inference", "tgi_request_inference_duration"),
        ),
        stage_order=("validation", "queue", "inference"),
        model_stages=("inference",),
    ),
    Profile(
        "triton",
        detect=("nv_inference_*",),
        # Triton's latencies are cumulative microsecond counters or summaries, not histograms;
        # only time-to-first-response has one (with --metrics-config histogram_latencies=true).
        ttft=_refs("nv_inference_first_response_histogram_ms", scale=0.001),
        requests=_refs('{__name__=~"nv_inference_request_(success|failure)(_total)?"}'),
        errors=_refs("nv_inference_request_failure"),
        queue=_refs("nv_inference_pending_request_count"),
    ),
    Profile(
        "llamacpp",
        detect=("llamacpp:*",),
        tokens=_refs("llamacpp:tokens_predicted_total"),
        queue=_refs("llamacpp:requests_deferred"),
        kv_cache=_refs("llamacpp:kv_cache_usage_ratio"),  # older builds only
    ),
    Profile(
        "rag",
        detect=(
            "rag_request_latency_seconds",
            "rag_stage_latency_seconds",
            "rag_request_total",
            "rag_token_output_total",
            "vector_search_latency_seconds",
        ),
        e2e=_refs("rag_request_latency_seconds"),
        ttft=_refs("rag_time_to_first_token_seconds"),
        tpot=_refs("rag_time_per_output_token_seconds"),
        tokens=_refs("rag_token_output_total"),
        requests=_refs("rag_request_total"),
        errors=_refs('rag_request_total{status="error"}'),
        # The demo serves each request on its own thread: requests in flight are the queue.
        queue=_refs("rag_requests_in_flight"),
        stages=(
            StageSource(MetricRef.of("rag_stage_latency_seconds"), label="stage"),
            # A service that times only its vector search: that is its retriever stage.
            StageSource(MetricRef.of("vector_search_latency_seconds"), name="retriever"),
        ),
        stage_order=("retriever", "reranker", "llm"),
        model_stages=("llm",),
    ),
    Profile("dcgm", detect=("DCGM_FI_*",)),
)


def model_stages(profile: str | None) -> tuple[str, ...]:
    """The stage-name patterns that are the model's own work in a built-in profile (() if none)."""
    found = next((p for p in BUILTIN_PROFILES if p.name == profile), None)
    return found.model_stages if found is not None else ()


def is_model_stage(profile: str | None, stage: str) -> bool:
    return any(fnmatchcase(stage, pattern) for pattern in model_stages(profile))


# -- which sample names a metric covers -------------------------------------------------------------

_OUTSIDE_METRIC_NAME = re.compile(r"[^a-zA-Z0-9_:]|^[0-9]")
_OUTSIDE_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]|^[0-9]")
_OUTSIDE_PATTERN = re.compile(r"[^a-zA-Z0-9_*?\[\]!]")


def spellings(name: str) -> tuple[str, ...]:
    """The names a metric may be exposed or stored under, as named first: the spec's underscore
    escaping (every character outside `[a-zA-Z0-9_:]` as `_`), and prometheus_client's, which
    also writes `:` as `_` in OpenMetrics sample lines (client_python#1177)."""
    found = [name]
    for pattern in (_OUTSIDE_METRIC_NAME, _OUTSIDE_LABEL_NAME):
        escaped = pattern.sub("_", name)
        if escaped not in found:
            found.append(escaped)
    return tuple(found)


def counter_names(name: str) -> tuple[str, ...]:
    """The sample names a counter may have: exposed with or without `_total` (prometheus_client
    and Prometheus disagree on which, see gpuscope.core.serving.exposition)."""
    base = name[: -len("_total")] if name.endswith("_total") else name
    return (base, f"{base}_total")


def sample_names(kind: str, selector: Selector, present: Iterable[str]) -> list[str]:
    """The sample names in `present` that this metric reads (for a histogram: its `_bucket`s),
    under the metric's own name (see `spelled` for the other spellings)."""
    present = present if isinstance(present, (set, frozenset)) else set(present)
    if selector.name is None:  # __name__ matchers (counters and gauges only)
        return sorted(n for n in present if selector.matches_name(n))
    if kind == "histogram":
        candidates: tuple[str, ...] = (f"{selector.name}_bucket",)
    elif kind == "counter":
        candidates = counter_names(selector.name)
    else:
        candidates = (selector.name,)
    return [n for n in candidates if n in present]


def spelled(kind: str, ref: MetricRef, present: Iterable[str]) -> MetricRef | None:
    """`ref` under the first of its spellings that has series in `present`, or None. A counter
    is looked for by its `_total` samples first: its bare name may be only a family name (an
    OpenMetrics `# TYPE x counter` line) while its samples are under another spelling."""
    present = present if isinstance(present, (set, frozenset)) else set(present)
    if ref.selector.name is None:
        return ref if sample_names(kind, ref.selector, present) else None
    candidates = {
        name: ref if name == ref.selector.name else MetricRef(ref.selector.renamed(name), ref.scale)
        for name in spellings(ref.selector.name)
    }
    if kind == "counter":
        found = next((c for name, c in candidates.items() if counter_names(name)[1] in present), None)
        if found is not None:
            return found
    return next((c for c in candidates.values() if sample_names(kind, c.selector, present)), None)


def kept_names(profile: Profile, present: Iterable[str]) -> set[str]:
    """Every sample name of a scrape that this profile may read (what a scrape window keeps)."""
    present = set(present)
    keep: set[str] = set()
    for kind, ref in profile.refs():
        found = spelled(kind, ref, present)
        if found is None:
            continue
        if kind == "histogram":
            name = found.selector.name
            keep.update(n for n in (f"{name}_bucket", f"{name}_sum") if n in present)
        else:
            keep.update(sample_names(kind, found.selector, present))
    return keep


def detect(profiles: Sequence[Profile], names: Iterable[str]) -> Profile | None:
    """The first profile one of whose `detect` patterns matches a metric name present (under
    the pattern's underscore-escaped spelling too: `vllm:*` finds `vllm_e2e_...`)."""
    names = list(names)
    for profile in profiles:
        for pattern in profile.detect:
            for spelling in {pattern, _OUTSIDE_PATTERN.sub("_", pattern)}:
                if any(fnmatchcase(n, spelling) for n in names):
                    return profile
    return None


# -- resolving a profile against what is there, and the plan of queries --------------------------------


@dataclass(frozen=True, slots=True)
class Resolved:
    """A profile with, per slot, the first alternative present, under the spelling present
    (None: the signal is None)."""

    profile: Profile
    slots: Mapping[str, MetricRef | None]
    stages: tuple[StageSource, ...]


def resolve(profile: Profile, present: Iterable[str]) -> Resolved:
    present = set(present)
    slots: dict[str, MetricRef | None] = {}
    for slot in SLOT_KEYS:
        kind = "histogram" if slot in HISTOGRAM_SLOTS else "counter" if slot in COUNTER_SLOTS else "gauge"
        slots[slot] = next((f for r in getattr(profile, slot) if (f := spelled(kind, r, present))), None)
    stages = tuple(
        replace(s, histogram=found) for s in profile.stages if (found := spelled("histogram", s.histogram, present))
    )
    return Resolved(profile, slots, stages)


@dataclass(frozen=True, slots=True)
class Quantile:
    """`histogram_quantile(q, sum by (le[, by]) (rate(h_bucket[w])))`; raw buckets when w == 0."""

    histogram: MetricRef
    q: float
    by: str | None = None


@dataclass(frozen=True, slots=True)
class CounterSum:
    """`sum [by (by)] (rate(c[w]))`; `sum(c)` (the cumulative count) when w == 0."""

    counter: MetricRef
    by: str | None = None


@dataclass(frozen=True, slots=True)
class GaugeAggregate:
    """`sum(g)` or `avg(g)` of the latest values."""

    gauge: MetricRef
    how: str  # "sum" | "avg"


Query = Quantile | CounterSum | GaugeAggregate
# A query's answer: by-label value -> value (key None without `by`). A key that is absent means
# "no series" (PromQL's empty result); NaN means "no data" (an idle histogram).
Answer = dict[str | None, float]


def plan(resolved: Resolved, window_s: float) -> dict[str, Query]:
    """The queries that compute this profile's signals and stages, by key."""
    s = resolved.slots
    queries: dict[str, Query] = {}
    for slot, prefix in (("e2e", "e2e_latency"), ("ttft", "ttft"), ("tpot", "tpot")):
        ref = s[slot]
        if ref is None:
            continue
        wanted = ("p50_s", "p95_s", "p99_s") if slot == "e2e" else ("p95_s",)
        for suffix in wanted:
            queries[f"{prefix}_{suffix}"] = Quantile(ref, QUANTILES[suffix])
    for slot in COUNTER_SLOTS:
        counted = s[slot]
        if counted is not None:
            queries[slot] = CounterSum(counted)
    if s["queue"] is not None:
        queries["queue_depth"] = GaugeAggregate(s["queue"], "sum")
    if s["kv_cache"] is not None:
        queries["kv_cache_usage"] = GaugeAggregate(s["kv_cache"], "avg")
    for i, source in enumerate(resolved.stages):
        for suffix, q in QUANTILES.items():
            queries[f"stage{i}.{suffix}"] = Quantile(source.histogram, q, source.label)
        queries[f"stage{i}.sum"] = CounterSum(source.histogram.sum_series(), source.label)
    return queries


def _scalar(answers: Mapping[str, Answer], key: str) -> float | None:
    answer = answers.get(key)
    return None if not answer or None not in answer else answer[None]


def assemble(resolved: Resolved, window_s: float, answers: Mapping[str, Answer]) -> tuple[Signals, tuple[StageStats, ...]]:
    """Signals and stages from the answers to `plan(resolved, window_s)`."""
    s = resolved.slots

    def scaled(key: str, slot: str) -> float | None:
        value, ref = _scalar(answers, key), s[slot]
        return None if value is None or ref is None else value * ref.scale

    def quantile(key: str, slot: str) -> float | None:
        return finite_or_none(scaled(key, slot))

    def counter(slot: str) -> float | None:
        return scaled(slot, slot)

    errors, requests = counter("errors"), counter("requests")
    if errors is None and requests is not None and s["errors"] is not None:
        # Requests were counted, the errors metric exists, but no series matches its labels
        # (vLLM has had no finished_reason="abort" yet): 0 errors, as `or vector(0)` would say.
        errors = 0.0
    error_rate = None
    if errors is not None and requests is not None and requests > 0:
        error_rate = errors / requests
    rates = window_s > 0
    signals = Signals(
        e2e_latency_p50_s=quantile("e2e_latency_p50_s", "e2e") if s["e2e"] else None,
        e2e_latency_p95_s=quantile("e2e_latency_p95_s", "e2e") if s["e2e"] else None,
        e2e_latency_p99_s=quantile("e2e_latency_p99_s", "e2e") if s["e2e"] else None,
        ttft_p95_s=quantile("ttft_p95_s", "ttft") if s["ttft"] else None,
        tpot_p95_s=quantile("tpot_p95_s", "tpot") if s["tpot"] else None,
        tokens_per_s=finite_or_none(counter("tokens")) if rates and s["tokens"] else None,
        requests_per_s=finite_or_none(requests) if rates else None,
        error_rate=finite_or_none(error_rate),
        queue_depth=finite_or_none(_scalar(answers, "queue_depth")) if s["queue"] else None,
        kv_cache_usage=finite_or_none(_scalar(answers, "kv_cache_usage")) if s["kv_cache"] else None,
    )
    return signals, _stages(resolved, answers)


def _stages(resolved: Resolved, answers: Mapping[str, Answer]) -> tuple[StageStats, ...]:
    found: dict[str, dict[str, float | None]] = {}
    sums: dict[str, float] = {}
    for i, source in enumerate(resolved.stages):
        scale = source.histogram.scale
        per_key = {suffix: answers.get(f"stage{i}.{suffix}", {}) for suffix in (*QUANTILES, "sum")}
        names: dict[str, str | None]
        if source.label is None:
            stage = source.name
            names = {stage: None} if stage is not None and any(None in a for a in per_key.values()) else {}
        else:
            names = {k: k for a in per_key.values() for k in a if k}  # "": series without the label
        for name, key in names.items():
            if name in found:
                continue  # an earlier source already provides this stage
            found[name] = {
                suffix: finite_or_none(per_key[suffix][key] * scale) if key in per_key[suffix] else None
                for suffix in QUANTILES
            }
            total = per_key["sum"].get(key)
            if total is not None and total == total:  # not NaN
                sums[name] = total * scale
    grand = sum(sums.values())
    order = {name: n for n, name in enumerate(resolved.profile.stage_order)}
    return tuple(
        StageStats(
            name,
            share=finite_or_none(sums[name] / grand) if name in sums and grand > 0 else None,
            **found[name],
        )
        for name in sorted(found, key=lambda n: (order.get(n, len(order)), n))
    )


# -- the configuration file ----------------------------------------------------------------------------


def load_profiles(config: Config | None = None) -> tuple[Profile, ...]:
    """The built-in profiles with the configuration's overrides, profiles it adds first (so a
    custom profile wins detection over a built-in one matching the same names)."""
    if config is None or not config.profiles:
        return BUILTIN_PROFILES
    if not isinstance(config.profiles, Mapping):
        raise config.error(("profiles",), "expected tables like [profiles.vllm]")
    builtin = {p.name: p for p in BUILTIN_PROFILES}
    added: list[Profile] = []
    changed: dict[str, Profile] = {}
    for name, table in config.profiles.items():
        if not isinstance(table, Mapping):
            raise config.error(("profiles", name), "expected a table, e.g. [profiles." + name + "]")
        base = builtin.get(name)
        if base is None and "detect" not in table:
            raise config.error(("profiles", name), 'a new profile needs detect = ["metric_name", ...]')
        profile = _override(config, name, base or Profile(name, detect=()), table)
        if base is None:
            added.append(profile)
        else:
            changed[name] = profile
    return (*added, *(changed.get(p.name, p) for p in BUILTIN_PROFILES))


def _override(config: Config, name: str, profile: Profile, table: Mapping[str, Any]) -> Profile:
    changes: dict[str, Any] = {}
    for key, value in table.items():
        keys = ("profiles", name, key)
        if key not in PROFILE_KEYS:
            raise config.error(keys, f"unknown key (known: {', '.join(PROFILE_KEYS)})")
        if key == "detect":
            if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
                raise config.error(keys, 'expected a list of metric names, e.g. ["mysvc_requests_total"]')
            changes["detect"] = tuple(value)
        elif key in SLOT_KEYS:
            kind = "histogram" if key in HISTOGRAM_SLOTS else "counter" if key in COUNTER_SLOTS else "gauge"
            changes[key] = tuple(_metric(config, keys, v, kind) for v in (value if isinstance(value, list) else [value]))
        elif key == "stages":
            changes["stages"] = _stages_setting(config, keys, value, table.get("stage_label", "stage"))
            changes["stage_order"] = tuple(value) if isinstance(value, Mapping) else ()
        elif key == "stage_label":
            if not isinstance(table.get("stages"), str):
                raise config.error(keys, 'only meaningful with stages = "histogram_name"')
            if not isinstance(value, str) or not value:
                raise config.error(keys, "expected a label name")
    return replace(profile, **changes)


def _metric(config: Config, keys: tuple[str, ...], value: Any, kind: str) -> MetricRef:
    scale = 1.0
    if isinstance(value, Mapping):
        unknown = set(value) - {"metric", "scale"}
        if unknown or "metric" not in value:
            raise config.error(keys, 'expected {metric = "name", scale = 0.001}')
        scale = value.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise config.error(keys, "scale must be a positive number")
        value = value["metric"]
    if not isinstance(value, str):
        raise config.error(keys, 'expected a metric name or selector, e.g. "my_ttft_seconds"')
    try:
        selector = Selector.parse(value)
    except ValueError as exc:
        raise config.error(keys, str(exc)) from None
    if kind == "histogram" and selector.name is None:
        raise config.error(keys, "a histogram needs a plain metric name, not a __name__ matcher")
    return MetricRef(selector, float(scale))


def _stages_setting(config: Config, keys: tuple[str, ...], value: Any, label: Any) -> tuple[StageSource, ...]:
    if isinstance(value, str):
        if not isinstance(label, str) or not label:
            raise config.error((*keys[:-1], "stage_label"), "expected a label name")
        return (StageSource(_metric(config, keys, value, "histogram"), label=label),)
    if isinstance(value, Mapping) and value:
        return tuple(
            StageSource(_metric(config, (*keys, stage), metric, "histogram"), name=stage)
            for stage, metric in value.items()
        )
    raise config.error(keys, 'expected "histogram_name" (one stage per stage label) or {stage = "histogram_name", ...}')

