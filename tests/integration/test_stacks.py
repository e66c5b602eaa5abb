"""Stack dumps and sampling with the real py-spy against real Python programs."""

import json
import subprocess
import sys

import psutil
import pytest

from gpuscope.core.target import pyspy
from gpuscope.core.target.stacks import LIBRARY, NATIVE, OWN, STDLIB, StackFrame, classify, owner_frame

from helpers import IDLER, gpuscope_cmd, wait_until

BUSY = """
import threading, time
def worker(n):
    while True:
        time.sleep(60)  # asleep whenever a dump comes: never caught awake, even on a busy machine
for i in range(3):
    threading.Thread(target=worker, args=(i,), name=f"worker-{i}", daemon=True).start()
def crunch():
    return sum(i * i for i in range(5000))
print("ready", flush=True)
while True:
    crunch()
"""
ASLEEP = """
import time
print("ready", flush=True)
time.sleep(1e6)  # never awake: a program that wakes each second is caught runnable on a busy machine
"""
MANY_THREADS = """
import threading, time
for i in range(100):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""
ASYNC = """
import asyncio
async def crunch():
    while True:
        sum(i * i for i in range(20000))
        await asyncio.sleep(0)
async def main():
    print("ready", flush=True)
    await asyncio.gather(crunch(), asyncio.sleep(600))
asyncio.run(main())
"""
LIBRARY_LOOP = """
import psutil
me = psutil.Process()
print("ready", flush=True)
while True:
    me.cpu_times()
"""
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time\\ndef nap():\\n    print('child-ready', flush=True)\\n    time.sleep(600)\\nnap()"])
print(child.pid, flush=True)
time.sleep(600)
"""


def own_frames(dump):
    return [(f.function, f.kind) for t in dump.threads for f in t.frames]


def test_dump_of_an_idle_program(spawn_python):
    child = spawn_python(ASLEEP)
    dump = pyspy.dump(child.pid)
    assert dump.pid == child.pid and dump.mode == "blocking" and len(dump.threads) == 1
    [main] = dump.threads
    assert main.name in (None, "MainThread") and main.state == "idle"  # no name until threading is imported
    assert main.frames[0].kind == OWN and main.frames[-1].function == "<module>"


