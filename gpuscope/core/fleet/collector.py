"""The fleet as gpuscope exporters report it to Prometheus: every node's processes, fastest growth
first; the command that attaches a console to one of them; and a diagnosis from history alone.

Three uses of the same series (`gpuscope exporter`'s `gpuscope_process_*`):

- `read_fleet(client)`: ONE instant query (its parts tagged with `label_replace`, joined with
  `or`, as gpuscope.core.serving.prometheus does) for the `FLEET_LIMIT` fastest-growing processes, the
  `NEW_LIMIT` largest still too new to have a growth rate (listed last), and, for those alone,
  their GPU memory, RSS, verdict and alert; parsed into immutable `FleetProcess` rows.
  `FleetSource` repeats it on its own thread at the pace Prometheus scrapes the exporters.
- gpuscope.core.fleet.attach builds, from a row, the command that opens gpuscope on its node.
- `remote_diagnosis(client, node, pid, ...)`: the exporter's history of one process (query_range)
  as the diagnosis engine's Evidence, then the engine's seven steps; the code path (step 7) needs
  the node, and the diagnosis says so.

Label values are other people's text (a command line, a node name, a pod name): every one is
made printable and cut to a bounded length before it is kept.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from gpuscope.core.diagnosis.steps import TITLES, DeviceEvidence, Diagnosis, Evidence, Series, Step, diagnose
from gpuscope.core.leak import LeakThresholds
from gpuscope.core.node.cgroup import NAME_CHARS as RUNS_IN_CHARS
from gpuscope.core.node.model import ProcessRow
from gpuscope.core.common.poller import Poller, Reading
from gpuscope.core.common.printable import printable_line
from gpuscope.core.common.units import whole_number
from gpuscope.core.serving.prometheus import TAG, PrometheusAuth, PrometheusCollector, checked_results
from gpuscope.core.serving.promql import Matcher
from gpuscope.core.serving.model import ServingSnapshot, SourceError
from gpuscope.core.settings import PrometheusConfig
from gpuscope.errors import GpuscopeError

FLEET_LIMIT = 200  # processes in the fleet view: the fastest growing across every node ...
NEW_LIMIT = 50  # ... and the largest (RSS) of those too new to have a growth rate yet
MAX_SERIES = 10_000  # series in one answer (a fleet query yields a few per process)
MAX_POINTS = 10_000  # points per series in a range query (Prometheus itself refuses 11,000)
LABEL_CHARS = 120
COMMAND_CHARS = 80
MIN_REFRESH_S = 1.0
MAX_REFRESH_S = 60.0
DEFAULT_REFRESH_S = 5.0  # until Prometheus has said how often it scrapes the exporters

GROWTH = "gpuscope_process_memory_growth_bytes_per_second"
GPU_MEMORY = "gpuscope_process_gpu_memory_bytes"
RSS = "gpuscope_process_resident_memory_bytes"
VERDICT = "gpuscope_process_leak_verdict"
LEAK = "gpuscope_process_leak"
INFO = "gpuscope_process_info"  # the command line, once per process (not on every series)
READY = "gpuscope_exporter_ready"  # one series per exporter, written at every scrape
IDENTITY = ("node", "pid", "start_time")  # one process (a reused PID is a new start_time)


def label(value: object, limit: int = LABEL_CHARS) -> str:
    """A label value as it may be kept and shown: printable, one line, at most `limit` characters."""
    return printable_line(value, limit) if isinstance(value, str) else ""


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# -- the fleet view ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FleetProcess:
    """One process on one node, as its exporter last reported it. `pod` and `namespace` are the
    labels Prometheus put on the exporter's target (the exporter's own pod on Kubernetes)."""

    node: str
    pid: int
    start_time: str
    command: str = ""
    runs_in: str = ""  # its systemd unit, container or pod, as its node's exporter read it
    user: str = ""
    pod: str = ""
    namespace: str = ""
    pod_uid: str = ""
    gpus: tuple[int, ...] = ()
    gpu_bytes: float | None = None  # on all its GPUs
    rss_bytes: float | None = None
    growth_bytes_per_s: float | None = None  # the fastest of its series (GPU or RSS); None: too new
    growth_memory: str = ""  # "gpu" | "rss": which series grows fastest
    verdict: str = ""  # of that series: leak | no-leak | inconclusive ("" before it was judged)
    pattern: str = ""
    alerting: bool = False  # the exporter's leak watch raises an alert on one of its series

    @property
    def key(self) -> str:
        return f"{self.node}:{self.pid}:{self.start_time}"


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """One read of the fleet: rows fastest growth first, or why there are none (`state`)."""

    time: float
    target: str
    processes: tuple[FleetProcess, ...] = ()
    state: str = "ok"
    scrape_interval_s: float | None = None  # how often Prometheus scrapes the exporters

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def fleet_query(limit: int = FLEET_LIMIT, new_limit: int = NEW_LIMIT) -> str:
    """The fleet in one PromQL expression: the `limit` fastest-growing series and the `new_limit`
    largest processes too new to have a growth series, and the memory, verdicts and alerts of the
    processes behind them (matched on node, pid and start_time)."""
    top = f"topk({limit}, {GROWTH})"
    on = f"on({', '.join(IDENTITY)})"
    # An exporter sends a process's RSS from its first sample and its growth only once the floor
    # has a slope: the processes with the one and not yet the other are the new ones.
    new = f"topk({new_limit}, {RSS} unless {on} {GROWTH})"
    listed = f"{top} or {new}"
    parts = {
        "growth": top,
        "gpu": f"{GPU_MEMORY} and {on} ({listed})",
        "rss": f"{RSS} and {on} ({listed})",
        "verdict": f"{VERDICT} and {on} ({listed})",
        "leak": f"({LEAK} == 1) and {on} ({listed})",
        "info": f"{INFO} and {on} ({listed})",
        # The pace Prometheus scrapes the exporters at, from the spacing of a series' own samples
        # (the fastest-scraped exporter's): other readers of /metrics (readiness probes, a second
        # Prometheus) add no sample to it. None until two samples are in.
        # (The times of its samples over two minutes: their span over the changes between them.)
        "interval": (f"min((max_over_time(timestamp({READY})[2m:1s]) - min_over_time(timestamp({READY})[2m:1s]))"
                     f" / (changes(timestamp({READY})[2m:1s]) > 0))"),
    }
    return " or ".join(f'label_replace({expr}, "{TAG}", "{key}", "", "")' for key, expr in parts.items())


def fleet_rows(results: Sequence[Mapping]) -> tuple[tuple[FleetProcess, ...], float | None]:
    """(rows fastest growth first, scrape interval) from the answer to `fleet_query`.
    Raises ValueError where the answer is not shaped like an instant query's."""
    found: dict[tuple[str, str, str], dict] = {}
    interval = None
    for r in results:
        labels = r["metric"]
        if not isinstance(labels, Mapping):
            raise ValueError("a series' labels are not an object")
        value = _number(r["value"][1])
        part = labels.get(TAG)
        if part == "interval":
            interval = value
            continue
        pid_text = labels.get("pid")
        if not isinstance(pid_text, str) or whole_number(pid_text, 10) is None:
            continue  # not an exporter's process series
        ident = (label(labels.get("node")), pid_text, label(labels.get("start_time"), 32))
        row = found.setdefault(ident, {"labels": labels, "gpus": {}, "growth": None, "series": {}})
        memory = labels.get("memory", "")
        series_key = (memory, labels.get("gpu", ""))
        if part == "growth" and value is not None:
            if row["growth"] is None or value > row["growth"][0]:
                row["growth"] = (value, series_key)
        elif part == "gpu" and value is not None:
            gpu = whole_number(labels.get("gpu"), 3)
            if gpu is not None:
                row["gpus"][gpu] = value
        elif part == "rss":
            row["rss"] = value
        elif part == "verdict" and value == 1:
            row["series"][series_key] = (label(labels.get("verdict"), 20), label(labels.get("pattern"), 40))
        elif part == "leak" and value == 1:
            row["alerting"] = True
        elif part == "info":
            row["command"] = label(labels.get("command"), COMMAND_CHARS)
            row["runs_in"] = label(labels.get("runs_in"), RUNS_IN_CHARS)
    rows = []
    for (node, pid_text, start), row in found.items():
        labels = row["labels"]
        growth, grown = row["growth"] or (None, ("", ""))
        verdict, pattern = row["series"].get(grown, ("", ""))
        gpus = row["gpus"]
        rows.append(FleetProcess(
            node=node, pid=int(pid_text), start_time=start,
            command=row.get("command", ""), runs_in=row.get("runs_in", ""), user=label(labels.get("user")),
            pod=label(labels.get("pod")), namespace=label(labels.get("namespace")),
            pod_uid=label(labels.get("pod_uid")),
            gpus=tuple(sorted(gpus)), gpu_bytes=sum(gpus.values()) if gpus else None,
            rss_bytes=row.get("rss"), growth_bytes_per_s=growth, growth_memory=label(grown[0], 8),
            verdict=verdict, pattern=pattern, alerting=row.get("alerting", False),
        ))
    rows.sort(key=lambda p: (-(p.growth_bytes_per_s if p.growth_bytes_per_s is not None else -math.inf),
                             p.node, p.pid))
    return tuple(rows), interval


