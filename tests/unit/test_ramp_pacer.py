"""The ramp's pacer: send times at a rate, and a step to a new rate that sends no burst."""

from __future__ import annotations

import threading
import time

from gpuscope.core.ramp.load import Pacer


def test_a_new_rate_starts_a_period_after_the_last_slot_used_not_at_once():
    """A step up right after a request was sent: the next one waits the new period (the old pacer
    sent it at once, two requests back to back that a one-worker service queues)."""
    pacer = Pacer()
    before = time.monotonic()
    pacer.set_rate(1.0)
    assert pacer.wait()  # the first slot: at once
    pacer.set_rate(2.0)
    assert pacer.wait()
    assert time.monotonic() - before >= 0.5


def test_slots_come_at_the_rate_and_stop_ends_the_waits():
    pacer = Pacer()
    before = time.monotonic()
    pacer.set_rate(20.0)
    for _ in range(5):
        assert pacer.wait()
    assert time.monotonic() - before >= 4 / 20  # five slots span four periods
    waiting = threading.Thread(target=lambda: results.append(pacer.wait()))
    results: list[bool] = []
    pacer.set_rate(0.001)  # the next slot in ~17 minutes
    waiting.start()
    pacer.stop()
    waiting.join(10)
    assert results == [False]


def test_a_slot_woken_late_is_let_go_so_a_starved_client_sends_no_burst():
    """A worker that cannot run past its slot (here: the pacer's lock held from elsewhere, as a
    starved process would be) lets the slot go: after it, requests come a period apart again,
    not the missed ones back to back."""
    pacer = Pacer()
    pacer.set_rate(5.0)  # a slot every 200 ms
    assert pacer.wait()
    returned: list[float] = []

    def worker() -> None:
        for _ in range(2):
            assert pacer.wait()
            returned.append(time.monotonic())

    taken = pacer._next
    waiting = threading.Thread(target=worker)
    waiting.start()
    while pacer._next == taken:  # until the worker holds its slot and waits for it
        time.sleep(0.01)
    with pacer._changed:  # its slot and the next pass while it cannot run
        time.sleep(0.7)
        released = time.monotonic()
    waiting.join(10)
    assert len(returned) == 2
    assert returned[1] - released >= 0.2  # the old pacer sent two at once, as soon as it could