def test_sampling_an_idle_program_says_it_was_idle(spawn_python):
    child = spawn_python(ASLEEP)
    out = subprocess.run(gpuscope_cmd() + ["stacks", "--pid", str(child.pid), "--samples", "20", "--interval", "0.02"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith(f"process {child.pid}: 20 ") and len(lines) == 2, out.stdout  # the header, then why nothing
    assert "no thread was active in any dump: the process was idle" in lines[1], out.stdout


def test_busy_program_threads_states_and_sampled_hot_path(spawn_python):
    child = spawn_python(BUSY)
    dump = pyspy.dump(child.pid)
    names = {t.name for t in dump.threads}
    assert {"MainThread", "worker-0", "worker-1", "worker-2"} <= names
    worker = next(t for t in dump.threads if t.name == "worker-0")
    assert worker.frames[0].function == "worker" and worker.frames[0].kind == OWN
    assert any(f.kind == STDLIB and f.function.startswith("Thread.") for f in worker.frames)
    sample = pyspy.sample(child.pid, 20, 0.02)
    assert sample.samples == 20 and sample.paths
    hottest = sample.paths[0]
    assert any(f.function == "crunch" for f in hottest.frames)
    assert hottest.frames[0].function == "<module>"  # outermost first in a hot path
    assert abs(sum(p.share for p in sample.paths) - 1.0) < 1e-9


def test_many_threads_are_read_without_pausing_the_process(spawn_python):
    child = spawn_python(MANY_THREADS)
    dump = pyspy.dump(child.pid)
    assert dump.mode == "nonblocking" and len(dump.threads) == 101


def test_asyncio_program_shows_its_coroutine_and_the_event_loop(spawn_python):
    child = spawn_python(ASYNC)
    sample = pyspy.sample(child.pid, 15, 0.02)
    frames = {f.function: f.kind for p in sample.paths for f in p.frames}
    assert frames.get("crunch") == OWN
    assert frames.get("BaseEventLoop.run_forever") == STDLIB


def test_installed_packages_are_told_apart_from_own_code(spawn_python):
    child = spawn_python(LIBRARY_LOOP)
    sample = pyspy.sample(child.pid, 15, 0.02)
    kinds = {f.kind for p in sample.paths for f in p.frames}
    assert LIBRARY in kinds and OWN in kinds


def test_a_subprocess_is_dumped_by_its_own_pid(spawn_python, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "child-ready"  # the child shares the parent's stdout
        dump = pyspy.dump(child_pid)
        assert [f.function for f in dump.threads[0].frames][:1] == ["nap"]
        assert pyspy.dump(parent.pid).threads[0].frames[0].function == "<module>"
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_failures_are_one_sentence(spawn_python, monkeypatch, tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(pyspy.PySpyError, match="not a Python process"):
            pyspy.dump(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    gone = spawn_python(IDLER)
    gone.kill()
    gone.wait()
    with pytest.raises(pyspy.PySpyError, match=f"process {gone.pid} exited"):
        pyspy.dump(gone.pid)
    alive = spawn_python(IDLER)
    monkeypatch.setattr(pyspy.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(pyspy.sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pyspy.PySpyError, match="py-spy is not installed"):
        pyspy.dump(alive.pid)


def test_classification_and_comprehensions_fold_into_their_function():
    assert classify("/usr/lib/python3.11/threading.py") == STDLIB
    assert classify("<frozen importlib._bootstrap>") == STDLIB
    assert classify("/venv/lib/python3.11/site-packages/torch/nn/module.py") == LIBRARY
    assert classify("/venv/lib/python3.11/site-packages/vllm/engine.py", own_roots=("/vllm/",)) == OWN
    assert classify("/srv/app/serve.py") == OWN
    assert classify("libc.so.6", native_module="libc.so.6") == NATIVE
    stack = (
        StackFrame("bytearray", "<native>", 0, NATIVE),
        StackFrame("<listcomp>", "/srv/app/rag.py", 41, OWN),
        StackFrame("Retriever.search", "/srv/app/rag.py", 40, OWN),
        StackFrame("handle", "/srv/app/server.py", 9, OWN),
    )
    assert owner_frame(stack) == StackFrame("Retriever.search", "/srv/app/rag.py", 41, OWN)
    assert owner_frame((StackFrame("dumps", "/usr/lib/python3.11/json/__init__.py", 1, STDLIB),)) is None


def test_stacks_command_json_and_errors(spawn_python):
    child = spawn_python(BUSY)
    out = subprocess.run(gpuscope_cmd() + ["stacks", "--pid", str(child.pid), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == "gpuscope.stacks/1" and doc["pid"] == child.pid and doc["samples"] == 1
    assert doc["mode"] == "blocking"
    worker = next(t for t in doc["threads"] if t["name"] == "worker-1")
    assert worker["frames"][0] == {"function": "worker", "file": worker["frames"][0]["file"], "line": 5, "kind": "own"}
    assert all("locals" not in f for t in doc["threads"] for f in t["frames"])  # only when asked for

    out = subprocess.run(gpuscope_cmd() + ["stacks", "--pid", str(child.pid), "--samples", "8", "--interval", "0.02", "--json"],
                         capture_output=True, text=True, timeout=60)
    doc = json.loads(out.stdout)
    assert doc["samples"] == 8 and doc["hot_paths"][0]["count"] >= 1
    assert any(f["function"] == "crunch" for f in doc["hot_paths"][0]["frames"])

    out = subprocess.run(gpuscope_cmd() + ["stacks", "--pid", str(child.pid), "--locals"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "n = " in out.stdout  # worker(n) shows its argument

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        out = subprocess.run(gpuscope_cmd() + ["stacks", "--pid", str(sleeper.pid)], capture_output=True, text=True, timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "not a Python process" in out.stderr


# Stand-ins for a py-spy that dies with the target stopped (py-spy #390, #416: a stop it sent is
# delivered after it let go). Called as `py-spy dump --pid PID ...`: $3 is the target. `exec`, so
# that killing the stand-in leaves no child holding its output open.
STOPS_THEN_HANGS = '#!/bin/sh\nkill -STOP "$3"\nexec sleep 60\n'
STOPS_THEN_FAILS = '#!/bin/sh\nkill -STOP "$3"\necho "Error: failed to read the stack" >&2\nexit 1\n'


@pytest.mark.parametrize("script, error", [(STOPS_THEN_HANGS, "did not finish"), (STOPS_THEN_FAILS, "failed to read")],
                         ids=["killed-at-its-deadline", "failed"])
def test_a_py_spy_that_dies_with_the_target_stopped_never_leaves_it_stopped(spawn_python, monkeypatch, tmp_path,
                                                                           script, error):
    child = spawn_python(BUSY)
    stand_in = tmp_path / "py-spy"
    stand_in.write_text(script)
    stand_in.chmod(0o755)
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: str(stand_in))
    with pytest.raises(pyspy.PySpyError, match=error):
        pyspy.dump(child.pid, timeout=2)
    target = psutil.Process(child.pid)
    assert target.status() != psutil.STATUS_STOPPED
    before = sum(target.cpu_times()[:2])
    wait_until(lambda: sum(target.cpu_times()[:2]) > before, timeout=10, what="the target to keep running")


def test_a_target_that_exits_while_being_sampled_keeps_what_was_sampled(spawn_python):
    child = spawn_python(BUSY.replace("while True:\n    crunch()", "import time\nend = time.time() + 1.0\nwhile time.time() < end:\n    crunch()"))
    sample = pyspy.sample(child.pid, 200, 0.02)
    assert 0 < sample.samples < 200 and any("exited" in e for e in sample.errors)
    assert any(f.function == "crunch" for p in sample.paths for f in p.frames)
