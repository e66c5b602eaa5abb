"""Steps 3 and 5 judge by the profile and by what moves, against a live metrics server per
built-in profile whose counters and histograms advance as a real server's do.

Each service is served twice: steady (the model's stages take most of the time, latency level)
and degrading (a stage other than the model's slows and takes the time; end-to-end latency
rises). A step that returned a fixed answer fails one of the two.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import replace

import pytest

from gpuscope.core.diagnosis.endpoint import serves_endpoint
from gpuscope.core.diagnosis.steps import ALERT, OK, SKIPPED, WARN, Evidence, Series, step_backpressure, step_throughput
from gpuscope.core.diagnosis.investigation import first_measured
from gpuscope.core.serving.source import ServingSource, make_collector

from metrics_server import MetricsServer, Reply

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 4.0, 5.0, 10.0)
RATE = 20.0  # requests per second

# profile: (e2e histogram, requests counter, tokens counter, stage histogram and label or names,
#           model stage, other stage)
SERVICES = {
    "vllm": ("vllm:e2e_request_latency_seconds", "vllm:request_success_total", "vllm:generation_tokens_total",
             {"queue": "vllm:request_queue_time_seconds", "prefill": "vllm:request_prefill_time_seconds",
              "decode": "vllm:request_decode_time_seconds"}, "decode", "queue"),
    "tgi": ("tgi_request_duration", "tgi_request_count", "tgi_request_generated_tokens_sum",
            {"validation": "tgi_request_validation_duration", "queue": "tgi_request_queue_duration",
             "inference": "tgi_request_inference_duration"}, "inference", "queue"),
    "sglang": ("sglang:e2e_request_latency_seconds", "sglang:num_requests_total", "sglang:generation_tokens_total",
               ("sglang:per_stage_req_latency_seconds", "stage", ("prefill_waiting", "prefill_forward",
                                                                  "decode_forward")), "decode_forward",
               "prefill_waiting"),
    "rag": ("rag_request_latency_seconds", "rag_request_total", "rag_token_output_total",
            ("rag_stage_latency_seconds", "stage", ("retriever", "reranker", "llm")), "llm", "retriever"),
}


class Service:
    """What a server would export after `elapsed` seconds of serving RATE requests a second:
    per stage, every request observed at that stage's latency at that moment."""

    def __init__(self, profile: str, degrading: bool) -> None:
        self.profile = profile
        self.degrading = degrading
        e2e, requests, tokens, stages, self.model, self.other = SERVICES[profile]
        self.names = {"e2e": e2e, "requests": requests, "tokens": tokens}
        self.stages = stages
        self.started = time.monotonic()
        self.last = 0.0
        self.lock = threading.Lock()
        self.hist: dict[tuple[str, str | None], list] = {}  # (family, stage) -> [bucket counts, sum, count]
        self.requests = 0.0

    def stage_names(self) -> tuple[str, ...]:
        return tuple(self.stages) if isinstance(self.stages, dict) else self.stages[2]

    def latency(self, stage: str, t: float) -> float:
        if stage == self.model:
            return 0.85
        if stage == self.other and self.degrading:
            return 0.05 + 0.3 * t  # slows past the model's time within seconds
        return 0.05

    def observe(self, key: tuple[str, str | None], value: float, n: float) -> None:
        counts, total, count = self.hist.setdefault(key, [[0.0] * len(BUCKETS), 0.0, 0.0])
        for i, le in enumerate(BUCKETS):
            if value <= le:
                counts[i] += n
        self.hist[key] = [counts, total + value * n, count + n]

    def advance(self) -> None:
        now = time.monotonic() - self.started
        while self.last < now:
            step = min(0.1, now - self.last)
            t = self.last + step
            n = RATE * step
            e2e = 0.0
            for stage in self.stage_names():
                value = self.latency(stage, t)
                e2e += value
                family = self.stages[stage] if isinstance(self.stages, dict) else self.stages[0]
                self.observe((family, None if isinstance(self.stages, dict) else stage), value, n)
            self.observe((self.names["e2e"], None), e2e, n)
            self.requests += n
            self.last = t

    def exposition(self) -> str:
        with self.lock:
            self.advance()
            lines = [f"# TYPE {self.names['requests']} counter", f"{self.names['requests']} {self.requests:.3f}"]
            if not self.names["tokens"].endswith("_sum"):
                lines += [f"# TYPE {self.names['tokens']} counter", f"{self.names['tokens']} {self.requests * 50:.3f}"]
            else:
                lines.append(f"{self.names['tokens']} {self.requests * 50:.3f}")
            families = sorted({k[0] for k in self.hist})
            for family in families:
                lines.append(f"# TYPE {family} histogram")
                for (name, stage), (counts, total, count) in sorted(self.hist.items(), key=lambda kv: str(kv[0])):
                    if name != family:
                        continue
                    label = f'{self.stages[1]}="{stage}",' if stage is not None else ""
                    for le, c in zip(BUCKETS, counts):
                        lines.append(f'{family}_bucket{{{label}le="{le}"}} {c:.3f}')
                    lines.append(f'{family}_bucket{{{label}le="+Inf"}} {count:.3f}')
                    lines.append(f"{family}_sum{{{label.rstrip(',')}}} {total:.4f}" if label else f"{family}_sum {total:.4f}")
                    lines.append(f"{family}_count{{{label.rstrip(',')}}} {count:.3f}" if label else f"{family}_count {count:.3f}")
            return "\n".join(lines) + "\n"


