"""The gate's judgements on made-up rounds: the growth line, the allowance, each criterion."""

import dataclasses
import math

import pytest

from gpuscope.core.gate.verdict import (
    MIN_SITE_EXCESS,
    Baseline,
    CheckRun,
    Criterion,
    Growth,
    Memory,
    Round,
    Site,
    _median,
    growth_of,
    grown_sites,
    judge,
    steady_sites,
)
from gpuscope.core.leak import LeakAssessment

MB = 1 << 20


def rounds(floors, *, requests=None, sites=None, cut=(), load_exit=None, peaks=None):
    """Round 0 (the reference) and judged rounds 1.., with the given rss floors."""
    out = []
    for n, floor in enumerate(floors):
        memory = {"rss": Memory(floor, peaks[n] if peaks else None)}
        out.append(Round(n, False, 1.0, memory, requests=requests[n] if requests else None,
                         sites=sites[n] if sites else None, completed=n not in cut, load_exit=load_exit))
    return tuple(out)


def run_of(rs, **kw):
    settings = kw.pop("settings", {"rounds": len(rs) - 1})
    return CheckRun("svc", settings, rs, **kw)


def baseline_of(rs, **kw):
    return Baseline("base.json", rs, {}, **kw)


def assessment(verdict, growth=1e6, reason="why", pattern="steady-growth"):
    return LeakAssessment(verdict, pattern, growth, 0.9, 0.0, None, 0.0, 1.0, 10, 10.0, reason)


def criterion(verdict, name):
    return next(c for c in verdict.criteria if c.name == name)


# -- the growth line ---------------------------------------------------------------------------------


def test_growth_is_the_slope_through_the_floors_and_noise_the_largest_distance_from_it():
    g = growth_of(rounds([100, 110, 125, 130, 140]), "rss")
    assert g.per_round == 10  # the pairwise slopes' median
    assert g.noise == 5  # round 2 sits 5 above the line through the others
    assert g.reference_floor == 100
    # the residuals (0, 0, 5, 0, 0) have a median of 0: no uncertainty
    assert g.uncertainty == 0


def test_the_uncertainty_is_the_robust_scatter_over_the_spread_of_the_rounds():
    # the line 10 per round through 0, with residuals 0, +4, -4, +4, 0 about it
    g = growth_of(rounds([0, 14, 16, 34, 40]), "rss")
    assert g.per_round == 10
    spread = math.sqrt(4 + 1 + 0 + 1 + 4)
    assert g.uncertainty == pytest.approx(1.4826 * 4 / spread)
    assert g.noise == 4


def test_two_floors_give_a_slope_and_no_uncertainty_one_gives_nothing():
    two = growth_of(rounds([100, 130]), "rss")
    assert two.per_round == 30 and two.uncertainty == 0.0
    one = growth_of(rounds([100]), "rss")
    assert one.per_round is None and one.noise == 0.0 and one.reference_floor == 100


def test_the_line_starts_at_the_comparable_round_and_skips_rounds_cut_short():
    rs = rounds([0, 100, 110, 120, 900, 140], cut=(4,))
    g = growth_of(rs, "rss", since=1)
    assert g.per_round == 10 and g.noise == 0
    assert g.reference_floor == 0  # still round 0's


def test_requests_per_round_only_when_every_judged_round_counted():
    assert growth_of(rounds([0, 10, 20], requests=[None, 10, 30]), "rss").requests_per_round == 20
    assert growth_of(rounds([0, 10, 20], requests=[None, 10, None]), "rss").requests_per_round is None
    g = growth_of(rounds([0, 10, 20], requests=[5, 10, 30]), "rss")
    assert g.requests_per_round == 20  # round 0's requests do not count
    assert g.per_request == 0.5


def test_per_request_needs_a_slope_and_requests():
    assert Growth(10.0, 0.0, 0, 4.0).per_request == 2.5
    assert Growth(None, 0.0, 0, 4.0).per_request is None
    assert Growth(10.0, 0.0, 0, 0.0).per_request is None
    assert Growth(10.0, 0.0, 0, None).per_request is None


