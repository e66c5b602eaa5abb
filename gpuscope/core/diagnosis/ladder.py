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

Each rung is a private module of this package (`_torch_history`, `_probe_trackers` for memray and
tracemalloc through the probe, `_memray_attach`, `_stack_sampling`); `attribute` climbs them, and
this module is their one interface.

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
process) run as that owner (`gpuscope.core.target.privilege`; the checks live in `gpuscope.core.target.interpreter`), gdb reads no init file and auto-loads
nothing from the target's files, and the capture memray writes goes into a folder of the
owner's inside a private one of gpuscope's, read only as a regular file of the owner's.
`memray attach` runs gpuscope's own memray, whose gdb also reads no init file (so gdb's
auto-load safe-path stays the system's folders).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuscope.core.target import inject, probe_client, pyspy
from gpuscope.core.diagnosis.attribution import (
    Attribution,
    Rung,
)
from gpuscope.core.target.stacks import Suspect
from gpuscope.core.diagnosis._memray_attach import check_attach, memray_importable, memray_suspects
from gpuscope.core.diagnosis._probe_trackers import (
    TRACEMALLOC_SEES,
    TRACKING_COST,
    Tracked,
    own_memray_path,
    probe_memray_suspects,
    probe_tracemalloc_suspects,
)
from gpuscope.core.diagnosis._shared import GROUPS, AttachRefused, group_records
from gpuscope.core.diagnosis._stack_sampling import SamplingCount, rss_of, sample_growth
from gpuscope.core.diagnosis._torch_history import torch_history_suspects, torch_unavailable

# The rungs' names the rest of gpuscope uses, from this one interface.
__all__ = [
    "GROUPS", "TRACEMALLOC_SEES", "TRACKING_COST", "AttachRefused", "SamplingCount", "Tracked", "attribute",
    "bring_probe",
    "check_attach", "group_records", "memray_importable", "memray_suspects", "own_memray_path",
    "probe_memray_suspects", "probe_tracemalloc_suspects", "rss_of", "sample_growth", "torch_history_suspects",
    "torch_unavailable",
]


MEMRAY_MIN_S = 1.0  # the least time left in the budget for a memray capture worth taking


# -- bringing the probe in ----------------------------------------------------------------------------


def bring_probe(pid: int) -> str:
    """Start gpuscope's probe inside `pid`, which has none (`inject.inject_probe`: sys.remote_exec
    on Python 3.14+, else gdb once the throwaway check passed): how it came in, or "refused: why".
    The probe stays in the process afterwards, idle (a thread waiting on its private socket)."""
    began = time.monotonic()
    try:
        done = inject.inject_probe(pid, anyway=True)
    except inject.InjectRefused as exc:
        return f"refused: not brought in: {exc}"
    if done.method == "already running":
        return "refused: the process already has a probe, which did not answer"
    return f"brought into the process through {done.method} in {time.monotonic() - began:.1f} s; left idle after"


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
        if brought_in_at is not None and not ran:
            ran.append((brought_in_at, time.time()))  # the probe alone ran inside: its memory is in the RSS
        span = (min(w[0] for w in ran), max(w[1] for w in ran)) if ran else None
        if span is not None and brought_in_at is not None:
            span = (min(span[0], brought_in_at), span[1])
        cost = tracked.cost if tracked else (costs[-1] if costs else {})
        return Attribution(pid, found, tuple(rungs), method, confidence, time.monotonic() - started,
                           times=tracked.times if tracked else (), sites=tracked.sites if tracked else (),
                           window=span, cost=cost, heap_times=tracked.heap_times if tracked else (),
                           heap=tracked.heap if tracked else (), heap_blocks=tracked.heap_blocks if tracked else ())

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
    brought_in_at = None  # when the probe was brought in (time.time()): its cost is the tracker's
    # Brought in only where the process has none (one that did not answer is not replaced).
    if client is None and use_memray and not cancelled() and why_not.startswith("no gpuscope probe"):
        brought_in_at = time.time()
        how = bring_probe(pid)
        if how.startswith("refused: "):
            rungs.append(Rung("probe", "failed", how.removeprefix("refused: ")))
            said(f"probe: {how.removeprefix('refused: ')}")
            brought_in_at = None
        else:
            client, hello, why_not = connect()
            rungs.append(Rung("probe", "used" if client is not None else "failed",
                              how if client is not None else f"{how}, but it did not answer: {why_not}"))
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
    if use_memray and client is not None and left() < MEMRAY_MIN_S:
        # Bringing the probe in (or torch's history) took the time: a capture of a blink would
        # only say that nothing it saw is still held.
        probe_took = f" (bringing the probe in and asking it took {time.time() - brought_in_at:.1f} s)" if brought_in_at else ""
        rungs.append(Rung("memray", "skipped", f"no tracking time left in --duration{probe_took}"))
    elif use_memray:
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
