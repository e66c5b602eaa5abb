"""The poller: coalesced requests, one read at a time, a deadline, errors as values.

No sleeps and no timing assertions: reads block on events the test controls, and the clock
is injected.
"""

import threading

from gpuscope.core.common.poller import Poller, pace

from helpers import wait_until


class Gate:
    """A read that blocks until released, counting calls and concurrency."""

    def __init__(self):
        self.calls = 0
        self.active = 0
        self.max_active = 0
        self.release = threading.Event()
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            self.calls += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.entered.set()
        self.release.wait(10)
        with self.lock:
            self.active -= 1
        return self.calls


def test_requests_during_a_read_collapse_into_one():
    gate, readings = Gate(), []
    poller = Poller("t", gate, readings.append, timeout=60)
    poller.start()
    try:
        poller.request()
        assert gate.entered.wait(5)
        for _ in range(20):  # twenty ticks while the first read is stuck
            poller.request()
        gate.release.set()
        wait_until(lambda: len(readings) == 2, what="the read in flight and one coalesced read")
        assert gate.calls == 2 and gate.max_active == 1
    finally:
        poller.stop()


def test_a_read_past_its_deadline_is_reported_once_and_never_doubled():
    now = [0.0]
    gate, readings = Gate(), []
    poller = Poller("nvml", gate, readings.append, timeout=5, clock=lambda: now[0])
    poller.start()
    try:
        poller.request()
        assert gate.entered.wait(5)
        now[0] = 6.0
        poller.request()
        poller.request()
        overdue = [r for r in readings if r.error]
        assert len(overdue) == 1 and "nvml has not answered for 6.0 s" in overdue[0].error
        assert gate.calls == 1
        gate.release.set()
        wait_until(lambda: any(r.value for r in readings), what="the late reading")
        late = next(r for r in readings if r.value)
        assert late.late
    finally:
        poller.stop()


def test_an_exception_in_a_read_becomes_an_error_value():
    readings = []

    def broken():
        raise OSError("disk on fire")

    poller = Poller("host", broken, readings.append, timeout=5)
    poller.start()
    try:
        poller.request()
        wait_until(lambda: readings, what="a reading")
        assert readings[0].value is None and readings[0].error == "OSError: disk on fire"
        poller.request()  # the thread survived
        wait_until(lambda: len(readings) == 2, what="a second reading")
    finally:
        poller.stop()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_pace_backs_off_while_a_source_is_slow_and_recovers():
    clock, readings = Clock(), []
    took = {"s": 3.0}

    def read():
        clock.now += took["s"]  # the read "takes" this long on the injected clock
        return "ok"

    slow = Poller("slow", read, readings.append, timeout=60, clock=clock)
    fast = Poller("fast", lambda: "ok", readings.append, timeout=60, clock=clock)
    assert pace(1.0, [slow, fast]) == 1.0  # nothing read yet: the configured interval
    for p in (slow, fast):
        p.start()
        p.request()
    wait_until(lambda: len(readings) == 2, what="both reads")
    assert pace(1.0, [slow, fast]) == 6.0  # twice what the slow read took
    took["s"] = 30.0
    slow.request()
    wait_until(lambda: len(readings) == 3, what="the slower read")
    assert pace(1.0, [slow, fast]) == 8.0  # never slower than 8x the interval
    took["s"] = 0.1
    slow.request()
    wait_until(lambda: len(readings) == 4, what="a fast read again")
    assert pace(1.0, [slow, fast]) == 1.0
    for p in (slow, fast):
        p.stop()


def test_pace_counts_a_read_still_in_flight():
    clock, gate, readings = Clock(), Gate(), []
    poller = Poller("t", gate, readings.append, timeout=60, clock=clock)
    poller.start()
    poller.request()
    assert gate.entered.wait(10)
    clock.now += 2.5  # the read has been running for 2.5 s and has not answered
    assert pace(1.0, [poller]) == 5.0
    gate.release.set()
    wait_until(lambda: readings, what="the read")
    poller.stop()
