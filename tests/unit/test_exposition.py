"""Parsing real /metrics samples (some malformed as published) and fetching them over HTTP."""

from __future__ import annotations

import math
import socket

import pytest

from gpuscope.core.serving.exposition import Endpoint, parse_exposition
from gpuscope.core.serving.scrape import scrape
from gpuscope.core.serving.model import SourceError
from gpuscope.core.serving.promql import histogram_quantile, parse_le
from helpers import FIXTURES
from metrics_server import OPENMETRICS, MetricsServer, Reply


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def buckets(exposition, name: str) -> list[tuple[float, float]]:
    """The `le` buckets of a histogram summed by `le` (as `sum by (le)`)."""
    by_le: dict[str, float] = {}
    for labels, value in exposition.series.get(f"{name}_bucket", []):
        le = dict(labels)["le"]
        by_le[le] = by_le.get(le, 0.0) + value
    return [(parse_le(le), v) for le, v in by_le.items()]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()))
def test_every_fixture_names_its_source_on_its_first_line(name):
    assert fixture(name).splitlines()[0].startswith("# source: ")


def test_sglang_sample_parses_whole():
    e = parse_exposition(fixture("sglang_metrics.txt"))
    assert e.malformed == 0
    for hist in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "time_per_output_token_seconds"):
        b = buckets(e, f"sglang:{hist}")
        count = e.series[f"sglang:{hist}_count"][0][1]
        assert max(b)[1] == count  # the +Inf bucket is the count
    assert e.series["sglang:generation_tokens_total"][0][1] == 7.557572e06
    # its e2e P99 is in the +Inf bucket: the highest finite bound
    assert histogram_quantile(0.99, buckets(e, "sglang:e2e_request_latency_seconds")) == 60.0


def test_vllm_doc_excerpt_skips_its_elisions_and_keeps_the_rest():
    e = parse_exposition(fixture("vllm_metrics_design_doc_excerpt.txt"))
    assert e.malformed == 3  # the three "..." lines
    assert e.series["vllm:num_requests_running"][0][1] == 8.0
    reasons = {dict(labels)["finished_reason"]: v for labels, v in e.series["vllm:request_success_total"]}
    assert reasons == {"stop": 1.0, "length": 131.0, "abort": 0.0}
    # the TTFT block is truncated in the doc (no +Inf bucket): no quantile, not a wrong one
    assert math.isnan(histogram_quantile(0.95, buckets(e, "vllm:time_to_first_token_seconds")))


def test_triton_summary_and_untyped_counters():
    e = parse_exposition(fixture("triton_metrics_doc_excerpt.txt"))
    assert e.malformed == 0
    quantiles = {dict(labels)["quantile"]: v for labels, v in e.series["nv_inference_queue_summary_us"]}
    assert quantiles["0.99"] == 101
    # no TYPE line: kept under the exposed name (no _total appended)
    assert e.series["nv_inference_request_success"][0][1] == 161


def test_triton_malformed_histogram_parses_leniently_but_is_no_histogram():
    e = parse_exposition(fixture("triton_histogram_doc_excerpt_malformed.txt"))
    assert e.malformed == 0  # every line is syntactically a sample ...
    assert "nv_inference_first_response_histogram_ms_bucket" not in e.series  # ... but no _bucket series
    assert len(e.series["nv_inference_first_response_histogram_ms"]) == 5


def test_dcgm_readme_sample_skips_shell_lines_and_elisions():
    e = parse_exposition(fixture("dcgm_exporter_readme_sample.txt"))
    assert e.malformed == 6  # two `curl` lines, four `...`
    clocks = e.series["DCGM_FI_DEV_SM_CLOCK"]
    assert [v for _, v in clocks] == [139, 139]
    assert dict(clocks[1][0])["UUID"] == "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
    assert e.series["DCGM_FI_DEV_MEMORY_TEMP"][0][1] == float(9223372036854775794)  # "blank" sentinel, as a float


def test_a_csv_is_not_an_exposition():
    e = parse_exposition(fixture("dcgm_default_counters.csv"))
    assert not e.series and e.malformed > 10


def test_one_bad_line_costs_only_itself():
    lines = fixture("sglang_metrics.txt").splitlines()
    lines.insert(20, 'sglang:broken{model_name="m" 12')  # unterminated label set
    e = parse_exposition("\n".join(lines) + "\n")
    whole = parse_exposition(fixture("sglang_metrics.txt"))
    assert e.malformed == 1
    assert e.sample_count == whole.sample_count


