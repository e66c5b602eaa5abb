"""Guarantees of the allocation trackers, on real processes under `gpuscope run` (its probe inside):
tracemalloc names only the sites whose held memory grew, never the working set that is merely
held when tracking ends; and the diagnosis's watch after a tracker that replies late ends at the
stop grace."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from gpuscope.core.diagnosis import investigation
from gpuscope.core.diagnosis import ladder as allocations
from gpuscope.core.diagnosis._probe_trackers import probe_tracemalloc_suspects
from gpuscope.core.diagnosis.attribution import Attribution
from gpuscope.core.target import probe_client
from helpers import gpuscope_cmd, wait_until

# `leak` keeps 50 kB each loop (about 1 MB/s); `work` builds a 24 MB working set each loop and
# drops the one before: at any moment it holds far more than `leak` has kept, and none of it stays.
WORKING_SET_AND_LEAK = """
    import time
    kept = []
    def leak():
        kept.append(bytearray(50_000))
    def work():
        return [bytearray(12_000_000) for _ in range(2)]
    working = work()
    print("ready", flush=True)
    while True:
        leak()
        working = work()
        time.sleep(0.05)
"""

MIN_SNAPSHOTS = 6  # what "grew over the tracking" needs: the first half against the last quarter

SLOW_LEAKER = """
    import time
    kept = []
    print("ready", flush=True)
    for _ in range(3000):  # bounded: at most 600 MB, over 5 min
        kept.append(bytearray(200_000)); time.sleep(0.1)
"""


def _start(tmp_path, name: str, code: str, *, probe: bool) -> subprocess.Popen:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(code))
    command = [sys.executable, str(script)]
    proc = subprocess.Popen(gpuscope_cmd() + ["run", "--", *command] if probe else command,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_tracemalloc_names_the_site_that_grew_not_the_working_set_held_at_the_end(tmp_path):
    proc = _start(tmp_path, "working_set", WORKING_SET_AND_LEAK, probe=True)
    try:
        wait_until(lambda: probe_client.probe_path(proc.pid), timeout=10, what="the probe")
        for seconds in (6.0, 12.0, 24.0):  # a loaded machine snapshots less often: track longer
            with probe_client.probe_for(proc.pid) as client:
                tracked = probe_tracemalloc_suspects(client, proc.pid, seconds)
            if len(tracked.times) >= MIN_SNAPSHOTS:
                break
    finally:
        proc.kill()
        proc.wait()
    assert len(tracked.times) >= MIN_SNAPSHOTS, tracked.times
    held = {s.function: s.held for s in tracked.sites}
    # The working set was there, larger than the leak's bytes, all along: what a tracker that named
    # whatever is held at the end would put first.
    assert "work" in held and "leak" in held, sorted(held)
    assert held["work"][-1] > held["leak"][-1], (held["work"][-4:], held["leak"][-4:])
    named = [(s.function, s.bytes) for s in tracked.suspects]
    assert named and named[0][0] == "leak", (named, held, tracked.times)
    # `work` may be named for the few bytes its list grew by, never for the working set it holds.
    assert all(size < 1_000_000 for function, size in named if function == "work"), named


def test_the_watch_after_a_tracker_that_replies_just_inside_the_grace_is_cut_at_the_grace(tmp_path, monkeypatch):
    """The tracker replies half a second before `duration + STOP_GRACE_S`: the watch that would
    otherwise follow it for `AFTER_MIN_S` ends at the grace. Measured from the reply, on the
    diagnosis's own clock, so a slow machine only makes the margin smaller, never the verdict."""
    duration = 8.0
    before, _ = investigation.schedule(duration)
    replied: list[float] = []
    proc = _start(tmp_path, "leaker", SLOW_LEAKER, probe=False)

    def late(pid, track, *, cancelled, **kwargs):
        began = time.time()
        reply_at = time.monotonic() + duration + investigation.STOP_GRACE_S - 0.5 - before
        while time.monotonic() < reply_at and not cancelled():
            time.sleep(0.05)
        replied.append(time.monotonic())
        return Attribution(pid, (), (), None, "none", window=(began, time.time()))

    monkeypatch.setattr(allocations, "attribute", late)
    try:
        investigation.investigate(proc.pid, duration)
        ended = time.monotonic()
    finally:
        proc.kill()
        proc.wait()
    assert replied, "the tracker never ran"
    # Unbounded, the watch would end AFTER_MIN_S after the reply or later.
    assert ended - replied[0] < investigation.AFTER_MIN_S, ended - replied[0]
