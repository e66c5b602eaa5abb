"""gpuscope's probe inside a service: its protocol, its client, its manners.

The probe runs in real child processes (without torch, with CPU torch, with a stand-in torch whose
CUDA is "initialised"), except where a test needs to look at the files it makes.
"""

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import types
from pathlib import Path

import psutil
import pytest

from gpuscope import probe
from gpuscope.core.diagnosis import ladder as allocations
from gpuscope.core.diagnosis import attribution
from gpuscope.core.target import probe_client
from gpuscope.core.target.probe_client import ProbeClient, ProbeError

from helpers import ROOT, SUPPORT, wait_until

TESTS = str(SUPPORT)

# A child with the probe started; `{setup}` runs before the probe, `{body}` after "ready".
PROBED = """
import os, sys, time
sys.path.insert(0, {tests!r})
{setup}
from gpuscope import probe
assert probe.start(), probe.last_error()
print("ready", flush=True)
{body}
"""
IDLE = "while True:\n    time.sleep(0.2)"
EXIT_ON_FLAG = "while not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\nprint('bye', flush=True)"
LEAKING = """
keep = []
def keep_request_buffers(i):
    keep.append(bytearray(200_000))
def handle(i):
    scratch = [bytearray(50_000) for _ in range(4)]
    keep_request_buffers(i)
    return len(scratch)
i = 0
while True:
    handle(i); i += 1
    time.sleep(0.01)
"""
FAKE_CUDA = "import fake_cuda_torch as torch"
CUDA_LEAKING = """
kv = []
def keep_kv(step):
    kv.append(torch.empty(4 << 20))
def scratch(step):
    for _ in range(3):
        torch.free(torch.empty(1 << 20))
step = 0
while True:
    keep_kv(step); scratch(step); step += 1
    time.sleep(0.02)
"""


def probed(spawn_python, body=IDLE, setup="", *args):
    child = spawn_python(PROBED.format(tests=TESTS, setup=setup, body=textwrap.dedent(body)), *args)
    wait_until(lambda: probe_client.probe_path(child.pid), timeout=10, what="the probe's socket")
    return child


def connect(pid, **kw) -> ProbeClient:
    client = probe_client.probe_for(pid, **kw)
    assert client is not None, f"no probe found for {pid}"
    return client


def loaded_after_import(module: str) -> set[str]:
    code = f"import sys\nbefore = set(sys.modules)\nimport {module}\nprint(' '.join(sorted(set(sys.modules) - before)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


# -- importing it ------------------------------------------------------------------------------------


def test_importing_the_probe_loads_only_the_standard_library():
    loaded = loaded_after_import("gpuscope.probe")
    heavy = {m for m in loaded if m.split(".")[0] in ("torch", "textual", "rich", "memray", "psutil", "prometheus_client")}
    assert heavy == set() and not any(m.startswith("gpuscope.core") for m in loaded)


NAMED_BY_CODE = """
import functools
x = [bytearray(10) for _ in range(2)]  # <module>
def deco(f):
    @functools.wraps(f)
    def wrapper(*a):
        return f(*a)
    return wrapper
@deco
def decorated():
    return bytearray(5)  # decorated
def outer():
    def inner():
        return [bytearray(i) for i in range(3)]  # inner
    return inner
class Kept:
    def method(self):
        return bytearray(1)  # method
    @staticmethod
    def static():
        return bytearray(2)  # static
    @property
    def prop(self):
        return bytearray(3)  # prop
    class Nested:
        def deep(self):
            return bytearray(4)  # deep
"""


