"""Driving a service through the rounds of `gpuscope check`, and measuring each one.

What a round is:
- with a load command (`--load CMD`), one run of it: the round starts when gpuscope starts it
  (`/bin/sh -c CMD`) and its busy part ends when it exits; gpuscope then watches the quiet
  service for `settle_s` more seconds;
- without one, a fixed `round_s` seconds of the service's own work (a service that loads itself,
  a soak test), the last `settle_s` seconds of which are the quiet part.

The floor of a round is the lowest memory of its quiet part: what the round left behind, not the
temporaries of the requests in flight. Before round 1 come the warm-up rounds (driven the same
way, not judged), the last of which is round 0, the reference; without warm-up, round 0 is
`settle_s` seconds of the idle service.

Measured meanwhile, every `interval_s`: the resident memory (RSS) of the service's process tree
(the process and its descendants, re-listed every second: a server's workers count); every
`gpu_interval_s`, through NVML, its GPU memory per device. Where the service's /metrics are given,
one scrape at each end of a round gives the requests it served (the profile's request counter)
and their P95 latency over the round. In each Python process of the tree that runs gpuscope's
probe (`gpuscope run` starts it), memray tracks the allocations of the round's busy part: asked
for as long as a round may last and stopped the moment the busy part ends, so that a round slower
than the one before (as on a busy machine) is tracked to its end; those still alive at the end
are grouped by the code that made them. Before round 0, memray is started and
stopped once in each process, so that its own footprint (a few MB, once) is in every floor.

Memory stays flat across rounds: per round, a few numbers and at most SITES_PER_ROUND sites; the
samples go into the leak detector's bounded sketch (gpuscope.core.leak.LeakWatch) and nowhere else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from gpuscope import probe as _probe
from gpuscope.core.diagnosis import ladder as allocations

from gpuscope.core.diagnosis import attribution

from gpuscope.core.target import probe_client

from gpuscope.core.target import pyspy
from gpuscope.core.serving import fetch
from gpuscope.core.serving.exposition import Endpoint, Exposition
from gpuscope.core.gate.verdict import SITES_PER_ROUND, CheckRun, Memory, Round, Site
from gpuscope.core.leak import LeakThresholds, LeakWatch
from gpuscope.core.common.poller import Poller, Reading
from gpuscope.core.common.redact import redact_command, without_own_secrets
from gpuscope.core.serving.model import Signals, SourceError

if TYPE_CHECKING:
    from gpuscope.core.serving.scrape import ScrapeCollector

TREE_REFRESH_S = 1.0
MAX_TREE = 64  # processes of the tree measured (a service with more workers is measured by its first 64)
MAX_TRACKED = 8  # processes memray tracks at once
MAX_STACK_FRAMES = 8  # of the code path kept with each allocation site
TRACK_LONGEST_S = 600.0  # the longest capture a probe takes; each is stopped when its round's busy part ends
STOP_AGAIN_S = 0.25  # a capture asked to stop before it had begun is asked again this long after
TRACK_GRACE_S = 1.0  # waited, at least, for memray's answer after the quiet part
STOP_TIMEOUT_S = 10.0
READY_POLL_S = 0.2
GPU_READ_TIMEOUT_S = 5.0
PROBE_WAIT_S = 3.0  # for a service just started to show its probe
DEFAULT_ROUND_S = 10.0  # a round without a load command
LOAD_SETTLE_S = 0.25  # the quiet part after a load command: all a round's wall time gains from the check


@dataclass(frozen=True)
class Plan:
    """How to drive the rounds."""

    rounds: int
    warmup_rounds: int
    load: str | None = None  # shell command run once per round
    round_s: float = DEFAULT_ROUND_S  # a round's length without a load command
    settle_s: float = LOAD_SETTLE_S
    round_timeout_s: float = 900.0  # a load command running longer fails the check
    interval_s: float = 0.1
    gpu_interval_s: float = 0.5
    memray: bool = True
    first_round_s: float | None = None  # the expected length of the first round (from a baseline)
    thresholds: LeakThresholds = field(default_factory=LeakThresholds)

    batch: bool = False  # the command finishes: run once per round (drive_batch)

    @property
    def mode(self) -> str:
        return "batch" if self.batch else "load" if self.load else "time"

    def settings(self) -> dict:
        """What is reported and kept in a baseline (the load command redacted: it may carry a token)."""
        return {"mode": self.mode, "rounds": self.rounds, "warmup_rounds": self.warmup_rounds,
                "load": redact_command(self.load) if self.load else None,
                "round_s": None if self.load or self.batch else self.round_s,
                "settle_s": None if self.batch else self.settle_s,
                **({"retained_from_last": RETAINED_SAMPLES} if self.batch else {})}


# -- the service -------------------------------------------------------------------------------------


class Service:
    """The process a check watches."""

    pid: int

    def exited(self) -> bool:
        raise NotImplementedError

    def shell_status(self) -> int | None:
        """Its exit status as a shell shows it (128+N when killed by signal N); None while it runs
        or when it is not known (a process the check did not start)."""
        return None

    def describe_exit(self) -> str:
        raise NotImplementedError


class StartedService(Service):
    """COMMAND, started by the check in its own session (so its whole process group can be stopped)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def shell_status(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else (128 - code if code < 0 else code)

    def describe_exit(self) -> str:
        code = self.proc.returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name} (exit status {128 - code})"
        return f"exited with status {code}"

    def stop(self) -> None:
        stop_process_group(self.proc)
        probe_client.list_probes()  # removes the sockets of probes whose process died without cleaning up


