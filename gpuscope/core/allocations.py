"""Where memory that stays was allocated: the attribution ladder.

Stack sampling shows where time goes, not where memory is allocated: a fast function that leaks is
almost never on a sampled stack. So attribution climbs a ladder and says which rung it stood on:

1. torch allocator history  — through the gpuscope probe inside the process (`gpuscope.probe`),
   when torch there has initialised CUDA: record the allocator's stacks of live blocks, snapshot at
   the start and at the end, and group the CUDA blocks allocated meanwhile and still alive by the
   innermost frame of the program's own code;
2. memray                    — the allocations made during a bounded time and still alive at the
   end, grouped the same way: in process through the probe (no injection needed; what each site
   held is read over time, and gpuscope's own memray is brought in when the service's
   environment has none and the interpreter can load it), else through `memray attach`;
3. tracemalloc              — the standard library's tracker, through the probe: nothing to install
   in the service, but it sees only Python-domain allocations (not memory C/C++/Rust code
   allocates itself: a FAISS index, a tokenizer's buffers);
4. stack sampling           — py-spy samples weighted by the memory growth in each interval
   (low confidence: a ranked list of suspects, not a verdict; a torn dump is skipped and counted).

The allocation trackers are instruments inside the service: they slow it and take memory of
their own. Each reports the service's RSS before, while and after tracking (`Attribution.cost`)
and when it tracked (`Attribution.window`), so that the diagnosis judges the memory trend on the
samples taken outside that window; the tracker's state is freed and returned to the system after.

Attaching memray runs code inside the target (through gdb before Python 3.14). On some machines
that kills the target (gdb 13 cannot restore registers on CPUs with AMX state; the interrupted
system call then fails in the target), so gpuscope first tries the same injection on a throwaway
process of the same interpreter and refuses to touch the real one if the throwaway is harmed. A
process with a probe needs none of that: it runs memray's tracker itself when asked.

gpuscope usually runs as root, and the target's interpreter, environment and files belong to its
owner: the checks that run them (is memray importable there, which Python is it, the throwaway
process) run as that owner (`gpuscope.core.privilege`; the checks live in `gpuscope.core.target`), gdb reads no init file and auto-loads
nothing from the target's files, and the capture memray writes goes into a folder of the
owner's inside a private one of gpuscope's, read only as a regular file of the owner's.
`memray attach` runs gpuscope's own memray, whose gdb also reads no init file (so gdb's
auto-load safe-path stays the system's folders).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from gpuscope.core import privilege, probe_client, pyspy
from gpuscope.core.printable import printable_line
from gpuscope.core.attribution import (
    Attribution,
    Rung,
    Site,
    counted_suspects_from_capture,
    sites_from_records,
    suspects_from_records,
    suspects_from_stacks,
)
from gpuscope.core.leak import Settled, tracking_settled
from gpuscope.core.stacks import StackDump, StackFrame, Suspect
from gpuscope.core.target import Interpreter, injection_problem, python_version, run_python, target_interpreter
from gpuscope.errors import GpuscopeError

MEMRAY_MIN_PYTHON_FOR_REMOTE_EXEC = (3, 14)
ATTACH_TIMEOUT_S = 60.0


class AttachRefused(GpuscopeError):
    """memray will not be attached; the message says why and what to do instead."""


# -- can memray be attached to this process, safely? -----------------------------------------------


def memray_importable(interpreter: Interpreter) -> bool:
    out = run_python(interpreter, "import memray", 30)
    return out is not None and out.returncode == 0


def check_attach(pid: int) -> Interpreter:
    """Everything that must hold before memray touches `pid`. Raises AttachRefused."""
    try:
        interpreter = target_interpreter(pid)
    except psutil.NoSuchProcess:
        raise AttachRefused(f"process {pid} exited") from None
    except psutil.AccessDenied:
        raise AttachRefused(f"not permitted to read process {pid}: {pyspy.PERMISSION_HELP}") from None
    except privilege.NotPermitted as exc:
        raise AttachRefused(str(exc)) from None
    if not memray_importable(interpreter):
        raise AttachRefused(
            f"memray is not importable by the service's interpreter ({printable_line(interpreter.path)}): "
            "install it into the service's environment (pip install memray, or install gpuscope there), then try again"
        )
    version = python_version(interpreter)
    if version is None or version < MEMRAY_MIN_PYTHON_FOR_REMOTE_EXEC:
        problem = injection_problem(interpreter)
        if problem:
            raise AttachRefused(f"memray will not be attached: {problem}")
    return interpreter


# -- the memray rung ---------------------------------------------------------------------------------

MEMRAY_WINDOW_MAX_S = 30  # memray attach tracks at most this long: it stops by itself even if gpuscope is killed
CAPTURE_LIMIT = 1 << 30  # bytes: a larger capture is not read


def memray_cli() -> list[str]:
    """gpuscope's own memray (run in "/", so that nothing in the caller's folder is imported)."""
    return [sys.executable, "-m", "memray"]


def memray_suspects(
    pid: int, duration: float, *, cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float, int | None], None] = lambda fraction, sites: None,
) -> tuple[Suspect, ...]:
    """Attach memray for `duration` seconds (at most MEMRAY_WINDOW_MAX_S); the allocations still
    alive at the end, by owning frame. `progress(fraction, sites)` as `probe_memray_suspects`'s.

    Tracking is always detached: memray stops by itself after the window (also when gpuscope is
    killed meanwhile); on a timeout, an error or a cancel, `memray detach` is run before returning.
    The process writes its capture into a folder of its owner's inside a private one of
    gpuscope's (`privilege.SharedFolder`), removed afterwards.
    """
    interpreter = check_attach(pid)
    window = min(MEMRAY_WINDOW_MAX_S, max(1, round(duration)))
    roots = pyspy.own_roots(pid)
    with privilege.SharedFolder("memray", interpreter.owner) as folder:
        folder.hand_over()
        capture = os.path.join(folder.shared, "capture.bin")
        attached = False
        try:
            attach = ["attach", "--aggregate", "-f", "-o", capture, "--duration", str(window), str(pid)]
            out = privilege.run_as(None, memray_cli() + attach, timeout=ATTACH_TIMEOUT_S)
            if out is None or out.returncode != 0:
                last = ((out.stderr or out.stdout).strip().splitlines()[-1:] if out else []) or ["no answer"]
                raise AttachRefused(f"memray could not attach to process {pid}: {printable_line(last[0])}")
            attached = True
            waiting = _while_waiting(window, cancelled, progress)
            deadline = time.monotonic() + window + 30.0
            while time.monotonic() < deadline:
                if waiting():
                    raise AttachRefused("cancelled")
                if not psutil.pid_exists(pid):
                    raise AttachRefused(f"process {pid} exited while memray was attached")
                if time.monotonic() > deadline - 30.0:
                    read = _read_capture_counted(folder, roots)
                    if read is not None:
                        attached = False  # memray stopped itself after the window
                        found, seen = read
                        progress(1.0, seen)
                        return found
                time.sleep(0.2)
            raise AttachRefused(f"memray's capture of process {pid} did not complete in time")
        finally:
            if attached and psutil.pid_exists(pid):
                privilege.run_as(None, memray_cli() + ["detach", str(pid)], timeout=30)


def _read_capture(folder: privilege.SharedFolder, roots: Sequence[str]) -> tuple[Suspect, ...] | None:
    """The suspects of the capture the process wrote, or None while it is not complete."""
    read = _read_capture_counted(folder, roots)
    return None if read is None else read[0]


def _read_capture_counted(folder: privilege.SharedFolder, roots: Sequence[str]) -> tuple[tuple[Suspect, ...], int] | None:
    """The suspects of the capture the process wrote and how many allocation stacks still alive it
    holds, or None while it is not complete (an aggregated capture is written when tracking stops;
    until then it does not open). Read only as a regular file of the process's owner, never
    through a link (AttachRefused otherwise)."""
    try:
        opened = folder.read_owned("capture.bin", CAPTURE_LIMIT)
    except OSError as exc:
        raise AttachRefused(str(exc)) from None
    if opened is None:
        return None
    fd, _ = opened
    try:
        return counted_suspects_from_capture(f"/proc/self/fd/{fd}", roots)
    except OSError:
        return None
    finally:
        os.close(fd)


# -- through the probe inside the process ----------------------------------------------------------

HISTORY_MAX_ENTRIES = 100_000  # bounded: with enabled="state" torch keeps stacks of live blocks only
GROUPS = 200  # stacks asked of the probe (largest first)


def _wait(duration: float, cancelled: Callable[[], bool], progress: Callable[[float], None]) -> bool:
    """Wait `duration` seconds unless cancelled (False then), reporting progress."""
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        if cancelled():
            return False
        if elapsed >= duration:
            progress(1.0)
            return True
        progress(elapsed / duration if duration else 1.0)
        time.sleep(min(0.1, duration - elapsed))


def _records(groups: Sequence[dict], size_key: str) -> list[tuple[tuple, int, int]]:
    out = []
    for g in groups:
        frames = tuple(tuple(f) for f in g.get("frames") or () if isinstance(f, (list, tuple)) and len(f) == 3)
        out.append((frames, int(g.get(size_key) or 0), int(g.get("count") or 0)))
    return out


def torch_unavailable(hello: dict) -> str | None:
    """Why the torch-history rung cannot run in the process that said `hello` (None: it can)."""
    if not hello.get("torch"):
        return "torch is not imported in the process"
    if not (hello.get("cuda") or {}).get("initialized"):
        return "CUDA not available in the process (torch has not initialised CUDA)"
    return None


def torch_history_suspects(
    client: probe_client.ProbeClient,
    pid: int,
    duration: float,
    *,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float], None] = lambda fraction: None,
) -> tuple[Suspect, ...]:
    """CUDA blocks allocated during `duration` and still alive at the end, by owning frame.

    Recording is started (live blocks' Python stacks only, bounded) and always stopped again; the
    first snapshot is taken once recording is on, so blocks alive before are in both and drop out
    of the diff."""
    client.history_start(max_entries=HISTORY_MAX_ENTRIES)
    try:
        first = client.snapshot(limit=0)
        if not _wait(duration, cancelled, progress):
            raise AttachRefused("cancelled")
        last = client.snapshot(limit=0)
        diff = client.diff(before=first["id"], after=last["id"], limit=GROUPS)
    finally:
        try:
            client.history_stop()
        except probe_client.ProbeError:
            pass
    return suspects_from_records(_records(diff.get("groups") or (), "bytes"), pyspy.own_roots(pid), "torch-history")


HELD_INTERVAL_S = 1.0  # how often a tracker's held bytes per site are read
# What tracking costs the service, as benchmarks/diagnosis_cost.py measured it on an
# allocation-heavy service (shown where the operator is asked before anything runs inside it).
TRACKING_COST = ("expected cost: the service runs up to ~10% slower while it is tracked (memray or "
                 "tracemalloc; stack sampling takes ~20% of a small machine's CPU instead), and keeps "
                 "~12 MB after (memray's code, once loaded, stays; glibc may also keep more of the heap it frees)")


@dataclass(frozen=True, slots=True)
class Tracked:
    """What one tracking rung found: suspects, held bytes per site over time, and its cost."""

    suspects: tuple[Suspect, ...]
    times: tuple[float, ...]
    sites: tuple[Site, ...]
    cost: dict
    seen: int = 0  # allocation stacks the tracker reported (those left out of its reply included)


PROBE_FILE = os.sep + os.path.join("gpuscope", "probe.py")


def _probes_own(group: dict) -> bool:
    """Whether a tracker's record is the probe's own work (its reply, its socket): a stack that
    passes through the probe's file, which runs no code of the service's."""
    frames = group.get("frames") or ()
    return any(isinstance(f, (list, tuple)) and len(f) == 3 and str(f[1]).endswith(PROBE_FILE) for f in frames)


def _grown(group: dict) -> dict | None:
    """`group` with its size replaced by the least it held over the last quarter of tracking above
    the most it held in the first half (None where that is not more): memory a site still adds to,
    not the working set it keeps (which comes and goes: a query's array alive during each call)."""
    held = [int(h or 0) for h in group.get("held") or () if isinstance(h, (int, float))]
    if len(held) < 4 or len(held) != len(group.get("held") or ()):
        return None
    growth = min(held[-max(2, len(held) // 4):]) - max(held[: len(held) // 2])
    return {**group, "size": growth} if growth > 0 else None


def _tracked(reply: dict, pid: int, method: str, sees: str, *, growing: bool = False,
             planned: float | None = None, early: EarlyStop | None = None) -> Tracked:
    roots = pyspy.own_roots(pid)
    groups = [g for g in reply.get("records") or () if isinstance(g, dict) and not _probes_own(g)]
    times = tuple(float(t) for t in reply.get("times") or ())
    reported = reply.get("rss")
    rss = reported if isinstance(reported, dict) else {}
    cost = {"rss_before": rss.get("before"), "rss_tracking": rss.get("tracking"), "rss_after": rss.get("after"),
            "seconds": reply.get("seconds"), "from": reply.get("from") or "the standard library", "sees": sees,
            "cut_short": bool(reply.get("cut_short")), "planned_s": planned}
    if reply.get("stopped_early") and early is not None and early.settled is not None:
        cost["stopped"] = early.settled.reason
    if growing:
        live = [g for g in map(_grown, groups) if g is not None]
    else:
        live = [g for g in groups if int(g.get("size") or 0) > 0]
    seen = len(groups) + max(0, int(reply.get("omitted") or 0))
    return Tracked(suspects_from_records(_records(live, "size"), roots, method),
                   times, sites_from_records(groups, times, roots) if times else (), cost, seen)


def own_memray_path() -> str | None:
    """The folder gpuscope's own memray is imported from (None: gpuscope has none)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("memray")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))


def _while_waiting(duration: float, cancelled: Callable[[], bool],
                   progress: Callable[[float, int | None], None],
                   early: EarlyStop | None = None) -> Callable[[], bool]:
    """`cancelled`, also reporting how much of `duration` has passed each time it is asked (a
    request to the probe asks it several times a second while it waits for the reply), and
    letting `early` look at the capture's progress."""
    started = time.monotonic()

    def asked() -> bool:
        progress(min(0.99, (time.monotonic() - started) / duration) if duration > 0 else 0.99, None)
        if early is not None:
            early.poll()
        return cancelled()

    return asked


class EarlyStop:
    """Watches a capture running in the process through a second connection to its probe, once a
    second, and asks it to stop once what it has seen is clear (`leak.tracking_settled`): the
    time saved goes to watching the process with nothing inside it. Anything unexpected ends the
    watching, never the capture (it then runs its full time)."""

    def __init__(self, client: probe_client.ProbeClient, every: float = HELD_INTERVAL_S) -> None:
        self.path, self.pid, self.every = client.path, client.pid, every
        self.side: probe_client.ProbeClient | None = None
        self.next_at = time.monotonic() + every
        self.settled: Settled | None = None
        self.done = False

    def poll(self) -> None:
        if self.done or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every
        try:
            if self.side is None:
                self.side = probe_client.ProbeClient(self.path, pid=self.pid, timeout=5.0)
            settled = settled_of(self.side.track_progress())
            if settled is not None:
                self.settled = settled
                self.side.track_stop()
                self.done = True
        except (probe_client.ProbeError, OSError):
            self.done = True

    def close(self) -> None:
        if self.side is not None:
            self.side.close()


def _numbers(values: object, n: int) -> list[float | None] | None:
    if not isinstance(values, list) or len(values) != n:
        return None
    return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in values]


def settled_of(progress: dict) -> Settled | None:
    """`tracking_settled` over a probe's `track_progress` reply (the process's data: checked)."""
    raw_times = progress.get("times")
    times = _numbers(raw_times, len(raw_times)) if isinstance(raw_times, list) else None
    if not progress.get("tracking") or not times or any(t is None for t in times):
        return None
    n = len(times)
    sites = []
    for site in progress.get("sites") or ():
        held = _numbers(site.get("held"), n) if isinstance(site, dict) else None
        if held is not None:
            sites.append(("a site's held bytes", held))
    totals = [(name, held) for name, key in (("the heap in use", "heap"), ("the RSS", "rss"))
              if (held := _numbers(progress.get(key), n)) is not None and any(v is not None for v in held)]
    return tracking_settled([t for t in times if t is not None], sites[:10], totals)


def probe_memray_suspects(
    client: probe_client.ProbeClient, pid: int, duration: float, *, hello: dict | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float, int | None], None] = lambda fraction, sites: None,
    settle: bool = False,
) -> Tracked:
    """memray's tracker run by the probe inside the process for `duration`, held bytes read every
    second: no injection. When the service's environment has no memray and its interpreter is
    gpuscope's version, gpuscope's own memray is offered (the probe loads it only if it can).

    `progress(fraction, sites)`: the part of the window passed while memray tracks (sites None:
    the probe reads its capture when tracking ends), then (1.0, allocation sites seen) once read.
    `settle`: stop tracking as soon as its trend is clear (`EarlyStop`)."""
    path = None
    if hello is not None and not hello.get("memray"):
        ours = "%d.%d" % sys.version_info[:2]
        if str(hello.get("python") or "").startswith(ours + "."):
            path = own_memray_path()
    duration = max(0.1, duration)
    early = EarlyStop(client) if settle else None
    try:
        reply = client.memray_track(duration, limit=GROUPS, interval=HELD_INTERVAL_S, memray_path=path,
                                    cancelled=_while_waiting(duration, cancelled, progress, early))
    finally:
        if early is not None:
            early.close()
    tracked = _tracked(reply, pid, "memray", "every allocation of Python and native code made through malloc",
                       planned=duration, early=early)
    progress(1.0, tracked.seen)
    return tracked


def probe_tracemalloc_suspects(
    client: probe_client.ProbeClient, pid: int, duration: float, *, cancelled: Callable[[], bool] = lambda: False,
    settle: bool = False,
) -> Tracked:
    """The standard library's tracemalloc, run by the probe for `duration`, a snapshot every second.

    Its suspects are the sites whose held memory still grew over the second half of tracking,
    ranked by that growth: tracemalloc sees only the Python domain, so where a service's memory
    grows in native code (a FAISS index) what it sees at the end is the working set of Python
    objects (the current query), which must not be named as the leak."""
    duration = max(0.1, duration)
    early = EarlyStop(client) if settle else None
    try:
        reply = client.tracemalloc_track(duration, interval=HELD_INTERVAL_S, limit=GROUPS,
                                         cancelled=_while_waiting(duration, cancelled, lambda f, n: None, early))
    finally:
        if early is not None:
            early.close()
    return _tracked(reply, pid, "tracemalloc", TRACEMALLOC_SEES, growing=True, planned=duration, early=early)


TRACEMALLOC_SEES = ("Python-domain allocations only: memory that C, C++ or Rust code allocates itself "
                    "(a FAISS index, a tokenizer's buffers) is not seen")


# -- the stack-sampling rung ------------------------------------------------------------------------


def rss_of(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        try:
            return float(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None


@dataclass(frozen=True, slots=True)
class SamplingCount:
    """How many py-spy dumps the sampling rung took, how many of them failed (torn), and in how
    many memory had grown while no thread was running (no stack to weigh)."""

    taken: int
    failed: int
    last_error: str = ""
    grew_idle: int = 0


def sample_growth(
    pid: int,
    duration: float,
    *,
    interval: float = 0.2,
    memory: Callable[[int], float | None] = rss_of,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float], None] = lambda fraction: None,
) -> tuple[tuple[Suspect, ...], SamplingCount]:
    """py-spy dumps taken while memory grows, each stack weighted by the growth since the last look,
    and how many dumps failed.

    Low confidence by nature: a function that allocates quickly and returns is rarely caught on a
    stack, so this ranks where the process was *while* memory grew, not what allocated it. A dump
    that fails (a torn stack: py-spy read a thread while it changed) is skipped and counted; the
    rung fails (PySpyError) only when the process is gone or refuses us, or when most dumps failed."""
    roots = pyspy.own_roots(pid)
    weighted: list[tuple[tuple[StackFrame, ...], float, int]] = []
    before = memory(pid)
    started = time.monotonic()
    taken = failed = grew_idle = 0
    last_error = ""
    while time.monotonic() - started < duration and not cancelled():
        tick = time.monotonic()
        taken += 1
        try:
            dump: StackDump = pyspy.dump(pid, nonblocking=True, roots=roots)
        except pyspy.PySpyError as exc:
            if pyspy.exited(pid) or "not permitted" in str(exc) or "not a Python" in str(exc):
                raise
            failed += 1
            last_error = str(exc)
            time.sleep(max(0.0, interval - (time.monotonic() - tick)))
            continue
        now = memory(pid)
        growth = (now - before) if now is not None and before is not None else 0.0
        before = now
        stacks = [t.frames for t in dump.threads if t.active or t.owns_gil]
        if growth > 0 and stacks:
            for frames in stacks:
                weighted.append((frames, growth / len(stacks), 1))
        elif growth > 0:
            grew_idle += 1
        progress(min(1.0, (time.monotonic() - started) / duration))
        time.sleep(max(0.0, interval - (time.monotonic() - tick)))
    count = SamplingCount(taken, failed, last_error, grew_idle)
    if taken and failed * 2 > taken:
        raise pyspy.PySpyError(f"{failed} of {taken} stack dumps of process {pid} failed (last: {last_error})")
    return suspects_from_stacks(weighted, "stack-sampling", known_bytes=False), count


# -- the ladder --------------------------------------------------------------------------------------


def _connect(pid: int) -> tuple[probe_client.ProbeClient | None, dict | None, str]:
    """The probe of `pid`, what it said hello with, or why there is none."""
    try:
        client = probe_client.probe_for(pid)
    except probe_client.ProbeError as exc:
        return None, None, str(exc)
    if client is None:
        return None, None, (
            "no gpuscope probe in the process (start one with gpuscope.probe.start(), "
            "'gpuscope run -- <command>', or 'gpuscope run --inject --pid PID')"
        )
    try:
        return client, client.hello(), ""
    except probe_client.ProbeError as exc:
        client.close()
        return None, None, f"the process's probe did not answer: {exc}"


def attribute(
    pid: int,
    duration: float,
    *,
    use_memray: bool = True,
    memory: Callable[[int], float | None] = rss_of,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[str, float], None] = lambda rung, fraction: None,
    budget: float | None = None,
    said: Callable[[str], None] = lambda line: None,
    sites_seen: Callable[[str, int], None] = lambda rung, sites: None,
    settle: bool = True,
) -> Attribution:
    """Climb the ladder for `pid` until a rung names suspects; record what each rung did.

    A tracking rung tracks for `duration` seconds; the whole climb keeps within `budget` seconds
    (default: `duration`) plus the time to start and stop a tracker: a rung that fails hands the
    rest of the budget, not a fresh one, to the next. `said` gets one line per rung that fails.
    `progress(rung, fraction)` says how far each rung is (memray's too, while it tracks);
    `sites_seen(rung, sites)` how many allocation sites a tracker has seen so far, once it has read
    its capture (memray reads it when tracking ends). `settle`: a tracker in the probe stops as
    soon as what it sees is clear (`EarlyStop`), not at the end of its time."""
    started = time.monotonic()
    deadline = started + (duration if budget is None else max(budget, 0.0))
    opened: list[probe_client.ProbeClient] = []
    try:
        return _climb(pid, duration, deadline, opened, use_memray, memory, cancelled, progress, said, sites_seen,
                      started, settle)
    finally:
        for client in opened:
            client.close()


def _climb(pid, duration, deadline, opened, use_memray, memory, cancelled, progress, said, sites_seen,
           started, settle) -> Attribution:
    def connect():
        client, hello, why_not = _connect(pid)
        if client is not None:
            opened.append(client)
        return client, hello, why_not

    ran: list[tuple[float, float]] = []  # when trackers ran inside the process (also those that found nothing)
    costs: list[dict] = []

    def done(found: tuple[Suspect, ...], method: str | None, confidence: str, tracked: Tracked | None = None,
             window: tuple[float, float] | None = None) -> Attribution:
        if window is not None and window not in ran:
            ran.append(window)
        span = (min(w[0] for w in ran), max(w[1] for w in ran)) if ran else None
        cost = tracked.cost if tracked else (costs[-1] if costs else {})
        return Attribution(pid, found, tuple(rungs), method, confidence, time.monotonic() - started,
                           times=tracked.times if tracked else (), sites=tracked.sites if tracked else (),
                           window=span, cost=cost)

    def failed(method: str, detail: str) -> None:
        rungs.append(Rung(method, "failed", detail))
        said(f"{method}: {detail}")

    def left() -> float:
        return deadline - time.monotonic()

    def tracking_left() -> float:  # the tracking rungs share `duration` seconds between them
        return min(started + duration, deadline) - time.monotonic()

    rungs: list[Rung] = []
    held_over_time: Tracked | None = None  # a tracker's sites over time, kept when a later rung names the suspects
    client, hello, why_not = connect()
    # 1. torch allocator history, through the probe
    reason = why_not if client is None else torch_unavailable(hello or {})
    if reason:
        rungs.append(Rung("torch-history", "skipped", reason))
    else:
        progress("torch-history", 0.0)
        try:
            found = torch_history_suspects(
                client, pid, min(duration, max(0.1, left())), cancelled=cancelled,
                progress=lambda f: progress("torch-history", f)
            )
        except (probe_client.ProbeError, AttachRefused) as exc:
            failed("torch-history", str(exc))
            if not cancelled():
                client, hello, why_not = connect()  # a failed request may have closed the connection
        except Exception as exc:  # a surprise in the probe's reply must not end the diagnosis
            failed("torch-history", f"{type(exc).__name__}: {exc}")
        else:
            if found:
                rungs.append(Rung("torch-history", "used", f"{len(found)} allocation sites of CUDA memory still held"))
                return done(found, "torch-history", "high")
            rungs.append(Rung("torch-history", "failed", "no CUDA memory allocated while recording is still held"))
    if cancelled():
        return done((), None, "none")
    # 2. memray: in process through the probe, else `memray attach`
    if use_memray:
        progress("memray", 0.0)
        way = "in process through gpuscope's probe" if client is not None else "memray attach"
        begun = time.time()

        def memray_progress(fraction: float, sites: int | None) -> None:
            progress("memray", fraction)
            if sites is not None:
                sites_seen("memray", sites)

        try:
            if client is not None:
                tracked = probe_memray_suspects(client, pid, min(duration, max(0.1, left())), hello=hello,
                                                cancelled=cancelled, progress=memray_progress, settle=settle)
            else:
                found = memray_suspects(pid, min(duration, max(1.0, left())), cancelled=cancelled,
                                        progress=memray_progress)
                tracked = Tracked(found, (), (), {"sees": "allocations made through malloc while attached"})
        except (AttachRefused, probe_client.ProbeError) as exc:
            failed("memray", f"{way}: {exc}" if client is not None else str(exc))
            if client is not None and not cancelled():
                client, hello, why_not = connect()
        except Exception as exc:  # a memray or file-format surprise must not end the diagnosis
            failed("memray", f"{way}: {type(exc).__name__}: {exc}")
        else:
            window = (begun, time.time())
            came = tracked.cost.get("from")
            cut = ("; its capture reached its size cap, so tracking stopped early (allocations after that were not kept)"
                   if tracked.cost.get("cut_short") else "")
            if tracked.suspects:
                also = f" (memray from {came})" if came and came != "the service's environment" else ""
                rungs.append(Rung("memray", "used", f"{way}: {len(tracked.suspects)} allocation sites still holding "
                                  f"memory{also}; sees {tracked.cost.get('sees')}{cut}"))
                return done(tracked.suspects, "memray", "high", tracked, window)
            settled = f"; stopped early: {tracked.cost['stopped']}" if tracked.cost.get("stopped") else ""
            rungs.append(Rung("memray", "failed",
                              f"{way}: no allocation made while tracking is still alive{cut}{settled}"))
            ran.append(window)
            costs.append(tracked.cost)
            # Nothing held at the end, but what was held over time is evidence; and where memray
            # stopped because nothing grew, tracemalloc (which sees less) would only spend the time saved.
            if tracked.sites or settled:
                return done((), None, "none", tracked, window)
    else:
        rungs.append(Rung("memray", "skipped", "not requested (it runs code inside the process)"))
    if cancelled():
        return done((), None, "none")
    # 3. tracemalloc, through the probe: the standard library, nothing installed in the service
    if not use_memray:
        rungs.append(Rung("tracemalloc", "skipped", "not requested (it runs code inside the process)"))
    elif client is None:
        rungs.append(Rung("tracemalloc", "skipped", why_not))
    elif tracking_left() < 3.0:
        rungs.append(Rung("tracemalloc", "skipped", "no tracking time left in --duration"))
    else:
        progress("tracemalloc", 0.0)
        begun = time.time()
        try:
            tracked = probe_tracemalloc_suspects(client, pid, tracking_left(), cancelled=cancelled, settle=settle)
        except probe_client.ProbeError as exc:
            failed("tracemalloc", f"in process through gpuscope's probe: {exc}")
        except Exception as exc:
            failed("tracemalloc", f"in process through gpuscope's probe: {type(exc).__name__}: {exc}")
        else:
            window = (begun, time.time())
            if tracked.suspects:
                rungs.append(Rung("tracemalloc", "used",
                                  f"in process through gpuscope's probe: {len(tracked.suspects)} allocation sites "
                                  f"whose memory grew while tracing; sees {TRACEMALLOC_SEES}"))
                return done(tracked.suspects, "tracemalloc", "medium", tracked, window)
            ran.append(window)
            costs.append(tracked.cost)
            if tracked.sites:
                held_over_time = tracked  # no suspect, but what was held over time is evidence
            failed("tracemalloc", "no Python allocation site grew while tracing "
                   f"({TRACEMALLOC_SEES.split(':')[1].strip()})")
    if cancelled():
        return done((), None, "none")
    # 4. stack sampling, in what is left of the budget
    if left() < 1.0:
        rungs.append(Rung("stack-sampling", "skipped", "no time left in --duration"))
        return done((), None, "none", held_over_time)
    progress("stack-sampling", 0.0)
    try:
        found, count = sample_growth(
            pid, left(), memory=memory, cancelled=cancelled, progress=lambda f: progress("stack-sampling", f)
        )
    except pyspy.PySpyError as exc:
        failed("stack-sampling", str(exc))
        return done((), None, "none", held_over_time)
    torn = f"; {count.failed} of {count.taken} dumps failed and were skipped" if count.failed else ""
    if not found:
        why = (f"memory grew only while no thread ran ({count.grew_idle} of {count.taken} dumps)" if count.grew_idle
               else "memory did not grow while sampling")
        failed("stack-sampling", f"{why}{torn}")
        return done((), None, "none", held_over_time)
    rungs.append(Rung("stack-sampling", "used", f"where the process was while its memory grew (low confidence){torn}"))
    return done(found, "stack-sampling", "low", held_over_time)