def test_tracemalloc_sites_are_named_from_the_loaded_code_without_reading_the_file(tmp_path, monkeypatch):
    """tracemalloc's frames carry a file and a line: the probe names the innermost function there
    from the code objects loaded from that file (nested functions, methods, decorated functions;
    a comprehension belongs to its function), not by parsing the source inside the service. The
    file is gone before the names are asked: nothing is read."""
    path = tmp_path / "named_by_code.py"
    path.write_text(NAMED_BY_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "named_by_code", raising=False)
    __import__("named_by_code")
    path.unlink()
    # What else sits in sys.modules is the service's: none of its attribute hooks may run.
    hooked = []
    lazy = types.ModuleType("lazy_module")
    lazy.__getattr__ = lambda name: hooked.append(name)
    monkeypatch.setitem(sys.modules, "lazy_module", lazy)
    monkeypatch.setitem(sys.modules, "not_a_module", type("Anything", (), {"__getattr__": lambda self, name: hooked.append(name)})())
    expected = {i: line.rsplit("# ", 1)[1] for i, line in enumerate(NAMED_BY_CODE.splitlines(), 1) if "bytearray(" in line}
    names = probe._FunctionNames()
    assert {i: names.at(str(path), i) for i in expected} == expected
    assert names.at(str(tmp_path / "never_loaded.py"), 3) == "?"
    assert hooked == []


# -- in this process: files, permissions, start and stop ---------------------------------------------


@pytest.fixture
def runtime(monkeypatch):
    # Not under tmp_path, which can be too deep for a socket's path (at most 107 bytes).
    run = Path(tempfile.mkdtemp(prefix="gpuscope-run-"))  # 0700
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    yield run / "gpuscope"
    probe.stop()
    shutil.rmtree(run, ignore_errors=True)


def test_socket_is_private_named_by_pid_idempotent_and_removed_when_stopped(runtime):
    path = probe.start()
    assert path == str(runtime / f"probe-{os.getpid()}.sock")
    assert stat.S_IMODE(os.stat(runtime).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(path).st_mode) and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert probe.start() == path and probe.running() == path  # once per process
    with ProbeClient(path) as client:
        assert client.hello()["pid"] == os.getpid()
    probe.stop()
    assert not os.path.exists(path) and probe.running() is None
    wait_until(lambda: not any(t.name == "gpuscope-probe" for t in threading.enumerate()), timeout=5,
               what="the probe's thread to end")
    assert probe.start() == path  # and it can start again


def test_the_socket_shows_under_its_name_only_once_it_listens(runtime, monkeypatch):
    # A client that connects to a socket bound but not yet listening is refused, and removes it
    # as a dead probe's: the name must not exist before listen().
    seen = []

    class Watched(socket.socket):
        def listen(self, *args):
            seen.append(os.path.exists(runtime / f"probe-{os.getpid()}.sock"))
            return super().listen(*args)

    monkeypatch.setattr(probe.socket, "socket", Watched)
    path = probe.start()
    assert path and seen == [False]
    assert probe_client.probe_path(os.getpid()) == path and sorted(os.listdir(runtime)) == [os.path.basename(path)]


