"""gpuscope in a real terminal: tmux runs it, send-keys types, capture-pane reads the screen."""

import json
import shlex

import psutil
import pyte
import pytest

from helpers import LEAKER, fake_nvml_env, gpuscope_cmd, wait_until

pytestmark = pytest.mark.terminal


def test_attach_to_a_leaking_child_shows_it_growing_help_and_quit(tmux_session, spawn_python, tmp_path):
    child = spawn_python(LEAKER)
    # The fake NVML reports the child's RSS as its GPU memory, so the GPU path runs end to end too.
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"devices": [{"name": "NVIDIA H200", "total": 150 * 2**30, "util": 50, "temp": 60,
                                                 "compute": [{"pid": child.pid, "used": "rss"}]}]}))
    env = fake_nvml_env(scenario)
    env["TERM"] = "xterm-256color"
    tmux = tmux_session(gpuscope_cmd() + ["--pid", str(child.pid), "--refresh", "0.5"], env={k: env[k] for k in ("PYTHONPATH", "GPUSCOPE_FAKE_NVML", "TERM")})

    def grown():
        screen = tmux.screen()
        line = next((ln for ln in screen.splitlines() if ln.strip().startswith(str(child.pid))), "")
        return "▲" in line and screen
    screen = wait_until(grown, timeout=60, interval=0.3, what="the child's row with a growth arrow")
    assert f"PID {child.pid}" in screen  # the attached-process panel
    assert "GPU0" in screen and "NVIDIA H200" in screen
    assert "python" in screen and "threads" in screen

    tmux.keys("?")
    wait_until(lambda: "gpuscope — keys" in tmux.screen(), timeout=20, what="the help screen")
    tmux.keys("Escape")
    wait_until(lambda: "gpuscope — keys" not in tmux.screen(), timeout=20, what="help to close")
    tmux.keys("q")
    wait_until(tmux.dead, timeout=20, what="gpuscope to exit on q")
    assert child.poll() is None  # quitting the console never touches the attached process


def test_no_such_pid_in_a_terminal_is_one_line(tmux_session, spawn_python):
    child = spawn_python(LEAKER)
    child.kill()
    child.wait()
    # As from an interactive shell: the shell outlives gpuscope, so its last words stay on screen
    # (a pane whose command exits at once can lose its final output in tmux).
    line = shlex.join(gpuscope_cmd() + ["--pid", str(child.pid)])
    tmux = tmux_session(["sh", "-c", f'{line}; echo "[exit $?]"; sleep 2'], size=(80, 24))
    screen = wait_until(lambda: "[exit" in tmux.screen() and tmux.screen(), timeout=20, what="gpuscope to exit")
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    assert lines == [f"gpuscope: no process with PID {child.pid}; list running ones with 'gpuscope ps'", "[exit 1]"]


def test_the_shell_gets_its_screen_back_after_the_console(tmux_session, spawn_python):
    """The console's title bar is painted before Python lays the console out, on the alternate
    screen the console then takes over; once it quits, the shell's own screen is back as it was."""
    child = spawn_python(LEAKER)
    line = shlex.join(gpuscope_cmd() + ["--pid", str(child.pid)])
    tmux = tmux_session(["sh", "-c", f'echo "[before]"; {line}; echo "[exit $?]"; sleep 20'], size=(100, 30))
    wait_until(lambda: any(ln.startswith(" HOST") for ln in tmux.screen().splitlines()), timeout=30,
               what="the console's host line")
    tmux.keys("q")
    screen = wait_until(lambda: "[exit" in tmux.screen() and tmux.screen(), timeout=20, what="gpuscope to exit")
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    assert lines[0] == "[before]" and lines[-1] == "[exit 0]", lines
    assert not any("starting…" in ln or ln.startswith(" gpuscope ") for ln in lines), lines


def test_the_shell_writes_in_its_own_style_after_the_console(tmux_session, spawn_python):
    """The console leaves the text style of its last cells in effect from one update to the next
    and resets it before it hands the terminal back. tmux would restore the style itself when the
    alternate screen is left: with the alternate screen off, what is written next shows the style
    the console left."""
    child = spawn_python(LEAKER)
    line = shlex.join(gpuscope_cmd() + ["--pid", str(child.pid)])
    tmux = tmux_session(["sh", "-c", f'{line}; printf "[after the console]"; sleep 20'], size=(100, 30),
                        options=["set -g alternate-screen off"])
    wait_until(lambda: any(ln.startswith(" HOST") for ln in tmux.screen().splitlines()), timeout=30,
               what="the console's host line")
    tmux.keys("q")
    wait_until(lambda: "[after the console]" in tmux.screen(), timeout=20, what="gpuscope to exit")
    terminal = pyte.Screen(100, 30)
    pyte.Stream(terminal).feed(tmux.screen(escapes=True).replace("\n", "\r\n"))
    [row] = [row for row in terminal.display if "[after the console]" in row]
    y = terminal.display.index(row)
    x = row.index("[after the console]")
    styles = {(c.fg, c.bg, c.bold, c.reverse) for c in (terminal.buffer[y][x + i] for i in range(19))}
    assert styles == {("default", "default", False, False)}, styles


def demo_children(pane_pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pane_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in kids if any("gpuscope.demo." in a for a in _cmdline(p))]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.mark.parametrize("ending", ["ctrl-c", "lost terminal"])
def test_demo_console_stops_everything_it_started(tmux_session, ending):
    tmux = tmux_session(gpuscope_cmd() + ["demo"], env={"TERM": "xterm-256color"})
    pane_pid = int(tmux._run("display-message", "-p", "-t", "t", "#{pane_pid}").strip())
    children = wait_until(lambda: len(demo_children(pane_pid)) == 2 and demo_children(pane_pid), timeout=60,
                          what="the demo service and load generator")
    service = next(p for p in children if "gpuscope.demo.service" in " ".join(p.cmdline()))
    wait_until(lambda: f"PID {service.pid}" in tmux.screen(), timeout=60, what="the console attached to the service")
    # The demo's /metrics feed the service panel: the rag profile and its three stages.
    wait_until(lambda: "SERVICE rag" in tmux.screen() and "retriever" in tmux.screen() and "llm" in tmux.screen(),
               timeout=60, what="the service panel")
    if ending == "ctrl-c":
        tmux.keys("C-c")
    else:
        tmux.close()  # the terminal goes away: gpuscope gets SIGHUP
    def running(p: psutil.Process) -> bool:
        # Exited but not yet reaped by its parent (a zombie) is gone as far as the user is concerned.
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    watched = [psutil.Process(pane_pid), *children]
    wait_until(lambda: not any(running(p) for p in watched), timeout=30, interval=0.2, what="everything the demo started to end")
