"""`gpuscope rules`: the leak test as Prometheus rules, run by `promtool test rules` (Debian's
prometheus package) over series of the same shapes the detector's tests use (tests/integration/test_leak.py),
scraped every 15 s and evaluated every minute: the rules fire for the leaks and stay silent for the step, the sawtooth, the
square wave, the warm-up once it has plateaued, a falling floor and noise; and scraped every 5 s:
a 4 MB/s leak fires within 2 minutes, a 300 MB cache, big temporaries, sawtooths and a warm-up
never do, and the alert and the recorded trend end at the process's exit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuscope.core.leak import LeakThresholds
from gpuscope.core.fleet.rules import render_rules
from helpers import gpuscope_cmd, require_tool
from test_leak import GB, MB, sawtooth, series, warm_up

SCRAPE_S = 15
ALERT = "GpuscopeLeakProcessGpuMemory"
PROCESS = 'node="node-a",pid="4242",start_time="1.00"'
LABELS = PROCESS + ',user="svc",pod_uid="",container_id="",gpu="0"'
INFO = (f'gpuscope_process_info{{{PROCESS},command="python serve.py",user="svc",pod_uid="",container_id="",'
        f'runs_in="rag.service"}}')


def rules_text(th: LeakThresholds = LeakThresholds()) -> str:
    return render_rules(th, ttft_p95_s=0.8, e2e_latency_p95_s=4.0)


def values(shape, minutes: float, *, seed: int, noise: float = 5 * MB, base: float = 20 * GB,
           every: float = SCRAPE_S, bursts: float = 0.0) -> str:
    _, vs = series(minutes * 60, shape, seed=seed, noise=noise, base=base, every=every, bursts=bursts)
    return " ".join(f"{max(v, 0.0):.0f}" for v in vs)


def firing(minute: float, horizons: list[str], alert: str = ALERT) -> str:
    samples = "".join(f"          - labels: '{{horizon=\"{h}\"}}'\n            value: 1\n" for h in horizons)
    return (f"      - expr: count by (horizon) (ALERTS{{alertname=\"{alert}\",alertstate=\"firing\"}})\n"
            f"        eval_time: {round(minute * 60)}s\n        exp_samples:\n" + (samples or "          []\n"))


def promtool_test(tmp_path: Path, input_series: list[tuple[str, str]], checks: list[str],
                  rules: str | None = None, every: int = SCRAPE_S,
                  evaluated_every: int | None = None) -> subprocess.CompletedProcess:
    """`promtool test rules` over series scraped `every` seconds, the rules evaluated every
    `evaluated_every` (default: at each scrape). promtool steps at that interval, so a group with
    a shorter interval of its own is evaluated only that often."""
    promtool = require_tool("promtool")
    (tmp_path / "rules.yml").write_text(rules if rules is not None else rules_text())
    inputs = "".join(f"      - series: '{name}'\n        values: '{vals}'\n" for name, vals in input_series)
    (tmp_path / "test.yml").write_text(
        f"rule_files: [rules.yml]\nevaluation_interval: {evaluated_every or every}s\ntests:\n"
        f"  - interval: {every}s\n    input_series:\n{inputs}    promql_expr_test:\n" + "".join(checks)
    )
    return subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def gpu_series(vals: str) -> list[tuple[str, str]]:
    """The process's GPU memory and its info series (the command the alert carries), as long as the memory."""
    return [(f"gpuscope_process_gpu_memory_bytes{{{LABELS}}}", vals), (INFO, f"1x{len(vals.split()) - 1}")]