def test_a_folder_left_too_open_is_made_private(runtime):
    runtime.mkdir(mode=0o755)
    os.chmod(runtime, 0o755)
    assert probe.start()
    assert stat.S_IMODE(os.stat(runtime).st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder of another user needs root")
def test_a_folder_name_taken_by_another_user_is_left_alone_and_a_private_folder_beside_it_used(runtime):
    runtime.mkdir(mode=0o777)
    os.chmod(runtime, 0o777)
    os.chown(runtime, 65534, 65534)
    path = probe.start()
    assert path, probe.last_error()
    folder = Path(path).parent
    assert folder.parent == runtime.parent and folder.name.startswith("gpuscope-")
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert list(runtime.iterdir()) == []  # nothing written into the other user's folder
    assert probe_client.probe_path(os.getpid()) == path  # the client looks beside it too
    probe.stop()
    assert probe.start() == path  # the same private folder next time


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder of another user needs root")
def test_an_explicit_path_in_a_folder_of_another_user_is_refused_without_raising(runtime, capsys):
    runtime.mkdir(mode=0o700)
    os.chown(runtime, 65534, 65534)
    assert probe.start(path=str(runtime / "probe.sock")) is None
    assert "another user" in probe.last_error()
    assert "gpuscope probe: not started" in capsys.readouterr().err


def test_a_second_copy_of_the_module_does_not_start_a_second_probe(runtime):
    """`gpuscope run` may load probe.py by path while the service imports its own gpuscope."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpuscope_probe_copy", probe.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    path = copy.start()
    try:
        assert probe.start() == path and probe.running() is None  # it answered: this copy stays idle
    finally:
        copy.stop()


def test_a_forked_child_leaves_the_parents_probe_alone(spawn_python):
    child = probed(spawn_python, """
        pid = os.fork()
        if pid == 0:
            from gpuscope import probe as p
            assert p.running() is None  # the child has no probe of its own
            sys.exit(0)                 # atexit runs here: it must not remove the parent's socket
        os.waitpid(pid, 0)
        print("forked", flush=True)
        while True:
            time.sleep(0.2)
    """)
    assert child.stdout.readline().strip() == "forked"
    with connect(child.pid) as client:
        assert client.hello()["pid"] == child.pid


def test_the_fallback_folder_is_per_user_in_the_temp_dir(monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert probe.runtime_dir().endswith(f"gpuscope-{os.getuid()}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent-runtime-dir")
    assert probe.runtime_dir().endswith(f"gpuscope-{os.getuid()}")


# -- a service without torch -------------------------------------------------------------------------


def test_hello_and_the_torch_requests_without_torch(spawn_python):
    child = probed(spawn_python)
    with connect(child.pid) as client:
        hello = client.hello()
        assert hello["pid"] == child.pid and hello["torch"] is None and hello["protocol"] == probe.PROTOCOL
        assert hello["cuda"] == {"initialized": False, "available": None, "devices": []}
        for op in ("stats", "history_start", "snapshot", "history_stop"):
            with pytest.raises(ProbeError, match="^CUDA not available: torch is not imported"):
                client.request(op)
    assert probe_client.torch_memory(child.pid) is None


def _descriptors_past(number: int) -> list[int]:
    """Files held open until the next descriptor is numbered `number` or more (a process with
    many connections or open files: a console keeping every process's stat file open, a
    server with a thousand clients)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < number + 64:
        if hard != resource.RLIM_INFINITY and hard < number + 64:
            pytest.skip(f"this machine allows {hard} open files: none is numbered {number} or more")
        resource.setrlimit(resource.RLIMIT_NOFILE, (number + 64, hard))
    held = []
    while not held or held[-1] < number:
        held.append(os.open(os.devnull, os.O_RDONLY))
    return held


HIGH_DESCRIPTORS = """
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
"""


def test_a_client_and_a_probe_with_descriptors_past_1024_talk_and_a_capture_runs_its_time(spawn_python):
    """select() cannot watch a descriptor numbered 1024 or more. A client with that many files
    open (the console and diagnose keep every process's stat file open: a node of a thousand
    processes) read every reply as "closed the connection before answering"; a probe in such a
    service took every client for one that had hung up, and stopped each capture at once."""
    child = probed(spawn_python, LEAKING, HIGH_DESCRIPTORS)
    held = _descriptors_past(1024)
    try:
        with connect(child.pid) as client:
            assert client._sock.fileno() >= 1024
            assert client.hello()["pid"] == child.pid
            reply = client.tracemalloc_track(2.0, interval=0.5)
        assert not reply["stopped_early"] and reply["seconds"] >= 1.9, reply
    finally:
        for fd in held:
            os.close(fd)


def test_garbage_gets_an_error_reply_and_breaks_nothing(spawn_python):
    child = probed(spawn_python)
    path = probe_client.probe_path(child.pid)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(10)
    raw.connect(path)
    reader = raw.makefile("rb")
    for junk in (b"hello\n", b"[1, 2]\n", b'{"op": 5}\n', b'{"op": "rm -rf"}\n', b"\xff\xfe\x00\n",
                 b'{"op": "memray_track", "seconds": "soon"}\n', b'{"op": "diff", "before": [1]}\n'):
        raw.sendall(junk)
        reply = json.loads(reader.readline())
        assert reply["ok"] is False and reply["error"], junk
    raw.sendall(b'{"op": "hello"}\n')  # the same connection still works
    assert json.loads(reader.readline())["result"]["pid"] == child.pid
    raw.sendall(b"x" * (probe.MAX_REQUEST + 10))  # no newline, too long: an error, then closed
    reply = json.loads(reader.readline())
    assert reply["ok"] is False and "longer than" in reply["error"]
    assert reader.readline() == b""
    raw.close()
    with connect(child.pid) as client:  # the probe still serves
        assert client.hello()["pid"] == child.pid
    assert child.poll() is None


def test_two_clients_at_once(spawn_python):
    child = probed(spawn_python, LEAKING)
    slow, quick = connect(child.pid), connect(child.pid)
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault("track", slow.memray_track(1.5)))
    thread.start()
    try:
        wait_until(lambda: quick.hello()["memray_capture"], timeout=10, what="the capture to begin")
        started = time.monotonic()
        assert quick.hello()["pid"] == child.pid  # answered while the other client's capture runs
        assert time.monotonic() - started < 1.0
        with pytest.raises(ProbeError, match="already running"):
            quick.memray_track(1.0)  # one capture at a time in the process
    finally:
        thread.join(30)
        slow.close()
        quick.close()
    assert results["track"]["records"][0]["frames"][0][0] == "keep_request_buffers"


