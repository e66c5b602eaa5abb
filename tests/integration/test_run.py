"""`gpuscope run`: a program with the probe inside; `gpuscope run --inject`: into a running one.

The launcher execs the program, so the program keeps gpuscope's PID: arguments, signals and exit
statuses are the program's own. Injection runs code inside a live process through a debugger:
gdb, else lldb where gdb cannot call into processes (gdb 13 on CPUs with AMX state); where both
harm processes it must refuse and leave the target alive.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from gpuscope import cli
from gpuscope.core.target import inject
from gpuscope.core.target import probe_client
from gpuscope.core.target.interpreter import injection_debugger, python_version_of, target_interpreter

from helpers import canary_says, gpuscope_cmd, wait_until

PY = sys.executable
CHILD = """
import json, os, signal, sys, time
if "--trap" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
probe = sys.modules.get("gpuscope.probe") or sys.modules.get("gpuscope_probe")
print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "probe": probe and probe.running()}), flush=True)
if "--exit" in sys.argv:
    sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]))
while True:
    time.sleep(0.1)
"""


def default_signals() -> None:
    # A shell that runs the tests in the background (nohup, `&`) hands its children SIGINT and
    # SIGHUP ignored, and an exec keeps that: start from the defaults a terminal would give.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def launch(tmp_path, *args, env=None):
    script = tmp_path / "serve.py"
    script.write_text(CHILD)
    return subprocess.Popen([*gpuscope_cmd(), "run", "--", PY, str(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_signals)


def first_line(proc) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


@pytest.fixture
def launched():
    procs = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_arguments_pass_through_and_the_program_has_a_probe(tmp_path, launched):
    proc = launch(tmp_path, "a b", "--flag=1", "-x", "--", "ü")
    launched.append(proc)
    seen = first_line(proc)
    assert seen["argv"] == ["a b", "--flag=1", "-x", "--", "ü"]
    assert seen["pid"] == proc.pid  # the launcher became the program
    assert seen["probe"] and seen["probe"].endswith(f"probe-{proc.pid}.sock")
    with probe_client.probe_for(proc.pid) as client:
        assert client.hello()["pid"] == proc.pid


@pytest.mark.parametrize("code", [0, 7])
def test_the_exit_status_is_the_programs(tmp_path, code):
    proc = launch(tmp_path, "--exit", str(code))
    first_line(proc)
    assert proc.wait(30) == code


@pytest.mark.parametrize("signum, args, status", [
    (signal.SIGTERM, ("--trap",), 3),          # handled by the program: its exit status
    (signal.SIGTERM, (), -signal.SIGTERM),    # not handled: killed by it (128+15 to a shell)
    (signal.SIGINT, (), -signal.SIGINT),      # KeyboardInterrupt unhandled: Python dies of SIGINT
    (signal.SIGHUP, (), -signal.SIGHUP),
])
def test_signals_reach_the_program(tmp_path, launched, signum, args, status):
    proc = launch(tmp_path, *args)
    launched.append(proc)
    first_line(proc)
    proc.send_signal(signum)
    assert proc.wait(30) == status


def test_the_shell_sees_128_plus_the_signal():
    line = f"{' '.join(gpuscope_cmd())} run -- {PY} -c 'import os; os.kill(os.getpid(), 15)'; echo $?"
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "143", out.stderr


def test_an_existing_sitecustomize_still_runs_and_children_get_probes_too(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    code = textwrap.dedent("""
        import os, subprocess, sys
        probe = sys.modules.get("gpuscope.probe") or sys.modules.get("gpuscope_probe")
        print(os.environ.get("THEIRS_RAN"), bool(probe.running()))
        sys.stdout.flush()
        subprocess.run([sys.executable, "-c", "import sys; p = sys.modules.get('gpuscope.probe') or "
                        "sys.modules.get('gpuscope_probe'); print(bool(p and p.running()))"], check=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([*gpuscope_cmd(), "run", PY, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["yes", "True", "True"]


def test_a_program_that_is_not_python_runs_untouched(tmp_path):
    out = subprocess.run([*gpuscope_cmd(), "run", "--", "sh", "-c", "echo \"$0 $1\"; exit 5", "x", "y"],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (5, "x y\n")


@pytest.mark.parametrize("args, status, message", [
    ([], 2, "give the program to run"),
    (["--", "no-such-program-gpuscope"], 127, "no such program: no-such-program-gpuscope"),
    (["--pid", "1"], 2, "--pid and --memray go with --inject"),
    (["--inject"], 2, "--inject needs --pid PID"),
    (["--inject", "--pid", "1", "python"], 2, "give --pid PID, not a command"),
    (["--inject", "--pid", "4194304"], 1, "refused: no process with PID 4194304"),
])
def test_bad_uses_are_one_plain_line(args, status, message):
    out = subprocess.run([*gpuscope_cmd(), "run", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == status and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


# -- injection into a running process ----------------------------------------------------------------

IDLE_PY = "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.05)\n"


def test_a_process_that_is_not_python_is_refused(launched):
    sleeper = subprocess.Popen(["sleep", "60"])
    launched.append(sleeper)
    with pytest.raises(inject.InjectRefused, match=f"process {sleeper.pid} \\(sleep\\) is not a Python process"):
        inject.inject_probe(sleeper.pid)


def test_a_process_that_already_has_a_probe_is_left_alone(tmp_path, launched):
    proc = launch(tmp_path)
    launched.append(proc)
    first_line(proc)
    done = inject.inject_probe(proc.pid, warn=lambda: pytest.fail("nothing should run inside it"))
    assert done.method == "already running" and done.path == probe_client.probe_path(proc.pid)


def test_injection_refuses_where_gdb_harms_processes_and_the_target_lives(spawn_python, monkeypatch, capsys):
    """Where gdb kills what it calls into, the refusal must say so and touch nothing."""
    target = spawn_python(IDLE_PY)
    canary_says(monkeypatch, "gdb's call killed the throwaway process (SIGSEGV)")
    warned = []
    with pytest.raises(inject.InjectRefused, match="injection is unsafe on this machine: .*gpuscope run"):
        inject.inject_probe(target.pid, anyway=True, warn=lambda: warned.append(1))
    assert warned == []  # no code ran inside it
    assert target.poll() is None and psutil.Process(target.pid).status() != psutil.STATUS_STOPPED
    assert probe_client.probe_path(target.pid) is None
    capsys.readouterr()
    status = cli.main(["run", "--inject", "--pid", str(target.pid)])
    err = capsys.readouterr().err
    assert status == 1 and "refused: injection is unsafe on this machine: gdb's call killed" in err
    assert len(err.strip().splitlines()) == 2  # "checking..." and the refusal: no warning, no traceback
    assert target.poll() is None


def test_injection_through_a_debugger_starts_the_probe_in_a_running_python(spawn_python):
    target = spawn_python(IDLE_PY)
    version = python_version_of(target.pid)
    if version is None or version >= (3, 14):
        pytest.skip(f"the debugger route is for Python before 3.14; this target runs {version}")
    debugger, problem = injection_debugger(target_interpreter(target.pid))
    if debugger is None:
        pytest.skip(f"injection is unsafe here: {problem}")
    with pytest.raises(inject.InjectRefused, match="has not imported torch"):
        inject.inject_probe(target.pid)  # the default: only where torch is imported
    assert target.poll() is None
    done = inject.inject_probe(target.pid, anyway=True)
    assert done.method == debugger and target.poll() is None
    with probe_client.probe_for(target.pid) as client:
        assert client.hello()["pid"] == target.pid


@pytest.mark.parametrize("compiled_by", ["gpuscope", "the target's interpreter"])
def test_the_probe_comes_in_compiled_and_from_its_source_where_the_compiled_file_is_refused(spawn_python, compiled_by):
    """Compiling probe.py inside the service would leave it megabytes larger for good: the folder
    staged for the injection holds probe.pyc (compiled by gpuscope for its own Python version,
    else by the target's interpreter as its owner) and the bootstrap loads that; a .pyc the target
    refuses (another Python's magic number) falls back to the source."""
    target = spawn_python(IDLE_PY)
    version = sys.version_info[:2] if compiled_by == "gpuscope" else (3, 0)  # (3, 0): not gpuscope's Python
    folder = inject._stage(target_interpreter(target.pid), version, anyway=True)
    bootstrap, status, pyc = (os.path.join(folder.shared, name) for name in ("bootstrap.py", "status", "probe.pyc"))
    show = "import sys; exec(open(sys.argv[1]).read()); print(sys.modules['gpuscope_probe'].__file__)"

    def loaded() -> str:
        out = subprocess.run([PY, "-c", show, bootstrap], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        with open(status) as f:
            assert f.read().startswith("started "), "the probe did not start"
        return out.stdout.strip()

    try:
        assert loaded() == pyc
        with open(pyc, "r+b") as f:
            f.write(b"\0\0\0\0")
        assert loaded() == pyc[:-1]
    finally:
        folder.close()


def test_the_injection_takes_lldb_where_gdb_harms_processes_and_neither_where_both_do(monkeypatch):
    from gpuscope.core.target import interpreter as target  # noqa: PLC0415 - its canary is played

    monkeypatch.setattr(target, "_SAFE_INJECTION", {})
    monkeypatch.setattr(target.shutil, "which", lambda name: f"/usr/bin/{name}")
    harmed = {"gdb": "gdb cannot call into processes on this machine (Couldn't write extended state status)"}
    monkeypatch.setattr(target, "_canary", lambda name, path, interpreter: harmed.get(name))
    mine = target_interpreter(os.getpid())
    assert target.injection_debugger(mine) == ("lldb", None)
    harmed["lldb"] = "lldb harmed a test process when calling into it (Segmentation fault)"
    monkeypatch.setattr(target, "_SAFE_INJECTION", {})
    debugger, why = target.injection_debugger(mine)
    assert debugger is None and harmed["gdb"] in why and harmed["lldb"] in why
    del harmed["gdb"]
    monkeypatch.setattr(target, "_SAFE_INJECTION", {})
    assert target.injection_debugger(mine) == ("gdb", None)  # gdb first where it is safe


def test_a_main_thread_asleep_in_one_long_call_is_said_not_to_have_run_the_queued_script(spawn_python):
    """lldb queues the script for the main thread; one asleep for ten minutes does not run it in
    time: the refusal says so, and the target is left running, not stopped."""
    target = spawn_python("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    debugger, problem = injection_debugger(target_interpreter(target.pid))
    if debugger != "lldb":
        pytest.skip(f"lldb does not inject here (gdb runs the script before it detaches): {debugger or problem}")
    with pytest.raises(inject.InjectRefused, match="has not run the script within 2 s .*main thread"):
        inject.inject_probe(target.pid, anyway=True, timeout=2)
    assert target.poll() is None and psutil.Process(target.pid).status() != psutil.STATUS_STOPPED


@pytest.mark.skipif(sys.version_info < (3, 14), reason="sys.remote_exec needs Python 3.14 (this is %d.%d)"
                    % sys.version_info[:2])
def test_injection_through_remote_exec_starts_the_probe(spawn_python):
    target = spawn_python(IDLE_PY)
    done = inject.inject_probe(target.pid, anyway=True)
    assert done.method == "sys.remote_exec"
    wait_until(lambda: probe_client.probe_path(target.pid), timeout=10, what="the probe")