def watched(profile: str, degrading: bool, seconds: float = 4.0) -> Evidence:
    service = Service(profile, degrading)
    with MetricsServer() as server:
        server.route("/metrics", Reply(service.exposition))
        snapshots = []
        source = ServingSource(make_collector(window_s=1.5, metrics_urls=[server.url()]), interval=0.5)
        source.start(snapshots.append)
        try:
            time.sleep(seconds)
        finally:
            source.stop()
        # The server runs in this process: the process diagnosed is the one that serves the signals.
        serves = serves_endpoint(os.getpid(), server.url())
    ok = [s for s in snapshots if s.ok]
    assert ok and ok[-1].profile == profile, [s.state for s in snapshots[-1:]]
    return Evidence(pid=os.getpid(), command="", duration_s=seconds, rss=Series((), ()), serving_start=first_measured(ok),
                    serving_end=ok[-1], serves=serves)


@pytest.fixture(scope="module")
def evidence():
    """Every service watched once, steady and degrading, all at the same time."""
    found: dict[tuple[str, bool], Evidence] = {}
    threads = [threading.Thread(target=lambda p=p, d=d: found.__setitem__((p, d), watched(p, d)))
               for p in SERVICES for d in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return found


@pytest.mark.parametrize("profile", list(SERVICES))
def test_a_steady_service_whose_model_takes_the_time_is_not_backpressure(evidence, profile):
    ev = evidence[(profile, False)]
    step = step_backpressure(ev)
    assert step.status == OK, step.finding
    model = SERVICES[profile][4]
    assert ev.serving_end.stage(model).share > 0.5  # the model's stage does take most of the time
    assert step_throughput(ev).status == OK, step_throughput(ev).finding


@pytest.mark.parametrize("profile", list(SERVICES))
def test_a_stage_that_slows_and_takes_the_time_is_backpressure_and_the_service_degrades(evidence, profile):
    ev = evidence[(profile, True)]
    step = step_backpressure(ev)
    other = SERVICES[profile][5]
    assert step.status == WARN and other in step.finding, step.finding
    throughput = step_throughput(ev)
    assert throughput.status == ALERT and "P95" in throughput.finding, throughput.finding
    assert "bear on" not in throughput.finding  # the process serves them: nothing to explain


def orphan_sleeper() -> int:
    """A process on this host that serves nothing, and whose parent is not this (serving) process."""
    out = subprocess.run(["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_steps_3_and_5_judge_the_service_only_for_its_own_process(evidence):
    ev = evidence[("vllm", True)]
    assert ev.serves is True
    other = orphan_sleeper()
    try:
        with MetricsServer() as server:
            assert serves_endpoint(os.getpid(), server.url()) is True
            assert serves_endpoint(other, server.url()) is False
            not_it = replace(ev, pid=other, serves=serves_endpoint(other, server.url()))
    finally:
        os.kill(other, signal.SIGKILL)
    for step in (step_throughput(not_it), step_backpressure(not_it)):
        assert step.status == SKIPPED and f"PID {other} is not the service" in step.finding, step.finding
    # Whose signals they are not known (a Prometheus server's): judged, and said what they bear on.
    unknown = replace(ev, serves=None)
    throughput = step_throughput(unknown)
    assert throughput.status == WARN and "only if it serves them" in throughput.finding, throughput.finding
    assert serves_endpoint(os.getpid(), "http://prometheus.example:9090 job=vllm") is None