class FleetClient(PrometheusCollector):
    """PromQL asked of Prometheus through the serving source's bounded client: one deadline per
    request, a capped answer, credentials that never follow a redirect, errors as one line."""

    def __init__(self, url: str, *, auth: PrometheusAuth | None = None, timeout: float = 5.0) -> None:
        super().__init__(url, window_s=0.0, profiles=(), auth=auth, timeout=timeout)

    def query(self, promql: str) -> list[dict]:
        """An instant query's result. Raises SourceError (one line, redacted)."""
        return self._checked(self._call(self._client.custom_query, promql))

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[dict]:
        """A range query's result (`{"metric", "values": [[t, "v"], ...]}` each). Raises SourceError."""
        step_s = max(step_s, (end - start) / MAX_POINTS, 0.001)
        when = [datetime.fromtimestamp(t, timezone.utc) for t in (start, end)]
        return self._checked(self._call(self._client.custom_query_range, promql, *when, f"{step_s:.3f}"))

    def _checked(self, results: object) -> list[dict]:
        if not isinstance(results, list):
            raise self._not_prometheus()
        if len(results) > MAX_SERIES:
            raise SourceError(f"Prometheus at {self.target} answered {len(results):,} series; "
                              f"gpuscope reads at most {MAX_SERIES:,}", unreachable=False)
        try:
            return checked_results(results, max_series=MAX_SERIES)
        except ValueError:
            raise self._not_prometheus() from None


