"""Each of the rules' ramp conditions alone, on a staircase that only it turns away (run by
`promtool test rules`, scraped every 15 s): "the floor rose at every slice" and "no slice
carries more than `max_jump_share` of the rise". Either condition missing, the shape fires."""

from __future__ import annotations

from gpuscope.core.leak import LeakThresholds
from test_leak import MB
from test_rules import firing, gpu_series, promtool_test, values

TH = LeakThresholds()


def staircase(step_s: float, height: float, slope: float = 0.0):
    return lambda t: slope * t + height * (t // step_s)


def test_a_staircase_with_a_flat_slice_in_every_window_is_no_ramp(tmp_path):
    """100 MB every minute (1.7 MB/s, over twice the 5-minute rule's rate): six 50 s slices see
    four or five steps, so one slice-to-slice rise is nearly always zero, while none of the others
    carries more than a third of the rise. Only "the floor rose at every slice" keeps it silent."""
    assert TH.alert_rate(300) * TH.rate_margin < 100 * MB / 60 and TH.max_jump_share > 1 / 3
    checks = [firing(minute, []) for minute in (6, 8, 10, 12, 15, 20)]
    done = promtool_test(tmp_path, gpu_series(values(staircase(60, 100 * MB), 20, seed=3, noise=0)), checks)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_slow_ramp_with_one_large_step_per_window_is_no_leak(tmp_path):
    """0.2 MB/s (under the 5-minute rule's rate) and 400 MB at once every 6 minutes: every slice
    rises, the slope of the floors is far above the rate, but one step carries most of the rise.
    Only "no slice carries more than max_jump_share of the rise" keeps it silent."""
    assert TH.alert_rate(300) * TH.rate_margin > 0.2 * MB
    checks = [firing(minute, []) for minute in (7, 8, 9, 10, 13, 14, 15, 16, 20)]
    done = promtool_test(tmp_path, gpu_series(values(staircase(360, 400 * MB, slope=0.2 * MB), 20, seed=3, noise=0)),
                         checks)
    assert done.returncode == 0, done.stdout + done.stderr