def test_a_process_that_exits_removes_its_socket_and_clients_are_told(spawn_python, tmp_path):
    flag = tmp_path / "exit-now"
    child = probed(spawn_python, EXIT_ON_FLAG, "", str(flag))
    path = probe_client.probe_path(child.pid)
    client = connect(child.pid)
    assert client.hello()["pid"] == child.pid
    flag.touch()
    assert child.stdout.readline().strip() == "bye"
    child.wait(10)
    assert not os.path.exists(path)  # atexit removed it
    with pytest.raises(ProbeError, match="gone away|closed the connection"):
        client.hello()
    assert probe_client.probe_for(child.pid) is None
    with pytest.raises(ProbeError, match="no probe answers"):
        ProbeClient(path)


def test_a_killed_process_leaves_a_stale_socket_that_the_client_removes(spawn_python):
    child = probed(spawn_python)
    path = probe_client.probe_path(child.pid)
    child.kill()
    child.wait(10)
    assert os.path.exists(path)  # SIGKILL: no atexit
    assert child.pid not in [p.pid for p in probe_client.list_probes()]
    assert not os.path.exists(path)


def test_list_probes_finds_live_probes(spawn_python):
    first, second = probed(spawn_python), probed(spawn_python)
    pids = {p.pid for p in probe_client.list_probes()}
    assert {first.pid, second.pid} <= pids


def test_a_reply_that_never_comes_times_out(tmp_path):
    path = str(tmp_path / "mute.sock")
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(path)
    mute.listen(1)
    try:
        with ProbeClient(path, timeout=0.5) as client:
            started = time.monotonic()
            with pytest.raises(ProbeError, match="did not answer hello within 0.5 s"):
                client.hello()
            assert time.monotonic() - started < 3
    finally:
        mute.close()


# -- with CPU torch: "CUDA not available", and CUDA is never initialised -----------------------------


def test_with_cpu_torch_the_torch_requests_say_cuda_not_available(spawn_python):
    torch = pytest.importorskip("torch")
    child = probed(spawn_python, setup="import torch")
    with connect(child.pid, timeout=30) as client:
        hello = client.hello()
        assert hello["torch"] == torch.__version__
        for op in ("stats", "history_start", "snapshot", "diff", "history_stop"):
            with pytest.raises(ProbeError, match="^CUDA not available: torch has not initialised CUDA"):
                client.request(op)
        assert client.hello()["cuda"]["initialized"] is False  # asking did not initialise it
    result = allocations.attribute(child.pid, 0.5, use_memray=False)
    assert result.rungs[0] == attribution.Rung(
        "torch-history", "skipped", "CUDA not available in the process (torch has not initialised CUDA)"
    )


# -- with CUDA "initialised" (a stand-in torch): stats, history, snapshots, the torch rung ----------


