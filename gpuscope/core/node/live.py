"""The live source: this node's GPUs and processes, sampled on a steady tick.

Two pollers (NVML and host) read independently, so a hung GPU query never stops host memory from
updating and vice versa. Each host read joins the latest NVML reading, records every shown
process's memory in the bounded store, and emits one immutable Frame: first to `on_sample` (the
session's journal: each sample once, when taken), then to `on_frame` (the display). Selecting
another process shows the latest sample again, to `on_frame` alone.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from gpuscope.core.node.command_display import short_command
from gpuscope.core.node.host import HostCollector, ProcessForbidden, ProcessGone, SeenProcess
from gpuscope.core.target.interpreter import is_python
from gpuscope.core.leak import LeakAlert, LeakThresholds, LeakWatch
from gpuscope.core.node.model import (
    Alert,
    Frame,
    GpuUse,
    HostMemory,
    HostProcess,
    MemorySeries,
    NvmlReading,
    ProcessDetail,
    ProcessRow,
    TorchMemory,
)
from gpuscope.core.node.torch_memory import TorchMemoryCollector
from gpuscope.core.node.nvml import NvmlCollector, NvmlReader
from gpuscope.core.common.poller import Poller, Reading, pace
from gpuscope.core.node.store import SeriesStore
from gpuscope.core.common.units import format_bytes


MAX_PYTHON_ROWS = 20
MAX_RSS_ROWS = 15
MAX_GROWING_ROWS = 16  # processes kept in detail for their growth, beyond the GPU, Python and RSS ones
RISE_BYTES = 4 * 2**20  # private memory this far above its lowest: the process is kept in detail
RECENT_RISE_S = 60.0  # ... first among those that grew when it grew this recently
MAX_EARLY_FRAMES = 30  # frames kept while nobody listens yet (`NodeSource.prefetch`)
GROWTH_WINDOW_S = 30.0
CHART_WINDOW_S = 300.0
CONTAINER_NOTICE = (
    "{n} GPU process(es) using {mem} belong to PIDs this container cannot see: "
    "run gpuscope with --pid=host (Docker) or hostPID: true (Kubernetes)"
)


def in_container() -> bool:
    """True when gpuscope itself runs in a container (then NVML's host PIDs may be invisible)."""
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    try:
        with open("/proc/1/cgroup", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    return any(word in text for word in ("docker", "kubepods", "containerd", "libpod", "lxc"))


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """What one host read produced, before it is joined into a frame."""

    time: float
    memory: HostMemory
    processes: tuple[HostProcess, ...]
    visible: frozenset[int]
    detail: ProcessDetail | None


def choose_rows(seen: list[SeenProcess], gpu_pids: set[int], always: set[int],
                growing: Sequence[int] = ()) -> list[SeenProcess]:
    """The processes kept in detail (shown, their memory recorded and judged by the leak watch):
    GPU processes and `always` (the attached one, those alerting) first, then the `growing` ones
    (the screen's, fastest risen first), then Python processes, then the largest by RSS."""
    chosen: dict[int, SeenProcess] = {s.pid: s for s in seen if s.pid in gpu_pids or s.pid in always}
    by_pid = {s.pid: s for s in seen} if growing else {}
    for pid in growing[:MAX_GROWING_ROWS]:
        row = by_pid.get(pid)
        if row is not None:
            chosen.setdefault(pid, row)
    me = os.getpid()
    # gpuscope itself is not what the operator is looking for; kernel threads have no RSS.
    by_rss = sorted((s for s in seen if s.pid != me and s.rss), key=lambda s: s.rss or 0, reverse=True)
    pythons = [s for s in by_rss if is_python(s.name, s.exe)]
    for s in pythons[:MAX_PYTHON_ROWS]:
        chosen.setdefault(s.pid, s)
    for s in by_rss[:MAX_RSS_ROWS]:
        chosen.setdefault(s.pid, s)
    return list(chosen.values())


class GrowthScreen:
    """Every process on the node, judged cheaply on each pass: has its private memory risen
    `rise_bytes` above the lowest it was seen at? Those that have are kept in detail (their
    memory judged by the leak watch); the others cost a dictionary look-up a pass. Those still
    rising come first (risen in the last `recent_s`), the most risen first: a process that warmed
    up once and has been flat since does not hold a place that one growing now needs.

    Private memory (resident less shared pages), not RSS: processes that map one shared buffer
    each count it in their RSS as they touch it, and would crowd out a process that really grows.
    A row the host scan took unchanged from its last pass (the same object) is skipped at once:
    the work is proportional to the processes that are new or changed. A PID reused by another
    process starts afresh (known by its start time)."""

    __slots__ = ("rise_bytes", "recent_s", "_known", "_risen")

    def __init__(self, rise_bytes: float = RISE_BYTES, recent_s: float = RECENT_RISE_S) -> None:
        self.rise_bytes = rise_bytes
        self.recent_s = recent_s
        self._known: dict[int, tuple[SeenProcess, float]] = {}  # pid -> (its latest row, its lowest)
        self._risen: dict[int, tuple[float, float]] = {}  # pid -> (bytes above its lowest, when it last rose)

    def update(self, seen: list[SeenProcess], now: float) -> list[int]:
        """Take one pass's rows (taken at `now`, seconds); the processes risen, those still rising
        first, the most risen first."""
        known, risen = self._known, self._risen
        this: dict[int, tuple[SeenProcess, float]] = {}
        for row in seen:
            before = known.get(row.pid)
            if before is not None and before[0] is row:
                this[row.pid] = before
                continue
            value = _private(row)
            if value is None:
                continue
            if before is None or before[0].create_time != row.create_time:
                risen.pop(row.pid, None)
                this[row.pid] = (row, value)
                continue
            low = min(before[1], value)
            this[row.pid] = (row, low)
            if value - low >= self.rise_bytes:
                was = risen.get(row.pid)
                rose = was is None or value - low > was[0]
                risen[row.pid] = (value - low, now if rose or was is None else was[1])
            else:
                risen.pop(row.pid, None)
        for pid in [pid for pid in risen if pid not in this]:  # gone (few: only risen ones are kept)
            del risen[pid]
        self._known = this
        since = now - self.recent_s
        return sorted(risen, key=lambda pid: (risen[pid][1] >= since, risen[pid][0]), reverse=True)


def _private(row: SeenProcess | HostProcess) -> float | None:
    """The memory the leak watch judges for a process: its private memory, its RSS where that is unknown."""
    value = row.private if isinstance(row, SeenProcess) else row.private_bytes
    return value if value is not None else row.rss if isinstance(row, SeenProcess) else row.rss_bytes


class NodeSource:
    def __init__(
        self,
        *,
        interval: float = 1.0,
        focus_pid: int | None = None,
        nvml: NvmlReader | None = None,
        host: HostCollector | None = None,
        allocator: TorchMemoryCollector | None = None,
        store: SeriesStore | None = None,
        clock: Callable[[], float] = time.time,
        read_timeout: float | None = None,
        thresholds: LeakThresholds = LeakThresholds(),
        watch: LeakWatch | None = None,
        every_process: bool = False,
    ) -> None:
        self.interval = interval
        self._nvml: NvmlReader = nvml or NvmlCollector()
        self._host = host or HostCollector()
        self._allocator = allocator or TorchMemoryCollector()
        self._torch: dict[int, TorchMemory] = {}  # the latest allocator numbers, by PID
        self.store = store or SeriesStore()
        self._clock = clock
        self._focus = focus_pid
        self._selected = focus_pid
        self._on_frame: Callable[[Frame], None] | None = None
        self._on_sample: Callable[[Frame], None] | None = None
        self._nvml_reading = NvmlReading(status="reading NVML...")
        self._nvml_first = True  # no reading has come yet
        self._nvml_error: str | None = None
        self._host_error: str | None = None
        self._last: HostSnapshot | None = None
        self._emit_lock = threading.Lock()
        self._running = False
        self._early: list[Frame] = []  # frames read before `start` (a few: `prefetch` is for the first ones)
        # Fed and updated on the host poller's thread only (a caller that passes its own reads it
        # from on_frame, on that thread).
        self._watch = watch if watch is not None else LeakWatch(thresholds=thresholds)
        self._alerts: tuple[Alert, ...] = ()
        self._screen = GrowthScreen()
        self._every_process = every_process  # rows for every process with memory (`ps`), not a choice
        self._hostname = socket.gethostname()
        self._container = in_container()
        timeout = read_timeout if read_timeout is not None else max(5.0, 3 * interval)
        self._pollers = [
            Poller("nvml", self._nvml.read, self._on_nvml, timeout=timeout),
            Poller("host", self._read_host, self._on_host, timeout=timeout),
            Poller("torch", self._allocator.read, self._on_torch, timeout=timeout),
        ]
        self.pace_s = interval  # the interval in use: longer while a read is slow (poller.pace)
        self._stopping = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="gpuscope-ticker", daemon=True)

    # -- Source interface (gpuscope.core.session.interface) --------------------------------------

    def start(self, on_frame: Callable[[Frame], None], on_sample: Callable[[Frame], None] | None = None) -> None:
        with self._emit_lock:
            self._on_frame = on_frame
            self._on_sample = on_sample
            # Frames read ahead (`prefetch`): each sample to on_sample, the latest shown; under the
            # lock, so that a frame read meanwhile comes after them.
            early, self._early = self._early, []
            if on_sample is not None:
                for frame in early:
                    on_sample(frame)
            if early:
                on_frame(early[-1])
        self.prefetch()

    def prefetch(self) -> None:
        """Begin reading before anyone listens (the frames wait for `start`): the console's first
        frame is read while its screen is imported and built, not after."""
        if self._running:
            return
        self._running = True
        for p in self._pollers:
            p.start()
        self._ticker.start()

    def stop(self) -> None:
        self._stopping.set()
        for p in self._pollers:
            p.stop()
        if self._ticker.is_alive():
            self._ticker.join(1.0)
        self._nvml.close()
        self._host.close()
        self._allocator.close()

    def select(self, pid: int | None) -> None:
        self._selected = pid
        self._emit_cached()

    def focus(self, pid: int | None) -> None:
        self._focus = pid
        if pid is not None:
            self._selected = pid
        self._pollers[1].request()

    @property
    def last_host(self) -> HostSnapshot | None:
        """The host read behind the latest frame (its processes carry their start times)."""
        return self._last

    # -- one synchronous sample, for the headless commands ---------------------------------------

    def sample_once(self) -> Frame:
        """Read NVML and the host right now (no threads) and return the frame."""
        self._on_nvml(Reading("nvml", self._nvml.read()))
        snap = self._read_host()
        self._accept(snap)
        return self._frame(snap)

    # -- polling ----------------------------------------------------------------------------------

    def _tick(self) -> None:
        while not self._stopping.is_set():
            for p in self._pollers:
                p.request()
            self.pace_s = pace(self.interval, self._pollers)
            self._stopping.wait(self.pace_s)

    def _on_nvml(self, reading: Reading) -> None:
        if reading.error is not None:
            self._nvml_error = reading.error
            return
        self._nvml_error = None
        value: NvmlReading = reading.value
        first = self._nvml_first
        self._nvml_first = False
        self._nvml_reading = value
        if first:
            # NVML's first answer (its library loaded, its devices opened) usually comes after the
            # first host read: read the host again now rather than show "reading NVML..." a tick.
            self._pollers[1].request()
        now = self._clock()
        for d in value.devices:
            self.store.add(("dev", d.index), now, d.memory_used)

    def _on_torch(self, reading: Reading) -> None:
        # A probe that cannot be read now keeps nothing stale: its process shows NVML's number only.
        self._torch = {} if reading.error is not None else {t.pid: t for t in reading.value}

    def _read_host(self) -> HostSnapshot:
        now = self._clock()
        memory = self._host.memory()
        gpu_pids = {u.pid for u in self._nvml_reading.uses}
        # The rows on screen, the attached process and those alerting are read every pass; the
        # node's other processes, once calm, less often (`HostCollector.scan`).
        fresh = {p.pid for p in self._last.processes} if self._last is not None else set()
        fresh.update(gpu_pids)
        fresh.update(a.pid for a in self._alerts if a.pid is not None)
        if self._focus is not None:
            fresh.add(self._focus)
        seen = self._host.scan(fresh)
        growing = self._screen.update(seen, now)
        if self._every_process:
            chosen = [s for s in seen if s.rss or s.pid in gpu_pids]
        else:
            # The attached process and those alerting stay in detail whatever the screen says.
            always = {a.pid for a in self._alerts if a.pid is not None}
            if self._focus is not None:
                always.add(self._focus)
            chosen = choose_rows(seen, gpu_pids, always, growing)
        procs = self._host.complete(chosen)
        detail = None
        if self._focus is not None:
            try:
                # The interpreter's full version is asked in the background: the first frame
                # does not wait for another Python to start.
                row = next((s for s in seen if s.pid == self._focus), None)
                detail = self._host.detail(self._focus, wait_for_version=False, seen=row)
            except (ProcessGone, ProcessForbidden):
                prior = self._last.detail if self._last is not None else None
                detail = replace(prior, exited=True, threads=None, status="exited") if prior else None
        return HostSnapshot(now, memory, tuple(procs), frozenset(s.pid for s in seen), detail)

    def _on_host(self, reading: Reading) -> None:
        if reading.error is not None:
            self._host_error = reading.error
            self._emit_cached()
            return
        self._host_error = None
        snap: HostSnapshot = reading.value
        self._accept(snap)
        frame = self._frame(snap)
        with self._emit_lock:
            if self._on_frame is None:  # read ahead: kept for `start`
                self._early = [*self._early[-(MAX_EARLY_FRAMES - 1):], frame]
                return
        if self._on_sample is not None and not self._stopping.is_set():
            self._on_sample(frame)
        self._emit(frame)

    def _accept(self, snap: HostSnapshot) -> None:
        self._record(snap)
        self.store.prune(snap.time)
        self._last = snap
        self._alerts = tuple(self._alert(a, snap) for a in self._watch.update())

    def _alert(self, alert: LeakAlert, snap: HostSnapshot) -> Alert:
        key = cast(tuple, alert.key)  # the keys `_record` feeds the watch
        kind, ident = key[0], key[1]
        a = alert.assessment
        if kind == "device":
            device = next((d for d in self._nvml_reading.devices if d.index == ident), None)
            label, pid, index = f"GPU{ident} {device.name if device else ''}".strip(), None, ident
        else:
            proc = next((p for p in snap.processes if p.pid == ident), None)
            what = "GPU memory" if kind == "gpu" else "RSS"
            # Gone from the host: the console marks the alert `ended` ("(exited)"), the label need not.
            command = short_command(proc.command, 48, proc.cgroup.name) if proc else ""
            label, pid, index = " ".join(filter(None, (f"PID {ident}", command, f"({what})"))), ident, key[3] if kind == "gpu" else None
        return Alert(kind, pid, index, label, alert.growth_bytes_per_s, a.since, a.time_to_full_s, a.confidence, a.reason,
                     ended=alert.ended)

    def _emit_cached(self) -> None:
        if self._last is not None:
            self._emit(self._frame(self._last))

    def _emit(self, frame: Frame) -> None:
        with self._emit_lock:
            if self._on_frame is not None and not self._stopping.is_set():
                self._on_frame(frame)

    # -- frames -----------------------------------------------------------------------------------

    def _uses_by_pid(self) -> dict[int, list[GpuUse]]:
        uses: dict[int, list[GpuUse]] = {}
        for u in self._nvml_reading.uses:
            uses.setdefault(u.pid, []).append(u)
        return uses

    def _record(self, snap: HostSnapshot) -> None:
        uses = self._uses_by_pid()
        watch = self._watch
        for d in self._nvml_reading.devices:
            watch.add(("device", d.index), snap.time, d.memory_used, total_bytes=d.memory_total)
        for p in snap.processes:
            self.store.add(("rss", p.pid, p.create_time), snap.time, p.rss_bytes)
            # The watch judges private memory (the shown RSS less shared pages), and the
            # process's age (its start: a warm-up is not a leak).
            watch.add(("rss", p.pid, p.create_time), snap.time, _private(p), started=p.create_time)
            mine = uses.get(p.pid, [])
            if not mine:
                continue  # no GPU series for host-only processes (the chart reads N/A)
            for u in mine:
                watch.add(("gpu", p.pid, p.create_time, u.device), snap.time, u.memory, started=p.create_time)
            known = [u.memory for u in mine if u.memory is not None]
            self.store.add(("gpu", p.pid, p.create_time), snap.time, sum(known) if known else None)
            torch = self._torch.get(p.pid)
            if torch is not None:
                self.store.add(("alloc", p.pid, p.create_time), snap.time, torch.allocated_bytes)
                self.store.add(("resv", p.pid, p.create_time), snap.time, torch.reserved_bytes)

    def _growth(self, key: tuple) -> float | None:
        # The leak watch holds the same floors its alerts judge: the GROW column reads them too.
        return self._watch.recent_growth(key, GROWTH_WINDOW_S)

    def _frame(self, snap: HostSnapshot) -> Frame:
        uses = self._uses_by_pid()
        rows: list[ProcessRow] = []
        for p in snap.processes:
            rss_growth = self._growth(("rss", p.pid, p.create_time))
            common: dict[str, Any] = dict(
                pid=p.pid,
                user=p.user,
                rss_bytes=p.rss_bytes,
                cpu_percent=p.cpu_percent,
                command=p.command,
                runs_in=p.cgroup.name,
                name=p.name,
                is_python=p.is_python,
                rss_growth_bytes_per_s=rss_growth,
            )
            mine = uses.get(p.pid)
            if not mine:
                rows.append(ProcessRow(gpu=None, gpu_memory_bytes=None, **common))
                continue
            for u in sorted(mine, key=lambda u: u.device):
                growth = self._growth(("gpu", p.pid, p.create_time, u.device))
                rows.append(ProcessRow(gpu=u.device, gpu_memory_bytes=u.memory, gpu_growth_bytes_per_s=growth, **common))
        notices = self._notices(snap, uses)
        return Frame(
            time=snap.time,
            hostname=self._hostname,
            host=snap.memory,
            nvml=self._nvml_reading,
            processes=tuple(rows),
            notices=notices,
            focus=snap.detail,
            selected_pid=self._selected,
            chart=self._chart(snap),
            alerts=self._alerts,
            torch=tuple(t for pid, t in sorted(self._torch.items()) if pid in snap.visible),
        )

    def _notices(self, snap: HostSnapshot, uses: dict[int, list[GpuUse]]) -> tuple[str, ...]:
        notices: list[str] = list(self._nvml_reading.notices)
        invisible = [u for pid, us in uses.items() if pid not in snap.visible for u in us]
        # Outside a container a missing PID just exited between the two reads; inside one, NVML's
        # host PIDs are not in our namespace: say so once instead of rows of "no such process".
        if invisible and self._container:
            total = sum(u.memory or 0 for u in invisible)
            notices.append(CONTAINER_NOTICE.format(n=len({u.pid for u in invisible}), mem=format_bytes(total)))
        if self._nvml_error:
            notices.append(f"GPU data is stale: {self._nvml_error}")
        if self._host_error:
            notices.append(f"Host data is stale: {self._host_error}")
        if self.pace_s >= 1.5 * self.interval:  # small jitter is not worth a line
            notices.append(f"Refreshing every {self.pace_s:.0f} s instead of {self.interval:g} s: reads are slow")
        return tuple(notices)

    def _chart(self, snap: HostSnapshot) -> MemorySeries | None:
        if self._selected is None:
            return None
        return self.history(self._selected, CHART_WINDOW_S, now=snap.time)

    def history(self, pid: int, seconds: float, now: float | None = None) -> MemorySeries | None:
        """What was recorded of `pid`'s memory over the last `seconds` (also once it has exited)."""
        now = self._clock() if now is None else now
        starts = [k[2] for k in cast("list[tuple]", self.store.keys()) if k[0] == "rss" and k[1] == pid]
        if not starts:
            return None
        create_time = max(starts)  # the newest process to have had this PID
        t0 = now - seconds
        times, rss = self.store.window(("rss", pid, create_time), t0)
        aligned = {}
        for kind in ("gpu", "alloc", "resv"):
            ktimes, values = self.store.window((kind, pid, create_time), t0)
            by_time = dict(zip(ktimes, values))
            aligned[kind] = tuple(_none_if_nan(by_time.get(t)) for t in times) if ktimes else ()
        return MemorySeries(
            pid=pid,
            ages=tuple(now - t for t in times),
            gpu_bytes=aligned["gpu"] or (None,) * len(times),
            rss_bytes=tuple(_none_if_nan(v) for v in rss),
            allocated_bytes=aligned["alloc"],
            reserved_bytes=aligned["resv"],
            started=create_time,
        )


    def device_history(self, index: int, seconds: float, now: float | None = None) -> tuple[list[float], list[float | None]]:
        """What was recorded of device `index`'s used memory over the last `seconds`."""
        now = self._clock() if now is None else now
        times, values = self.store.window(("dev", index), now - seconds)
        return times, [_none_if_nan(v) for v in values]

    def latest_frame(self) -> tuple[Frame | None, float]:
        """The latest frame (None before the first sample) and the time it stands for."""
        snap = self._last
        frame = self._frame(snap) if snap is not None else None
        return frame, (frame.time if frame else self._clock())


def _none_if_nan(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else v