def test_counter_total_suffix_and_created_families():
    text = """# TYPE tgi_request_success counter
tgi_request_success 5
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 30
vllm:generation_tokens_created{model_name="m"} 1.7e9
"""
    e = parse_exposition(text)
    # kept as exposed, as a Prometheus server stores it (prometheus_client's own parser would
    # append _total to a counter declared without it)
    assert e.series["tgi_request_success"][0][1] == 5 and "tgi_request_success_total" not in e.series
    assert e.series["vllm:generation_tokens_total"][0][1] == 30
    assert "vllm:generation_tokens_created" in e.series  # its own series, harmless


def test_label_values_escapes_braces_and_odd_spacing():
    text = (
        'm{path="/a\\"b",note="x\\ny",empty=""} 1\n'  # escaped quote, newline, empty value
        'm{path="{}"} 2\n'  # braces in a value: prometheus_client's parser reads it
        'm  {  a = "1" , } 3 1700000000000\n'  # spaces, a trailing comma, a timestamp
        '{"my.metric", a="1"} 4\n'  # a quoted UTF-8 name
        'm{a="1",a="2"} 5\n'  # a label twice: not a sample
        'm 1_000\n'  # not a Go float
    )
    e = parse_exposition(text)
    assert e.malformed == 2
    got = {labels: v for labels, v in e.series["m"]}
    assert got[(("empty", ""), ("note", "x\ny"), ("path", '/a"b'))] == 1
    assert got[(("path", "{}"),)] == 2 and got[(("a", "1"),)] == 3
    assert e.series["my.metric"] == [((("a", "1"),), 4.0)]


def test_the_parser_agrees_with_prometheus_clients_on_every_fixture():
    from prometheus_client.parser import text_string_to_metric_families

    for path in sorted(FIXTURES.iterdir()):
        ours = parse_exposition(path.read_text())
        theirs: dict[str, list] = {}
        for line in path.read_text().splitlines():  # line by line: it gives up on a whole text
            try:
                families = list(text_string_to_metric_families(line + "\n"))
            except Exception:  # noqa: BLE001 - a line it refuses
                continue
            for s in (s for f in families for s in f.samples):
                theirs.setdefault(s.name, []).append((tuple(sorted(s.labels.items())), float(s.value)))
        assert {k: sorted(map(repr, v)) for k, v in ours.series.items()} == {
            k: sorted(map(repr, v)) for k, v in theirs.items()
        }, path.name


def test_le_spellings_nan_and_inf_values():
    text = """# TYPE h histogram
h_bucket{le="1"} 2
h_bucket{le="1.0"} 3
h_bucket{le="+Inf"} 10
h_count 10
h_sum NaN
g +Inf
"""
    e = parse_exposition(text)
    assert e.malformed == 0
    assert math.isnan(e.series["h_sum"][0][1]) and e.series["g"][0][1] == math.inf
    assert histogram_quantile(0.5, buckets(e, "h")) == 1.0  # "1" and "1.0" are one bucket of 5


def test_openmetrics_with_exemplars_and_without_eof():
    text = """# TYPE c counter
c_total 3 # {trace_id="abc"} 1.0 1600000000.0
c_created 1.5e9
# TYPE h histogram
h_bucket{le="0.5"} 1 # {trace_id="x"} 0.3
h_bucket{le="+Inf"} 2
h_count 2
h_sum 1.2
"""
    strict = parse_exposition(text + "# EOF\n", OPENMETRICS)
    assert strict.openmetrics and strict.malformed == 0
    assert strict.series["c_total"][0][1] == 3
    # no closing # EOF (cut short): the tolerant pass still reads every sample
    cut = parse_exposition(text, OPENMETRICS)
    assert cut.malformed == 0 and cut.sample_count == strict.sample_count


# -- over HTTP --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    with MetricsServer() as s:
        s.route("/metrics", Reply(fixture("sglang_metrics.txt")))
        s.route("/gzip", Reply(fixture("sglang_metrics.txt"), gzip=True))
        s.route("/openmetrics", Reply("# TYPE c counter\nc_total 4\n# EOF\n", content_type=OPENMETRICS))
        s.route("/500", Reply("oops", status=500))
        s.route("/garbage", Reply("<html><body>Welcome to nginx!</body></html>\n", content_type="text/html"))
        s.route("/slow", Reply(fixture("sglang_metrics.txt"), delay=30))
        yield s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scrape_asks_for_the_text_format_and_reads_both_formats(server):
    text = scrape(Endpoint.parse(server.url("/metrics")), 5)
    assert text.sample_count == parse_exposition(fixture("sglang_metrics.txt")).sample_count
    assert text.format == "text/plain; version=0.0.4"
    # prometheus_client serves OpenMetrics if any is offered, whatever its q: none is
    assert server.seen[-1][1]["Accept"] == "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
    om = scrape(Endpoint.parse(server.url("/openmetrics")), 5)
    assert om.openmetrics and om.series["c_total"][0][1] == 4
    assert om.format == "application/openmetrics-text; version=1.0.0"