def test_stats_read_memory_stats_and_missing_keys_are_null(spawn_python):
    child = probed(spawn_python, "torch.empty(3 << 20)\n" + IDLE, FAKE_CUDA)
    with connect(child.pid) as client:
        hello = client.hello()
        assert hello["torch"] == "2.99.0+fake" and hello["cuda"]["initialized"] is True
        assert hello["cuda"]["devices"] == [{"index": 0, "name": "Fake GPU", "total_memory": 80 << 30}]
        (device,) = client.stats()["devices"]
    assert device["allocated"] == 3 << 20 and device["reserved"] == 3 << 20 and device["allocations"] == 1
    assert device["reserved_peak"] is None and device["inactive_split"] is None and device["num_ooms"] == 0
    (memory,) = probe_client.torch_memory(child.pid)
    assert (memory.index, memory.allocated, memory.reserved) == (0, 3 << 20, 3 << 20)


def test_torch_history_rung_names_the_function_that_keeps_cuda_blocks(spawn_python):
    child = probed(spawn_python, CUDA_LEAKING, FAKE_CUDA)
    result = allocations.attribute(child.pid, 1.5)
    assert result.method == "torch-history" and result.confidence == "high"
    assert result.rungs == (attribution.Rung("torch-history", "used", result.rungs[0].detail),)
    top = result.suspects[0]
    assert top.function == "keep_kv" and top.method == "torch-history" and top.share == 1.0
    assert top.bytes == top.count * (4 << 20) and top.count >= 10  # bytes still held, not churn
    with connect(child.pid) as client:
        assert client.hello()["history"] is False  # recording was stopped again


def test_history_recording_stops_when_the_client_that_started_it_goes_away(spawn_python):
    """A gpuscope killed mid-diagnosis must not leave the allocator recording stacks in the service."""
    child = probed(spawn_python, IDLE, FAKE_CUDA)
    starter = connect(child.pid)
    assert starter.history_start(max_entries=1000)["recording"] is True
    with connect(child.pid) as other:
        assert other.hello()["history"] is True
        starter.close()  # as the kernel does for a client killed with SIGKILL
        wait_until(lambda: other.hello()["history"] is False, timeout=5, what="recording to stop")
        assert other.history_start()["recording"] is True
    with connect(child.pid) as again:  # the client that started it went: stopped again
        wait_until(lambda: again.hello()["history"] is False, timeout=5, what="recording to stop")


def test_snapshots_are_bounded_and_diff_needs_two(spawn_python):
    child = probed(spawn_python, CUDA_LEAKING, FAKE_CUDA)
    with connect(child.pid) as client:
        with pytest.raises(ProbeError, match="take two snapshots first"):
            client.diff()
        client.history_start(max_entries=10**9)
        ids = [client.snapshot(limit=1)["id"] for _ in range(3)]
        with pytest.raises(ProbeError, match=f"no snapshot {ids[0]} "):
            client.diff(before=ids[0], after=ids[2])
        diff = client.diff()  # the two latest
        assert (diff["before"], diff["after"]) == (ids[1], ids[2])
        assert client.history_stop()["stopped"] is True


# -- the snapshot logic, on snapshots in PyTorch's documented format --------------------------------


def frame(name, line, filename="/srv/app/model.py"):
    return {"filename": filename, "line": line, "name": name}


def block(address, size, state="active_allocated", frames=()):
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": list(frames)}


KV = [frame("grow_cache", 40), frame("decode", 90), frame("<module>", 5, "/srv/app/serve.py")]
ACT = [frame("forward", 12), frame("decode", 88), frame("<module>", 5, "/srv/app/serve.py")]


def snapshot(*blocks, device=0):
    return {"segments": [{"device": device, "address": 0, "total_size": 1 << 30, "segment_type": "large",
                          "blocks": list(blocks)}], "device_traces": [[]]}


