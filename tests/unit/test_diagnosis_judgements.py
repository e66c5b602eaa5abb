"""The diagnosis's judgements at their edges: the verdict of step 6, which sites count, growth the
tracker did not see, how long would settle a growth, and who decided the verdict."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frames import leaking_evidence
from gpuscope.core.diagnosis.attribution import Attribution, Rung, Site
from gpuscope.core.diagnosis.steps import (
    Evidence,
    Series,
    diagnose,
    rising_sites,
    settle_seconds,
    site_trends,
    step_classify,
    unseen_growth,
)
from gpuscope.core.leak import LeakAssessment, LeakThresholds
from gpuscope.core.serving.model import ServingSnapshot, Signals

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
