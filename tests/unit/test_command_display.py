"""A command's display name: the script or module before the interpreter, always one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuscope.core.node.command_display import display_command
from gpuscope.core.common.redact import redact_command
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.processes import ProcessTable
from gpuscope.tui.textlines import TextLines

from frames import FakeSource, frame, live, rows


@pytest.mark.parametrize(("command", "shown"), [
    ("python -m gpuscope.demo.service --port 8000", "-m gpuscope.demo.service --port 8000 · python"),
    ("/tmp/x/.venv/bin/python3.11 -u -X dev /srv/app/service.py --workers 2",
     "service.py --workers 2 · /tmp/x/.venv/bin/python3.11"),
    ("python3 -W ignore train.py", "train.py · python3"),
    ("python -c 'import time; time.sleep(9)'", "-c 'import time; time.sleep(9)' · python"),
    ("/usr/bin/dockerd -H fd://", "/usr/bin/dockerd -H fd://"),
    ("python3", "python3"),
    ("[kworker/0:1]", "[kworker/0:1]"),
    ("python 'unbalanced", "python 'unbalanced"),
])
def test_the_script_or_module_comes_before_the_interpreter(command, shown):
    assert display_command(command) == shown


def test_one_line_whatever_the_command_line_holds_and_secrets_stay_masked():
    raw = ["/opt/venv/bin/python", "serve.py", "--api-key", "sk-abcdef0123456789", "--banner", "a\nb\x1b[2Jc\u2028d"]
    shown = display_command(redact_command(raw))
    assert shown.startswith("serve.py --api-key ") and shown.endswith(" · /opt/venv/bin/python")
    assert "sk-abcdef0123456789" not in shown
    assert not any(c in shown for c in "\n\r\x1b\u2028")
    assert display_command("python x.py\nforged line") == "x.py␊forged line · python"


async def test_each_pid_shows_its_own_command_on_its_own_row_when_a_command_holds_newlines():
    changed = list(rows())
    changed[0] = replace(changed[0], command="python -m evil\nEVIL 4243\n\n\n")
    app = GpuScopeApp(live(FakeSource(frame(processes=tuple(changed)))))
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        table = app.query_one(ProcessTable)
        pids = table.query_one("#col-pid", TextLines).lines[1:]
        commands = table.query_one("#col-command", TextLines).lines[1:]
        by_pid = {int(p): c.strip() for p, c in zip(pids, commands) if p.strip()}
        assert len(pids) == len(commands) == len(changed)
        assert by_pid[4242].startswith("-m evil␊EVIL 4243") and by_pid[4242].endswith(" · python")
        for row in changed[1:]:
            assert by_pid[row.pid] == display_command(row.command)


@pytest.mark.parametrize(("command", "runs_in", "shown"), [
    ("/opt/venv/bin/python -m vllm.entrypoints.openai.api_server --port 8000", "vllm.service",
     "-m vllm.entrypoints.openai.api_server --port 8000 · vllm.service · /opt/venv/bin/python"),
    ("python3 serve.py", "docker:4f0c5d1e2a3b", "serve.py · docker:4f0c5d1e2a3b · python3"),
    ("/usr/bin/nginx -g 'daemon off;'", "pod:1b2c3d4e/ctr:9e8d7c6b5a41",
     "/usr/bin/nginx -g 'daemon off;' · pod:1b2c3d4e/ctr:9e8d7c6b5a41"),
    ("python3", "jupyter.service", "python3 · jupyter.service"),
    ("python 'unbalanced", "x.service", "python 'unbalanced · x.service"),
    ("python3 serve.py", "", "serve.py · python3"),
    ("python3 serve.py", "evil\x1b[2J.service", "serve.py · evil␛[2J.service · python3"),
])
def test_where_it_runs_comes_after_what_runs_and_before_the_interpreter(command, runs_in, shown):
    assert display_command(command, runs_in) == shown


def _screen_lines(app) -> list[str]:
    strips = app.screen._compositor.render_strips()
    return ["".join(segment.text for segment in strip) for strip in strips]


@pytest.mark.parametrize("width", [80, 220])
async def test_the_table_names_what_runs_first_and_where_then_cuts_with_an_ellipsis(width):
    changed = list(rows())
    changed[0] = replace(changed[0], command="/srv/envs/llm/.venv/bin/python -m vllm.entrypoints.openai.api_server "
                         "--port 8000", runs_in="vllm.service")
    app = GpuScopeApp(live(FakeSource(frame(processes=tuple(changed)))))
    async with app.run_test(size=(width, 40)) as pilot:
        await pilot.pause()
        line = next(line for line in _screen_lines(app) if " 4242 " in line)
        shown = line[line.index("-m vllm"):].rstrip(" │┃|")
        full = "-m vllm.entrypoints.openai.api_server --port 8000 · vllm.service · /srv/envs/llm/.venv/bin/python"
        if width == 80:
            assert shown.endswith("…") and full.startswith(shown[:-1]), shown
        else:
            assert shown == full, shown
