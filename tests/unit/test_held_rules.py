"""The rules that decide whether a tracked site's rise is leak evidence, how held bytes are
trended, what a short window asks of its samples, and how stack samples are weighed."""

from __future__ import annotations

from gpuscope.core.diagnosis.attribution import suspects_from_stacks
from gpuscope.core.diagnosis.steps import settle_seconds, window_thresholds
from gpuscope.core.leak import LeakThresholds, held_evidence, held_trend, rising_evidence, tracking_settled
from gpuscope.core.target.stacks import OWN, StackFrame

TIMES = [i * 0.25 for i in range(49)]  # 12 s read 4 times a second
MB = 1e6


def test_a_rise_the_memory_in_use_does_not_follow_is_turnover_not_a_leak():
    held = [1 * MB * t for t in TIMES]  # 1 MB/s of new cache entries ...
    trend = held_trend(TIMES, held)
    assert trend.kind == "rising"
    level = held_evidence(trend, TIMES, held, TIMES, [100 * MB] * len(TIMES))  # ... replacing older ones
    assert not level.counts and level.rule == "memory in use level", level
    rising = held_evidence(trend, TIMES, held, TIMES, [100 * MB + 0.9 * MB * t for t in TIMES])
    assert rising.counts and rising.rule == "memory in use rising", rising


def test_the_memory_in_use_rise_is_apportioned_among_rising_sites_fastest_first():
    """Beside a real leak (1 MB/s, which the memory in use follows), a site replacing older memory
    (0.8 MB/s: a cache turning over) does not count: the leak holds the rise."""
    leak = [1 * MB * t for t in TIMES]
    cache = [0.8 * MB * t for t in TIMES]
    heap = [100 * MB + 1 * MB * t for t in TIMES]
    judged = rising_evidence([(held_trend(TIMES, cache), TIMES, cache), (held_trend(TIMES, leak), TIMES, leak)],
                             TIMES, heap)
    assert [j.counts for j in judged] == [False, True], judged
    assert judged[0].rule == "memory in use level" and "faster rising sites" in judged[0].reason, judged[0]
    # two leaks the memory in use follows both count
    both = rising_evidence([(held_trend(TIMES, cache), TIMES, cache), (held_trend(TIMES, leak), TIMES, leak)],
                           TIMES, [100 * MB + 1.8 * MB * t for t in TIMES])
    assert [j.counts for j in both] == [True, True], both
    # the early stop apportions the same way: the cache alone rising steadily beside a leak that is
    # not yet steady keeps the tracker going
    steps = [i * 1.0 for i in range(10)]
    wobbly = [1 * MB * t + (1.5 * MB if i % 2 else 0.0) for i, t in enumerate(steps)]
    settled = tracking_settled(steps, [("the cache", [0.8 * MB * t for t in steps]), ("the leak", wobbly)],
                               [100 * MB + 1 * MB * t + (2 * MB if i % 2 else 0.0) for i, t in enumerate(steps)],
                               [150 * MB] * len(steps), resident_before=150 * MB)
    assert settled is None or "the cache" not in settled.reason, settled


def test_small_python_objects_count_through_the_blocks_malloc_does_not_hand_out():
    held = [1 * MB * t for t in TIMES]
    trend = held_trend(TIMES, held)
    blocks = [1000 + 4000 * t for t in TIMES]  # 4000 blocks/s: up to 2 MB/s
    judged = held_evidence(trend, TIMES, held, TIMES, [50 * MB] * len(TIMES), blocks)
    assert judged.counts and judged.rule == "memory in use rising", judged


def test_a_rise_larger_than_all_the_memory_in_use_at_the_start_outlasts_any_turnover():
    held = [3 * MB * t for t in TIMES]  # 36 MB gained
    judged = held_evidence(held_trend(TIMES, held), TIMES, held, TIMES, [20 * MB] * len(TIMES))
    assert judged.counts and judged.rule == "outlasts turnover", judged


def test_what_the_program_mapped_itself_counts_in_what_the_process_held_at_the_start():
    # 36 MB gained at a site while malloc had 20 MB in use, but the process held 120 MB (maps of
    # its own, which no allocator counts): turnover of those could free as much
    held = [3 * MB * t for t in TIMES]
    judged = held_evidence(held_trend(TIMES, held), TIMES, held, TIMES, [20 * MB] * len(TIMES),
                           resident_before=120 * MB)
    assert not judged.counts and judged.rule == "memory in use level", judged


def test_a_tracker_is_stopped_early_only_for_a_rise_the_verdict_would_count():
    """The early stop judges a rising site by the verdict's rule: a full cache turning over (its
    site rises, the memory in use stays level) is tracked its full time, not stopped as rising."""
    steps = [i * 1.0 for i in range(10)]
    site = [("a site's held bytes", [1 * MB * t for t in steps])]
    level = tracking_settled(steps, site, [100 * MB] * len(steps), [150 * MB] * len(steps),
                             blocks=[1000] * len(steps), resident_before=150 * MB)
    assert level is None, level
    added = tracking_settled(steps, site, [100 * MB + 0.9 * MB * t for t in steps], [150 * MB] * len(steps),
                             resident_before=150 * MB)
    assert added is not None and added.kind == "rising" and "memory in use rising" in added.reason, added
    # small Python objects count through their blocks, as in the verdict
    blocks = tracking_settled(steps, site, [100 * MB] * len(steps), [150 * MB] * len(steps),
                              blocks=[1000 + 4000 * t for t in steps], resident_before=150 * MB)
    assert blocks is not None and blocks.kind == "rising", blocks


