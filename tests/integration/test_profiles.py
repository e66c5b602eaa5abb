"""Profiles: detection on real samples, what each maps to, and the configuration file."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpuscope.config import ConfigError, config_path, load_config
from gpuscope.core.serving.exposition import parse_exposition
from gpuscope.core.serving.profiles import BUILTIN_PROFILES, MetricRef, detect, load_profiles, resolve, spellings
from gpuscope.core.serving.promql import histogram_quantile, parse_le
from gpuscope.core.serving.prometheus import PrometheusAuth
from gpuscope.core.serving.scrape import ScrapeCollector
from gpuscope.core.serving.model import SIGNAL_NAMES
from gpuscope.demo.service import Metrics
from helpers import FIXTURES, gpuscope_cmd



def demo_exposition() -> str:
    """What the demo RAG service's /metrics says before its first request."""
    return generate_latest(Metrics().registry).decode()


def evaluate(text: str, window_s: float = 0.0, profiles=BUILTIN_PROFILES):
    collector = ScrapeCollector(["http://127.0.0.1:9/metrics"], window_s=window_s, profiles=profiles)
    collector.record(0, (time.time(), parse_exposition(text)))
    return collector.evaluate()


@pytest.mark.parametrize(
    "text, profile",
    [
        ((FIXTURES / "sglang_metrics.txt").read_text(), "sglang"),
        ((FIXTURES / "vllm_metrics_design_doc_excerpt.txt").read_text(), "vllm"),
        ((FIXTURES / "triton_metrics_doc_excerpt.txt").read_text(), "triton"),
        ((FIXTURES / "triton_histogram_doc_excerpt_malformed.txt").read_text(), "triton"),
        ((FIXTURES / "dcgm_exporter_readme_sample.txt").read_text(), "dcgm"),
        (demo_exposition(), "rag"),
        ("tgi_queue_size 3\n", "tgi"),
        ("# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 5\n", "llamacpp"),
        ("process_cpu_seconds_total 3\n", None),
    ],
    ids=["sglang", "vllm", "triton", "triton-malformed", "dcgm", "rag-demo", "tgi", "llamacpp", "none"],
)
def test_detection(text, profile):
    found = detect(BUILTIN_PROFILES, parse_exposition(text).names)
    assert (found.name if found else None) == profile


def test_a_metric_is_found_under_its_escaped_spellings():
    assert spellings("vllm:e2e_request_latency_seconds") == (
        "vllm:e2e_request_latency_seconds", "vllm_e2e_request_latency_seconds")
    assert spellings("http.server.duration") == ("http.server.duration", "http_server_duration")
    assert spellings("a:b.c") == ("a:b.c", "a:b_c", "a_b_c")  # the spec's underscores, and prometheus_client's
    assert spellings("rag_request_total") == ("rag_request_total",)


def test_what_a_prometheus_stored_from_a_mangled_scrape_reads_as_the_server():
    # the sample names Prometheus 2.x stores from prometheus_client 0.26's OpenMetrics (no family names)
    stored = {"vllm_e2e_request_latency_seconds_bucket", "vllm_e2e_request_latency_seconds_sum",
              "vllm_request_success_total", "vllm_num_requests_waiting", "vllm_kv_cache_usage_perc"}
    vllm = detect(BUILTIN_PROFILES, stored)
    assert vllm.name == "vllm"
    slots = resolve(vllm, stored).slots
    assert slots["e2e"].selector.name == "vllm_e2e_request_latency_seconds"
    assert str(slots["errors"].selector) == 'vllm_request_success_total{finished_reason=~"abort|error"}'
    assert slots["queue"].selector.name == "vllm_num_requests_waiting"
    assert slots["kv_cache"].selector.name == "vllm_kv_cache_usage_perc"  # the V1 name, the first alternative
    assert slots["ttft"] is None
    # a name present as it is named wins over its escaped spelling
    assert resolve(vllm, stored | {"vllm:num_requests_waiting"}).slots["queue"].selector.name == "vllm:num_requests_waiting"


def test_a_counter_is_found_where_its_samples_are_not_its_family_name():
    # OpenMetrics: `# TYPE vllm:request_success counter` names the family; the samples are elsewhere
    present = {"vllm:request_success", "vllm_request_success_total"}
    assert resolve(BUILTIN_PROFILES[0], present).slots["requests"].selector.name == "vllm_request_success_total"


