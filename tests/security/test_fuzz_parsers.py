"""Every parser of input from outside gpuscope, fuzzed: whatever arrives, the answer is a result or
the parser's one refusal, within a time budget per input (hypothesis' deadline), never another
exception. Each test is bounded to a few seconds in all."""

from __future__ import annotations

import json
import math
import os
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscope.core.common import json_depth
from gpuscope.core.common.json_depth import nests_deeper, values_in
from gpuscope.core.common.toml_text import parse_toml
from gpuscope.core.diagnosis._probe_trackers import _tracked, settled_of
from gpuscope.core.fleet.collector import fleet_rows
from gpuscope.core.gate.verdict import BaselineError, load_baseline
from gpuscope.core.serving.exposition import parse_exposition
from gpuscope.core.serving.prometheus import checked_results
from gpuscope.core.target.probe_client import ProbeError

FUZZ = settings(max_examples=150, deadline=500, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=10), inner, max_size=6),
    max_leaves=40,
)

EXPOSITION_CHARS = string.ascii_letters[:6] + string.digits[:4] + ' \t\n{}=",#\\_:.+-eE' + "Naf"
exposition_lines = st.lists(
    st.one_of(
        st.text(EXPOSITION_CHARS, max_size=60),
        st.builds(lambda name, labels, value: f"{name}{{{labels}}} {value}",
                  st.sampled_from(["m", "m_total", "vllm:x", "U__a_2e_b"]),
                  st.text(EXPOSITION_CHARS.replace("\n", ""), max_size=40),
                  st.sampled_from(["1", "NaN", "+Inf", "1e3", "x", ""])),
        st.sampled_from(["# TYPE m counter", "# HELP m help \\n", "# EOF", "# UNIT m bytes"]),
    ),
    max_size=30,
)


@FUZZ
@given(exposition_lines, st.sampled_from([None, "text/plain; version=0.0.4", "application/openmetrics-text",
                                          "text/plain; escaping=dots"]))
def test_an_exposition_parses_to_samples_or_malformed_lines(lines, content_type):
    text = "\n".join(lines) + "\n"
    exposition = parse_exposition(text, content_type)
    assert exposition.malformed >= 0
    for samples in exposition.series.values():
        assert all(isinstance(v, float) for _, v in samples)


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@FUZZ
@given(json_values, st.integers(0, 8))
def test_the_depth_check_agrees_with_the_depth_of_any_json(value, limit):
    text = json.dumps(value).encode()
    assert nests_deeper(text, limit) == (depth(value) > limit)


def count_values(value) -> int:
    if isinstance(value, list):
        return 1 + sum(map(count_values, value))
    if isinstance(value, dict):
        return 1 + len(value) + sum(map(count_values, value.values()))
    return 1


@FUZZ
@given(json_values, st.integers(0, 8), st.sampled_from([1, 2, 3, 5, 64, 1 << 16]))
def test_the_checks_agree_with_any_json_however_it_is_cut_into_pieces(value, limit, piece):
    """The strings are cut out a piece at a time: a piece may begin or end inside a string or on a
    quote; and the value count is never below the values there are."""
    text = json.dumps(value).encode()
    before, json_depth._PIECE = json_depth._PIECE, piece
    try:
        assert nests_deeper(text, limit) == (depth(value) > limit)
        assert values_in(text) >= count_values(value)
    finally:
        json_depth._PIECE = before


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 20))
def test_the_depth_check_takes_any_bytes(text, limit):
    assert isinstance(nests_deeper(text, limit), bool)


@FUZZ
@given(json_values)
def test_a_prometheus_answer_is_checked_or_refused_and_then_read(value):
    try:
        results = checked_results(value)
    except ValueError:
        return
    rows, interval = fleet_rows(results)
    assert interval is None or math.isfinite(interval)
    assert all(isinstance(p.pid, int) for p in rows)


series = st.fixed_dictionaries({
    "metric": st.dictionaries(st.sampled_from(["node", "pid", "start_time", "gpuscope_query", "memory", "gpu"]),
                              st.one_of(st.text(max_size=8), st.sampled_from(["1", "42", "growth", "gpu", "rss"])),
                              max_size=6),
    "value": st.lists(st.one_of(st.floats(), st.text(max_size=6), st.integers()), min_size=2, max_size=2),
})


@FUZZ
@given(st.lists(series, max_size=8))
def test_answers_shaped_like_prometheus_make_fleet_rows(results):
    try:
        checked = checked_results(results)
    except ValueError:
        return
    fleet_rows(checked)


progress_replies = st.fixed_dictionaries({
    "tracking": st.booleans(),
    "times": st.one_of(json_values, st.lists(st.floats(0, 60), max_size=40)),
    "rss": st.one_of(json_values, st.lists(st.one_of(st.none(), st.floats()), max_size=40)),
    "heap": json_values,
    "sites": st.one_of(json_values, st.lists(st.fixed_dictionaries({"held": json_values}), max_size=12)),
})


@settings(FUZZ, max_examples=80)
@given(progress_replies)
def test_a_progress_reply_settles_or_not(reply):
    result = settled_of(reply)
    assert result is None or result.kind in ("rising", "levelled", "flat")


tracker_replies = st.fixed_dictionaries({
    "times": st.one_of(json_values, st.lists(st.floats(0, 60), max_size=20)),
    "records": st.one_of(json_values, st.lists(st.fixed_dictionaries({
        "frames": st.one_of(json_values, st.lists(st.tuples(st.text(max_size=5), st.sampled_from(["/srv/app.py", "x"]),
                                                            st.one_of(st.integers(), st.text(max_size=3))).map(list),
                                                  max_size=4)),
        "size": json_values, "count": json_values, "held": json_values}), max_size=6)),
    "omitted": json_values, "rss": json_values, "seconds": json_values,
})


@settings(FUZZ, max_examples=50)  # each reads the process's own code roots: ~50 ms
@given(tracker_replies)
def test_a_tracker_reply_is_read_or_refused_in_one_line(reply):
    try:
        tracked = _tracked(reply, os.getpid(), "tracemalloc", "fuzzed")
    except ProbeError as exc:
        assert "\n" not in str(exc)
        return
    assert all(len(s.held) == len(tracked.times) for s in tracked.sites)


@FUZZ
@given(st.one_of(st.binary(max_size=400), json_values.map(lambda v: json.dumps(
    {"schema": "gpuscope.check-baseline/1", "rounds": v}).encode())))
def test_a_baseline_file_loads_or_is_refused_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("baseline") / "baseline.json"
    path.write_bytes(data)
    try:
        load_baseline(str(path))
    except BaselineError as exc:
        assert "\n" not in str(exc)


TOML_CHARS = "ab1 .=[]{}\"',\n#-_"


@FUZZ
@given(st.text(TOML_CHARS, max_size=200))
def test_a_settings_or_theme_text_parses_or_is_one_value_error(text):
    try:
        assert isinstance(parse_toml(text), dict)
    except ValueError as exc:
        assert str(exc)
