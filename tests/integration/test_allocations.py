"""The attribution ladder against real leaking programs, real memray and real py-spy.

memray's allocation tracking names the leaking function; stack sampling alone does not (it sees
where time goes) — which is why the ladder exists. `memray attach` needs to inject code through
gdb before Python 3.14; where that would harm the target, the ladder refuses and the target lives.
"""

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import venv

import psutil
import pytest

from gpuscope.core.diagnosis import _memray_attach, _probe_trackers
from gpuscope.core.diagnosis import ladder as allocations
from gpuscope.core.target.interpreter import injection_debugger, target_interpreter

from gpuscope.core.diagnosis import attribution

from gpuscope.core.target import privilege

from helpers import canary_says, wait_until

# Each leaker: a fast function that keeps what it allocates, beside neighbours that only make
# temporaries or burn CPU. Bounded, so that `memray run` sees the end.
LEAKERS = {
    "beside CPU-heavy neighbours": ("leak", """
        cache = {{}}
        def leak(i):
            cache[i] = bytearray(100_000)
        def churn():
            return [bytearray(100_000) for _ in range(20)]
        def cpu_heavy():
            return sum(i * i for i in range(30000))
        for i in range({n}):
            leak(i); churn(); cpu_heavy()
    """),
    "in a background thread": ("collect", """
        import threading
        kept = []
        def collect(n):
            for _ in range(n):
                kept.append(bytes(50_000))
        def busy():
            return sorted(str(i) for i in range(20000))
        t = threading.Thread(target=collect, args=({n},), name="collector")
        t.start()
        for _ in range({n}):
            busy()
        t.join()
    """),
    "an unbounded dict cache": ("search", """
        class Retriever:
            def __init__(self):
                self.cache = {{}}
            def search(self, query):
                if query not in self.cache:
                    self.cache[query] = [bytearray(1_000) for _ in range(100)]
                return self.cache[query]
        def rerank(docs):
            return sorted(docs, key=len)
        r = Retriever()
        for i in range({n}):
            rerank(r.search(f"q{{i}}"))
    """),
    "a slow leak among large short-lived allocations": ("remember", """
        history = []
        def remember(i):
            history.append(bytearray(10_000))
        def batch():
            buf = bytearray(5_000_000)
            return len(buf)
        for i in range({n}):
            batch(); remember(i)
    """),
}


def program(body: str, n: int) -> str:
    return textwrap.dedent(body).format(n=n)


