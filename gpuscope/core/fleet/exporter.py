"""This node's processes as Prometheus metrics: the headless agent behind `gpuscope exporter`.

A `NodeSource` samples the node on its own pollers (NVML, host, torch probes) and feeds a
`LeakWatch`, exactly as for the console; `NodeCollector` keeps the latest frame with the watch's
assessments and turns it into metric families when Prometheus scrapes (a prometheus_client custom
collector: nothing is computed per scrape but the families themselves).

The series are bounded: a process is exported when it is among the `top` largest by GPU memory,
the `top` largest by RSS or the `top` fastest growing, or when the leak watch alerts on it (the
source judges every process's growth and keeps those that grow in detail, so the fastest growing
are ranked among all of the node's processes, not among the largest); an
exited process is simply absent from the next scrape. Every per-process series carries the same
identifying labels: node, pid, start_time (so a reused PID is a new series), user, and the
Kubernetes pod UID and container id when the cgroup tells (read once per process by the host
collector, `gpuscope.core.node.cgroup`); the command line (redacted, printable, short) and where
the process runs (its systemd unit or container, short) are on one series per process,
`gpuscope_process_info`, to be joined on (node, pid, start_time) where they are wanted.

Growth is the floor's slope over GROWTH_WINDOW_S, or over MIN_GROWTH_SAMPLES sampling intervals
when the node is sampled more slowly than that allows (a loaded node): a slow tick widens the
window rather than leaving the process without a growth series.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuscope.core.node.host import HostCollector, HostProcess
from gpuscope.core.leak import VERDICTS, LeakAssessment, LeakThresholds, LeakWatch
from gpuscope.core.node.model import Frame, NvmlReading, TorchMemory
from gpuscope.core.node.live import GROWTH_WINDOW_S, NodeSource
from gpuscope.core.node.nvml import NvmlCollector
from gpuscope.core.common.printable import printable, shortened

TOP_PER_CRITERION = 20  # processes by GPU memory, by RSS, by growth (plus every alert)
COMMAND_CHARS = 80
LABEL_CHARS = 120
WATCHED_SERIES = 8192  # the leak watch's bound: 8 GPUs x 200 processes x (GPU + RSS) and the devices
PROCESS_LABELS = ("node", "pid", "start_time", "user", "pod_uid", "container_id")
INFO_LABELS = ("node", "pid", "start_time", "command", "user", "pod_uid", "container_id", "runs_in")
MIN_GROWTH_SAMPLES = 6  # samples a growth window holds at least, however slowly the node is sampled
# gpuscope_nvml_up's reason: a short enum (the full text is in the exporter's log and the console)
NVML_REASONS = ("", "not-installed", "no-driver", "no-permission", "error")

@dataclass(frozen=True)
class Sample:
    """What one host tick left for the next scrape: the frame, the processes behind it (with their
    start times) and the leak watch's assessments (copied on the poller's thread)."""

    frame: Frame
    processes: tuple[HostProcess, ...]
    assessments: dict
    at: float  # monotonic time it arrived
    seen: int | None = None  # processes on the node (all judged for growth; `processes`: those in detail)
    growth: dict = field(default_factory=dict)  # the watch's key -> floor growth, bytes/s (None: too new)
    interval_s: float | None = None  # seconds since the sample before (None: the first)


@dataclass
class ExporterHealth:
    """The exporter's own counters, shared between the poller thread and the scrapes."""

    read_errors: dict[str, int] = field(default_factory=lambda: {"nvml": 0, "host": 0})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, source: str) -> None:
        with self.lock:
            self.read_errors[source] = self.read_errors.get(source, 0) + 1


def choose_exported(processes: Iterable[HostProcess], gpu_bytes: dict[int, float], growth: dict[int, float],
                    alerting: set[int], top: int = TOP_PER_CRITERION) -> list[HostProcess]:
    """The processes to export: the `top` by GPU memory, by RSS and by growth, and every alert."""
    procs = list(processes)
    chosen: dict[int, HostProcess] = {p.pid: p for p in procs if p.pid in alerting}
    rankings = (
        sorted((p for p in procs if gpu_bytes.get(p.pid)), key=lambda p: -gpu_bytes[p.pid]),
        sorted((p for p in procs if p.rss_bytes), key=lambda p: -(p.rss_bytes or 0)),
        sorted((p for p in procs if (growth.get(p.pid) or 0) > 0), key=lambda p: -growth[p.pid]),
    )
    for ranking in rankings:
        for p in ranking[:top]:
            chosen.setdefault(p.pid, p)
    return sorted(chosen.values(), key=lambda p: p.pid)


