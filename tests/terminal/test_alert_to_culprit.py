"""From the alert to the culprit in a real terminal, as an on-call engineer meets it: `gpuscope
demo` runs a leaking service; once the alert is on screen, at most two keys, each announced
where the operator looks, put the culprit's function and file:line on screen."""

import re

import pytest

from helpers import gpuscope_cmd, wait_until

pytestmark = pytest.mark.terminal

MAX_KEYS = 2


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
@pytest.mark.timeout(300)  # the demo's leak must first grow into an alert: slow on a busy machine
def test_from_the_alert_to_the_culprit_in_two_announced_keys(tmux_session, size):
    tmux = tmux_session(gpuscope_cmd() + ["demo"], env={"TERM": "xterm-256color"}, size=size)
    pressed: list[str] = []

    def press(key: str, announced: str) -> None:
        """A key the screen announced (`announced` is on it), counted."""
        assert announced in tmux.screen(), f"{key!r} is not announced on screen:\n{tmux.screen()}"
        pressed.append(key)
        tmux.keys(key)

    wait_until(lambda: "⚠ LEAK +" in tmux.screen() and "w: diagnose" in tmux.screen(), timeout=90, interval=0.5,
               what="the leak alert, with the key that diagnoses it")
    press("w", "w: diagnose")
    wait_until(lambda: "Diagnosis of PID" in tmux.screen() and "y: find the code that keeps memory" in tmux.screen(),
               timeout=30, what="the wizard, offering the search")
    assert "j k: steps" in tmux.screen()  # how to move, on the same line
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