def test_live_blocks_are_active_allocated_only():
    snap = snapshot(block(1, 100, frames=KV), block(2, 200, "inactive"), block(3, 300, "active_awaiting_free", ACT),
                    block(4, 400, "active_pending_free", ACT), block(5, 500))  # 5: from before history
    blocks, truncated = probe.live_blocks(snap)
    assert [(b[1], b[2]) for b in blocks] == [(1, 100), (5, 500)] and not truncated
    assert blocks[0][3][0] == ("grow_cache", "/srv/app/model.py", 40) and blocks[1][3] == ()
    assert probe.live_blocks(snap, limit=1) == (blocks[:1], True)
    assert probe.live_blocks({}) == ([], False) and probe.live_blocks({"segments": [{"blocks": None}]}) == ([], False)


def test_diff_keeps_what_was_allocated_between_and_is_still_held():
    before, _ = probe.live_blocks(snapshot(block(1, 500), block(2, 100, frames=KV), block(3, 64, frames=ACT)))
    after, _ = probe.live_blocks(snapshot(
        block(1, 500),                      # from before history: held all along
        block(2, 100, frames=KV),           # held all along
        # 3 was freed; its address was reused by a new block of the same size elsewhere
        block(3, 64, frames=KV),
        block(6, 2048, frames=KV), block(7, 2048, frames=KV),
        block(8, 512, frames=ACT),
        block(9, 4096, "inactive"),         # cached by the allocator, not held
        block(10, 1024, "active_awaiting_free", KV),  # freed by the program
    ))
    groups, omitted = probe.group_by_stack(probe.diff_blocks(before, after))
    assert [(g["bytes"], g["count"], g["frames"][0][0]) for g in groups] == [(4160, 3, "grow_cache"), (512, 1, "forward")]
    assert omitted == 0 and groups[0]["frames"][1] == ["decode", "/srv/app/model.py", 90]
    assert probe.group_by_stack(probe.diff_blocks(before, after), limit=1)[1] == 1
    suspects = attribution.suspects_from_records([(tuple(map(tuple, g["frames"])), g["bytes"], g["count"]) for g in groups],
                                                 method="torch-history")
    assert [(s.function, s.bytes, s.method) for s in suspects] == [("grow_cache", 4160, "torch-history"),
                                                                   ("forward", 512, "torch-history")]


def test_device_stats_reads_keys_defensively():
    figures = probe.device_stats({"allocated_bytes.all.current": 10, "allocated.all.current": 3, "num_ooms": 1,
                                  "reserved_bytes.all.current": True})
    assert figures["allocated"] == 10 and figures["allocations"] == 3 and figures["num_ooms"] == 1
    assert figures["reserved"] is None and figures["num_alloc_retries"] is None
    assert all(v is None for v in probe.device_stats(None).values())


# -- memray in process ------------------------------------------------------------------------------


def test_memray_track_names_what_stays_and_leaves_out_the_probe(spawn_python):
    child = probed(spawn_python, LEAKING)
    with connect(child.pid) as client:
        reply = client.memray_track(1.0)
    assert 0.9 < reply["seconds"] < 5 and reply["bytes"] > 1_000_000
    top = reply["records"][0]
    assert top["frames"][0][0] == "keep_request_buffers" and top["size"] >= 20 * 200_000
    assert not any(f[1].endswith("probe.py") for r in reply["records"] for f in r["frames"])


def test_memray_track_stops_when_the_client_hangs_up(spawn_python):
    child = probed(spawn_python, LEAKING)
    client = connect(child.pid)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(ProbeError, match="cancelled"):
        client.memray_track(60, cancelled=cancel.is_set)
    assert time.monotonic() - started < 5
    with connect(child.pid) as again:  # the capture ended: a new one may start at once
        wait_until(lambda: _tracks(again), timeout=10, what="the cancelled capture to end")


def _tracks(client):
    try:
        return client.memray_track(0.2) is not None
    except ProbeError as exc:
        assert "already running" in str(exc)
        return False


def test_memray_missing_in_the_service_is_said_plainly(spawn_python):
    child = probed(spawn_python, setup="sys.modules['memray'] = None  # as if not installed")
    with connect(child.pid) as client:
        with pytest.raises(ProbeError, match="install memray \\(or gpuscope\\) into the service's environment"):
            client.memray_track(1)
        assert client.hello()["pid"] == child.pid
    assert psutil.Process(child.pid).is_running()