# (shape, minutes of data, {minute: horizons firing}) - the detector's verdicts on the same shapes
# are in tests/integration/test_leak.py: leaks there are leaks here, the rest is silent here.
# Evaluated every minute (Prometheus's default): hours of series evaluated every 15 s took promtool
# four times the CPU and decided the same.
SHAPES = {
    "fast-leak-5MB/s": (lambda t: 5 * MB * t, 20, {4: [], 12: ["5m"], 20: ["5m"]}),
    "leak-1MB/s": (lambda t: 1 * MB * t, 40, {12: ["5m"], 40: ["30m", "5m"]}),
    "slow-leak-0.2MB/s-3h": (lambda t: 0.2 * MB * t, 180, {60: [], 130: ["2h"], 180: ["2h"]}),
    "sawtooth-with-rising-floor": (sawtooth(20, 300 * MB, floor_rate=0.5 * MB), 45, {20: [], 40: ["30m"]}),
    "step-then-plateau": (lambda t: 2 * GB if t >= 12 else 0.0, 60, {2: [], 5: [], 10: [], 30: [], 60: []}),
    "sawtooth-flat-floor": (sawtooth(20, 300 * MB), 60, {5: [], 10: [], 30: [], 60: []}),
    "square-wave-buffers": (lambda t: 500 * MB if (t % 30) < 12 else 0.0, 60, {5: [], 30: [], 60: []}),
    "short-warm-up": (warm_up(60, 1.5 * GB), 60, {2: [], 5: [], 10: [], 30: [], 60: []}),
    "warm-up-after-plateau": (warm_up(300, 1.5 * GB), 60, {15: [], 30: [], 60: []}),
    "falling-floor": (lambda t: -0.5 * MB * t, 60, {10: [], 30: [], 60: []}),
    "flat-noise": (lambda t: 0.0, 60, {5: [], 30: [], 60: []}),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_leak_rules_fire_for_leaks_and_stay_silent_otherwise(tmp_path, name):
    shape, minutes, expected = SHAPES[name]
    checks = [firing(minute, horizons) for minute, horizons in expected.items()]
    done = promtool_test(tmp_path, gpu_series(values(shape, minutes, seed=11)), checks, evaluated_every=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dcgm_memory_is_judged_only_where_no_gpuscope_exporter_answers(tmp_path):
    ramp = values(lambda t: 2 * MB * t, 20, seed=3, base=1 * GB)
    mib = " ".join(str(round(float(v) / 1048576)) for v in ramp.split())
    inputs = [
        ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",Hostname="node-a"}', mib),
        ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-b",Hostname="node-b"}', mib),
        # node-b runs the gpuscope exporter: its per-process rules speak for it
        ('gpuscope_gpu_memory_used_bytes{node="node-b",gpu="0",uuid="GPU-b",name="H200"}', ramp),
    ]
    check = ("      - expr: count by (Hostname) (ALERTS{alertname=\"GpuscopeLeakGpuMemory\",alertstate=\"firing\"})\n"
             "        eval_time: 15m\n        exp_samples:\n          - labels: '{Hostname=\"node-a\"}'\n"
             "            value: 1\n")
    done = promtool_test(tmp_path, inputs, [check])
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_thresholds_come_from_the_alerts_settings(tmp_path):
    # 1 MB/s for 12 minutes is a leak by default (above) and not with a fast rule ten times higher.
    slower = LeakThresholds(fast_rate=50e6)
    checks = [firing(12, [])]
    done = promtool_test(tmp_path, gpu_series(values(lambda t: 1 * MB * t, 12, seed=11)), checks, rules_text(slower))
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_command_writes_checked_rules_and_follows_the_output_rule(tmp_path):
    promtool = require_tool("promtool")
    config = tmp_path / "config.toml"
    config.write_text("[alerts]\nfast_rate = 50000000\n")
    out = tmp_path / "gpuscope.rules.yml"
    run = lambda *a: subprocess.run([*gpuscope_cmd(), "--config", str(config), "rules", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    done = run("-o", str(out))
    assert done.returncode == 0, done.stderr
    assert subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, timeout=60).returncode == 0
    assert "alert rate 50 MB/s for 10 s" in out.read_text()
    again = run("-o", str(out))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--force" in again.stderr
    assert run("-o", str(out), "--force").returncode == 0
    stdout = run("-o", "-")
    assert stdout.returncode == 0 and stdout.stdout == out.read_text()
    assert run("-o", str(tmp_path)).returncode == 2  # a folder is not a regular file


# Scraped every 5 s, the one-minute horizon sees fast leaks: the shapes of the fleet's targets.
FAST_S = 5
CACHE = 300 * MB


def fast_checks(expected: dict[float, list[str]]) -> list[str]:
    return [firing(minute, horizons) for minute, horizons in expected.items()]


# (shape, minutes of data, {minute: horizons firing}, bursts)
FAST_SHAPES = {
    # 4 MB/s from the first sample: firing by 2 minutes (the one-minute horizon), not at 1 minute
    "fast-leak-4MB/s": (lambda t: 4 * MB * t, 4, {1: [], 2: ["1m"], 4: ["1m"]}, 0.0),
    # a 300 MB cache filled in 60 s, then held
    "cache-300MB-fills-and-stays": (warm_up(60, CACHE), 20, {m: [] for m in (1, 1.5, 2, 3, 5, 10, 20)}, 0.0),
    # big temporaries (50 MB - 1 GB, 5-25 s, at random) over a flat floor
    "flat-with-big-temporaries": (lambda t: 0.0, 30, {m: [] for m in range(1, 31)}, 0.05),
    # a sawtooth filling 300 MB in 60 s, again and again (judged just before each drop)
    "sawtooth-60s": (sawtooth(60, CACHE), 20, {m + 55 / 60: [] for m in range(0, 20)}, 0.0),
    # one filling 300 MB in 120 s: its first fill is a ramp to a new high, the next ones only refill
    "sawtooth-120s-after-its-first-fill": (sawtooth(120, CACHE), 20, {m + 115 / 60: [] for m in range(2, 19, 2)},
                                           0.0),
    # a climb of 2 minutes at 5 MB/s looks like a leak while it climbs; 40 s after it stopped it does not
    "climb-then-plateau": (warm_up(120, 600 * MB), 6, {1.75: ["1m"], 2.75: [], 3.5: [], 6: []}, 0.0),
    # a model loaded in 60 s (1.5 GB), then held
    "warm-up-60s": (warm_up(60, 1.5 * GB), 10, {m: [] for m in (1, 1.25, 1.5, 2, 3, 5, 10)}, 0.0),
}


@pytest.mark.parametrize("name", list(FAST_SHAPES))
def test_scraped_every_5s_a_fast_leak_fires_within_2_minutes_and_the_other_shapes_never(tmp_path, name):
    shape, minutes, expected, bursts = FAST_SHAPES[name]
    vals = values(shape, minutes, seed=5, every=FAST_S, bursts=bursts)
    done = promtool_test(tmp_path, gpu_series(vals), fast_checks(expected), every=FAST_S)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alert_resolves_and_the_recorded_trend_ends_at_the_exit(tmp_path):
    # 4 MB/s for 4 minutes, then the process exits: its series go stale at the next scrape.
    vals = values(lambda t: 4 * MB * t, 4, seed=5, every=FAST_S).split()
    n = len(vals) - 1
    inputs = [(f"gpuscope_process_gpu_memory_bytes{{{LABELS}}}", " ".join(vals) + " stale"),
              (INFO, f"1x{n} stale")]
    exited = (n + 1) * FAST_S  # seconds: the first scrape without the process
    record = "gpuscope:process_gpu_memory_bytes:floor_deriv1m"
    checks = [
        firing(n * FAST_S / 60, ["1m"]),
        f"      - expr: count({record})\n        eval_time: {n * FAST_S}s\n        exp_samples:\n"
        "          - labels: '{}'\n            value: 1\n",
        firing((exited + FAST_S) / 60, []),
        f"      - expr: {record}\n        eval_time: {exited + FAST_S}s\n        exp_samples: []\n",
        f"      - expr: ALERTS{{alertname=\"{ALERT}\"}}\n        eval_time: {exited + FAST_S}s\n        exp_samples: []\n",
    ]
    done = promtool_test(tmp_path, inputs, checks, every=FAST_S)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alert_carries_the_command_and_where_it_runs_from_the_info_series(tmp_path):
    vals = values(lambda t: 4 * MB * t, 3, seed=5, every=FAST_S)
    check = ("      - expr: count by (command, runs_in) (ALERTS{alertstate=\"firing\"})\n"
             "        eval_time: 3m\n        exp_samples:\n"
             "          - labels: '{command=\"python serve.py\", runs_in=\"rag.service\"}'\n            value: 1\n")
    done = promtool_test(tmp_path, gpu_series(vals), [check], every=FAST_S)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_warm_up_then_a_slow_creep_never_fires(tmp_path):
    # 300 MB in 60 s, then 0.3 MB/s (fragmentation, a log buffer): every floor after the warm-up is
    # above the one before, but by a sliver of the horizon's rise, which is no ramp.
    shape = lambda t: 300 * MB * min(t, 60) / 60 + 0.3 * MB * max(0.0, t - 60)  # noqa: E731
    vals = values(shape, 10, seed=5, every=FAST_S, noise=0.2 * MB)
    checks = fast_checks({m / 60: [] for m in range(60, 601, 10)})
    done = promtool_test(tmp_path, gpu_series(vals), checks, every=FAST_S)
    assert done.returncode == 0, done.stdout + done.stderr


def test_one_step_in_slow_growth_never_fires(tmp_path):
    # 1.5 MB/s (under the 1-minute horizon's leak rate) and one 150 MB step: the step carries most
    # of the horizon's rise, which is no ramp, though the slope through it is over the rate.
    shape = lambda t: 1.5 * MB * t + (150 * MB if t >= 100 else 0.0)  # noqa: E731
    vals = values(shape, 4, seed=5, every=FAST_S, noise=0.2 * MB)
    done = promtool_test(tmp_path, gpu_series(vals), fast_checks({m / 60: [] for m in range(100, 241, 10)}),
                         every=FAST_S)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_rise_under_flat_bytes_is_flat_whatever_the_rate(tmp_path):
    # Thresholds low enough that 0.2 MB/s is over the 1-minute horizon's rate (53 kB/s): its rise
    # over that horizon, 10 MB, is under flat_bytes (16 MB), so it is flat there.
    th = LeakThresholds(fast_rate=1e5, slow_bytes=1e8)
    vals = values(lambda t: 0.2 * MB * t, 4, seed=5, every=FAST_S, noise=0.05 * MB)
    done = promtool_test(tmp_path, gpu_series(vals), fast_checks({m / 60: [] for m in range(60, 241, 10)}),
                         rules_text(th), every=FAST_S)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_cache_emptied_and_filled_again_over_minutes_fires_only_on_its_first_fill(tmp_path):
    # 600 MB filled in 4 minutes (2.5 MB/s, over the 1-minute horizon's rate), emptied, filled again:
    # the first fill climbs to a height never held before (growth while it climbs); each fill after
    # it only returns to where the one before was, which the 10 minutes looked back on before the
    # horizon see (one horizon back would see only the same fill, lower).
    vals = values(sawtooth(240, 600 * MB), 20, seed=5, every=FAST_S)
    checks = fast_checks({3: ["1m"], **{s / 60: [] for s in range(260, 1201, 10)}})
    done = promtool_test(tmp_path, gpu_series(vals), checks, every=FAST_S)
    assert done.returncode == 0, done.stdout + done.stderr
