"""Another user's escape sequences never reach the terminal: `ps`, `ps --json`, the console, errors.

The other user runs a process whose arguments, working directory and name hold terminal control
sequences (OSC 0 retitles the window, CSI 2J clears the screen, U+009B is the one-byte CSI, a raw
0x9B byte is not even UTF-8), a bidi override, a newline and Rich markup. Whatever gpuscope shows
of it must carry none of them: each control character is replaced by a visible one (ESC by ␛,
BEL by ␇, a newline by ␊, the rest by �), and markup is shown as the text it is.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import unicodedata
from dataclasses import replace

import pytest

from gpuscope.core.node.host import HostCollector
from gpuscope.core.node.model import Alert, Device
from gpuscope.core.node.live import NodeSource
from gpuscope.core.common.printable import printable
from gpuscope.core.serving.model import ServingSnapshot, Signals, StageStats
from gpuscope.core.target.stacks import StackDump, StackFrame, ThreadStack
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.detail import ProcessPanel
from gpuscope.tui.processes import ProcessTable
from gpuscope.tui.stacks import DumpScreen

from conftest import SYSTEM_PYTHON
from frames import FakeServing, FakeSource, frame, live, rows
from helpers import ROOT, fake_nvml_env, gpuscope_cmd, wait_until
from pilot_wait import until

OSC_TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
HOSTILE_ARGS = [OSC_TITLE, CLEAR, "\x9b31mcsi", "[bold red]markup[/]", "[link=https://evil.example]click[/link]",
                "\u202eevil", "one\ntwo"]
RAW_C1 = b"\x9b2Jraw"  # not UTF-8: psutil hands it over as a lone surrogate
HOSTILE_DIR = f"work{OSC_TITLE}{CLEAR}"
SLEEPER = (
    "open('/proc/self/comm', 'w').write('\\x1b]0;pwn\\x07')\n"
    "print('ready', flush=True)\n"
    "import time; time.sleep(60)\n"
)
UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def unsafe(text: str, allowed: str = "") -> list[str]:
    return [c for c in text if unicodedata.category(c) in UNSAFE_CATEGORIES and c not in allowed]


@pytest.fixture
def hostile(other_user, tmp_path):
    """A process of the other user with control sequences in its argv, its cwd and its name,
    on the (fake) GPU so that it has a row however busy the node is."""
    folder = other_user.home / HOSTILE_DIR
    folder.mkdir()
    other_user.own(folder)
    proc = other_user.popen([SYSTEM_PYTHON, "-c", SLEEPER, *HOSTILE_ARGS, RAW_C1], cwd=folder,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"devices": [{"name": "NVIDIA H200", "total": 2**37,
                                                 "compute": [{"pid": proc.pid, "used": 2**30}]}]}))
    return proc, scenario


def test_printable_replaces_every_control_format_and_separator_character():
    assert printable(f"a{OSC_TITLE}b{CLEAR}") == "a␛]0;pwned␇b␛[2J"
    assert printable("\x9b31m \u202eabc \u200b \ufeff \udc9b \u2028") == "�31m �abc � � � �"
    assert printable("one\ntwo\tthree\r") == "one␊two␉three␍"
    assert printable("one\ntwo\t", newlines=True) == "one\ntwo␉"
    assert printable("plain text, ünïcödé, 中文, emoji 🙂 [bold]") == "plain text, ünïcödé, 中文, emoji 🙂 [bold]"
    every = "".join(chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) in UNSAFE_CATEGORIES)
    shown = printable(every)
    assert len(shown) == len(every) and unsafe(shown) == []  # one visible character for each


def test_the_host_collector_reads_another_users_text_as_printable(hostile):
    proc, _ = hostile
    host = HostCollector()
    seen = next(s for s in host.scan() if s.pid == proc.pid)
    row = host.complete([seen])[0]
    detail = host.detail(proc.pid)
    for text in (seen.name, row.name, row.command, row.user, detail.command, detail.cwd, detail.exe):
        assert unsafe(text) == [], text
    assert seen.name == "␛]0;pwn␇"
    assert "␛]0;pwned␇ ␛[2J �31mcsi '[bold red]markup[/]'" in row.command and "one␊two" in row.command
    assert row.command.endswith("�2Jraw")
    assert detail.cwd.endswith("/work␛]0;pwned␇␛[2J")


def test_ps_shows_another_users_escape_sequences_inert(hostile):
    proc, scenario = hostile
    out = subprocess.run(gpuscope_cmd() + ["ps"], capture_output=True, timeout=60, env=fake_nvml_env(scenario), cwd=ROOT)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    text = out.stdout.decode("utf-8")  # strict: a raw 0x9B byte would not decode
    assert unsafe(text, allowed="\n") == []
    line = next(ln for ln in text.splitlines() if ln.lstrip().startswith(str(proc.pid)))
    assert "gpuscope-o" in line  # the user column is 10 wide
    assert "␛]0;pwned␇ ␛[2J" in line and "[bold red]markup[/]" in line and "one␊two" in line and "�2Jraw" in line


def test_ps_json_carries_no_control_character_of_another_user(hostile):
    proc, scenario = hostile
    out = subprocess.run(gpuscope_cmd() + ["ps", "--json"], capture_output=True, timeout=60, env=fake_nvml_env(scenario),
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    rows_ = json.loads(out.stdout)
    for r in rows_:
        assert unsafe(r["command"]) == [] and unsafe(r["user"] or "") == []  # what `jq -r .command` would print
    row = next(r for r in rows_ if r["pid"] == proc.pid)
    assert "␛]0;pwned␇" in row["command"] and row["command"].endswith("�2Jraw")


def test_stack_frames_from_py_spy_are_printable_and_secret_locals_masked():
    """py-spy reports the target's own names: function, file, thread, locals (made up by it)."""
    from gpuscope.core.target import pyspy

    raw = [{"thread_id": 1, "thread_name": f"T{OSC_TITLE}", "active": True, "owns_gil": True, "frames": [
        {"name": f"handler{CLEAR}", "filename": f"/srv/{OSC_TITLE}.py", "line": 3, "locals": [
            {"name": "password", "repr": "'Hunter2'"},
            {"name": "dsn", "repr": "'postgres://u:PgPw@db/x'"},
            {"name": "note", "repr": f"'{OSC_TITLE}'"},
        ]},
    ]}]
    dump = pyspy._parse(raw, 1, "blocking", False, 0.0, ())
    thread = dump.threads[0]
    frame_ = thread.frames[0]
    assert thread.name == "T␛]0;pwned␇" and frame_.function == "handler␛[2J" and frame_.file == "/srv/␛]0;pwned␇.py"
    assert dict(frame_.locals) == {"password": "***", "dsn": "'postgres://u:***@db/x'", "note": "'␛]0;pwned␇'"}


