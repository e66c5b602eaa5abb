"""The leak watch's shortcuts for flat series give what the full analysis gives.

Most series of a node are flat most of the time (an idle process's GPU memory), so the watch
judges a horizon whose samples are all alike without the fits, passes over a short horizon that
is all alike (its "flat" never changes the combined view), and the GROW column reads a flat floor
without a fit. These tests run the same series through the shortcuts and through the full analysis and
ask for equal results, so a shortcut can never say something the analysis would not.
"""

from __future__ import annotations

import math
import random

import pytest

from gpuscope.core.leak import _analysis as leak
from gpuscope.core.leak import FloorSketch, LeakThresholds, LeakWatch, floor_growth

MB = 1e6


def shapes(seed: int) -> dict[str, list[tuple[float, float]]]:
    """Series of (time, value) that are flat for part or all of their length, with uneven ticks."""
    rnd = random.Random(seed)
    out: dict[str, list[tuple[float, float]]] = {}
    t = 1000.0
    times = []
    for _ in range(400):
        t += rnd.choice((1.0, 1.0, 1.0, 0.5, 2.0, 3.7))
        times.append(t)
    out["flat"] = [(t, 256 * MB) for t in times]
    out["step, then flat"] = [(t, 100 * MB if i < 150 else 300 * MB) for i, t in enumerate(times)]
    # Steps while the series is young (a short horizon sees them before the whole series does).
    out["early steps"] = [(t, 100 * MB + 200 * MB * (i >= 30) + 50 * MB * (i >= 52)) for i, t in enumerate(times)]
    out["noise, then flat"] = [(t, 50 * MB + (rnd.random() * MB if i < 200 else 0)) for i, t in enumerate(times)]
    out["growth, then flat"] = [(t, 10 * MB + min(i, 120) * MB) for i, t in enumerate(times)]
    out["flat, then growth"] = [(t, 10 * MB + max(0, i - 300) * MB) for i, t in enumerate(times)]
    out["sawtooth"] = [(t, 80 * MB + (i % 10) * 20 * MB) for i, t in enumerate(times)]
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_a_flat_horizon_is_judged_as_the_full_analysis_judges_it(seed):
    th = LeakThresholds()
    shortcuts = 0
    for name, series in shapes(seed).items():
        sketch = FloorSketch(window_s=6 * 3600.0)
        for i, (t, v) in enumerate(series):
            sketch.add(t, v)
            if i % 7 and i > 20:
                continue
            for h in leak._horizons(sketch, th):
                end = sketch.last_time
                for buckets in (sketch.recent(end - h - 1e-9 * max(1.0, abs(end))), list(sketch.buckets())):
                    quick = leak._analyse_flat(buckets, h, th)
                    if quick is None:
                        continue
                    shortcuts += 1
                    assert quick == leak._analyse(buckets, h, th, sketch.ref, sketch.noise(), sketch.origin), name
    assert shortcuts > 100  # the shortcut was taken, not only passed over


def test_the_watch_says_the_same_with_and_without_the_shortcut(monkeypatch):
    def run() -> list[dict]:
        watch = LeakWatch()
        seen = []
        series = shapes(3)
        for i in range(400):
            for name, points in series.items():
                t, v = points[i]
                watch.add(name, t, v, total_bytes=1000 * MB)
            watch.update()
            seen.append(watch.assessments())
            seen.append({name: watch.recent_growth(name, 30.0) for name in series})
        return seen

    with_shortcuts = run()
    monkeypatch.setattr(leak, "_analyse_flat", lambda buckets, horizon, th: None)
    monkeypatch.setattr(FloorSketch, "flat_since", property(lambda sketch: math.inf))  # never skip a horizon
    assert run() == with_shortcuts


@pytest.mark.parametrize("seed", range(5))
def test_a_flat_floor_grows_by_what_theil_sen_finds(seed, monkeypatch):
    rnd = random.Random(seed)
    cases = []
    for n in range(1, 40):
        t = 0.0
        times = []
        for _ in range(n):
            t += rnd.choice((0.25, 1.0, 2.0))
            times.append(t)
        cases.append((times, [7 * MB] * n))
    quick = [floor_growth(FloorSketch.of(times, values)) for times, values in cases]
    monkeypatch.setattr(FloorSketch, "flat_since", property(lambda sketch: math.inf))  # never the shortcut
    assert [floor_growth(FloorSketch.of(times, values)) for times, values in cases] == quick
    assert quick.count(0.0) > 20 and None in quick