def test_a_batch_seen_freed_once_and_filling_again_at_the_end_is_not_a_rise():
    # A 5 MB map every 0.2 s for 3 s, all unmapped, 0.5 s of rest, again: the tracker began 0.5 s
    # into a batch (its older maps unseen), saw it freed, and stopped as the next one filled
    def mapped(t: float) -> float:
        if t < 2.5:
            return 5 * MB * (1 + int(t / 0.2))
        return 0.0 if t < 3.0 else 5 * MB * (1 + int((t - 3.0) / 0.2))
    times = [i * 0.25 for i in range(25)]  # 6 s
    held = [mapped(t) for t in times]
    assert held_trend(times, held).kind != "rising", held


def test_without_a_measure_of_the_memory_in_use_the_site_decides():
    held = [1 * MB * t for t in TIMES]
    judged = held_evidence(held_trend(TIMES, held), TIMES, held, (), ())
    assert judged.counts and judged.rule == "no measure of memory in use", judged


def test_what_is_built_and_dropped_leaves_no_floor_however_the_reads_line_up():
    # 40 MB built over each 0.96 s and dropped, read 4 times a second: raw reads drift upward for
    # a few seconds at a time; what stays held does not rise
    for period in (0.7, 0.75, 0.8, 0.83, 0.85, 0.9, 0.96, 1.1):
        held = [40 * MB * ((t % period) / period) for t in TIMES]
        assert held_trend(TIMES, held).kind != "rising", period
    # a leak with its own small temporaries at the same site still rises
    leak = [0.5 * MB * t + 2 * MB * ((t % 0.96) / 0.96) for t in TIMES]
    assert held_trend(TIMES, leak).kind == "rising"


def test_a_short_window_asks_less_of_its_samples_and_a_long_one_the_defaults():
    th = LeakThresholds()
    assert window_thresholds(th, 30.0) == th
    short = window_thresholds(th, 10.0)
    assert short.min_span_s == 4.0 and short.fast_duration_s == 4.0
    # 5 MB/s over 4 s counts
    assert short.rate_margin * short.alert_rate(4.0) <= 5e6


def test_how_long_would_settle_a_slow_growth_grows_as_the_rate_falls():
    th = LeakThresholds()
    fast, slow = settle_seconds(th, 2e6, 30.0), settle_seconds(th, 0.2e6, 30.0)
    assert fast is not None and slow is not None and 60 <= fast < slow
    assert settle_seconds(th, 1e3, 30.0) is None  # under min_rate: never a leak


def frame(function: str, line: int) -> StackFrame:
    return StackFrame(function, "/srv/app.py", line, OWN)


def test_stack_samples_net_growth_by_function():
    keeps = [((frame("ingest", 10),), 1e6, 1), ((frame("ingest", 11),), 1e6, 1), ((frame("ingest", 12),), 1e6, 1)]
    # a neighbour credited 10 MB on its builds and debited 9.5 MB on its drops
    churns = [((frame("rebuild", 40),), 5e6, 1), ((frame("rebuild", 40),), 5e6, 1), ((frame("rebuild", 41),), -9.5e6, 1)]
    found = suspects_from_stacks(keeps + churns, "stack-sampling", known_bytes=False, by_function=True)
    assert [s.function for s in found] == ["ingest", "rebuild"], found
    assert abs(found[0].share - 3 / 3.5) < 1e-9
    per_line = suspects_from_stacks(keeps + churns, "stack-sampling", known_bytes=False)
    assert per_line[0].function == "rebuild"  # per line, ingest's share is split in three


def test_growth_while_no_thread_runs_is_a_lone_threads_own_and_nobodys_among_several(monkeypatch):
    """A one-thread service that sleeps between requests is rarely caught inside one: its growth
    goes to where it waits. Among several waiting threads no one is blamed (counted as idle)."""
    from gpuscope.core.diagnosis import _stack_sampling
    from gpuscope.core.target import pyspy
    from gpuscope.core.target.stacks import StackDump, ThreadStack

    def waiting(tid: int, function: str) -> ThreadStack:
        return ThreadStack(tid, None, tid, False, False, (StackFrame(function, "/srv/app.py", 10, OWN),))

    for threads, named in (((waiting(1, "serve_forever"),), ["serve_forever"]),
                           ((waiting(1, "serve_forever"), waiting(2, "poll_queue")), [])):
        rss = iter(range(100, 10_000))
        monkeypatch.setattr(pyspy, "own_roots", lambda pid: ())
        monkeypatch.setattr(pyspy, "dump", lambda pid, threads=threads, **kw: StackDump(pid, 0.0, "nonblocking", False, threads))
        found, count = _stack_sampling.sample_growth(1, 0.3, interval=0.01, memory=lambda pid: float(next(rss) * 1e6))
        assert [s.function for s in found] == named, found
        assert (count.grew_idle > 0) == (not named), count
