"""The console in the terminals it meets over SSH: 16 colours, NO_COLOR, TERM=linux/screen/dumb,
80x24 and resizing, a lost terminal. tmux runs it; capture-pane -e shows the escape sequences."""

import re

import psutil
import pytest

from helpers import gpuscope_cmd, wait_until

pytestmark = pytest.mark.terminal

EXTENDED_COLOUR = re.compile(r"\x1b\[[0-9;]*[34]8;[25];")  # 256-colour (38;5;n) and truecolour (38;2;r;g;b)
ANY_COLOUR = re.compile(r"\x1b\[(?:[0-9]+;)*(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])[;m]")


def console(tmux_session, term: str, *args: str, env: str = "", size=(120, 40)):
    # tmux sets the pane's TERM itself: `env` puts the one under test in front of gpuscope.
    command = ["env", f"TERM={term}", *env.split(), *gpuscope_cmd(), "--refresh", "0.5", *args]
    tmux = tmux_session(command, size=size)
    wait_until(lambda: "HOST" in tmux.screen() and "COMMAND" in tmux.screen(), timeout=30, what="the console")
    return tmux


def escapes(tmux) -> str:
    return tmux._run("capture-pane", "-e", "-p", "-t", "t")


@pytest.mark.parametrize(
    "term, env, args",
    [
        ("xterm", "", ()),  # 16 colours by TERM
        ("xterm-256color", "TEXTUAL_COLOR_SYSTEM=standard", ()),  # Textual's colour-system setting
        ("xterm-256color", "COLORTERM=truecolor", ("--theme", "gpuscope-ansi")),  # the terminal's own palette
        ("linux", "", ("--theme", "gpuscope-light")),
        ("screen", "", ("--theme", "gpuscope-high-contrast")),
    ],
)
def test_sixteen_colours_send_no_256_or_truecolour_sequences(tmux_session, term, env, args):
    tmux = console(tmux_session, term, *args, env=env)
    screen = escapes(tmux)
    assert ANY_COLOUR.search(screen), "colour is expected, only from the 16"
    assert not EXTENDED_COLOUR.search(screen), [m.group() for m in EXTENDED_COLOUR.finditer(screen)][:5]
    tmux.keys("q")
    wait_until(tmux.dead, timeout=20, what="gpuscope to exit on q")


@pytest.mark.parametrize("term", ["xterm-256color", "tmux-256color"])
def test_no_color_sends_no_colour_at_all(tmux_session, term):
    tmux = console(tmux_session, term, env="NO_COLOR=1 COLORTERM=truecolor")
    screen = escapes(tmux)
    assert not ANY_COLOUR.search(screen), [m.group() for m in ANY_COLOUR.finditer(screen)][:5]
    assert "\x1b[7m" in screen or ";7m" in screen or ";7;" in screen  # the cursor row in reverse video


def test_a_dumb_terminal_gets_one_line_pointing_to_the_headless_commands(tmux_session):
    line = " ".join(gpuscope_cmd())
    tmux = tmux_session(["sh", "-c", f'TERM=dumb {line}; echo "[exit $?]"; sleep 2'], size=(200, 10))
    screen = wait_until(lambda: "[exit" in tmux.screen() and tmux.screen(), timeout=20, what="gpuscope to exit")
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[1] == "[exit 1]", lines
    assert lines[0].startswith("gpuscope: this terminal cannot run the console (TERM=dumb") and "gpuscope ps --json" in lines[0]


def test_80x24_keeps_every_panel_and_resizes_live(tmux_session):
    tmux = console(tmux_session, "xterm-256color", size=(160, 50))
    wait_until(lambda: "No process attached" in tmux.screen() and "GROW MB/s" in tmux.screen(), timeout=20,
               what="every panel at 160x50")
    tmux._run("resize-window", "-t", "t", "-x", "80", "-y", "24")
    narrow = wait_until(lambda: max(len(ln.rstrip()) for ln in tmux.screen().splitlines()) <= 80 and tmux.screen(),
                        timeout=20, what="the console to redraw at 80 columns")
    for seen in ("gpuscope", "HOST", "GROW MB/s", "No process attached", "Help", "Quit"):
        wait_until(lambda: seen in tmux.screen(), timeout=20, what=f"{seen!r} at 80x24")
    assert len(narrow.splitlines()) <= 24
    tmux.keys("?")  # the keys not in the footer are one key away
    wait_until(lambda: "gpuscope — keys" in tmux.screen() and "diagnose" in tmux.screen(), timeout=20, what="the help at 80x24")


def test_a_lost_terminal_leaves_no_process_behind(tmux_session):
    tmux = console(tmux_session, "xterm-256color")
    pane = psutil.Process(int(tmux._run("display-message", "-p", "-t", "t", "#{pane_pid}").strip()))
    processes = [pane, *pane.children(recursive=True)]
    tmux.close()  # the terminal goes away: SIGHUP

    def running(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    wait_until(lambda: not any(running(p) for p in processes), timeout=30, interval=0.2, what="gpuscope to end")


def test_ctrl_z_suspends_and_fg_brings_the_whole_screen_back(tmux_session):
    tmux = tmux_session(["bash", "--norc", "--noprofile", "-i"], env={"PS1": "$ "})
    tmux.keys(" ".join(gpuscope_cmd() + ["--no-journal", "--refresh", "0.5"]), "Enter")
    wait_until(lambda: "HOST" in tmux.screen() and "COMMAND" in tmux.screen(), timeout=30, what="the console")
    tmux.keys("C-z")
    wait_until(lambda: "Stopped" in tmux.screen(), timeout=20, what="the shell's job control to report it stopped")
    tmux.keys("fg", "Enter")
    # Every panel comes back, not only the cells that changed while it was away.
    wait_until(lambda: all(s in tmux.screen() for s in ("gpuscope 0.1.0", "HOST", "COMMAND", "No process attached")),
               timeout=20, what="the whole console after fg")
    tmux.keys("q")
    wait_until(lambda: "GROW MB/s" not in tmux.screen(), timeout=20, what="the console to end on q")
    assert not tmux.dead()  # the shell is still there: gpuscope gave its terminal back


def test_the_console_takes_the_pane_s_size_whatever_the_environment_says(tmux_session):
    """The terminal tests mean the size they ask for: the console fills a 120x40 pane."""
    tmux = console(tmux_session, "xterm-256color", size=(120, 40))
    wait_until(lambda: max(len(ln.rstrip()) for ln in tmux.screen().splitlines()) > 100, timeout=20,
               what="the console drawn 120 columns wide")