def test_median_of_odd_and_even_counts():
    assert _median([3.0, 1.0, 2.0]) == 2.0
    assert _median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_a_criterion_says_pass_fail_or_skipped():
    assert [Criterion("x", p, "").status for p in (True, False, None)] == ["pass", "fail", "skipped"]


# -- the growth criterion ------------------------------------------------------------------------------


def test_growth_within_the_tolerance_of_the_floor_passes_and_beyond_it_fails():
    # 3 % of 100 MB is 3 MB a round
    flat = run_of(rounds([100 * MB, 100 * MB + 2 * MB, 100 * MB + 4 * MB, 100 * MB + 6 * MB]))
    v = judge(flat, None)
    assert criterion(v, "rss-growth").passed is True and v.passed
    assert v.allowance["rss"] == pytest.approx(3 * MB)
    assert criterion(v, "rss-growth").figures["expected_growth_per_round_bytes"] == 0
    grows = run_of(rounds([100 * MB, 104 * MB, 108 * MB, 112 * MB]))
    v = judge(grows, None)
    assert criterion(v, "rss-growth").passed is False and not v.passed
    # each round grew 4 MB, more than the 3 MB allowed: each is named
    assert sorted(v.round_failures) == [1, 2, 3]


def test_growth_exactly_at_the_limit_passes():
    v = judge(run_of(rounds([100, 103, 106, 109])), None)
    assert criterion(v, "rss-growth").passed is True


def test_a_round_that_grew_within_the_limit_is_not_named_when_the_trend_fails():
    v = judge(run_of(rounds([100 * MB, 105 * MB, 110 * MB, 112 * MB, 120 * MB])), None)
    assert criterion(v, "rss-growth").passed is False
    assert 3 not in v.round_failures and 1 in v.round_failures


def test_the_baseline_growth_is_expected_and_its_reference_floor_sets_the_allowance():
    base = baseline_of(rounds([200 * MB, 205 * MB, 210 * MB, 215 * MB]))
    # 5 MB a round expected, 3 % of the baseline's 200 MB = 6 MB allowed: 11 MB a round passes
    ok = judge(run_of(rounds([100 * MB, 111 * MB, 122 * MB, 133 * MB])), base)
    c = criterion(ok, "rss-growth")
    assert c.passed is True
    assert c.figures["expected_growth_per_round_bytes"] == 5 * MB
    assert c.figures["reference_floor_bytes"] == 200 * MB
    assert ok.baseline_growth["rss"].per_round == 5 * MB
    bad = judge(run_of(rounds([100 * MB, 112 * MB, 124 * MB, 136 * MB])), base)
    assert criterion(bad, "rss-growth").passed is False


def test_a_baseline_that_shrank_expects_no_growth():
    base = baseline_of(rounds([100 * MB, 95 * MB, 90 * MB]))
    v = judge(run_of(rounds([100 * MB, 104 * MB, 108 * MB])), base)
    assert criterion(v, "rss-growth").figures["expected_growth_per_round_bytes"] == 0
    assert criterion(v, "rss-growth").passed is False


def test_the_expected_growth_scales_to_this_runs_requests_per_round():
    base = baseline_of(rounds([100 * MB, 110 * MB, 120 * MB], requests=[None, 10, 10]))
    # twice the requests a round: twice the baseline's 10 MB expected
    run = run_of(rounds([100 * MB, 120 * MB, 140 * MB], requests=[None, 20, 20]))
    c = criterion(judge(run, base), "rss-growth")
    assert c.figures["expected_growth_per_round_bytes"] == 20 * MB
    assert c.passed is True
    assert "at this run's requests per round" in c.message


def test_noisy_floors_are_allowed_twice_the_slopes_uncertainty():
    run = run_of(rounds([0, 14, 16, 34, 40]))
    v = judge(run, None)
    spread = math.sqrt(10)
    assert v.allowance["rss"] == pytest.approx(2 * 1.4826 * 4 / spread)
    assert "uncertainty" in criterion(v, "rss-growth").message


