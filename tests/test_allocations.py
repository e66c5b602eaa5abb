"""The attribution ladder against real leaking programs, real memray and real py-spy.

memray's allocation tracking names the leaking function; stack sampling alone does not (it sees
where time goes) — which is why the ladder exists. `memray attach` needs to inject code through
gdb before Python 3.14; where that would harm the target, the ladder refuses and the target lives.
"""

import subprocess
import sys
import textwrap
import venv

import psutil
import pytest

from gpuscope.core import allocations

from helpers import wait_until

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
    suspects = allocations.suspects_from_capture(str(capture), (str(tmp_path) + "/",))
    assert suspects[0].function == leaker and suspects[0].method == "memray"
    assert suspects[0].bytes > 0 and suspects[0].share > 0.5 and suspects[0].file == str(script)


def test_stack_sampling_alone_does_not_name_the_leak_and_says_it_is_low_confidence(spawn_python):
    _, body = LEAKERS["beside CPU-heavy neighbours"]
    child = spawn_python(program(body, 3000).replace("\nfor i in", '\nprint("ready", flush=True)\nfor i in', 1))
    result = allocations.attribute(child.pid, 3.0, use_memray=False)
    assert result.method == "stack-sampling" and result.confidence == "low"
    assert [r.status for r in result.rungs] == ["skipped", "skipped", "used"]
    assert result.suspects and result.suspects[0].function != "leak"  # it finds where time goes
    assert all(s.bytes is None for s in result.suspects)


def test_memray_rung_never_harms_the_target(spawn_python):
    """Here gdb may be unable to inject safely (then the rung refuses); elsewhere memray attaches
    and must name the leak. Either way the target is alive afterwards and tracking is detached."""
    _, body = LEAKERS["beside CPU-heavy neighbours"]
    child = spawn_python(program(body, 100000).replace("\nfor i in", '\nimport time\nprint("ready", flush=True)\nfor i in', 1)
                         .replace("cpu_heavy()\n", "cpu_heavy(); time.sleep(0.01)\n"))
    result = allocations.attribute(child.pid, 3.0)
    memray_rung = next(r for r in result.rungs if r.method == "memray")
    assert child.poll() is None and psutil.Process(child.pid).status() != psutil.STATUS_STOPPED
    if memray_rung.status == "used":
        assert result.method == "memray" and result.suspects[0].function == "leak"
    else:
        assert memray_rung.status == "failed" and memray_rung.detail
        assert result.method in ("stack-sampling", None)


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
        assert [r.status for r in result.rungs][:2] == ["skipped", "failed"]
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()


def test_an_exited_process_is_refused(spawn_python):
    child = spawn_python("print('ready', flush=True)")
    wait_until(lambda: child.poll() is not None, what="the child to exit")
    with pytest.raises(allocations.AttachRefused, match="exited"):
        allocations.check_attach(child.pid)