def terminal_output(app) -> str:
    """Everything Textual would write to a terminal to paint the current screen in full."""
    return app.screen._compositor.render_update(full=True).render_segments(app.console)


def assert_inert(painted: str) -> None:
    for sequence in (OSC_TITLE, CLEAR, "\x1b]0;pwn", "\x9b", "\u202e", "\x07", "\x1b]8;"):
        assert sequence not in painted


async def test_the_console_shows_a_live_hostile_process_inert(hostile, fake_nvml):
    proc, _ = hostile
    source = NodeSource(interval=0.2, focus_pid=proc.pid)
    app = GpuScopeApp(live(source))
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: "cwd     /" in app.query_one(ProcessPanel).text.plain
                    and app.query_one(ProcessTable).order, "the hostile process's panel")
        panel = app.query_one(ProcessPanel).text.plain
        assert "cwd     " in panel and "work␛]0;pwned␇␛[2J" in panel
        assert "[bold red]markup[/]" in panel  # markup shown as the text it is
        painted = terminal_output(app)
        assert_inert(painted)
        assert "␛]0;pwned␇" in painted


async def test_the_console_over_crafted_frames_shows_every_field_inert():
    """A recording from an older gpuscope, or a crafted one, reaches the console without passing
    the collectors: every field of a frame is someone else's text."""
    hostile = f"x{OSC_TITLE}{CLEAR}\x9b31m\u202e [bold red]markup[/] [link=https://evil.example]click[/link]"
    row = replace(rows()[0], command=hostile, user=f"u{CLEAR}", name=hostile)
    f = frame(
        hostname=f"node{OSC_TITLE}",
        processes=(row,) + rows()[1:],
        focus=replace(frame().focus, command=hostile, cwd=f"/srv/{OSC_TITLE}\nuser    root", user=hostile, status=hostile),
        nvml=replace(frame().nvml, devices=(Device(0, f"GPU{OSC_TITLE}", memory_used=1, memory_total=2),
                                            Device(1, "GPU", error=f"lost{CLEAR}"))),
        notices=(f"notice{OSC_TITLE}",),
        alerts=(Alert("rss", 4242, None, f"PID 4242 {hostile}", 5e6, None, None, 0.9, "floor rising"),),
    )
    serving = ServingSnapshot(time=f.time, source="scrape", target=f"http://h{OSC_TITLE}/metrics", profile="rag",
                              window_s=30.0, signals=Signals(), stages=(StageStats(f"stage{CLEAR}", 0.1, 0.2, 0.3, 1.0),),
                              state=f"http://h answered HTTP 500 {OSC_TITLE}{CLEAR}")
    app = GpuScopeApp(live(FakeSource(f), serving=FakeServing(serving)))
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        painted = terminal_output(app)
        assert_inert(painted)
        assert "node␛]0;pwned␇" in painted and "[bold red]markup[/]" in painted and "stage␛[2J" in painted
        panel = app.query_one(ProcessPanel).text.plain
        assert "/srv/␛]0;pwned␇␊user    root" in panel  # a newline in a folder name forges no line

        dump = StackDump(4242, f.time, f"[red]mode{CLEAR}", False, (
            ThreadStack(1, f"[bold]thread{OSC_TITLE}", 11, True, True, (StackFrame(f"fn{CLEAR}[red]", f"/srv/{OSC_TITLE}.py", 3),)),
        ))
        app.push_screen(DumpScreen(4242, recorded=dump))
        await pilot.pause()
        painted = terminal_output(app)
        assert_inert(painted)
        assert "fn␛[2J[red]" in painted and "[bold]thread␛]0;pwned␇" in painted
        assert "[red]mode␛[2J dump" in painted  # the status line: not markup either