@pytest.mark.parametrize("case", list(LEAKERS))
def test_memray_names_the_leaking_function_first(tmp_path, case):
    leaker, body = LEAKERS[case]
    script = tmp_path / "leaker.py"
    script.write_text(program(body, 150))
    capture = tmp_path / "capture.bin"
    run = subprocess.run([sys.executable, "-m", "memray", "run", "--aggregate", "-q", "-o", str(capture), str(script)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    suspects = attribution.suspects_from_capture(str(capture), (str(tmp_path) + "/",))
    assert suspects[0].function == leaker and suspects[0].method == "memray"
    assert suspects[0].bytes > 0 and suspects[0].share > 0.5 and suspects[0].file == str(script)


def test_a_capture_in_the_folder_shared_with_the_process_is_read_through_the_opened_file(tmp_path):
    """`memray attach` has the process write its capture into a folder of its owner's: gpuscope
    reads it as the regular file it opened, without following any link (see tests/security)."""
    leaker, body = LEAKERS["beside CPU-heavy neighbours"]
    script = tmp_path / "leaker.py"
    script.write_text(program(body, 150))
    with privilege.SharedFolder("memray", privilege.owner_of(os.getpid())) as folder:
        assert _memray_attach._read_capture(folder, ()) is None  # not written yet
        capture = os.path.join(folder.shared, "capture.bin")
        run = subprocess.run([sys.executable, "-m", "memray", "run", "--aggregate", "-q", "-o", capture, str(script)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        suspects = _memray_attach._read_capture(folder, (str(tmp_path) + "/",))
    assert suspects[0].function == leaker and suspects[0].file == str(script)
    assert not os.path.exists(folder.private)


def test_stack_sampling_alone_does_not_name_the_leak_and_says_it_is_low_confidence(spawn_python):
    _, body = LEAKERS["beside CPU-heavy neighbours"]
    child = spawn_python(program(body, 3000).replace("\nfor i in", '\nprint("ready", flush=True)\nfor i in', 1))
    result = allocations.attribute(child.pid, 3.0, use_memray=False)
    assert result.method == "stack-sampling" and result.confidence == "low"
    assert [r.status for r in result.rungs] == ["skipped", "skipped", "skipped", "used"]
    assert result.suspects and result.suspects[0].function != "leak"  # it finds where time goes
    assert all(s.bytes is None for s in result.suspects)


def slow_leaker(spawn_python):
    _, body = LEAKERS["beside CPU-heavy neighbours"]
    return spawn_python(program(body, 100000).replace("\nfor i in", '\nimport time\nprint("ready", flush=True)\nfor i in', 1)
                        .replace("cpu_heavy()\n", "cpu_heavy(); time.sleep(0.01)\n"))


def test_memray_attaches_names_the_leak_and_leaves_the_target_running(spawn_python):
    child = slow_leaker(spawn_python)
    debugger, problem = injection_debugger(target_interpreter(child.pid))
    if debugger is None:  # the refusal is tested below on any machine; attaching needs a debugger that is safe
        pytest.skip(f"no debugger can inject safely on this machine: {problem}")
    # Tracking 3 s, with time to bring the probe in first: through a debugger that takes 1-2 s on
    # a quiet machine and 3.5-5 s on a loaded one, where a budget of the tracking's 3 s left the
    # trackers none.
    result = allocations.attribute(child.pid, 3.0, budget=60.0)
    memray_rung = next(r for r in result.rungs if r.method == "memray")
    assert memray_rung.status == "used" and result.method == "memray" and result.suspects[0].function == "leak", \
        "; ".join(f"{r.method} {r.status}: {r.detail}" for r in result.rungs)
    assert child.poll() is None and psutil.Process(child.pid).status() != psutil.STATUS_STOPPED


def test_where_gdb_harms_processes_the_memray_rung_refuses_and_the_target_lives(spawn_python, monkeypatch):
    child = slow_leaker(spawn_python)
    canary_says(monkeypatch, "gdb's call killed the throwaway process (SIGSEGV)")
    result = allocations.attribute(child.pid, 3.0)
    memray_rung = next(r for r in result.rungs if r.method == "memray")
    assert memray_rung.status == "failed" and "gdb's call killed the throwaway process" in memray_rung.detail
    assert result.method in ("stack-sampling", None)  # the sampling rung's, where its dumps found suspects
    assert child.poll() is None and psutil.Process(child.pid).status() != psutil.STATUS_STOPPED


def test_memray_not_importable_in_the_target_is_said_with_what_to_do(tmp_path):
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)  # an environment without memray (or anything else)
    python = bare / "bin" / "python"
    target = subprocess.Popen([str(python), "-c", "import time\nprint('ready', flush=True)\ntime.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        with pytest.raises(allocations.AttachRefused, match="memray is not importable.*install it into the service"):
            allocations.check_attach(target.pid)
        result = allocations.attribute(target.pid, 1.0)
        statuses = {r.method: r.status for r in result.rungs}
        assert statuses["torch-history"] == "skipped" and statuses["memray"] == "failed", result.rungs
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()


def test_an_exited_process_is_refused(spawn_python):
    child = spawn_python("print('ready', flush=True)")
    wait_until(lambda: child.poll() is not None, what="the child to exit")
    with pytest.raises(allocations.AttachRefused, match="exited"):
        allocations.check_attach(child.pid)


# -- with gpuscope's probe inside the process: memray in process, no injection ----------------------

PROBED_LEAKER = """
import time
from gpuscope import probe
assert probe.start()
cache = {}
def leak(i):
    cache[i] = bytearray(100_000)
def churn():
    return [bytearray(100_000) for _ in range(20)]
def cpu_heavy():
    return sum(i * i for i in range(30000))
print("ready", flush=True)
i = 0
while True:
    leak(i); churn(); cpu_heavy(); i += 1
    time.sleep(0.01)
"""


def test_a_process_with_a_probe_has_its_leak_named_by_memray_in_process(spawn_python, monkeypatch):
    """Where gdb cannot inject, `memray attach` is refused; the probe needs no injection."""
    canary_says(monkeypatch, "gdb's call killed the throwaway process (SIGSEGV)")
    child = spawn_python(PROBED_LEAKER)
    result = allocations.attribute(child.pid, 2.0)
    assert result.method == "memray" and result.confidence == "high"
    torch_rung, memray_rung = result.rungs
    assert torch_rung == attribution.Rung("torch-history", "skipped", "torch is not imported in the process")
    assert memray_rung.status == "used" and memray_rung.detail.startswith("in process through gpuscope's probe")
    top = result.suspects[0]
    assert top.function == "leak" and top.method == "memray" and top.share > 0.5 and top.bytes >= 10 * 100_000
    assert child.poll() is None


def test_without_a_probe_the_torch_rung_says_how_to_get_one(spawn_python):
    child = spawn_python("import time\nprint('ready', flush=True)\ntime.sleep(60)")
    result = allocations.attribute(child.pid, 0.3, use_memray=False)
    assert result.rungs[0].status == "skipped" and "no gpuscope probe" in result.rungs[0].detail
    assert "gpuscope run" in result.rungs[0].detail


def test_the_demo_service_leak_is_named_through_its_probe():
    """The demo (retriever caching every query) under its load generator: attribute(pid, 8)."""
    service = subprocess.Popen([sys.executable, "-m", "gpuscope.demo.service", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    load = None
    try:
        url = service.stdout.readline().strip().removeprefix("listening on ")
        assert url.startswith("http://"), service.stderr.read()
        load = subprocess.Popen([sys.executable, "-m", "gpuscope.demo.load", "--url", url, "--rate", "20"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: allocations.probe_client.probe_path(service.pid), timeout=10, what="the demo's probe")
        result = allocations.attribute(service.pid, 8)
        assert result.method == "memray", result.rungs
        assert "through gpuscope's probe" in result.rungs[1].detail
        top = result.suspects[0]
        # The block is allocated in Retriever._remember (called by Retriever.search): the innermost
        # own frame, so the suspect is `_remember`, holding nearly everything that stayed.
        assert top.function == "_remember" and top.method == "memray" and top.bytes > 0
        assert top.file.endswith("gpuscope/demo/service.py") and top.share > 0.9
        assert [f.function for f in top.stack[:2]] == ["_remember", "search"]
        assert service.poll() is None
    finally:
        for proc in (load, service):
            if proc is not None:
                proc.terminate()
                proc.wait(10)


# -- the sampling rung survives torn dumps ---------------------------------------------------------


def _tearing(real, every: int):
    """py-spy's dump, with every `every`-th one failing as a torn nonblocking dump does."""
    calls = []

    def dump(pid, **kwargs):
        calls.append(pid)
        if len(calls) % every == 0:
            raise allocations.pyspy.PySpyError(f"py-spy failed on process {pid}: Failed to get stack traces")
        return real(pid, **kwargs)

    return dump


def test_a_torn_dump_is_skipped_and_counted_not_the_end_of_the_rung(spawn_python, monkeypatch):
    _, body = LEAKERS["beside CPU-heavy neighbours"]
    child = spawn_python(program(body, 3000).replace("\nfor i in", '\nprint("ready", flush=True)\nfor i in', 1))
    monkeypatch.setattr(allocations.pyspy, "dump", _tearing(allocations.pyspy.dump, 3))
    result = allocations.attribute(child.pid, 3.0, use_memray=False)
    rung = result.rungs[-1]
    assert rung.method == "stack-sampling" and rung.status == "used", result.rungs
    assert re.search(r"; \d+ of \d+ dumps failed and were skipped", rung.detail), rung.detail


def test_the_sampling_rung_fails_when_most_dumps_fail_and_says_how_many(spawn_python, monkeypatch):
    child = spawn_python("import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.01)")
    real = allocations.pyspy.dump
    monkeypatch.setattr(allocations.pyspy, "dump", _tearing(real, 1))
    said = []
    result = allocations.attribute(child.pid, 1.5, use_memray=False, said=said.append)
    rung = result.rungs[-1]
    assert rung.status == "failed" and re.match(r"\d+ of \d+ stack dumps of process \d+ failed", rung.detail), rung
    assert said == [f"stack-sampling: {rung.detail}"]


@contextlib.contextmanager
def probed_in_a_bare_venv(tmp_path, script):
    """`script` run under `gpuscope run` by a venv's Python with nothing installed (no memray, no
    rich), once it says ready and its probe listens; killed afterwards."""
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)
    proc = subprocess.Popen([sys.executable, "-m", "gpuscope", "run", "--", str(bare / "bin" / "python"), str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        wait_until(lambda: allocations.probe_client.probe_path(proc.pid), timeout=10, what="the probe")
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_without_any_memray_tracemalloc_names_the_leak_and_says_what_it_cannot_see(tmp_path, monkeypatch):
    """An interpreter without memray, and no memray of gpuscope's to lend it: the tracemalloc rung,
    through the probe `gpuscope run` started, names the leaking function from its held bytes."""
    script = tmp_path / "leaker.py"
    script.write_text(textwrap.dedent("""
        import time
        kept = []
        def leak():
            kept.append(bytearray(200_000))
        def churn():
            return [bytearray(100_000) for _ in range(10)]
        print("ready", flush=True)
        while True:
            leak(); churn(); time.sleep(0.02)
    """))
    monkeypatch.setattr(_probe_trackers, "own_memray_path", lambda: None)
    with probed_in_a_bare_venv(tmp_path, script) as proc:
        result = allocations.attribute(proc.pid, 6.0)  # its first second is the tracker starting
    memray_rung, tracemalloc_rung = result.rungs[1:3]
    assert memray_rung.status == "failed" and "memray is not importable" in memray_rung.detail
    assert tracemalloc_rung.status == "used" and "Python-domain allocations only" in tracemalloc_rung.detail
    assert result.method == "tracemalloc" and result.suspects[0].function == "leak", result.suspects[:3]
    leak_site = next(s for s in result.sites if s.function == "leak")
    assert len(result.times) >= 4 and leak_site.held[-1] > leak_site.held[1] > 0
    assert result.cost["rss_after"] is not None and result.window is not None


def test_a_budget_spent_before_memray_skips_it_and_says_so(spawn_python):
    """Bringing the probe in took the whole budget: memray is not run for a blink and reported as
    having found nothing still held; it is skipped, and the time it would have needed is said."""
    child = slow_leaker(spawn_python)
    debugger, problem = injection_debugger(target_interpreter(child.pid))
    if debugger is None:
        pytest.skip(f"no debugger can inject safely on this machine: {problem}")
    result = allocations.attribute(child.pid, 3.0, budget=0.0)
    by = {r.method: r for r in result.rungs}
    assert by["memray"].status == "skipped" and "no tracking time left" in by["memray"].detail, result.rungs
    assert "bringing the probe in" in by["memray"].detail or "probe" not in by, result.rungs
    assert child.poll() is None


def _library_pages_kb(pid: int, folder: str, *, outside: bool = False) -> int:
    """kB of the process's RSS in read-only mappings of the files under `folder` (`outside`: of
    every other file)."""
    total, counted = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:
                name = fields[5] if len(fields) >= 6 else ""
                counted = name.startswith("/") and name.startswith(folder) != outside and "w" not in fields[1]
            elif counted and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_a_lent_memray_leaves_neither_rich_nor_its_libraries_code_in_the_service(tmp_path):
    """A service with no memray and no rich of its own is lent gpuscope's memray: once tracking
    ends, memray's libraries' code is no longer in its RSS (their read-only pages, as on disk,
    dropped; what runs again comes back) while its own libraries' stays, and rich, which memray imports only to draw progress
    bars, was never loaded."""
    own = _probe_trackers.own_memray_path()
    if own is None:
        pytest.skip("gpuscope's own memray cannot be lent on this machine")
    status = tmp_path / "modules.txt"
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        kept = []
        print("ready", flush=True)
        while True:
            kept.append(bytearray(50_000))
            loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("rich", "memray"))
            open({str(status)!r}, "w").write(" ".join(loaded))
            time.sleep(0.05)
    """))
    with probed_in_a_bare_venv(tmp_path, script) as proc:
        client = allocations.probe_client.probe_for(proc.pid)
        assert client is not None
        libraries = os.path.join(os.path.realpath(own), "memray")  # memray/ and memray.libs/
        try:
            for capture in (1, 2):  # the second capture reuses the memray the first one loaded
                own_before = _library_pages_kb(proc.pid, libraries, outside=True)
                tracked = _probe_trackers.probe_memray_suspects(client, proc.pid, 2.0, hello=client.hello(), settle=False)
                assert tracked.cost.get("from", "").startswith("gpuscope's own packages"), (capture, tracked.cost)
                assert tracked.suspects, capture
                loaded = wait_until(lambda: "memray" in status.read_text() and status.read_text(), timeout=10,
                                    what="the service to see memray loaded")
                assert not [m for m in loaded.split() if m.split(".")[0] == "rich"], loaded
                # about 2.7 MB while they stay; what memray's hooks still run comes back (0.2-0.4 MB)
                assert _library_pages_kb(proc.pid, libraries) < 1024, (capture, _library_pages_kb(proc.pid, libraries))
                # The service's own libraries keep their pages (what memray brought beside them,
                # libstdc++ among them, gives back its 0.2-0.4 MB again): only what lending mapped.
                own_after = _library_pages_kb(proc.pid, libraries, outside=True)
                assert own_after > own_before - 1024, (capture, own_before, own_after)
        finally:
            client.close()
