"""From the alert to the culprit in a real terminal, as an on-call engineer meets it on a busy
node: `gpuscope demo` runs a leaking service and attaches to it while another process on the
node grows faster. Once the service's alert is on screen, at most two keys, each announced where
the operator looks, diagnose the service itself (by its PID, whatever else grows) and put the
culprit's function and file:line on screen."""

import re
import subprocess
import sys

import psutil
import pytest

from helpers import gpuscope_cmd, wait_until

pytestmark = pytest.mark.terminal

MAX_KEYS = 2
# A program on the same node whose memory grows faster than the demo's leak (about 6 MB/s) for a
# minute, then stays: the console must not send the operator to it.
FASTER_GROWER = """
import sys, time
held = []
for _ in range(60):
    held.append(bytearray(12 << 20))
    for page in range(0, 12 << 20, 4096):
        held[-1][page] = 1
    time.sleep(1.0)
print("grown", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def faster_grower():
    proc = subprocess.Popen([sys.executable, "-c", FASTER_GROWER], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def demo_service_pid(tmux) -> int | None:
    """The demo's service, among what the terminal runs: the test knows what it started."""
    try:
        children = psutil.Process(tmux.pid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if "gpuscope.demo.service" in child.cmdline():
                return child.pid
        except psutil.Error:
            continue
    return None


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
@pytest.mark.timeout(300)  # the demo's leak must first grow into an alert: slow on a busy machine
def test_from_the_alert_to_the_culprit_in_two_announced_keys(tmux_session, faster_grower, size):
    tmux = tmux_session(gpuscope_cmd() + ["demo"], env={"TERM": "xterm-256color"}, size=size)
    service = wait_until(lambda: demo_service_pid(tmux), timeout=60, what="the demo's service")
    pressed: list[str] = []

    def press(key: str, announced: str) -> None:
        """A key the screen announced (`announced` is on it), counted."""
        assert announced in tmux.screen(), f"{key!r} is not announced on screen:\n{tmux.screen()}"
        pressed.append(key)
        tmux.keys(key)

    # The bar shows the attached service's alert once it comes, whatever else grows faster.
    wait_until(lambda: "⚠ LEAK +" in tmux.screen() and "w: diagnose" in tmux.screen(), timeout=90, interval=0.5,
               what="the service's leak alert, with the key that diagnoses it")
    at_alert = tmux.screen()
    # The service's chart and its process panel stay beside the alert bar and the service panel, 80x24 too.
    assert "SERVICE" in at_alert and f"PID {service}: " in at_alert and "threads " in at_alert, at_alert
    press("w", "w: diagnose")
    wait_until(lambda: "Diagnosis of PID" in tmux.screen() and "y: find the code that keeps memory" in tmux.screen(),
               timeout=30, what="the wizard, offering the search")
    title = tmux.screen()
    assert f"Diagnosis of PID {service} (" in title, f"not the demo's service (PID {service}):\n{title}"
    assert "gpuscope.demo.service" in title  # named by what it runs, not by its PID alone
    assert "j k: steps" in title  # how to move, on the same line
    press("y", "y: find the code that keeps memory")
    wait_until(lambda: "memray running" in tmux.screen(), timeout=20, what="the search, running")

    def culprit() -> str | bool:
        # The finding is in the step panel, right of the steps' list: read from its column on,
        # the wrapped lines joined again.
        rows = tmux.screen().splitlines()
        at = next(((y, row.index("First suspect:")) for y, row in enumerate(rows) if "First suspect:" in row), None)
        if at is None:
            return False
        y, x = at
        finding = " ".join(row[x:].strip() for row in rows[y:y + 6])
        found = re.search(r"First suspect: (\w+) \(([^)]*)\)", finding)
        if found is None:
            return False
        where = found.group(2).replace(" ", "")  # a path folded across lines
        return re.search(r"\w+\.py:\d+$", where) is not None and f"{found.group(1)} {where}"

    named = wait_until(culprit, timeout=120, interval=0.5, what="the culprit's function and file:line")
    assert "_remember" in named, named
    assert len(pressed) <= MAX_KEYS, f"{len(pressed)} keys after the alert: {pressed}"
    tmux.keys("q")
    wait_until(tmux.dead, timeout=30, what="gpuscope to exit")