class RunningService(Service):
    """A service already running (--pid): watched, never stopped; its exit status is not ours to read."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._process = psutil.Process(pid)

    def exited(self) -> bool:
        try:
            return not self._process.is_running() or self._process.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def describe_exit(self) -> str:
        return "exited"


def stop_process_group(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to the process's group, SIGKILL after `timeout`: the group is gone when this returns."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)  # what is left of the group (workers that ignored SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass  # unkillable (D state): nothing more a parent can do


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def wait_ready(service: Service, url: str, timeout: float) -> str | None:
    """Wait until `url` answers 2xx. None when it does, else why not (one line)."""
    endpoint = Endpoint.parse(url)
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        if service.exited():
            return f"the service {service.describe_exit()} before it was ready"
        try:
            answer = fetch.get(endpoint.url, where=endpoint.display,
                               headers={"Authorization": endpoint.authorization} if endpoint.authorization else None,
                               timeout=min(2.0, max(0.1, deadline - time.monotonic())), max_bytes=1 << 20)
            if answer.ok:
                return None
            last = f"{endpoint.display} answered HTTP {answer.status} {answer.reason}".rstrip()
        except fetch.FetchError as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            return f"the service was not ready within {timeout:g} s ({last})"
        time.sleep(READY_POLL_S)


# -- memory of a process tree ------------------------------------------------------------------------


class TreeMemory:
    """RSS of a process and its descendants; their GPU memory per device (through an NVML poller)."""

    def __init__(self, root: int, nvml=None, gpu_interval_s: float = 0.5) -> None:
        self.root = root
        self._pids: list[int] = [root]
        self._listed_at = 0.0
        self._nvml = nvml
        self._gpu_interval = gpu_interval_s
        self._gpu_asked = 0.0
        self._gpu_lock = threading.Lock()
        self._gpu_answered = threading.Condition(self._gpu_lock)
        self._gpu_latest: tuple[float, dict[int, int]] | None = None
        self._gpu_taken: float | None = None
        self._devices: set[int] = set()
        self.gpu_status: str | None = None
        self._poller: Poller | None = None
        if nvml is not None:
            self._poller = Poller("NVML", nvml.read, self._on_gpu, timeout=GPU_READ_TIMEOUT_S)
            self._poller.start()

    def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()
        if self._nvml is not None:
            self._nvml.close()

    def pids(self) -> list[int]:
        now = time.monotonic()
        if now - self._listed_at >= TREE_REFRESH_S:
            self._listed_at = now
            try:
                children = psutil.Process(self.root).children(recursive=True)
                self._pids = [self.root, *(c.pid for c in children)][:MAX_TREE]
            except psutil.Error:
                self._pids = [self.root]
        return self._pids

    def rss(self) -> int | None:
        values = [v for v in (allocations.rss_of(p) for p in self.pids()) if v is not None]
        return int(sum(values)) if values else None

    def gpu(self) -> dict[int, int] | None:
        """The newest GPU reading not yet taken (device -> bytes), asking for the next one when due."""
        now = time.monotonic()
        if self._poller is not None and now - self._gpu_asked >= self._gpu_interval:
            self._gpu_asked = now
            self._poller.request()
        with self._gpu_lock:
            latest = self._gpu_latest
            if latest is None or latest[0] == self._gpu_taken:
                return None
            self._gpu_taken = latest[0]
            return latest[1]

    def gpu_now(self, wait_s: float) -> dict[int, int] | None:
        """A GPU reading asked for now, waited for up to `wait_s`; None when none came by then. For
        figures paired with what happened up to now (requests served), which a reading asked an
        interval before would lag."""
        if self._poller is None:
            return None
        asked = self._gpu_asked = time.monotonic()
        self._poller.request()
        with self._gpu_answered:
            while self._gpu_latest is None or self._gpu_latest[0] < asked:
                left = asked + wait_s - time.monotonic()
                if left <= 0:
                    return None
                self._gpu_answered.wait(left)
            self._gpu_taken = self._gpu_latest[0]
            return self._gpu_latest[1]

    def _on_gpu(self, reading: Reading) -> None:
        if reading.error is not None or reading.value is None:
            self.gpu_status = reading.error
            return
        nvml = reading.value
        if nvml.status is not None:
            self.gpu_status = nvml.status
            return
        tree = set(self._pids)
        used: dict[int, int] = {}
        for use in nvml.uses:
            if use.pid in tree and use.memory is not None:
                used[use.device] = used.get(use.device, 0) + use.memory
        with self._gpu_answered:
            self._devices.update(used)
            self._gpu_latest = (time.monotonic(), {d: used.get(d, 0) for d in self._devices})
            self._gpu_answered.notify_all()


# -- one round's figures ------------------------------------------------------------------------------


class _Figures:
    """Running floor (over the quiet part) and peak of each series: a few numbers, not the samples.
    A series read more slowly than the quiet part lasts (GPU memory) has its latest value as floor
    when no reading fell in the quiet part."""

    def __init__(self) -> None:
        self.floor: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.last: dict[str, int] = {}

    def add(self, series: str, value: int, quiet: bool) -> None:
        self.peak[series] = max(value, self.peak.get(series, value))
        self.last[series] = value
        if quiet:
            self.floor[series] = min(value, self.floor.get(series, value))

    def memory(self) -> dict[str, Memory]:
        return {s: Memory(self.floor.get(s, self.last[s]), self.peak[s]) for s in self.peak}


# -- allocation sites through the probe ---------------------------------------------------------------


class Tracking:
    """memray through the probe of each Python process of the tree, for one window."""

    def __init__(self, pids: Sequence[int], seconds: float) -> None:
        self.seconds = seconds
        self._cancel = threading.Event()
        self._results: list[tuple[int, dict | None, str | None]] = []
        self._lock = threading.Lock()
        self._threads: dict[int, threading.Thread] = {}  # pid -> the thread awaiting its probe's capture
        self._stop_asked_at: float | None = None
        self.problems: list[str] = []
        for pid in pids:
            if len(self._threads) >= MAX_TRACKED:
                break
            try:
                client = probe_client.probe_for(pid)
            except probe_client.ProbeError as exc:
                self.problems.append(str(exc))
                continue
            if client is None:
                continue
            thread = self._threads[pid] = threading.Thread(target=self._track, args=(pid, client),
                                                           name=f"gpuscope-memray-{pid}", daemon=True)
            thread.start()

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def answered(self) -> bool:
        """Every probe has replied (or failed): nothing of memray's runs in the service any more."""
        return not any(t.is_alive() for t in self._threads.values())

    def answered_pids(self) -> set[int]:
        """The processes whose probe replied with a capture."""
        with self._lock:
            return {pid for pid, reply, _ in self._results if reply is not None}

    def cancel(self) -> None:
        """Stop tracking now (the probes see the hang-up and stop memray); nothing is returned."""
        self._cancel.set()

    def stop(self) -> None:
        """Ask each capture still running to end now and reply with what it has (the round's busy
        part is over). A capture that had not begun when asked is asked again, at most every
        STOP_AGAIN_S."""
        now = time.monotonic()
        if self._stop_asked_at is not None and now - self._stop_asked_at < STOP_AGAIN_S:
            return
        self._stop_asked_at = now
        for pid, thread in self._threads.items():
            if not thread.is_alive():
                continue
            try:
                client = probe_client.probe_for(pid)
                if client is not None:
                    with client:
                        client.track_stop()
            except probe_client.ProbeError:
                pass  # its capture ends at its own time

    def _track(self, pid: int, client: probe_client.ProbeClient) -> None:
        try:
            reply, problem = client.memray_track(self.seconds, limit=allocations.GROUPS, cancelled=self._cancel.is_set), None
        except probe_client.ProbeError as exc:
            reply, problem = None, str(exc)
        finally:
            client.close()
        with self._lock:
            self._results.append((pid, reply, problem))

    def finish(self, wait_s: float) -> tuple[tuple[Site, ...] | None, str | None]:
        """The sites (merged over the processes, largest first), or None and why not."""
        deadline = time.monotonic() + wait_s
        for thread in self._threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        late = any(t.is_alive() for t in self._threads.values())
        if late:
            self._cancel.set()  # the probe stops tracking when the client hangs up
            for thread in self._threads.values():
                thread.join(2.0)
        merged: dict[tuple[str, str, int], Site] = {}
        problems = list(self.problems)
        answered = 0
        with self._lock:
            results = list(self._results)
        for pid, reply, problem in results:
            if reply is None:
                problems.append(problem or "no answer")
                continue
            answered += 1
            records = allocations.group_records(reply.get("records") or (), "size")
            for s in attribution.suspects_from_records(records, pyspy.own_roots(pid)):
                stack = tuple((f.function, f.file, f.line) for f in s.stack[:MAX_STACK_FRAMES])
                site = Site(s.function, s.file, s.line, int(s.bytes or 0), int(s.count or 0), stack)
                kept = merged.get(site.key)
                merged[site.key] = site if kept is None else Site(
                    site.function, site.file, site.line, kept.bytes + site.bytes, kept.count + site.count,
                    kept.stack or site.stack)
        if late and not answered:
            return None, "allocation tracking ran past the round's end (the round was shorter than the one before)"
        if not answered:
            return None, (f"memray: {problems[0]}" if problems else
                          "no process of the service has gpuscope's probe (for a running one: "
                          "gpuscope run --inject --memray --pid PID)")
        sites = tuple(sorted(merged.values(), key=lambda s: -s.bytes)[:SITES_PER_ROUND])
        return sites, None