def test_the_baselines_uncertainty_counts_when_larger():
    base = baseline_of(rounds([0, 14, 16, 34, 40]))
    v = judge(run_of(rounds([0, 10, 20, 30, 40])), base)
    assert v.allowance["rss"] == pytest.approx(2 * 1.4826 * 4 / math.sqrt(10))
    assert criterion(v, "rss-growth").passed is True


def test_a_run_that_is_to_become_the_baseline_records_its_growth_without_judging_it():
    v = judge(run_of(rounds([100 * MB, 150 * MB, 200 * MB])), None, compare=False)
    assert criterion(v, "rss-growth").passed is None and v.passed
    assert v.growth["rss"].per_round == 50 * MB


def test_no_completed_round_skips_the_growth_criterion():
    v = judge(run_of(rounds([100, 200], cut=(1,))), None)
    assert criterion(v, "rss-growth").passed is None
    assert v.round_failures == {1: "cut short"}


# -- the other criteria ----------------------------------------------------------------------------------


def test_a_service_that_stopped_fails_the_command_criterion():
    rs = rounds([100, 100, 100])
    assert criterion(judge(run_of(rs), None), "command").passed is True
    stopped = judge(run_of(rs, stopped="exited 1", stopped_by="service", exit_status=1), None)
    c = criterion(stopped, "command")
    assert c.passed is False and c.message == "exited 1" and c.figures == {"exit_status": 1}
    assert not stopped.passed
    by_load = judge(run_of(rs, stopped="load failed", stopped_by="load", settings={"load": "x"}), None)
    assert criterion(by_load, "command").passed is True
    assert criterion(by_load, "load").passed is False


def test_the_load_criterion_counts_the_rounds_the_load_ran():
    ran = judge(run_of(rounds([100, 100, 100], load_exit=0), settings={"load": "x"}), None)
    c = criterion(ran, "load")
    assert c.passed is True and "each of the 3 rounds" in c.message
    never = judge(run_of(rounds([100, 100, 100]), settings={"load": "x"}), None)
    assert criterion(never, "load").passed is None
    assert all(c.name != "load" for c in judge(run_of(rounds([100, 100])), None).criteria)


def test_the_leak_criterion_fails_on_an_outright_leak_and_names_the_fastest():
    rs = rounds([100, 100, 100])
    assert criterion(judge(run_of(rs), None), "leak").passed is None
    calm = judge(run_of(rs, leak={"rss": assessment("no-leak", pattern="flat")}), None)
    assert criterion(calm, "leak").passed is True
    leak = judge(run_of(rs, leak={"rss": assessment("leak", 1e6, "slow"), "gpu0": assessment("leak", 5e6, "fast"),
                                  "gpu1": assessment("no-leak")}), None)
    c = criterion(leak, "leak")
    assert c.passed is False and "GPU 0" in c.message and "fast" in c.message
    assert not leak.passed


# -- the sites -------------------------------------------------------------------------------------------


def site(name, size):
    return Site(name, "app.py", 1, size)


def test_a_site_steady_in_every_tracked_round_is_counted_beyond_the_baseline():
    big = MIN_SITE_EXCESS * 4
    tracked = [None, (site("keep", big),), (site("keep", big),), (site("keep", int(big * 0.95)),)]
    steady, n = steady_sites(rounds([0, 0, 0, 0], sites=tracked), ())
    assert n == 3 and [g.site.function for g in steady] == ["keep"]
    assert steady[0].per_round == big and steady[0].site.bytes == big and steady[0].excess == big
    base = rounds([0, 0, 0], sites=[None, (site("keep", big),), (site("keep", big),)])
    assert steady_sites(rounds([0, 0, 0, 0], sites=tracked), base) == ([], 3)