def open_client(url: str, *, config: PrometheusConfig | None = None, env: Mapping[str, str] = os.environ,
                timeout: float = 5.0) -> FleetClient:
    """A client for `url`, with the credentials of the environment or the settings (as the serving
    source finds them). Raises ValueError (one line, no secret) on an unusable URL."""
    clean, auth = PrometheusAuth.resolve(url, env, config)
    return FleetClient(clean, auth=auth, timeout=timeout)


def read_fleet(client: FleetClient, limit: int = FLEET_LIMIT, clock: Callable[[], float] = time.time) -> FleetSnapshot:
    """The fleet now. Raises SourceError (one line) when Prometheus cannot be read."""
    results = client.query(fleet_query(limit))
    try:
        processes, interval = fleet_rows(results)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise client._not_prometheus() from None
    return FleetSnapshot(clock(), client.target, processes, "ok", interval)


class FleetSource:
    """The fleet read on its own thread (a coalescing Poller) at the pace Prometheus scrapes the
    exporters: asking more often would only read the same samples again, and only while someone
    looks (between `start` and `pause`). Immutable snapshots go to the callback; a failed read keeps
    the last rows and says why in `state`."""

    def __init__(self, read: Callable[[], FleetSnapshot], target: str, *, timeout: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self._clock = clock
        self._poller = Poller("fleet", read, self._on_reading, timeout=timeout)
        self._ticker = threading.Thread(target=self._tick, name="gpuscope-fleet-ticker", daemon=True)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._listener: Callable[[FleetSnapshot], object] | None = None
        self.latest: FleetSnapshot | None = None
        self.interval_s = DEFAULT_REFRESH_S

    @classmethod
    def of(cls, client: FleetClient) -> FleetSource:
        return cls(lambda: read_fleet(client), client.target, timeout=client.timeout * 2)

    @property
    def started(self) -> bool:
        return self._ticker.is_alive()

    def start(self, on_snapshot: Callable[[FleetSnapshot], object]) -> None:
        """Begin reading (or, once started, send the snapshots to `on_snapshot` from now on)."""
        with self._lock:
            self._listener = on_snapshot
        if self._stopping.is_set():
            return
        if self._ticker.is_alive():
            self._poller.request()  # back after a pause: fresh rows now, not at the next tick
        else:
            self._poller.start()
            self._ticker.start()

    def pause(self) -> None:
        """Stop asking until `start` again (no one is looking); a read in flight still finishes."""
        with self._lock:
            self._listener = None

    def refresh(self) -> None:
        """Read now (coalesced with a read in flight)."""
        self._poller.request()

    def stop(self) -> None:
        self._stopping.set()
        self._poller.stop()
        if self._ticker.is_alive():
            self._ticker.join(1.0)

    def _tick(self) -> None:
        while not self._stopping.is_set():
            if self._listener is not None:
                self._poller.request()
            self._stopping.wait(self.interval_s)

    def _on_reading(self, reading: Reading) -> None:
        value = reading.value
        if isinstance(value, FleetSnapshot):
            snapshot = value
            if value.scrape_interval_s is not None:
                self.interval_s = min(MAX_REFRESH_S, max(MIN_REFRESH_S, value.scrape_interval_s))
        else:  # the poller's error line (a SourceError's text, or a read that did not answer)
            last = self.latest
            snapshot = FleetSnapshot(self._clock(), self.target, last.processes if last else (),
                                     label(reading.error or "no answer", 300))
        with self._lock:
            self.latest = snapshot
            listener = self._listener
        if listener is not None and not self._stopping.is_set():
            listener(snapshot)


# -- a diagnosis from Prometheus history ------------------------------------------------------------------


class ProcessNotExported(GpuscopeError):
    """Prometheus holds no exporter series of that node and PID over the window."""


def _series(values: Sequence, times: Sequence[float]) -> Series:
    by_time = {}
    for t, v in values:
        by_time[round(float(t), 3)] = _number(v)
    return Series(tuple(times), tuple(by_time.get(round(t, 3)) for t in times))


def remote_evidence(client: FleetClient, node: str, pid: int, duration_s: float) -> Evidence:
    """The exporter's history of one process over the last `duration_s` seconds as Evidence.

    Which process (the newest start_time under that PID), the times of its samples, one range
    query for all of its memory series and its node's GPUs at the pace of those samples, the
    GPU's size, and the node's processes by growth now (step 4).
    Raises ProcessNotExported, or SourceError."""
    window = f"{max(1, round(duration_s))}s"
    ident = [Matcher("node", "=", node), Matcher("pid", "=", str(pid))]
    found = client.query(f"last_over_time({RSS}{{{','.join(m.promql() for m in ident)}}}[{window}])")
    if not found:
        raise ProcessNotExported(node, pid)
    newest = max(found, key=lambda r: _number(r["metric"].get("start_time")) or 0.0)
    labels = newest["metric"]
    this = [*ident, Matcher("start_time", "=", str(labels.get("start_time", "")))]
    sel = ",".join(m.promql() for m in this)
    on_node = Matcher("node", "=", node).promql()
    # The raw samples' times: the range query then asks at their pace over the span they cover,
    # so no sample is invented (a finer step) or skipped (a coarser one).
    raw = client.query(f"{RSS}{{{sel}}}[{window}]")
    times = sorted(float(t) for r in raw for t, _ in r.get("values", ()))
    if len(times) < 2:
        raise ProcessNotExported(node, pid)
    start, end = times[0], times[-1]
    step = max(0.001, (end - start) / (len(times) - 1))
    parts = {
        "rss": f"{RSS}{{{sel}}}",
        "gpu": f"sum by (gpu) ({GPU_MEMORY}{{{sel}}})",
        "allocated": f"gpuscope_process_torch_allocated_bytes{{{sel}}}",
        "reserved": f"gpuscope_process_torch_reserved_bytes{{{sel}}}",
        "device": f"gpuscope_gpu_memory_used_bytes{{{on_node}}}",
    }
    combined = " or ".join(f'label_replace({expr}, "{TAG}", "{key}", "", "")' for key, expr in parts.items())
    results = client.query_range(combined, start, end, step)
    got: dict[str, list[dict]] = {}
    for r in results:
        got.setdefault(r["metric"].get(TAG, ""), []).append(r)
    stamps = sorted({round(float(t), 3) for r in got.get("rss", []) + got.get("gpu", []) for t, _ in r["values"]})
    if not stamps:
        raise ProcessNotExported(node, pid)
    rss = _series(got["rss"][0]["values"] if got.get("rss") else (), stamps)
    per_gpu = {r["metric"].get("gpu", ""): _series(r["values"], stamps) for r in got.get("gpu", [])}
    gpu = device = None
    if per_gpu:
        total = [sum(v for v in vs if v is not None) if any(v is not None for v in vs) else None
                 for vs in zip(*(s.values for s in per_gpu.values()))]
        gpu = Series(tuple(stamps), tuple(total))
        main = max(per_gpu, key=lambda g: max(per_gpu[g].known(), default=0.0))
        used = next((r for r in got.get("device", []) if r["metric"].get("gpu") == main), None)
        index = whole_number(main, 3)
        if used is not None and index is not None:
            totals = client.query(f"gpuscope_gpu_memory_total_bytes{{{on_node},{Matcher('gpu', '=', main).promql()}}}")
            total_bytes = _number(totals[0]["value"][1]) if totals else None
            device = DeviceEvidence(index, label(used["metric"].get("name", "")),
                                    int(total_bytes) if total_bytes else None, _series(used["values"], stamps))
    torch = {k: _series(got[k][0]["values"], stamps) if got.get(k) else None for k in ("allocated", "reserved")}
    info = client.query(f"last_over_time({INFO}{{{sel}}}[{window}])")
    return Evidence(
        pid=pid, command=label(info[0]["metric"].get("command") if info else "", COMMAND_CHARS), duration_s=stamps[-1] - stamps[0],
        runs_in=label(info[0]["metric"].get("runs_in") if info else "", RUNS_IN_CHARS),
        rss=rss, gpu=gpu, device=device, processes=_node_processes(client, on_node),
        allocated=torch["allocated"] if gpu is not None else None,
        reserved=torch["reserved"] if gpu is not None else None,
    )


def _node_processes(client: FleetClient, on_node: str) -> tuple[ProcessRow, ...]:
    """The node's exported processes with their growth now: what step 4 ranks."""
    rows: dict[tuple[int, int | None], dict] = {}
    info = client.query(f"{INFO}{{{on_node}}}")
    commands = {r["metric"].get("pid", ""): label(r["metric"].get("command"), COMMAND_CHARS) for r in info}
    places = {r["metric"].get("pid", ""): label(r["metric"].get("runs_in"), RUNS_IN_CHARS) for r in info}
    for r in client.query(f"{GROWTH}{{{on_node}}}"):
        m = r["metric"]
        pid_text = m.get("pid", "")
        pid = whole_number(pid_text, 10)
        if pid is None:
            continue
        gpu = whole_number(m.get("gpu"), 3)
        row = rows.setdefault((pid, gpu), {"command": commands.get(pid_text, ""), "runs_in": places.get(pid_text, "")})
        row["gpu_growth" if m.get("memory") == "gpu" else "rss_growth"] = _number(r["value"][1])
    # A GPU row takes its process's RSS growth from the row without a GPU: looked up, not searched
    # for (an answer holds up to MAX_SERIES rows).
    process_rss = {pid: row.get("rss_growth") for (pid, gpu), row in rows.items() if gpu is None}
    out = []
    for (pid, gpu), row in rows.items():
        rss_growth = row.get("rss_growth", process_rss.get(pid))
        out.append(ProcessRow(pid=pid, user=None, gpu=gpu, gpu_memory_bytes=None, rss_bytes=None, cpu_percent=None,
                              command=row["command"], runs_in=row["runs_in"], gpu_growth_bytes_per_s=row.get("gpu_growth"),
                              rss_growth_bytes_per_s=rss_growth))
    return tuple(out)


def remote_diagnosis(evidence: Evidence, node: str, *, thresholds: LeakThresholds = LeakThresholds(),
                     serving: ServingSnapshot | None = None) -> Diagnosis:
    """The seven steps over the history: steps 1-6 as on the node; step 7 (the code path) needs
    the process itself, and says where to run it."""
    diagnosis = diagnose(replace(evidence, serving_start=None, serving_end=serving), thresholds)
    restated = {7: Step(7, TITLES[6], "skipped",
                        f"skipped: the code path needs the node: run 'gpuscope diagnose --pid {evidence.pid}' on {node}.",
                        evidence={"node": node, "from": "prometheus"})}
    if serving is None:  # the engine would ask for a source; Prometheus was one, without the service's series
        why = "skipped: Prometheus holds no serving metrics of a known server (pick the service with --job, --instance)."
        restated.update({n: Step(n, TITLES[n - 1], "skipped", why) for n in (3, 5)})
    steps = tuple(restated.get(s.number, s) for s in diagnosis.steps)
    return replace(diagnosis, steps=steps, evidence=replace(diagnosis.evidence, prometheus_node=node))
