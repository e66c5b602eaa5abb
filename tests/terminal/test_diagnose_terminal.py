"""`gpuscope diagnose` printed in a real terminal (tmux): the report's lines without Markdown's
escapes (`\\_grow`, `\\[stack-sampling\\]`, `\\<command\\>`), which a file or a pipe keeps."""

import subprocess
import sys

import pytest

from helpers import gpuscope_cmd, wait_until

pytestmark = pytest.mark.terminal

GROWER = """
import time
held = []
def _grow_cache():
    held.append(bytearray(2 << 20))
print("ready", flush=True)
while True:
    _grow_cache()
    time.sleep(0.2)
"""


@pytest.fixture
def grower():
    proc = subprocess.Popen([sys.executable, "-c", GROWER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait(timeout=30)


@pytest.mark.timeout(120)
def test_the_report_on_a_terminal_shows_no_markdown_escapes(tmux_session, grower, tmp_path):
    command = gpuscope_cmd() + ["diagnose", "--pid", str(grower.pid), "--duration", "8", "--no-inject"]
    tmux = tmux_session(command, env={"TERM": "xterm-256color"}, size=(200, 100))
    wait_until(lambda: "## 7. Code path" in tmux.screen() and tmux.dead(), timeout=90, interval=0.5,
               what="the report, printed")
    screen = tmux.screen()
    assert f"# gpuscope diagnosis of PID {grower.pid}" in screen, screen
    assert "\\" not in screen, screen  # no escape at all: nothing in this report needs a backslash
    # The same report into a file stays Markdown, escapes and all.
    out = tmp_path / "report.md"
    subprocess.run(command + ["-o", str(out)], check=True, capture_output=True, timeout=90)
    assert "\\" in out.read_text() and f"# gpuscope diagnosis of PID {grower.pid}" in out.read_text()