def test_gzip_body(server):
    assert scrape(Endpoint.parse(server.url("/gzip")), 5).sample_count > 50


def test_http_500_is_an_answer_not_unreachable(server):
    with pytest.raises(SourceError, match="HTTP 500") as err:
        scrape(Endpoint.parse(server.url("/500")), 5)
    assert not err.value.unreachable


@pytest.mark.parametrize(
    "body, reason",
    [
        ("<html><body>Welcome to nginx!</body></html>\n", "an HTML page"),
        ("<!DOCTYPE html>\n<html>\nrequests 5\n</html>\n", "an HTML page"),  # even with a sample-like line
        ("this is { not metrics\n", "1 unparseable line, no sample"),
        ("", "an empty answer"),
        ("# HELP x y\n# TYPE x gauge\n# EOF\n", "no sample in it"),
    ],
    ids=["html", "html-with-a-number", "garbage", "empty", "metadata-only"],
)
def test_what_is_not_metrics_says_so(server, body, reason):
    server.route("/garbage", Reply(body, content_type="text/html" if body.startswith("<") else "text/plain"))
    with pytest.raises(SourceError) as err:
        scrape(Endpoint.parse(server.url("/garbage")), 5)
    assert str(err.value) == f"{server.url('/garbage')}: not metrics ({reason})"
    assert not err.value.unreachable


def test_down_target_is_unreachable():
    with pytest.raises(SourceError, match="connection refused") as err:
        scrape(Endpoint.parse(f"http://127.0.0.1:{free_port()}/metrics"), 5)
    assert err.value.unreachable


def test_slow_target_times_out(server):
    with pytest.raises(SourceError, match="0.3 s") as err:
        scrape(Endpoint.parse(server.url("/slow")), 0.3)
    assert err.value.unreachable


def test_credentials_in_the_url_are_sent_but_never_shown(server):
    endpoint = Endpoint.parse(server.url("/metrics").replace("http://", "http://scraper:s3cr3t-pw@"))
    assert "s3cr3t-pw" not in endpoint.display and "s3cr3t-pw" not in repr(endpoint)
    scrape(endpoint, 5)
    assert server.seen[-1][1]["Authorization"].startswith("Basic ")
    with pytest.raises(SourceError) as err:
        scrape(Endpoint.parse(f"http://scraper:s3cr3t-pw@127.0.0.1:{free_port()}/metrics"), 5)
    assert "s3cr3t-pw" not in str(err.value)


def test_not_a_url_is_refused():
    with pytest.raises(ValueError, match="not an http"):
        Endpoint.parse("localhost:8000/metrics")


def test_only_the_wanted_lines_are_parsed_but_every_name_is_seen():
    text = fixture("sglang_metrics.txt") + "garbage here\n"
    seen: list[frozenset[str]] = []

    def wanted(names: frozenset[str]) -> set[str]:
        seen.append(names)
        return {"sglang:num_queue_reqs"}

    e = parse_exposition(text, wanted=wanted)
    assert "sglang:e2e_request_latency_seconds_bucket" in seen[0] and "garbage" in seen[0]
    assert list(e.series) == ["sglang:num_queue_reqs"] and e.malformed == 0  # nothing else parsed
    assert "sglang:e2e_request_latency_seconds" in e.names


def test_garbage_costs_a_bounded_number_of_slow_parses(monkeypatch):
    from gpuscope.core.serving import exposition

    calls = []
    slow = exposition._parse_slowly
    monkeypatch.setattr(exposition, "_parse_slowly", lambda *a: calls.append(1) or slow(*a))
    e = parse_exposition("this is { not metrics\n" * 5000 + 'good{a="b"} 1\n')
    assert e.malformed == 5000 and e.series["good"] == [((("a", "b"),), 1.0)]
    assert len(calls) == exposition.MAX_SLOW_LINES
