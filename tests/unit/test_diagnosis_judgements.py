"""The diagnosis's judgements at their edges: the verdict of step 6, which sites count, growth the
tracker did not see, how long would settle a growth, and who decided the verdict."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from frames import leaking_evidence
from gpuscope.core.diagnosis.attribution import Attribution, Rung, Site
from gpuscope.core.diagnosis.steps import (
    DeviceEvidence,
    Evidence,
    Series,
    diagnose,
    growth_ranking,
    rising_sites,
    settle_seconds,
    site_trends,
    step_locate,
    step_classify,
    uninstrumented,
    unseen_growth,
    window_thresholds,
)
from gpuscope.core.leak import LeakAssessment, LeakThresholds, assess
from gpuscope.core.node.model import ProcessRow
from gpuscope.core.serving.model import ServingSnapshot, Signals
from gpuscope.core.target.stacks import Suspect

MB = 1e6
TIMES = tuple(i * 0.5 for i in range(25))  # 12 s of tracking


def assessment(verdict="leak", pattern="steady-growth", growth=2 * MB, confidence=0.9):
    return LeakAssessment(verdict, pattern, growth, confidence, 0.0, None, 0.0, 1.0, 10, 10.0, "the floor rose")


def evidence(kv=None):
    end = None
    if kv is not None:
        end = ServingSnapshot(time=0.0, source="scrape", target="t", profile="vllm", window_s=0.0,
                              signals=Signals(kv_cache_usage=kv))
    return Evidence(pid=1, command="serve", duration_s=30.0, rss=Series((), ()), serving_end=end)


# -- step 6 --------------------------------------------------------------------------------------------


def test_step_6_calls_a_leak_a_leak_and_skips_without_data():
    step, verdict, pattern = step_classify(evidence(), assessment(), "rss")
    assert (verdict, pattern, step.number, step.status) == ("leak", "steady-growth", 6, "alert")
    step, verdict, pattern = step_classify(evidence(), None, "rss")
    assert (verdict, pattern, step.status) == ("inconclusive", "insufficient-data", "skipped")


def test_a_caching_allocator_keeping_freed_blocks_is_no_leak():
    _, verdict, pattern = step_classify(evidence(), assessment("no-leak", "cache-growth"), "gpu")
    assert (verdict, pattern) == ("no-leak", "cache-growth")


def test_gpu_growth_with_a_full_kv_cache_is_its_fill_not_a_leak():
    assert step_classify(evidence(kv=0.9), assessment(), "gpu")[1:] == ("no-leak", "kv-cache-fill")
    assert step_classify(evidence(kv=0.89), assessment(), "gpu")[1:] == ("leak", "steady-growth")
    assert step_classify(evidence(kv=0.95), assessment(), "rss")[1:] == ("leak", "steady-growth")
    step = step_classify(evidence(kv=0.5), assessment(), "gpu")[0]
    assert step.evidence["kv_cache_usage"] == 0.5


def test_not_conclusive_and_not_a_leak_keep_the_detectors_pattern():
    step, verdict, pattern = step_classify(evidence(), assessment("inconclusive", "steady-growth"), "rss")
    assert (verdict, pattern, step.status) == ("inconclusive", "steady-growth", "warn")
    step, verdict, pattern = step_classify(evidence(), assessment("no-leak", "sawtooth"), "rss")
    assert (verdict, pattern, step.status) == ("no-leak", "sawtooth", "ok")


# -- how long would settle a growth ------------------------------------------------------------------------


def test_growth_under_the_least_rate_can_never_settle():
    th = LeakThresholds()
    assert settle_seconds(th, None, 30.0) is None
    assert settle_seconds(th, th.min_rate * 0.99, 30.0) is None
    assert settle_seconds(th, th.min_rate, 30.0) is not None


def test_a_fast_growth_settles_in_twice_the_window_and_a_slow_one_needs_longer():
    th = LeakThresholds()
    assert settle_seconds(th, 100 * MB, 30.0) == 60.0  # already counts: twice the window
    assert settle_seconds(th, 100 * MB, 5.0) == pytest.approx(10.0 / 0.55, abs=1)  # the fast duration, untouched
    slow = settle_seconds(th, 0.5 * MB, 30.0)
    assert slow is not None and slow > 60.0
    # long enough that the growth reaches the alert rate (with its margin) on the untouched part
    lasted = slow * 0.55
    assert th.rate_margin * th.alert_rate(lasted) <= 0.5 * MB
    assert th.rate_margin * th.alert_rate(lasted / 1.3) > 0.5 * MB


def test_the_slowest_growth_is_settled_by_four_slow_windows_at_most():
    th = LeakThresholds()
    longest = settle_seconds(th, th.min_rate, 30.0)
    assert longest is not None and 4 * th.slow_window_s / 0.55 <= longest <= 1.25 * 4 * th.slow_window_s / 0.55 + 1


# -- which rising sites count ---------------------------------------------------------------------------------


def attribution(sites, *, heap=None, method="tracemalloc", times=TIMES, rss_before=None, rungs=None):
    return Attribution(
        pid=1, suspects=(), rungs=rungs or (Rung(method, "used", ""),), method=method, confidence="high",
        times=times, sites=tuple(sites), heap_times=times if heap is not None else (), heap=tuple(heap or ()),
        cost={"rss_before": rss_before} if rss_before is not None else {})


def site(name, held):
    return Site(name, "app.py", 1, tuple(int(v) for v in held))


def test_a_rising_site_counts_when_the_memory_in_use_rises_with_it():
    grow = site("grow", [2 * MB * t for t in TIMES])
    att = attribution([site("flat", [MB] * len(TIMES)), grow], heap=[50 * MB + 2 * MB * t for t in TIMES])
    kept, rule = rising_sites(att, site_trends(att, LeakThresholds()))
    assert [s.function for s, _ in kept] == ["grow"]
    assert rule["site"] == "grow" and rule["counts"] is True and rule["rule"] == "memory in use rising"


def test_a_rising_site_whose_memory_in_use_stays_level_is_turnover_and_the_first_rule_is_kept():
    grow = site("grow", [2 * MB * t for t in TIMES])
    att = attribution([grow], heap=[500 * MB] * len(TIMES), rss_before=600 * MB)
    kept, rule = rising_sites(att, site_trends(att, LeakThresholds()))
    assert kept == [] and rule["counts"] is False and rule["site"] == "grow"


def test_a_tracker_that_read_only_the_end_lets_the_memory_trend_decide():
    att = attribution([site("grow", [5 * MB])], times=())
    kept, rule = rising_sites(att, [])
    assert kept == [] and rule["rule"] == "no held-bytes series"
    assert rising_sites(None, []) == ([], None)
    flat = attribution([site("flat", [MB] * len(TIMES))])
    assert rising_sites(flat, site_trends(flat, LeakThresholds())) == ([], None)


# -- growth the tracker did not see ---------------------------------------------------------------------------


def test_rss_growth_the_trackers_sites_did_not_follow_is_unseen():
    att = attribution([site("small", [0.05 * MB * t for t in TIMES])])
    unseen = unseen_growth(att, assessment(growth=10 * MB), "rss")
    assert unseen is not None and unseen.tracker == "tracemalloc"
    assert unseen.memory_bytes_per_s == 10 * MB
    assert unseen.tracked_bytes_per_s == pytest.approx(0.05 * MB, rel=0.1)
    assert [s.function for s, _ in unseen.growing] == ["small"]


def test_growth_the_sites_did_follow_is_seen():
    att = attribution([site("big", [2 * MB * t for t in TIMES])])
    assert unseen_growth(att, assessment(growth=10 * MB), "rss") is None  # saw 20 %: not unseen
    att = attribution([site("some", [1.1 * MB * t for t in TIMES])])
    assert unseen_growth(att, assessment(growth=10 * MB), "rss") is None  # 11 %


def test_unseen_growth_needs_an_rss_leak_a_tracker_and_sites():
    att = attribution([site("small", [0.05 * MB * t for t in TIMES])])
    assert unseen_growth(att, assessment(growth=10 * MB), "gpu") is None
    assert unseen_growth(att, assessment("no-leak", growth=10 * MB), "rss") is None
    assert unseen_growth(att, None, "rss") is None
    assert unseen_growth(None, assessment(), "rss") is None
    assert unseen_growth(att, assessment(growth=0.0), "rss") is None
    sampled = attribution([site("small", [0.05 * MB * t for t in TIMES])], rungs=(Rung("stack-sampling", "used", ""),))
    assert unseen_growth(sampled, assessment(growth=10 * MB), "rss") is None
    assert unseen_growth(attribution([]), assessment(growth=10 * MB), "rss") is None
    one = attribution([site("a", [0.0])], times=(0.0,))
    assert unseen_growth(one, assessment(growth=10 * MB), "rss") is None


def test_a_failed_tracker_still_names_itself_and_a_skipped_one_does_not():
    att = attribution([site("small", [0.0] * len(TIMES))],
                      rungs=(Rung("memray", "skipped", ""), Rung("tracemalloc", "failed", "")))
    unseen = unseen_growth(att, assessment(growth=10 * MB), "rss")
    assert unseen is not None and unseen.tracker == "tracemalloc" and unseen.growing == ()


def test_what_a_site_held_in_its_first_read_and_before_its_first_quarter_is_left_out():
    # 5 MB held from the first second on, flat: nothing gained while tracked
    held = [0.0 if t < 1.0 else 5 * MB for t in TIMES]
    unseen = unseen_growth(attribution([site("start", held)]), assessment(growth=10 * MB), "rss")
    assert unseen is not None and unseen.tracked_bytes_per_s == 0.0


# -- who decided ------------------------------------------------------------------------------------------------


def diagnosed(ev: Evidence, att: Attribution | None):
    return diagnose(replace(ev, attribution=att))


def test_a_leaking_trend_with_rising_sites_is_decided_by_both():
    grow = site("grow", [2 * MB * t for t in TIMES])
    att = attribution([grow], heap=[50 * MB + 2 * MB * t for t in TIMES])
    d = diagnosed(leaking_evidence(), att)
    assert d.verdict == "leak" and d.evidence.decided_by == "both"
    assert d.evidence.sites[0].trend == "rising"


def test_rising_sites_alone_make_a_leak_the_memory_trend_did_not_see():
    ev = leaking_evidence(rate=0.0)
    grow = site("grow", [2 * MB * t for t in TIMES])
    att = attribution([grow], heap=[50 * MB + 2 * MB * t for t in TIMES])
    d = diagnosed(ev, att)
    assert (d.verdict, d.pattern, d.evidence.decided_by) == ("leak", "steady-growth", "allocation sites")
    assert d.evidence.confidence == pytest.approx(1.0)
    assert diagnosed(ev, None).verdict != "leak"


def test_a_site_rising_as_turnover_is_named_so_and_decides_nothing():
    ev = leaking_evidence(rate=0.0)
    grow = site("grow", [2 * MB * t for t in TIMES])
    att = attribution([grow], heap=[500 * MB] * len(TIMES), rss_before=600 * MB)
    d = diagnosed(ev, att)
    assert d.verdict != "leak" and d.evidence.decided_by == "memory trend"
    assert d.evidence.sites[0].trend == "turnover"


def test_a_cache_the_tracker_saw_level_off_is_decided_by_both():
    ev = leaking_evidence(rate=0.0)
    att = attribution([site("cache", [min(2 * MB * t, 8 * MB) for t in TIMES])])
    d = diagnosed(ev, att)
    assert d.verdict != "leak" and d.evidence.decided_by == "both"


def test_an_inconclusive_verdict_says_how_long_would_settle_it():
    ev = leaking_evidence(seconds=30, rate=1 * MB)
    d = diagnose(ev)
    assert d.verdict == "inconclusive"
    assert d.evidence.settle_s == settle_seconds(LeakThresholds(), d.memory.growth_bytes_per_s, 30.0) > 60
    assert d.steps[5].evidence["settle_s"] == d.evidence.settle_s
    assert diagnose(leaking_evidence()).evidence.settle_s is None


def test_a_tracker_without_held_bytes_over_time_counts_no_site():
    _, rule = rising_sites(attribution([site("grow", [5 * MB])], times=()), [])
    assert rule["counts"] is False


def test_step_4_on_the_gpu_ranks_the_processes_of_the_diagnosed_device_only():
    rows = (ProcessRow(1, "u", 0, MB, MB, 0.0, "a", gpu_growth_bytes_per_s=2 * MB),
            ProcessRow(2, "u", 1, MB, MB, 0.0, "b", gpu_growth_bytes_per_s=9 * MB),
            ProcessRow(3, "u", 0, MB, MB, 0.0, "c", gpu_growth_bytes_per_s=5 * MB),
            ProcessRow(4, "u", 0, MB, MB, 0.0, "d", gpu_growth_bytes_per_s=None))
    ev = replace(evidence(), processes=rows, device=DeviceEvidence(0, "H100", None, Series((), ())))
    assert growth_ranking(ev, "gpu") == [(3, 5 * MB), (1, 2 * MB)]


def test_a_growth_exactly_at_the_fast_alert_rate_settles_at_the_fast_duration():
    th = LeakThresholds()
    at_rate = th.rate_margin * th.alert_rate(th.fast_duration_s)
    assert settle_seconds(th, at_rate, 5.0) == math.ceil(th.fast_duration_s / 0.55)


def test_a_window_whose_untouched_span_reaches_the_least_span_keeps_the_thresholds_a_shorter_one_scales_them():
    th = LeakThresholds(min_span_s=10.0, fast_duration_s=20.0)
    assert window_thresholds(th, 25.0) == th  # 40 % of 25 s is the least span itself
    short = window_thresholds(th, 20.0)
    assert (short.min_span_s, short.fast_duration_s) == (8.0, 8.0)
    assert window_thresholds(th, 60.0) == th


def test_a_10_s_window_calls_a_leak_kept_in_bursts_on_a_busy_machine_a_leak():
    """2 MB kept a query at a time, the service stalled now and then: 6 samples before a tracker and
    7 after it, the samples' scatter mostly the leak's own bursts. Asked to stand 6 standard errors
    clear of that scatter, as a longer window's slope is, it read "not yet clear of the noise"; 4.5
    are enough here."""
    times = [-14.46, -13.58, -13.08, -12.56, -12.02, -11.56, -11.04, -10.59, -10.01, -9.56, -9.06, -8.59, -7.98,
             -7.51, -6.96, -6.51, -5.97, -5.46, -5.03, -4.53, -4.05, -3.55, -3.03, -2.48, -1.97, -1.48, -1.01, -0.07]
    mb = [36.186, 45.817, 51.949, 51.998, 55.651, 61.849, 68.122, 74.164, 80.059, 86.116, 91.891, 97.649, 102.098,
          107.636, 114.256, 119.833, 125.613, 131.962, 137.677, 141.91, 148.12, 150.443, 153.984, 153.997, 158.001,
          159.886, 165.918, 176.19]
    rss, _ = uninstrumented(Series(tuple(times), tuple(300 * MB + v * MB for v in mb)), ((-11.1, -4.0),))
    short = window_thresholds(LeakThresholds(), 10.0)
    assert assess(rss.times, rss.values, thresholds=short).verdict == "leak"
    # The same samples a flat process scattering by as much: no leak, however few its floors.
    flat = [300 * MB + (3 * MB if i % 2 else -3 * MB) for i in range(len(times))]
    kept, _ = uninstrumented(Series(tuple(times), tuple(flat)), ((-11.1, -4.0),))
    assert assess(kept.times, kept.values, thresholds=short).verdict == "no-leak"


def test_a_10_s_diagnosis_whose_tracker_ended_late_asks_what_10_s_ask_of_its_untouched_samples():
    """On a slow machine the probe came in slowly and its tracker ended 2 s past a 10 s window: the
    watch ran 14 s, the tracker had 9.1 s of it, and 5.5 s of untouched samples of a 5 MB/s leak
    were asked to cover 40 % of 14 s (5.6 s): "insufficient data". What a short window asks
    scales with the time asked for, not with what a late tracker added."""
    times = tuple(-14.0 + 0.5 * i for i in range(29))
    rss = Series(times, tuple(200 * MB + 5 * MB * (t + 14.0) for t in times))
    late = Evidence(pid=1, command="serve", duration_s=14.0, rss=rss, instrumented=((-11.1, -2.0),), asked_s=10.0)
    d = diagnose(late)
    assert d.verdict == "leak", d.steps[5].finding
    assert diagnose(replace(late, asked_s=None)).verdict == "inconclusive"  # judged as a 14 s window


def test_step_4_is_step_4_whether_the_process_exited_or_no_growth_is_known_and_ranks_by_itself():
    rows = (ProcessRow(1, "u", None, None, MB, 0.0, "serve", rss_growth_bytes_per_s=2 * MB + 0.26),
            ProcessRow(2, "u", None, None, MB, 0.0, "other", rss_growth_bytes_per_s=1 * MB))
    ev = replace(evidence(), processes=rows)
    calm = step_locate(ev, assessment("no-leak", "flat"), "rss")
    assert (calm.number, calm.status) == (4, "ok") and [r["pid"] for r in calm.evidence["ranking"]] == [1, 2]
    assert calm.evidence["ranking"][0]["growth_bytes_per_s"] == 2000000.3
    assert step_locate(ev, assessment(), "rss").status == "alert"
    assert step_locate(ev, None, "rss").status == "ok"
    gone = step_locate(replace(ev, exited=True), assessment(), "rss")
    assert (gone.number, gone.status) == (4, "warn")
    alone = step_locate(evidence(), assessment(), "rss")
    assert (alone.number, alone.status) == (4, "ok")


def test_step_6_is_step_6_in_every_branch():
    cases = [(evidence(), None, "rss"), (evidence(), assessment("no-leak", "cache-growth"), "gpu"),
             (evidence(kv=0.95), assessment(), "gpu"), (evidence(), assessment(), "rss"),
             (evidence(), assessment("inconclusive"), "rss"), (evidence(), assessment("no-leak", "flat"), "rss")]
    for ev, memory, source in cases:
        step = step_classify(ev, memory, source)[0]
        assert (step.number, step.title) == (6, "Classify"), step


def unseen(held, growth=10 * MB, times=TIMES):
    return unseen_growth(attribution([site("s", held)], times=times), assessment(growth=growth), "rss")


def test_a_tracker_that_saw_exactly_a_tenth_of_the_growth_saw_it():
    # kept: the reads from 1 s on (23 of them, 11 s); 11 MB gained over 11 s is 1 MB/s, a tenth of 10 MB/s
    assert unseen([int(MB * t) for t in TIMES]) is None
    assert unseen([int(0.99 * MB * t) for t in TIMES]) is not None


def test_what_a_site_gained_is_counted_from_the_least_of_its_first_quarter_of_reads():
    # the first quarter: the five reads from 1 s to 3 s; the least of them is at 3 s
    dip = [0.0 if t == 3.0 else (10 * MB if t < 3.0 else 10.5 * MB) for t in TIMES]
    assert unseen(dip, growth=1 * MB) is None  # 10.5 MB gained: seen
    later = [0.0 if t == 3.5 else (10 * MB if t < 3.5 else 10.5 * MB) for t in TIMES]
    assert unseen(later, growth=1 * MB) is not None  # 0.5 MB gained from the first quarter
    first = [0.0 if t == 1.0 else (10 * MB if t < 3.0 else 10.5 * MB) for t in TIMES]
    assert unseen(first, growth=1 * MB) is None  # the read at 1 s is the first kept


def test_a_short_tracking_counts_from_its_first_kept_read():
    times = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)  # six kept reads: a quarter is one
    assert unseen([0, 10 * MB, 10 * MB, 10 * MB, 10 * MB, 10.5 * MB], growth=2 * MB, times=times) is None
    assert unseen([10 * MB, 0, 10 * MB, 10 * MB, 10 * MB, 10.5 * MB], growth=2 * MB, times=times) is not None


def test_two_reads_a_second_apart_or_less_are_enough_and_one_span_of_none_is_not():
    assert unseen([0, 0], times=(1.0, 2.0)) is not None
    assert unseen([0, 0], times=(1.0, 1.5)) is not None
    assert unseen([0, 0, 0], times=(0.0, 0.5, 2.0)) is None  # one read after the first second: no span


def test_a_leak_with_no_measured_growth_or_a_tiny_one():
    assert unseen([0] * len(TIMES), growth=None) is None
    assert unseen([0] * len(TIMES), growth=0.5) is not None


def test_sites_still_growing_are_named_only_when_steady_with_six_reads_or_more():
    times6 = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    steady = unseen([0.01 * MB * t for t in times6], times=times6)
    assert steady is not None and [s.function for s, _ in steady.growing] == ["s"]
    five = unseen([0.01 * MB * t for t in times6[:5]], times=times6[:5])
    assert five is not None and five.growing == ()
    zigzag = [0.01 * MB * t + (0.05 * MB if i % 2 else 0) for i, t in enumerate(TIMES)]
    ragged = unseen(zigzag)
    assert ragged is not None and ragged.growing == ()


def test_a_gain_at_the_last_read_is_seen():
    jump = [0.0] * (len(TIMES) - 1) + [20 * MB]
    assert unseen(jump) is None


def test_sites_still_growing_come_fastest_first_and_must_still_rise_at_the_end():
    def rising(first: float, then: float) -> list[float]:
        return [first * t if t <= 6.0 else first * 6.0 + then * (t - 6.0) for t in TIMES]

    att = attribution([site("slow", rising(0.01 * MB, 0.01 * MB)), site("fast", rising(0.02 * MB, 0.02 * MB)),
                       site("slowing", rising(0.02 * MB, 0.012 * MB)), site("stopping", rising(0.02 * MB, 0.0005 * MB))])
    found = unseen_growth(att, assessment(growth=10 * MB), "rss")
    assert found is not None
    assert [s.function for s, _ in found.growing] == ["fast", "slowing", "slow"]


def test_the_sites_decide_in_step_6_with_their_last_held_bytes_and_rounded_confidence():
    ev = leaking_evidence(rate=0.0)
    held = [2 * MB * t for t in TIMES]
    held[8:12] = [held[12]] * 4  # a stretch held level: ties among the floors, a tau under 1
    grow = site("grow", held)
    d = diagnosed(ev, attribution([grow], heap=[50 * MB + 2 * MB * t for t in TIMES]))
    step = d.steps[5]
    assert (d.verdict, step.number, step.title) == ("leak", 6, "Classify")
    assert d.evidence.sites[0].held_bytes == int(held[-1])
    trend = site_trends(attribution([grow]), LeakThresholds())[0][1]
    assert trend.confidence != round(trend.confidence, 2)
    assert d.evidence.confidence == round(trend.confidence, 2)


def test_the_memory_trend_confidence_is_rounded_and_no_data_is_none():
    d = diagnose(leaking_evidence())
    assert d.memory.confidence != round(d.memory.confidence, 2)
    assert d.evidence.confidence == round(d.memory.confidence, 2)
    none = diagnose(Evidence(pid=1, command="x", duration_s=30.0, rss=Series((), ())))
    assert (none.evidence.confidence, none.memory.confidence, none.memory.samples, none.memory.span_s) == (0.0, 0.0, 0, 0.0)


def test_the_five_sites_held_most_are_in_the_evidence():
    sites = [site(f"s{k}", [MB * (k + 1)] * len(TIMES)) for k in range(6)]
    d = diagnosed(leaking_evidence(rate=0.0), attribution(sites))
    assert len(d.evidence.sites) == 5


def test_too_short_a_stretch_to_judge_still_reads_the_growth_of_its_floor():
    times = (-4.0, -3.0, -2.0, -1.0, 0.0)
    ev = Evidence(pid=1, command="x", duration_s=4.0, rss=Series(times, (100 * MB, None, 102 * MB, 103 * MB, 104 * MB)))
    d = diagnose(ev)
    assert d.memory.growth_bytes_per_s == pytest.approx(1 * MB)
    three = Evidence(pid=1, command="x", duration_s=4.0, rss=Series(times, (100 * MB, None, None, 103 * MB, 104 * MB)))
    assert diagnose(three).memory.growth_bytes_per_s is None


def test_the_seconds_a_tracker_took_out_of_the_memory_trend_are_said_before_the_end():
    d = diagnose(replace(leaking_evidence(), instrumented=((-40.0, -30.0),)))
    start, end = d.evidence.excluded_s_before_end
    assert start == 40.0 and 0.0 < end < 30.0


def suspect(method: str) -> Suspect:
    return Suspect("f", "app.py", 1, 100, 0.5, method)


def test_sites_of_a_tracker_that_did_not_see_the_growth_are_no_suspects():
    small = [site("small", [0.05 * MB * t for t in TIMES])]
    for method, kept in (("tracemalloc", False), ("memray", False), ("stack-sampling", True)):
        att = replace(attribution(small), suspects=(suspect(method),))
        d = diagnosed(leaking_evidence(), att)
        assert d.evidence.unseen_growth is not None
        assert bool(d.suspects) is kept, method


def test_stack_samples_blame_nothing_when_the_memory_does_not_leak():
    flat = leaking_evidence(rate=0.0)
    for method, kept in (("stack-sampling", False), ("memray", True)):
        att = replace(attribution([]), suspects=(suspect(method),), method=method)
        d = diagnosed(flat, att)
        assert d.verdict == "no-leak" and bool(d.suspects) is kept, method
    leaking = diagnosed(leaking_evidence(), replace(attribution([]), suspects=(suspect("stack-sampling"),)))
    assert leaking.suspects


def test_a_tracker_that_ran_to_the_end_took_no_seconds_before_it():
    d = diagnose(replace(leaking_evidence(), instrumented=((-0.5, 0.0),)))
    assert d.evidence.excluded_s_before_end == (0.5, 0.0)


def test_a_leak_from_a_young_process_s_first_seconds_is_said_to_be_maybe_its_warm_up():
    ev = replace(leaking_evidence(), ended_at=1_000_000.0, started_at=1_000_000.0 - 35.0)
    d = diagnose(ev)
    assert d.verdict == "leak" and "warming up" in d.steps[5].finding
    assert "warming up" not in diagnose(replace(ev, started_at=1_000_000.0 - 3600.0)).steps[5].finding


def test_the_probes_own_allocations_are_never_a_suspect_wherever_gpuscope_runs_from():
    """memray attached from outside sees what gpuscope's probe threads allocate too (its listener,
    its replies). Run from a source tree, the probe's file is outside site-packages and read as
    the service's own code: it was named first, ahead of the leaking function."""
    from gpuscope.core.diagnosis.attribution import suspects_from_records

    threading = ("_bootstrap_inner", "/usr/lib/python3.11/threading.py", 1045)
    records = [
        ((("_accept_loop", "/home/dev/gpuscope/gpuscope/probe.py", 414), threading), 1216, 3),
        ((("answer", "/home/dev/gpuscope/gpuscope/probe.py", 472), ("_serve", "/home/dev/gpuscope/gpuscope/probe.py",
                                                                    446), threading), 1_000_000, 1),
        ((("search", "/srv/app/service.py", 10), ("<module>", "/srv/app/service.py", 14)), 644, 1),
    ]
    suspects = suspects_from_records(records, roots=("/srv/app",))
    assert [(s.function, s.file) for s in suspects] == [("search", "/srv/app/service.py")]
    assert suspects[0].share == 1.0