class ReasonServer:
    """A loopback HTTP server whose status line carries escape sequences in its reason phrase."""

    def __init__(self, reason: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.reply = b"HTTP/1.1 500 " + reason + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def test_an_escape_sequence_in_an_http_reason_phrase_is_printed_inert():
    server = ReasonServer(OSC_TITLE.encode() + CLEAR.encode() + b"Oops")
    try:
        out = subprocess.run(gpuscope_cmd() + ["metrics", "--metrics-url", f"http://127.0.0.1:{server.port}/metrics",
                                               "--window", "0"], capture_output=True, timeout=60, cwd=ROOT)
    finally:
        server.close()
    assert out.returncode == 1
    err = out.stderr.decode("utf-8")
    assert unsafe(err, allowed="\n") == [] and "␛]0;pwned␇␛[2JOops" in err


def test_an_error_quoting_a_hostile_file_name_is_printed_inert(tmp_path, capsys):
    from gpuscope.cli import main

    assert main(["report", str(tmp_path / f"x{OSC_TITLE}.gpuscope")]) == 1
    err = capsys.readouterr().err
    assert unsafe(err, allowed="\n") == [] and "x␛]0;pwned␇.gpuscope" in err


@pytest.mark.terminal
def test_a_real_terminal_keeps_its_title_and_screen(hostile, tmux_session):
    """In tmux (a real terminal emulator): OSC 0 would set the pane's title, CSI 2J clear it."""
    proc, scenario = hostile
    env = fake_nvml_env(scenario)
    tmux = tmux_session(gpuscope_cmd() + ["--pid", str(proc.pid), "--refresh", "0.5"],
                        env={"PYTHONPATH": env["PYTHONPATH"], "GPUSCOPE_FAKE_NVML": str(scenario), "TERM": "xterm-256color"},
                        size=(200, 50))

    def title() -> str:
        return tmux._run("display-message", "-p", "-t", "t", "#{pane_title}")

    def settled() -> bool:  # retitled (the failure), or drawn with the process's panel
        screen = tmux.screen()
        return "pwn" in title() or (f"PID {proc.pid}" in screen and "threads 1" in screen)

    wait_until(settled, timeout=60, interval=0.3, what="the console showing the hostile process")
    time.sleep(1.0)  # a few more refreshes of the process's row and panel
    assert "pwn" not in title()
    screen = tmux.screen()
    assert f"PID {proc.pid}" in screen and "␛]0;pwned␇␛[2J" in screen  # its folder, shown; the screen not cleared
    tmux.keys("q")
    wait_until(tmux.dead, timeout=20, what="gpuscope to exit on q")
