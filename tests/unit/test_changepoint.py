"""The P99 change point: the CUSUM itself, and the finding as the serving source makes it and
every consumer of a snapshot receives it (JSON, journal, report)."""

from __future__ import annotations

import random
import threading
from dataclasses import replace

from frames import T0, session_frames
from gpuscope.core.serving.changepoint import latency_jump
from gpuscope.core.session.format import session_meta
from gpuscope.core.session.journal import Journal
from gpuscope.core.serving.profiles import BUILTIN_PROFILES
from gpuscope.core.session.recording import open_recording
from gpuscope.core.session.report import build_report
from gpuscope.core.serving.scrape import ScrapeCollector
from gpuscope.core.serving.source import ServingSource
from helpers import wait_until
from metrics_server import MetricsServer, Reply


def noisy(n, level, rng, t0=0.0):
    return [(t0 + i, level * (1 + rng.uniform(-0.1, 0.1))) for i in range(n)]


def test_a_p99_jump_is_found_with_when_it_started():
    rng = random.Random(3)
    points = noisy(60, 0.5, rng) + noisy(30, 1.4, rng, t0=60)
    jump = latency_jump(points)
    assert jump is not None and 58 <= jump.started <= 62
    assert 0.45 < jump.before_s < 0.55 and 1.3 < jump.after_s < 1.5


def test_noise_and_a_lone_spike_are_not_jumps():
    rng = random.Random(4)
    points = noisy(90, 0.5, rng)
    assert latency_jump(points) is None
    points[70] = (70, 5.0)  # one slow request
    assert latency_jump(points) is None


def test_too_little_history_or_gaps():
    assert latency_jump([(0, 1.0), (1, 2.0)]) is None
    rng = random.Random(5)
    points = noisy(40, 0.5, rng) + [(40 + i, None) for i in range(10)] + noisy(20, 2.0, rng, t0=50)
    jump = latency_jump(points)
    assert jump is not None and jump.started >= 50


def test_one_description_of_a_jump():
    jump = latency_jump([(T0 + i, 0.6) for i in range(20)] + [(T0 + 20 + i, 2.0) for i in range(5)])
    assert jump.describe().startswith("P99 jumped from 600 ms to 2.00 s at ")
    assert jump.to_json() == {"started": T0 + 20, "before_s": 0.6, "after_s": 2.0}


def histogram(slow: bool) -> str:
    """100 requests whose P99 sits in (0.1, 0.5] s, or, once slow, in (1, 5] s."""
    below_one = 90 if slow else 100
    return (
        "# TYPE rag_request_latency_seconds histogram\n"
        'rag_request_latency_seconds_bucket{le="0.1"} 50\n'
        f'rag_request_latency_seconds_bucket{{le="0.5"}} {below_one}\n'
        f'rag_request_latency_seconds_bucket{{le="1.0"}} {below_one}\n'
        'rag_request_latency_seconds_bucket{le="5.0"} 100\n'
        'rag_request_latency_seconds_bucket{le="+Inf"} 100\n'
        "rag_request_latency_seconds_sum 30\nrag_request_latency_seconds_count 100\n"
    )


def test_the_serving_source_finds_the_jump_and_every_snapshot_consumer_gets_it(tmp_path):
    reads = 0
    lock = threading.Lock()

    def body() -> str:
        nonlocal reads
        with lock:
            reads += 1
            return histogram(slow=reads > 16)

    snapshots = []
    with MetricsServer() as server:
        server.route("/metrics", Reply(body))
        collector = ScrapeCollector([server.url()], window_s=0.0, profiles=BUILTIN_PROFILES)
        source = ServingSource(collector, interval=0.05)
        source.start(snapshots.append)
        try:
            wait_until(lambda: reads >= 22, timeout=20, what="22 reads")
        finally:
            source.stop()
    found = [s for s in snapshots if s.p99_jump is not None]
    assert found, [s.signals.e2e_latency_p99_s for s in snapshots]
    jump = found[-1].p99_jump
    assert 0.45 < jump.before_s < 0.5 and jump.after_s > 1.0  # quantiles of the two shapes
    slow_since = next(s.time for s in snapshots if s.signals.e2e_latency_p99_s > 1.0)
    assert jump.started == slow_since
    assert not any(s.p99_jump for s in snapshots if s.time < slow_since)
    assert found[-1].to_json()["p99_jump"] == jump.to_json()  # `metrics --json`

    # the journal records the finding with the snapshot; the report shows it from there
    path = tmp_path / "s.gpuscope"
    j = Journal(path, meta=session_meta("journal"))
    for f in session_frames(3):
        j.frame(replace(f, time=snapshots[0].time))
    for s in snapshots:
        j.serving(s)
    j.close()
    recording = open_recording(path)
    assert recording.serving[-1].p99_jump == found[-1].p99_jump
    assert f"**{jump.describe()}**" in build_report(recording)


def _points(values, start=1000.0):
    return [(start + 15.0 * i, v) for i, v in enumerate(values)]


def test_a_shift_of_exactly_a_fifth_is_a_jump_once_it_has_lasted():
    # a noiseless 5 s: sigma is 5 % of it (0.25 s); each point at 6 s adds 3 sigmas beyond the slack
    assert latency_jump(_points([5.0] * 20 + [6.0] * 2)) is None  # 6 sigmas: not beyond the limit yet
    jump = latency_jump(_points([5.0] * 20 + [6.0] * 3))
    assert jump is not None and (jump.before_s, jump.after_s) == (5.0, 6.0)


def test_a_jump_starts_at_the_first_point_above_the_baseline():
    points = _points([5.0] * 20 + [5.4] + [6.0] * 3)
    jump = latency_jump(points)
    assert jump is not None and jump.started == points[20][0]


def test_the_baselines_spread_is_its_median_absolute_deviation_as_a_standard_deviation():
    # alternating 1.0 and 1.2 s: a MAD of 0.1 s, sigma 0.148 s; 1.5 s is 1.7 sigmas beyond the slack a point
    assert latency_jump(_points([1.0, 1.2] * 10 + [1.5] * 4)) is not None
    assert latency_jump(_points([1.0, 1.2] * 10 + [1.5] * 3)) is None


def test_the_baseline_is_the_first_half_of_the_history():
    # 10 points at 1 s, then 2 s for the rest: the first half of 44 points is mostly at 2 s
    assert latency_jump(_points([1.0] * 10 + [2.0] * 34)) is None