def test_sglang_signals_from_its_sample():
    text = (FIXTURES / "sglang_metrics.txt").read_text()
    e = parse_exposition(text)
    ev = evaluate(text)
    s = ev.signals
    e2e = [(parse_le(dict(k)["le"]), v) for k, v in e.series["sglang:e2e_request_latency_seconds_bucket"]]
    assert s.e2e_latency_p50_s == histogram_quantile(0.5, e2e)
    assert s.e2e_latency_p99_s == 60.0  # in the +Inf bucket: the highest finite bound
    assert s.ttft_p95_s is not None
    assert s.tpot_p95_s is not None  # from the older time_per_output_token_seconds name
    assert s.queue_depth == 2826 and s.kv_cache_usage == 0.28
    # window 0: no rates; no request counter in this sample: no error rate
    assert s.tokens_per_s is None and s.requests_per_s is None and s.error_rate is None
    assert ev.stages == ()


def test_vllm_excerpt_signals_are_null_where_the_sample_has_nothing():
    s = evaluate((FIXTURES / "vllm_metrics_design_doc_excerpt.txt").read_text()).signals
    assert s.ttft_p95_s is None  # truncated histogram: no +Inf bucket
    assert s.e2e_latency_p50_s is None and s.queue_depth is None and s.kv_cache_usage is None
    assert s.error_rate == 0.0  # 0 aborted of 132 finished


def test_dcgm_has_no_serving_signals():
    ev = evaluate((FIXTURES / "dcgm_exporter_readme_sample.txt").read_text())
    assert ev.profile == "dcgm"
    assert all(ev.signals.get(n) is None for n in SIGNAL_NAMES)


def test_demo_before_any_request_has_stages_but_no_numbers():
    ev = evaluate(demo_exposition())
    assert ev.profile == "rag"
    assert [st.name for st in ev.stages] == ["retriever", "reranker", "llm"]
    assert all(st.p95_s is None and st.share is None for st in ev.stages)  # no observations: null
    assert ev.signals.e2e_latency_p95_s is None and ev.signals.queue_depth == 0


def test_vllm_v0_and_v1_names():
    v1 = """vllm:inter_token_latency_seconds_bucket{le="0.01"} 5
vllm:inter_token_latency_seconds_bucket{le="+Inf"} 10
vllm:kv_cache_usage_perc{engine="0"} 0.5
vllm:kv_cache_usage_perc{engine="1"} 0.7
"""
    v0 = """vllm:time_per_output_token_seconds_bucket{le="0.05"} 5
vllm:time_per_output_token_seconds_bucket{le="+Inf"} 10
vllm:gpu_cache_usage_perc 0.25
"""
    s1, s0 = evaluate(v1).signals, evaluate(v0).signals
    assert s1.tpot_p95_s == 0.01 and s1.kv_cache_usage == pytest.approx(0.6)  # averaged over engines
    assert s0.tpot_p95_s == 0.05 and s0.kv_cache_usage == 0.25


def test_series_differing_in_other_labels_are_summed_by_le():
    text = """# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="1",model="a"} 10
tgi_request_duration_bucket{le="2",model="a"} 10
tgi_request_duration_bucket{le="+Inf",model="a"} 10
tgi_request_duration_bucket{le="1.0",model="b"} 0
tgi_request_duration_bucket{le="2",model="b"} 10
tgi_request_duration_bucket{le="+Inf",model="b"} 10
"""
    # model a: 10 at <= 1 s; model b: 10 in (1, 2] (its "1.0" is a's "1"): the median is 1 s,
    # p95 is 1.9 s
    s = evaluate(text).signals
    assert s.e2e_latency_p50_s == 1.0
    assert s.e2e_latency_p95_s == pytest.approx(1.9)


def test_triton_milliseconds_are_converted():
    text = """nv_inference_first_response_histogram_ms_bucket{model="m",le="100"} 8
nv_inference_first_response_histogram_ms_bucket{model="m",le="500"} 30
nv_inference_first_response_histogram_ms_bucket{model="m",le="+Inf"} 37
nv_inference_request_success{model="m"} 30
nv_inference_request_failure{model="m",reason="BACKEND"} 10
"""
    s = evaluate(text).signals
    assert s.ttft_p95_s == pytest.approx(0.5)  # 500 ms (the rank is in +Inf: highest finite bound)
    assert s.error_rate == pytest.approx(0.25)  # 10 failed of 40 finished


# -- the configuration file ------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_config_path_follows_the_environment(tmp_path):
    assert config_path({"GPUSCOPE_CONFIG": "/x/y.toml"}) == Path("/x/y.toml")
    assert config_path({"XDG_CONFIG_HOME": "/xdg"}) == Path("/xdg/gpuscope/config.toml")
    assert load_config(env={"XDG_CONFIG_HOME": str(tmp_path)}).profiles == {}  # no file: defaults


