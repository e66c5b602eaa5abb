"""Shared fixtures: real child processes that leak or idle, and the fake NVML."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import FAKE_NVML_DIR, Tmux

# A suite started where SIGINT is ignored (a background job of a shell without job control) hands
# that on to every process it starts, and a gpuscope started so rightly keeps running on Ctrl+C:
# the tests that send SIGINT to what they start need it delivered. A handler here (in the main
# process and in each worker) is reset to the default in their children at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The suite runs in several workers (pytest-xdist, `--dist loadgroup`): most tests wait on real
# processes rather than compute, so they overlap well. A group runs in one worker, one test at a
# time: the diagnoses judge memory over real-time windows and must not crowd each other (the
# other workers' tests only wait, mostly), nor share the machine with the 1 GB/s service or the
# terminal walk's own demo and diagnosis: three such groups at most run at once (the suite's
# longest path is theirs); the security tests share one other user of the machine.
GROUPS = {
    "diagnosis": ("integration/test_diagnose.py", "integration/test_diagnose_limits.py"),
    "diagnosis-libraries": ("integration/test_diagnose_libraries.py", "terminal/test_alert_to_culprit.py"),
    "diagnosis-bare": ("integration/test_diagnose_bare.py",),
    "other-user": ("security/",),
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    for item in items:
        where = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        for group, prefixes in GROUPS.items():
            if where.startswith(prefixes):
                item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def own_settings(tmp_path_factory, monkeypatch):
    """Every test gets empty config and state folders: the user's themes, settings and remembered
    theme never change what a test sees, and nothing a test does lands in the user's home."""
    base = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    # Probes of this test's children go in its own runtime folder, where the other workers' probe
    # listings (which remove dead processes' sockets) do not look and which they do not change.
    runtime = base / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    for name in ("GPUSCOPE_CONFIG", "GPUSCOPE_THEME", "GPUSCOPE_REFRESH", "NO_COLOR", "TEXTUAL_COLOR_SYSTEM"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def spawn_python(tmp_path):
    """Start a small Python program as a real child process; it is killed after the test."""
    children: list[subprocess.Popen] = []

    def spawn(code: str, *args: str) -> subprocess.Popen:
        script = tmp_path / f"child{len(children)}.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        children.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield spawn
    for proc in children:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def fake_nvml(monkeypatch):
    """The fake `pynvml` module, importable in-process; `configure(scenario)` sets what it plays."""
    monkeypatch.syspath_prepend(str(FAKE_NVML_DIR))
    sys.modules.pop("pynvml", None)
    import pynvml  # noqa: PLC0415 - the fake, from the prepended path

    assert Path(pynvml.__file__).parent == FAKE_NVML_DIR
    pynvml.configure({"init_error": "LibraryNotFound"})
    yield pynvml
    sys.modules.pop("pynvml", None)


@pytest.fixture
def tmux_session(tmp_path):
    sessions = []

    def start(command, env=None, size=(120, 40), options=()):
        session = Tmux(command, env, size, tmp_path / f"tmux{len(sessions)}.conf", tuple(options))
        sessions.append(session)
        return session

    yield start
    for s in sessions:
        s.close()