def test_a_site_missing_from_a_round_or_unsteady_is_not_steady():
    big = MIN_SITE_EXCESS * 4
    missing = [None, (site("a", big),), (), (site("a", big),)]
    assert steady_sites(rounds([0, 0, 0, 0], sites=missing), ())[0] == []
    unsteady = [None, (site("a", big),), (site("a", big // 2),), (site("a", big),)]
    assert steady_sites(rounds([0, 0, 0, 0], sites=unsteady), ())[0] == []
    one = [None, (site("a", big),)]
    assert steady_sites(rounds([0, 0], sites=one), ()) == ([], 1)
    small = [None, (site("a", MIN_SITE_EXCESS - 1),), (site("a", MIN_SITE_EXCESS - 1),)]
    assert steady_sites(rounds([0, 0, 0], sites=small), ())[0] == []
    exact = [None, (site("a", MIN_SITE_EXCESS),), (site("a", MIN_SITE_EXCESS),)]
    assert len(steady_sites(rounds([0, 0, 0], sites=exact), ())[0]) == 1


def test_steady_sites_come_most_first():
    a, b = MIN_SITE_EXCESS * 2, MIN_SITE_EXCESS * 8
    tracked = [None, (site("a", a), site("b", b)), (site("a", a), site("b", b))]
    assert [g.site.function for g in steady_sites(rounds([0, 0, 0], sites=tracked), ())[0]] == ["b", "a"]


def test_the_sites_criterion_fails_only_when_steady_sites_exceed_the_tolerance_and_the_floor_rose():
    keep = 8 * MB
    tracked = [None, (site("keep", keep),), (site("keep", keep),), (site("keep", keep),)]
    rising = run_of(rounds([100 * MB, 101 * MB, 102 * MB, 103 * MB], sites=tracked))
    c = criterion(judge(rising, None), "sites")
    assert c.passed is False and c.figures["steady_bytes_per_round"] == keep
    assert c.figures["allowance_bytes"] == round(0.03 * 100 * MB)
    flat = run_of(rounds([100 * MB] * 4, sites=tracked))
    c = criterion(judge(flat, None), "sites")
    assert c.passed is True and "did not rise" in c.message
    roomy = run_of(rounds([1000 * MB, 1001 * MB, 1002 * MB, 1003 * MB], sites=tracked))
    c = criterion(judge(roomy, None, tolerance_pct=1.0), "sites")
    assert c.passed is True and "within the allowance" in c.message
    recorded = criterion(judge(rising, None, compare=False), "sites")
    assert recorded.passed is None


def test_the_sites_criterion_takes_the_baselines_reference_floor():
    keep = 8 * MB
    tracked = [None, (site("keep", keep),), (site("keep", keep),), (site("keep", keep),)]
    run = run_of(rounds([100 * MB, 101 * MB, 102 * MB, 103 * MB], sites=tracked))
    base = baseline_of(rounds([1000 * MB, 1000 * MB, 1000 * MB]))
    c = criterion(judge(run, base), "sites")
    assert c.figures["allowance_bytes"] == round(0.03 * 1000 * MB) and c.passed is True


def test_the_sites_criterion_needs_two_tracked_rounds_and_passes_without_a_steady_site():
    one = run_of(rounds([0, 0], sites=[None, (site("a", MB),)]))
    assert criterion(judge(one, None), "sites").passed is None
    none_kept = run_of(rounds([0, 0, 0], sites=[None, (), ()]))
    assert criterion(judge(none_kept, None), "sites").passed is True
    assert criterion(judge(none_kept, None, compare=False), "sites").passed is None


def test_grown_sites_are_those_holding_more_than_the_baseline_by_the_least_excess_most_first():
    e = MIN_SITE_EXCESS
    mine = rounds([0, 0, 0], sites=[None, (site("a", 2 * e), site("b", 6 * e), site("c", e - 2)),
                                    (site("a", 4 * e), site("b", 6 * e))])
    theirs = rounds([0, 0], sites=[None, (site("b", 2 * e),)])
    grown = grown_sites(mine, theirs)
    assert [(g.site.function, g.per_round, g.baseline_per_round) for g in grown] == [
        ("b", 6 * e, 2 * e), ("a", 3 * e, 0.0)]
    assert grown[1].site.bytes == 4 * e  # the round that held most


# -- a batch command -------------------------------------------------------------------------------------


def batch(peaks, **kw):
    return run_of(rounds([0] * len(peaks), peaks=peaks, **{k: v for k, v in kw.items() if k == "cut"}),
                  settings={"mode": "batch"}, **{k: v for k, v in kw.items() if k != "cut"})


def test_a_batch_passes_while_the_median_peak_stays_within_the_tolerance_of_the_baselines():
    base = baseline_of(rounds([0, 0, 0, 0], peaks=[0, 100, 100, 100]))
    ok = judge(batch([0, 90, 103, 200]), base)
    c = criterion(ok, "rss-peak")
    assert c.passed is True and c.figures["median_bytes"] == 103 and c.figures["limit_bytes"] == 103
    assert ok.passed
    bad = judge(batch([0, 90, 104, 200]), base)
    assert criterion(bad, "rss-peak").passed is False and not bad.passed


def test_a_batch_median_of_an_even_count_and_without_the_reference_round():
    base = baseline_of(rounds([0, 0, 0], peaks=[0, 100, 100]))
    c = criterion(judge(batch([1000, 100, 104]), base), "rss-peak")
    assert c.figures["median_bytes"] == 102 and c.passed is True


def test_a_batch_that_failed_fails_its_command_criterion():
    v = judge(batch([0, 10, 10], stopped="exit 3", stopped_by="service", exit_status=3), None)
    c = criterion(v, "command")
    assert c.passed is False and c.message == "exit 3" and not v.passed
    ok = criterion(judge(batch([0, 10, 10]), None), "command")
    assert ok.passed is True and "3 runs" in ok.message


def test_a_batch_without_a_baseline_or_recorded_is_not_judged():
    assert criterion(judge(batch([0, 10, 10]), None), "rss-peak").passed is None
    base = baseline_of(rounds([0, 0], peaks=[0, 1]))
    assert criterion(judge(batch([0, 10, 10]), base, compare=False), "rss-peak").passed is None
    assert criterion(judge(batch([0, None, None]), base), "rss-peak").passed is None


def test_a_batch_round_cut_short_is_named_and_left_out_of_the_median():
    base = baseline_of(rounds([0, 0], peaks=[0, 100]))
    v = judge(batch([0, 100, 900], cut=(2,)), base)
    assert criterion(v, "rss-peak").figures["median_bytes"] == 100
    assert v.round_failures == {2: "failed"}


def test_a_batch_that_holds_more_at_its_end_fails_its_retained_criterion_alone():
    base = baseline_of(rounds([0, 50, 50, 50], peaks=[0, 100, 100, 100]))
    v = judge(run_of(rounds([0, 50, 80, 80], peaks=[0, 100, 100, 100]), settings={"mode": "batch"}), base)
    assert criterion(v, "rss-peak").passed is True
    c = criterion(v, "rss-retained")
    assert c.passed is False and c.figures["median_bytes"] == 80 and c.figures["limit_bytes"] == 52
    assert "held at its end" in c.message and not v.passed
    same = judge(run_of(rounds([0, 50, 51, 51], peaks=[0, 100, 100, 100]), settings={"mode": "batch"}), base)
    assert criterion(same, "rss-retained").passed is True and same.passed


def test_a_batch_baseline_that_recorded_its_ends_otherwise_does_not_judge_them():
    base = dataclasses.replace(baseline_of(rounds([0, 50, 50], peaks=[0, 100, 100])), settings={"mode": "batch"})
    v = judge(run_of(rounds([0, 90, 90], peaks=[0, 100, 100]),
                     settings={"mode": "batch", "retained_from_last": 3}), base)
    c = criterion(v, "rss-retained")
    assert c.passed is None and "write it again with --update-baseline" in c.message and v.passed


# -- the edges -------------------------------------------------------------------------------------------


def test_a_trend_within_the_allowance_names_no_round_even_one_that_jumped():
    # one step of 5 MB in six rounds: the slope (about 1.25 MB a round) is within 3 MB
    v = judge(run_of(rounds([100 * MB, 100 * MB, 100 * MB, 105 * MB, 105 * MB, 105 * MB])), None)
    assert criterion(v, "rss-growth").passed is True
    assert v.round_failures == {}


def test_a_round_that_grew_exactly_the_limit_is_not_named():
    v = judge(run_of(rounds([100, 103, 110, 117])), None)  # 3 % of 100: 3 bytes a round allowed
    assert criterion(v, "rss-growth").passed is False
    assert sorted(v.round_failures) == [2, 3]


def test_a_warm_up_round_zero_and_one_judged_round_are_judged():
    rs = (Round(0, True, 1.0, {"rss": Memory(100 * MB)}), Round(1, False, 1.0, {"rss": Memory(150 * MB)}))
    assert criterion(judge(run_of(rs), None), "rss-growth").passed is False


def test_requests_counted_by_one_run_only_leave_the_baselines_growth_as_it_is():
    base = baseline_of(rounds([100 * MB, 110 * MB, 120 * MB]))
    run = run_of(rounds([100 * MB, 120 * MB, 140 * MB], requests=[None, 20, 20]))
    c = criterion(judge(run, base), "rss-growth")
    assert c.figures["expected_growth_per_round_bytes"] == 10 * MB
    assert "requests per round" not in c.message
    base = baseline_of(rounds([100 * MB, 110 * MB, 120 * MB], requests=[None, 10, 10]))
    c = criterion(judge(run_of(rounds([100 * MB, 120 * MB, 140 * MB])), base), "rss-growth")
    assert c.figures["expected_growth_per_round_bytes"] == 10 * MB


def test_a_noiseless_run_without_a_baseline_has_no_noise_or_uncertainty_in_its_figures():
    c = criterion(judge(run_of(rounds([100, 100, 100])), None), "rss-growth")
    assert c.figures["noise_bytes"] == 0 and c.figures["uncertainty_bytes"] == 0
    assert c.figures["baseline_growth_per_round_bytes"] is None
    assert c.figures["allowance_bytes"] == 3


def test_the_growth_per_request_is_kept_to_two_decimals():
    c = criterion(judge(run_of(rounds([0, 1, 2], requests=[None, 3, 3])), None), "rss-growth")
    assert c.figures["growth_per_request_bytes"] == 0.33


def test_without_a_reference_floor_no_growth_is_allowed():
    # round 0 read no RSS: a slow rise (a byte every 50 rounds) is more than the nothing allowed
    rs = (Round(0, False, 1.0, {}),) + tuple(Round(n, False, 1.0, {"rss": Memory(n // 50)}) for n in range(1, 101))
    v = judge(run_of(rs), None)
    assert 0 < v.growth["rss"].per_round < 0.03
    assert criterion(v, "rss-growth").passed is False


def test_a_baseline_growing_no_more_than_zero_is_not_said_to_be_scaled():
    for shrinking in ([100 * MB, 95 * MB, 90 * MB], [100 * MB, 100 * MB, 100 * MB]):
        c = criterion(judge(run_of(rounds([100 * MB, 101 * MB, 102 * MB])), baseline_of(rounds(shrinking))),
                      "rss-growth")
        assert c.figures["expected_growth_per_round_bytes"] == 0
        assert "requests per round" not in c.message


def test_a_service_that_ran_through_or_stopped_on_its_own_says_which():
    rs = rounds([100, 100, 100])
    assert "ran through all" in criterion(judge(run_of(rs), None), "command").message
    early = criterion(judge(run_of(rs, stopped="the time ran out"), None), "command")
    assert early.passed is True and "until the rounds stopped" in early.message


def test_a_failed_load_says_why_and_which_exit_status():
    rs = rounds([100, 100]) + (Round(2, False, 1.0, {"rss": Memory(100)}, load_exit=7, completed=False),)
    c = criterion(judge(run_of(rs, stopped_by="load", settings={"load": "x"}), None), "load")
    assert c.passed is False and c.message == "the load command failed" and c.figures == {"exit_status": 7}
    never = criterion(judge(run_of(rounds([100, 100]), settings={"load": "x"}), None), "load")
    assert never.message == "the load command never ran (no round ran)"


def test_a_leak_without_a_measured_growth_is_named_after_one_with_growth():
    leaks = {"rss": assessment("leak", None, "unmeasured"), "gpu0": assessment("leak", 0.5, "measured")}
    c = criterion(judge(run_of(rounds([100, 100]), leak=leaks), None), "leak")
    assert "GPU 0" in c.message


def test_a_site_kept_at_exactly_the_steady_share_of_its_largest_is_steady():
    top = 10 * MB
    assert 0.9 * top == 9437184  # exact in binary
    tracked = [None, (site("a", int(top)),), (site("a", 9437184),)]
    assert len(steady_sites(rounds([0, 0, 0], sites=tracked), ())[0]) == 1
    tracked = [None, (site("a", int(top)),), (site("a", 9437183),)]
    assert steady_sites(rounds([0, 0, 0], sites=tracked), ())[0] == []


def test_sites_tracked_in_round_zero_are_not_a_judged_round():
    big = MIN_SITE_EXCESS * 4
    tracked = [(), (site("keep", big),), (site("keep", big),)]
    steady, n = steady_sites(rounds([0, 0, 0], sites=tracked), ())
    assert n == 2 and len(steady) == 1
    grown = grown_sites(rounds([0, 0], sites=[(site("keep", 100 * big),), (site("keep", big),)]), ())
    assert grown[0].per_round == big


def test_steady_sites_keeping_exactly_the_allowance_pass():
    keep = 3 * (1 << 20)  # 3 % of 100 MiB
    tracked = [None, (site("keep", keep),), (site("keep", keep),), (site("keep", keep),)]
    floors = [100 * (1 << 20) + n for n in range(4)]
    c = criterion(judge(run_of(rounds(floors, sites=tracked)), None), "sites")
    assert c.figures["allowance_bytes"] == keep and c.passed is True and "within the allowance" in c.message
    tracked = [None] + [(site("keep", keep + 1),)] * 3
    assert criterion(judge(run_of(rounds(floors, sites=tracked)), None), "sites").passed is False


def test_a_floor_rising_a_byte_a_round_counts_as_rising_for_the_sites():
    keep = 8 * MB
    tracked = [None] + [(site("keep", keep),)] * 3
    floors = [100 * MB + n for n in range(4)]
    assert criterion(judge(run_of(rounds(floors, sites=tracked)), None), "sites").passed is False


def test_the_sites_criterion_names_the_baseline_only_against_one():
    keep = 8 * MB
    tracked = [None] + [(site("keep", keep),)] * 3
    run = run_of(rounds([100 * MB + n for n in range(4)], sites=tracked))
    assert "baseline" not in criterion(judge(run, None), "sites").message
    assert ", baseline" in criterion(judge(run, baseline_of(rounds([100 * MB] * 3))), "sites").message


def test_a_site_holding_exactly_the_least_excess_has_grown():
    mine = rounds([0, 0], sites=[None, (site("a", MIN_SITE_EXCESS),)])
    assert [g.site.function for g in grown_sites(mine, ())] == ["a"]


def test_the_example_of_a_site_is_the_first_round_that_held_most():
    first, later = Site("a", "app.py", 1, MB, count=1), Site("a", "app.py", 1, MB, count=2)
    grown = grown_sites(rounds([0, 0, 0], sites=[None, (first,), (later,)]), ())
    assert grown[0].site.count == 1


def test_the_growth_is_said_per_request_only_when_requests_were_counted():
    counted = criterion(judge(run_of(rounds([0, 10, 20], requests=[None, 5, 5])), None), "rss-growth")
    assert "per request" in counted.message
    assert "per request" not in criterion(judge(run_of(rounds([0, 10, 20])), None), "rss-growth").message