def test_override_a_metric_and_add_a_profile(tmp_path):
    path = write(
        tmp_path,
        """
[profiles.vllm]
ttft = "my_ttft_seconds"

[profiles.mysvc]
detect = ["mysvc_*"]
e2e = {metric = "mysvc_request_ms", scale = 0.001}
requests = "mysvc_requests_total"
errors = 'mysvc_requests_total{code=~"5.."}'
stages = {fetch = "mysvc_fetch_ms", answer = "mysvc_answer_ms"}
""",
    )
    profiles = load_profiles(load_config(path))
    assert profiles[0].name == "mysvc"  # added profiles are tried first
    vllm = next(p for p in profiles if p.name == "vllm")
    assert vllm.ttft == (MetricRef.of("my_ttft_seconds"),)
    assert vllm.e2e == next(p for p in BUILTIN_PROFILES if p.name == "vllm").e2e  # the rest unchanged
    text = """mysvc_request_ms_bucket{le="100"} 1
mysvc_request_ms_bucket{le="+Inf"} 1
mysvc_requests_total{code="200"} 9
mysvc_requests_total{code="503"} 1
mysvc_fetch_ms_bucket{le="10"} 1
mysvc_fetch_ms_bucket{le="+Inf"} 1
mysvc_fetch_ms_sum 3
mysvc_answer_ms_bucket{le="10"} 1
mysvc_answer_ms_bucket{le="+Inf"} 1
mysvc_answer_ms_sum 1
"""
    ev = evaluate(text, profiles=profiles)
    assert ev.profile == "mysvc"
    assert ev.signals.e2e_latency_p50_s == pytest.approx(0.05)
    assert ev.signals.error_rate == pytest.approx(0.1)
    assert [(s.name, s.share) for s in ev.stages] == [("fetch", 0.75), ("answer", 0.25)]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[profiles.vllm]\nttfb = 'x'\n", r"config.toml, line 2: profiles.vllm.ttfb: unknown key"),
        ("[profiles.vllm]\n\nttft = 'x{'\n", r"config.toml, line 3: profiles.vllm.ttft: .*selector"),
        ("[profiles.mysvc]\ne2e = 'x'\n", r"config.toml, line 1: profiles.mysvc: a new profile needs detect"),
        ("[prometheus]\nurl = 5\n", r"config.toml, line 2: prometheus.url: expected a non-empty string"),
        ("[promethues]\nurl = 'x'\n", r"config.toml, line 1: promethues: unknown setting"),
        ("[profiles.vllm\nttft = 'x'\n", r"config.toml: not valid TOML: .*line 1"),
        ("[profiles.tgi]\ne2e = {metric = 'x', scale = -1}\n", r"line 2: profiles.tgi.e2e: scale must be a positive"),
    ],
)
def test_a_bad_config_is_one_line_naming_file_line_and_key(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=expected) as err:
        load_profiles(load_config(write(tmp_path, text)))
    assert "\n" not in str(err.value)


def test_config_named_by_the_environment_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(env={"GPUSCOPE_CONFIG": str(tmp_path / "missing.toml")})


def test_the_command_reports_a_bad_config_and_exits_non_zero(tmp_path):
    path = write(tmp_path, "[profiles.vllm]\nttfb = 'x'\n")
    out = subprocess.run(
        [*gpuscope_cmd(), "metrics", "--metrics-url", "http://127.0.0.1:9/metrics", "--window", "0"],
        capture_output=True, text=True, timeout=60, env={"GPUSCOPE_CONFIG": str(path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2
    assert out.stderr.strip() == f"gpuscope: {path}, line 2: profiles.vllm.ttfb: unknown key (known: detect, e2e, ttft, tpot, tokens, requests, errors, queue, kv_cache, stages, stage_label)"
    assert "Traceback" not in out.stderr


# -- Prometheus credentials ------------------------------------------------------------------------


def test_token_from_the_environment_wins_and_credentials_leave_the_url():
    url, auth = PrometheusAuth.resolve(
        "http://u:urlpw@prom:9090/", env={"GPUSCOPE_PROMETHEUS_TOKEN": "tok-123"}, config=None
    )
    assert url == "http://prom:9090" and auth.headers() == {"Authorization": "Bearer tok-123"}
    assert "tok-123" not in repr(auth)


def test_basic_auth_needs_both_halves():
    with pytest.raises(ValueError, match="GPUSCOPE_PROMETHEUS_PASSWORD") as err:
        PrometheusAuth.resolve("http://prom:9090", env={"GPUSCOPE_PROMETHEUS_USER": "u"})
    _, auth = PrometheusAuth.resolve("http://u:pw@prom:9090", env={})
    assert auth.basic() == ("u", "pw") and "pw" not in repr(auth)
    assert "pw" not in str(err.value)


def test_config_file_credentials(tmp_path):
    config = load_config(write(tmp_path, "[prometheus]\nurl = 'http://p:9090'\nuser = 'me'\npassword = 'hunter2'\n"))
    assert "hunter2" not in repr(config)
    _, auth = PrometheusAuth.resolve(config.prometheus.url, env={}, config=config.prometheus)
    assert auth.basic() == ("me", "hunter2")