def prime_memray(memory: TreeMemory, tried: set[int], wait_s: float = 0.0) -> tuple[bool, list[str]]:
    """Start and stop memray once in each probed process not tried yet (adding it to `tried`),
    so that memray's own footprint predates the floors that are compared. Whether memray was
    loaded into one now, and what went wrong.

    A probe starts with its interpreter: a service just started is given `wait_s` to show one."""
    deadline = time.monotonic() + wait_s
    while not any(probe_client.probe_path(p) for p in memory.pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    fresh = [p for p in memory.pids() if p not in tried and probe_client.probe_path(p)]
    if not fresh:
        return False, []
    tracking = Tracking(fresh, 0.1)
    _, problem = tracking.finish(30.0)
    tried.update(fresh)
    return bool(tracking.answered_pids()), [problem] if problem and tracking.started else []


# -- the service's counters --------------------------------------------------------------------------


class RoundMetrics:
    """Requests and P95 latency over a round, from one scrape of each /metrics at each end.

    `collector(window_s)` makes a collector for that window; its evaluation over exactly two scrapes
    is PromQL's rate and histogram_quantile over the round."""

    def __init__(self, collector: Callable[[float], ScrapeCollector]) -> None:
        self._collector = collector
        self._readers = collector(1.0).readers()

    def read(self) -> tuple[list, str | None]:
        readings: list[tuple[float, Exposition] | None] = []
        problem: str | None = None
        for read in self._readers:
            try:
                readings.append(read())
            except SourceError as exc:
                readings.append(None)
                problem = problem or str(exc)
        return readings, problem

    def signals(self, start: list, end: list) -> tuple[Signals, float] | None:
        """The signals between two readings (PromQL over exactly that span) and the span in
        seconds; None when no target was read at both ends."""
        pairs = [(i, a, b) for i, (a, b) in enumerate(zip(start, end)) if a is not None and b is not None]
        if not pairs:
            return None
        window = max(b[0] for _, _, b in pairs) - min(a[0] for _, a, _ in pairs) + 1e-3
        collector = self._collector(window)
        for i, a, b in pairs:
            collector.record(i, a)
            collector.record(i, b)
        return collector.evaluate().signals, window

    def figures(self, start: list, end: list) -> tuple[int | None, float | None, str | None]:
        between = self.signals(start, end)
        if between is None:
            return None, None, "the service's metrics could not be read at both ends of the round"
        signals, window = between
        rate = signals.requests_per_s
        requests = round(rate * window) if rate is not None else None
        note = None if rate is not None else "the service's metrics have no request counter gpuscope knows"
        return requests, signals.e2e_latency_p95_s, note


# -- the rounds ----------------------------------------------------------------------------------------


class _ExitWatch:
    """Sleep until a child exits or a timeout passes: a pidfd where the kernel has them (Linux
    5.3+), else a plain sleep (the exit is then seen at the next sample)."""

    def __init__(self, pid: int) -> None:
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._fd = None

    def wait(self, seconds: float) -> None:
        if self._fd is None:
            time.sleep(seconds)
            return
        try:
            _probe.readable(self._fd, seconds)  # readable once the process has ended
        except (OSError, ValueError):
            time.sleep(seconds)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None



def drive(
    service: Service,
    plan: Plan,
    *,
    command: str,
    memory: TreeMemory,
    metrics: RoundMetrics | None = None,
    progress: Callable[[str], None] = lambda line: None,
    load_output: int | None = 2,
    probe_wait_s: float = 0.0,
) -> CheckRun:
    """Drive the warm-up and judged rounds; what they measured. Stops early when the service exits,
    the load command fails or runs past `round_timeout_s`; the rounds so far are kept. Whatever
    interrupts it (a signal handler's exception), no load command and no tracking is left running."""
    watch = LeakWatch(thresholds=plan.thresholds)
    rounds: list[Round] = []
    notes: list[str] = []
    stopped: str | None = None
    stopped_by: str | None = None
    exit_status: int | None = None
    tried: set[int] = set()  # processes memray was loaded into (or failed to load into)
    comparable_from = 0
    if plan.memray:
        notes += prime_memray(memory, tried, probe_wait_s)[1]
    numbers = [n for n in range(1 - plan.warmup_rounds, plan.rounds + 1)]
    if plan.warmup_rounds == 0:
        rounds.append(_idle_reference(service, plan, memory))
        if rounds[-1].completed is False:
            stopped, stopped_by = rounds[-1].note, "service"
            exit_status = service.shell_status()
            numbers = []
    # The busy part of a round (before its quiet end), which memray may track: the quiet end is
    # the floor, and it must not hold the tracker's own memory.
    expected = plan.first_round_s if plan.load else max(0.0, plan.round_s - plan.settle_s)
    for number in numbers:
        what = "warm-up round" if number <= 0 else f"round {number}/{plan.rounds}"
        if plan.memray:
            # A process whose probe showed only now (a late start, a worker forked later): memray
            # is first loaded there before this round, and earlier rounds' floors lack its memory.
            loaded, problems = prime_memray(memory, tried)
            notes += [p for p in problems if p not in notes]
            if loaded and number > comparable_from:
                comparable_from = number
                notes.append(f"memray was first loaded into a process of the service before round {number} "
                             "(its probe showed late): the growth is judged from that round on")
        progress(f"{what}: {'running the load command' if plan.load else f'watching for {plan.round_s:g} s'}…")
        done = _round(service, plan, number, expected, memory, metrics, watch, load_output)
        rounds.append(done)
        progress(f"{what}: {_summary(done)}")
        if not done.completed:
            stopped, stopped_by = done.note, ("service" if service.exited() else "load")
            exit_status = service.shell_status()
            break
        if plan.load:
            expected = max(0.0, done.duration_s - plan.settle_s)
    watch.update()
    assessments = {str(k): a for k, a in watch.assessments().items()}
    if memory.gpu_status and not any(k.startswith("gpu") for r in rounds for k in r.memory):
        notes.append(f"no GPU figures: {memory.gpu_status}")
    return CheckRun(command, plan.settings(), tuple(rounds), assessments, exit_status, stopped, stopped_by, tuple(notes),
                    comparable_from)


# What a batch run held at its end: the largest of its last samples, as the very last may fall in
# the interpreter's teardown (which frees what the job kept).
RETAINED_SAMPLES = 3


def drive_batch(
    start: Callable[[], subprocess.Popen],
    plan: Plan,
    *,
    command: str,
    memory_of: Callable[[int], TreeMemory],
    progress: Callable[[str], None] = lambda line: None,
) -> CheckRun:
    """A batch command (one that finishes) run once per round, warm-ups first: per round its peak
    memory and what it held at its end (the round's `floor`: the largest of its last
    RETAINED_SAMPLES samples, what the run kept to its end), sampled every `interval_s`. Stops at the first run that fails or runs past
    `round_timeout_s`; the runs so far are kept. Nothing started is left running."""
    rounds: list[Round] = []
    stopped = stopped_by = None
    exit_status = None
    for number in range(1 - plan.warmup_rounds, plan.rounds + 1):
        what = "warm-up run" if number <= 0 else f"run {number}/{plan.rounds}"
        progress(f"{what}: running the command…")
        proc = start()
        memory = memory_of(proc.pid)
        peak: dict[str, int] = {}
        last: dict[str, list[int]] = {}
        started = time.monotonic()
        cut = None
        try:
            while proc.poll() is None:
                if time.monotonic() - started > plan.round_timeout_s:
                    cut = f"the command ran past the round timeout ({plan.round_timeout_s:g} s) in {what}"
                    break
                rss = memory.rss()
                readings = {"rss": rss} if rss is not None else {}
                readings.update({f"gpu{d}": used for d, used in (memory.gpu() or {}).items()})
                for series, value in readings.items():
                    peak[series] = max(value, peak.get(series, value))
                    last[series] = [*last.get(series, [])[1 - RETAINED_SAMPLES:], value]
                time.sleep(plan.interval_s)
        finally:
            if proc.poll() is None:
                stop_process_group(proc, timeout=2.0)
            memory.close()
        code = proc.returncode
        status = 128 - code if code is not None and code < 0 else code
        if cut is None and status != 0:
            cut = f"the command exited with status {status} in {what}"
        done = Round(number, number <= 0, time.monotonic() - started,
                     {s: Memory(max(last[s]), peak[s]) for s in peak}, load_exit=status, completed=cut is None, note=cut)
        rounds.append(done)
        peaks = ", ".join(f"{'RSS' if s == 'rss' else 'GPU ' + s[3:]} peak {m.peak / 2**20:.1f} MiB"
                          for s, m in sorted(done.memory.items()) if m.peak is not None)
        progress(f"{what}: {cut or peaks or 'no memory read'} ({done.duration_s:.1f} s)")
        if cut is not None:
            stopped, stopped_by, exit_status = cut, "service", status
            break
    return CheckRun(command, plan.settings(), tuple(rounds), {}, exit_status, stopped, stopped_by)


def _summary(r: Round) -> str:
    if not r.completed:
        return r.note or "cut short"
    floor = r.floor("rss")
    parts = [f"RSS floor {floor / 2**20:.1f} MiB" if floor is not None else "RSS floor N/A"]
    parts += [f"GPU {s[3:]} floor {m.floor / 2**20:.1f} MiB" for s, m in sorted(r.memory.items())
              if s.startswith("gpu") and m.floor is not None]
    if r.requests is not None:
        parts.append(f"{r.requests} requests")
    return ", ".join(parts) + f" ({r.duration_s:.1f} s)"


def _sample(memory: TreeMemory, figures: _Figures, watch: LeakWatch | None, quiet: bool) -> None:
    now = time.monotonic()
    rss = memory.rss()
    if rss is not None:
        figures.add("rss", rss, quiet)
        if watch is not None:
            watch.add("rss", now, rss)
    gpu = memory.gpu()
    for device, used in (gpu or {}).items():
        figures.add(f"gpu{device}", used, quiet)
        if watch is not None:
            watch.add(f"gpu{device}", now, used)


def _idle_reference(service: Service, plan: Plan, memory: TreeMemory) -> Round:
    """Round 0 without warm-up: the idle service's floor over `settle_s`."""
    figures = _Figures()
    started = time.monotonic()
    while time.monotonic() - started < plan.settle_s:
        if service.exited():
            return Round(0, True, time.monotonic() - started, figures.memory(), completed=False,
                         note=f"the service {service.describe_exit()} before round 1")
        _sample(memory, figures, None, True)
        time.sleep(plan.interval_s)
    return Round(0, True, time.monotonic() - started, figures.memory())


def _round(service: Service, plan: Plan, number: int, expected: float | None, memory: TreeMemory,
           metrics: RoundMetrics | None, watch: LeakWatch, load_output: int | None) -> Round:
    figures = _Figures()
    judged = watch if number > 0 else None
    notes: list[str] = []
    start_readings = None
    if metrics is not None:
        start_readings, problem = metrics.read()
        if problem:
            notes.append(problem)
    started = time.monotonic()
    tracking = (Tracking(memory.pids(), min(plan.round_timeout_s, TRACK_LONGEST_S)) if plan.memray and expected
                else None)
    load: subprocess.Popen | None = None
    load_exit: int | None = None
    exited: _ExitWatch | None = None
    cut: str | None = None
    last_update = started
    try:
        if plan.load:
            load = subprocess.Popen(["/bin/sh", "-c", plan.load], stdin=subprocess.DEVNULL, stdout=load_output,
                                    stderr=load_output, start_new_session=True, env=without_own_secrets(os.environ))
            exited = _ExitWatch(load.pid)
        busy_until = None if plan.load else started + plan.round_s - plan.settle_s
        quiet_until: float | None = None
        while True:
            now = time.monotonic()
            if service.exited():
                cut = f"the service {service.describe_exit()} during round {number}"
                break
            if quiet_until is None:
                # The quiet part begins once memray has answered too: it reads its capture inside
                # the service first, and the floor must not hold the tracker's own memory.
                answered = tracking is None or tracking.answered() or now - started > plan.round_timeout_s
                busy_over = False
                if load is not None and load.poll() is not None:
                    load_exit = load.returncode
                    if load_exit != 0:
                        cut = f"the load command exited with status {load_exit} in round {number}"
                        break
                    busy_over = True
                elif busy_until is not None and now >= busy_until:
                    busy_over = True
                elif now - started > plan.round_timeout_s:
                    cut = f"the load command ran past the round timeout ({plan.round_timeout_s:g} s) in round {number}"
                    break
                if busy_over and answered:
                    quiet_until = now + plan.settle_s
                elif busy_over and tracking is not None:
                    tracking.stop()
            if quiet_until is not None and now >= quiet_until:
                break
            _sample(memory, figures, judged, quiet_until is not None)
            if judged is not None and now - last_update >= 1.0:
                judged.update()  # the detector confirms a young leak over successive updates
                last_update = now
            pause = max(0.0, min(plan.interval_s, (quiet_until or busy_until or now + plan.interval_s) - now))
            if exited is not None and quiet_until is None:
                exited.wait(pause)  # the quiet part starts the moment the load command exits
            else:
                time.sleep(pause)
    except BaseException:
        if tracking is not None:
            tracking.cancel()
        raise
    finally:
        if exited is not None:
            exited.close()
        if load is not None and load.poll() is None:
            stop_process_group(load, timeout=2.0)
            if load_exit is None:
                load_exit = load.returncode
    duration = time.monotonic() - started
    sites, why = None, None
    if tracking is not None:
        sites, why = tracking.finish(TRACK_GRACE_S if cut else max(TRACK_GRACE_S, 0.2 * duration))
    elif plan.memray:
        why = "allocations were not tracked in this round: its length was not known yet"
    requests = p95 = None
    if metrics is not None and start_readings is not None and cut is None:
        end_readings, problem = metrics.read()
        if problem:
            notes.append(problem)
        requests, p95, missing = metrics.figures(start_readings, end_readings)
        if missing and not problem:
            notes.append(missing)
    if why:
        notes.append(why)
    note = cut or ("; ".join(dict.fromkeys(notes)) if notes else None)
    return Round(number, number <= 0, duration, figures.memory(), requests, p95,
                 load_exit if plan.load else None, sites, cut is None, note)