def nvml_reason(status: str | None) -> str:
    """NVML's status as gpuscope_nvml_up's short `reason` ("" when it answers)."""
    if status is None:
        return ""
    text = status.lower()
    for reason, words in (("not-installed", ("not installed", "not nvidia's")), ("no-driver", ("driver",)),
                          ("no-permission", ("permission",))):
        if any(w in text for w in words):
            return reason
    return "error"


class NodeCollector(Collector):
    """The prometheus_client collector: families built from the latest sample on each scrape."""

    def __init__(self, node: str, *, top: int = TOP_PER_CRITERION, health: ExporterHealth | None = None,
                 nvml_status: Callable[[], str | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.top = top
        self.health = health or ExporterHealth()
        self._clock = clock
        self._sample: Sample | None = None
        self._scrapes = 0
        self._scrape_errors = 0
        self._last_duration = 0.0

    # -- fed on the host poller's thread ------------------------------------------------------------

    def accept(self, frame: Frame, processes: Iterable[HostProcess], watch: LeakWatch, seen: int | None = None) -> None:
        """Keep the latest frame (call from the source's on_frame, the thread that feeds `watch`)."""
        now = self._clock()
        before = self._sample
        interval = now - before.at if before is not None else None
        window = max(GROWTH_WINDOW_S, MIN_GROWTH_SAMPLES * (interval or 0.0))
        processes = tuple(processes)
        starts = {p.pid: p.create_time for p in processes}
        growth: dict[tuple, float | None] = {}
        for r in frame.processes:  # the node's rows, as they come
            start = starts.get(r.pid)
            if start is None:
                continue
            growth[("rss", r.pid, start)] = watch.recent_growth(("rss", r.pid, start), window)
            if r.gpu is not None:
                key = ("gpu", r.pid, start, r.gpu)
                growth[key] = watch.recent_growth(key, window)
        self._sample = Sample(frame, processes, watch.assessments(), now, seen, growth, interval)

    # -- scraped ----------------------------------------------------------------------------------

    def describe(self) -> list[Metric]:
        return []  # families depend on the node; registering must not run a scrape

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        self._scrapes += 1
        try:
            families = self._families(self._sample)
        except Exception:  # a scrape must answer: the error is counted and the health still served
            self._scrape_errors += 1
            families = []
        yield from families
        yield from self._health(time.perf_counter() - started)

    def _families(self, sample: Sample | None) -> list[Metric]:
        if sample is None:
            return []
        frame = sample.frame
        node = self.node
        gpu_used = GaugeMetricFamily("gpuscope_gpu_memory_used_bytes", "GPU memory in use (NVML).",
                                     labels=("node", "gpu", "uuid", "name"))
        gpu_total = GaugeMetricFamily("gpuscope_gpu_memory_total_bytes", "GPU memory in all (NVML).",
                                      labels=("node", "gpu", "uuid", "name"))
        for d in frame.nvml.devices:
            labels = [node, str(d.index), printable(d.uuid or ""), shortened(d.name, LABEL_CHARS)]
            if d.memory_used is not None:
                gpu_used.add_metric(labels, d.memory_used)
            if d.memory_total is not None:
                gpu_total.add_metric(labels, d.memory_total)

        gpu_bytes: dict[int, float] = {}
        growth: dict[int, float] = {}
        starts = {p.pid: p.create_time for p in sample.processes}
        rows_by_pid: dict[int, list] = {}
        for r in frame.processes:
            rows_by_pid.setdefault(r.pid, []).append(r)
            if r.gpu is not None and r.gpu_memory_bytes is not None:
                gpu_bytes[r.pid] = gpu_bytes.get(r.pid, 0) + r.gpu_memory_bytes
            start = starts.get(r.pid)
            rates = [g for g in (sample.growth.get(("rss", r.pid, start)),
                                 sample.growth.get(("gpu", r.pid, start, r.gpu))) if g is not None]
            if rates:
                growth[r.pid] = max(growth.get(r.pid, rates[0]), *rates)
        alerting = {a.pid for a in frame.alerts if a.pid is not None}
        exported = choose_exported(sample.processes, gpu_bytes, growth, alerting, self.top)
        torch: dict[int, TorchMemory] = {t.pid: t for t in frame.torch}

        memory_labels = (*PROCESS_LABELS, "memory", "gpu")
        info = GaugeMetricFamily("gpuscope_process_info",
                                 "1 for each exported process, with its command line (redacted, at most "
                                 f"{COMMAND_CHARS} characters) and where it runs (runs_in: its systemd unit or "
                                 "container, e.g. vllm.service, docker:0123456789ab): join on node, pid, start_time.",
                                 labels=INFO_LABELS)
        p_gpu = GaugeMetricFamily("gpuscope_process_gpu_memory_bytes",
                                  "GPU memory of the process on one GPU (NVML; includes the CUDA context).",
                                  labels=(*PROCESS_LABELS, "gpu"))
        p_rss = GaugeMetricFamily("gpuscope_process_resident_memory_bytes", "Resident set size of the process.",
                                  labels=PROCESS_LABELS)
        p_growth = GaugeMetricFamily(
            "gpuscope_process_memory_growth_bytes_per_second",
            f"Growth of the memory floor (Theil-Sen slope of its minima over {GROWTH_WINDOW_S:g} s, or over "
            f"{MIN_GROWTH_SAMPLES} sampling intervals when sampling is slower), as the console's growth column.",
            labels=memory_labels)
        p_verdict = GaugeMetricFamily(
            "gpuscope_process_leak_verdict",
            "1 for the leak detector's current verdict and pattern of the series (memory=gpu|rss).",
            labels=(*memory_labels, "verdict", "pattern"))
        p_leak = GaugeMetricFamily("gpuscope_process_leak",
                                   "1 while the leak detector raises an alert on the series, else 0.",
                                   labels=memory_labels)
        p_conf = GaugeMetricFamily("gpuscope_process_leak_confidence",
                                   "The leak detector's confidence in its pattern (0 to 1).", labels=memory_labels)
        p_floor = GaugeMetricFamily("gpuscope_process_leak_growth_bytes_per_second",
                                    "The leak detector's floor slope of the series.", labels=memory_labels)
        t_alloc = GaugeMetricFamily("gpuscope_process_torch_allocated_bytes",
                                    "PyTorch's memory_allocated() (through gpuscope's probe).", labels=PROCESS_LABELS)
        t_resv = GaugeMetricFamily("gpuscope_process_torch_reserved_bytes",
                                   "PyTorch's memory_reserved() (through gpuscope's probe).", labels=PROCESS_LABELS)
        alerts = {(a.kind, a.pid, a.device) for a in frame.alerts}
        for p in exported:
            cg = p.cgroup
            user = shortened(p.user or "", LABEL_CHARS)
            ident = [node, str(p.pid), f"{p.create_time:.2f}", user, cg.pod_uid, cg.container_id]
            info.add_metric([*ident[:3], shortened(p.command, COMMAND_CHARS), user, cg.pod_uid, cg.container_id,
                             cg.name], 1.0)
            if p.rss_bytes is not None:
                p_rss.add_metric(ident, p.rss_bytes)
            rows = rows_by_pid.get(p.pid, ())
            rss_growth = sample.growth.get(("rss", p.pid, p.create_time))
            # (memory, gpu label, growth, the watch's key, the alerts' key)
            series: list[tuple[str, str, float | None, tuple, tuple]] = [
                ("rss", "", rss_growth, ("rss", p.pid, p.create_time), ("rss", p.pid, None))
            ]
            for r in rows:
                if r.gpu is None:
                    continue
                if r.gpu_memory_bytes is not None:
                    p_gpu.add_metric([*ident, str(r.gpu)], r.gpu_memory_bytes)
                series.append(("gpu", str(r.gpu), sample.growth.get(("gpu", p.pid, p.create_time, r.gpu)),
                               ("gpu", p.pid, p.create_time, r.gpu),
                               ("gpu", p.pid, r.gpu)))
            for memory, gpu, rate, watch_key, alert_key in series:
                labels = [*ident, memory, gpu]
                if rate is not None:
                    p_growth.add_metric(labels, rate)
                a: LeakAssessment | None = sample.assessments.get(watch_key)
                p_leak.add_metric(labels, 1.0 if alert_key in alerts else 0.0)
                if a is None:
                    continue
                p_verdict.add_metric([*labels, a.verdict if a.verdict in VERDICTS else "inconclusive", a.pattern], 1.0)
                p_conf.add_metric(labels, a.confidence)
                if a.growth_bytes_per_s is not None:
                    p_floor.add_metric(labels, a.growth_bytes_per_s)
            t = torch.get(p.pid)
            if t is not None:
                if t.allocated_bytes is not None:
                    t_alloc.add_metric(ident, t.allocated_bytes)
                if t.reserved_bytes is not None:
                    t_resv.add_metric(ident, t.reserved_bytes)
        status = frame.nvml.status
        nvml_up = GaugeMetricFamily("gpuscope_nvml_up", "1 when NVML answers, 0 when it cannot be read "
                                    f"(reason: {', '.join(r for r in NVML_REASONS if r)}; host memory is still exported).",
                                    labels=("node", "reason"))
        nvml_up.add_metric([node, nvml_reason(status)], 0.0 if status else 1.0)
        age = GaugeMetricFamily("gpuscope_exporter_sample_age_seconds",
                                "Seconds since the latest sample of the node (grows while reads hang).",
                                labels=("node",))
        age.add_metric([node], max(0.0, self._clock() - sample.at))
        spacing = GaugeMetricFamily("gpuscope_exporter_sample_interval_seconds",
                                    "Seconds between the latest two samples of the node (the growth window "
                                    f"widens to {MIN_GROWTH_SAMPLES} of them when that is over {GROWTH_WINDOW_S:g} s).",
                                    labels=("node",))
        if sample.interval_s is not None:
            spacing.add_metric([node], sample.interval_s)
        procs = GaugeMetricFamily("gpuscope_exporter_processes",
                                  "Processes sampled on the node (seen) and exported with series (exported).",
                                  labels=("node", "state"))
        procs.add_metric([node, "seen"], sample.seen if sample.seen is not None else len(sample.processes))
        procs.add_metric([node, "exported"], len(exported))
        return [gpu_used, gpu_total, info, p_gpu, p_rss, p_growth, p_verdict, p_leak, p_conf, p_floor, t_alloc, t_resv,
                nvml_up, age, spacing, procs]

    def _health(self, duration: float) -> list[Metric]:
        node = self.node
        scrape = GaugeMetricFamily("gpuscope_exporter_scrape_duration_seconds",
                                   "Seconds this scrape took to build its metrics.", labels=("node",))
        scrape.add_metric([node], duration)
        scrapes = CounterMetricFamily("gpuscope_exporter_scrapes", "Scrapes answered.", labels=("node",))
        scrapes.add_metric([node], self._scrapes)
        errors = CounterMetricFamily("gpuscope_exporter_errors",
                                     "Failures: reads of NVML or the host that failed or timed out, and scrapes "
                                     "that could not build the node's metrics.", labels=("node", "source"))
        with self.health.lock:
            counts = dict(self.health.read_errors)
        counts["scrape"] = self._scrape_errors
        for source, n in sorted(counts.items()):
            errors.add_metric([node, source], n)
        up = GaugeMetricFamily("gpuscope_exporter_ready", "1 once the node has been sampled.", labels=("node",))
        up.add_metric([node], 0.0 if self._sample is None else 1.0)
        return [scrape, scrapes, errors, up]


class _CountedNvml:
    """An NVML collector whose failed reads are counted in the exporter's health."""

    def __init__(self, inner: NvmlCollector, health: ExporterHealth) -> None:
        self._inner, self._health = inner, health

    def read(self) -> NvmlReading:
        try:
            return self._inner.read()
        except Exception:
            self._health.error("nvml")
            raise

    def close(self) -> None:
        self._inner.close()


class _CountedHost(HostCollector):
    """The host collector, its failed scans counted in the exporter's health."""

    def __init__(self, health: ExporterHealth) -> None:
        super().__init__()
        self._health = health

    def scan(self, fresh=frozenset()):
        try:
            return super().scan(fresh)
        except Exception:
            self._health.error("host")
            raise


class NodeAgent:
    """The node sampled on its pollers, its leak watch and the collector Prometheus scrapes."""

    def __init__(self, node: str, *, interval: float = 1.0, thresholds: LeakThresholds = LeakThresholds(),
                 top: int = TOP_PER_CRITERION, nvml: NvmlCollector | None = None) -> None:
        self.health = ExporterHealth()
        self.watch = LeakWatch(thresholds=thresholds, max_series=WATCHED_SERIES)
        self.collector = NodeCollector(node, top=top, health=self.health)
        self.source = NodeSource(
            interval=interval, thresholds=thresholds, watch=self.watch,
            nvml=_CountedNvml(nvml or NvmlCollector(), self.health), host=_CountedHost(self.health),
        )

    def start(self) -> None:
        self.source.start(self._on_frame)

    def stop(self) -> None:
        self.source.stop()

    def _on_frame(self, frame: Frame) -> None:  # on the host poller's thread, which feeds the watch
        snap = self.source.last_host
        self.collector.accept(frame, snap.processes if snap is not None else (), self.watch,
                              len(snap.visible) if snap is not None else None)
