"""`gpuscope demo`: the sample leaking RAG service, its load generator and the demo runner.

Real processes throughout. Assertions are on states and counts; where something must happen
over time, the test polls for the condition with a generous deadline instead of timing it.
"""

from __future__ import annotations

import importlib.util
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlencode

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.core.leak import LeakThresholds
from helpers import wait_until

PY = sys.executable
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
STAGES = {"retriever", "reranker", "llm"}


# -- helpers -------------------------------------------------------------------------------------


def read_lines(stream) -> queue.Queue:
    """Lines of a pipe, read by a daemon thread so the test can wait with a deadline."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def next_line(lines: queue.Queue, pattern: str, deadline_s: float = 30.0) -> re.Match:
    end = time.monotonic() + deadline_s
    while True:
        try:
            line = lines.get(timeout=max(0.01, end - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no line matching {pattern!r} within {deadline_s:.0f} s") from None
        match = re.search(pattern, line)
        if match:
            return match


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def get(url: str, timeout: float = 30.0) -> bytes:
    with OPENER.open(url, timeout=timeout) as resp:
        return resp.read()


def post(url: str, data: dict) -> dict:
    with OPENER.open(url, data=urlencode(data).encode(), timeout=30.0) as resp:
        return json.load(resp)


def query(url: str, text: str) -> dict:
    return json.loads(get(f"{url}/query?{urlencode({'q': text})}"))


def state(url: str) -> dict:
    return json.loads(get(f"{url}/admin/state"))


def start_service(*extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [PY, "-m", "gpuscope.demo.service", "--port", "0", *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )
    try:
        url = next_line(read_lines(proc.stdout), r"^listening on (http://127\.0\.0\.1:\d+)$").group(1)
    except BaseException:
        stop(proc)
        raise
    return proc, url


@pytest.fixture()
def service() -> Iterator[tuple[subprocess.Popen, str]]:
    proc, url = start_service()
    try:
        yield proc, url
    finally:
        stop(proc)


# -- the service ---------------------------------------------------------------------------------


def test_query_metrics_and_leak_switch(service):
    proc, url = service
    assert get(f"{url}/healthz").strip() == b"ok"

    answers = [query(url, f"why is gpu memory growing {i}") for i in range(3)]
    for a in answers:
        assert a["tokens"] >= 16 and len(a["answer"].split()) == a["tokens"]
        assert set(a["timings_s"]) >= STAGES | {"total"}

    families = {f.name: f for f in text_string_to_metric_families(get(f"{url}/metrics").decode())}
    for name, kind in [
        ("rag_request_latency_seconds", "histogram"),
        ("rag_stage_latency_seconds", "histogram"),
        ("rag_request", "counter"),  # exposed as rag_request_total
        ("rag_token_output", "counter"),  # exposed as rag_token_output_total
        ("vector_search_latency_seconds", "histogram"),
    ]:
        assert name in families and families[name].type == kind, name
    stage_counts = {
        s.labels["stage"]: s.value for s in families["rag_stage_latency_seconds"].samples if s.name.endswith("_count")
    }
    assert set(stage_counts) == STAGES and all(v == 3 for v in stage_counts.values())
    ok = [s.value for s in families["rag_request"].samples if s.name == "rag_request_total" and s.labels == {"status": "ok"}]
    assert ok == [3.0]
    tokens = [s.value for s in families["rag_token_output"].samples if s.name == "rag_token_output_total"]
    assert tokens == [float(sum(a["tokens"] for a in answers))]
    e2e = [s.value for s in families["rag_request_latency_seconds"].samples if s.name.endswith("_count")]
    assert e2e == [3.0]

    # The leak: one cache entry per unique query while enabled...
    before = state(url)
    assert before["leak_enabled"] is True and before["cache_entries"] == 3 and before["cache_bytes"] > 0
    # ...none while disabled, though queries are still served...
    assert post(f"{url}/admin/leak", {"enabled": "0"})["leak_enabled"] is False
    for i in range(3):
        query(url, f"kv cache usage high {i}")
    after = state(url)
    assert after["cache_entries"] == before["cache_entries"]
    assert after["requests_served"] == before["requests_served"] + 3
    # ...again once re-enabled; clear=1 empties the cache.
    post(f"{url}/admin/leak?enabled=1", {})
    query(url, "retriever slow again")
    assert state(url)["cache_entries"] == before["cache_entries"] + 1
    cleared = post(f"{url}/admin/leak", {"clear": "1"})
    assert cleared["cache_entries"] == 0 and cleared["cache_bytes"] == 0 and cleared["leak_enabled"] is True

    # Bad input is a 400 and an error count, and the service keeps serving.
    with pytest.raises(urllib.error.HTTPError) as err:
        get(f"{url}/query?q=")
    assert err.value.code == 400
    errors = [
        s.value
        for f in text_string_to_metric_families(get(f"{url}/metrics").decode())
        if f.name == "rag_request"
        for s in f.samples
        if s.name == "rag_request_total" and s.labels == {"status": "error"}
    ]
    assert errors == [1.0]
    assert proc.poll() is None


def test_leak_grows_rss_under_load(service):
    proc, url = service
    target = psutil.Process(proc.pid)
    start_rss = target.memory_info().rss
    load = subprocess.Popen(
        [PY, "-m", "gpuscope.demo.load", "--url", url, "--rate", "20", "--concurrency", "6", "--duration", "120"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_until(lambda: target.memory_info().rss - start_rss > 5 * 1024 * 1024, timeout=60, interval=0.2,
                   what="the service's RSS to grow by 5 MB")
        assert state(url)["cache_entries"] > 0
    finally:
        stop(load)
    # SIGTERM is a clean stop for the load generator too, with its tally on stderr.
    assert load.returncode == 0
    tally = re.search(r"load: (\d+) sent, (\d+) ok, (\d+) errors", load.stderr.read())
    assert tally and int(tally.group(2)) > 0


FAKE_TORCH = """
# Just enough of torch's API for the service's --cuda path, to run it where there is no GPU.
class cuda:
    emptied = 0
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def empty_cache():
        cuda.emptied += 1
def zeros(*shape, device=None):
    assert device == "cuda"
    return bytearray(4)
def full(shape, value, device=None):
    assert device == "cuda"
    return bytearray(4 * shape[0])
"""


def test_cuda_leak_path_with_a_stand_in_torch(tmp_path, monkeypatch):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    proc, url = start_service("--cuda", "--cuda-leak-kb", "256")
    try:
        query(url, "gpu tensor kept per query 1")
        query(url, "gpu tensor kept per query 2")
        s = state(url)
        assert s["cuda"] is True and s["cache_entries"] == 2 and s["cache_cuda_bytes"] == 2 * 256 * 1024
        assert post(f"{url}/admin/leak", {"clear": "1"})["cache_cuda_bytes"] == 0
    finally:
        stop(proc)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_cuda_flag_without_torch_says_so_once_and_serves():
    proc = subprocess.Popen(
        [PY, "-m", "gpuscope.demo.service", "--port", "0", "--cuda"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = next_line(read_lines(proc.stdout), r"^listening on (http://127\.0\.0\.1:\d+)$").group(1)
        assert query(url, "still serves on the cpu")["tokens"] > 0
        assert state(url)["cuda"] is False
    finally:
        stop(proc)
    err = proc.stderr.read().splitlines()
    assert len(err) == 1 and "CUDA unavailable" in err[0], err


def test_service_stops_cleanly_on_sigterm(service):
    proc, _ = service
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


@pytest.mark.parametrize("module", ["gpuscope.demo.service", "gpuscope.demo.load"])
def test_child_exits_when_its_parent_is_killed(module):
    # The load generator is pointed at a closed port: its errors are counted, it keeps going.
    args = ["--port", "0"] if module.endswith("service") else ["--url", "http://127.0.0.1:9"]
    # The launcher passes its PID the way `gpuscope demo` does, so even a child killed while
    # still importing knows its parent is gone.
    launcher = (
        "import subprocess, sys, time\n"
        "from gpuscope.demo.lifecycle import child_env\n"
        f"child = subprocess.Popen([sys.executable, '-m', {module!r}, *{args!r}], stdin=subprocess.DEVNULL,\n"
        "                         env=child_env())\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    middle = subprocess.Popen([PY, "-c", launcher], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    lines = read_lines(middle.stdout)
    child = None
    try:
        child = int(next_line(lines, r"^child (\d+)").group(1))
        if module.endswith("service"):
            next_line(lines, r"^listening on http://")  # its stdout is the launcher's: up and serving
        assert not gone(child)
        middle.kill()  # SIGKILL: the launcher gets no chance to stop its child
        middle.wait(10)
        wait_until(lambda: gone(child), timeout=20, interval=0.2, what=f"{module} (PID {child}) to exit after its parent died")
    finally:
        stop(middle)
        if child is not None and not gone(child):
            psutil.Process(child).kill()


# -- the runner ----------------------------------------------------------------------------------


def run_demo_watching_children(*args: str, timeout: float = 90) -> tuple[subprocess.CompletedProcess, set[int]]:
    """Run `gpuscope demo ...`, collecting the PIDs of every process it starts while it runs."""
    proc = subprocess.Popen(
        [PY, "-m", "gpuscope", "demo", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    out: dict[str, str] = {}
    reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate(timeout=timeout))))
    reader.start()
    children: set[int] = set()
    parent = psutil.Process(proc.pid)
    while reader.is_alive():
        try:
            children.update(c.pid for c in parent.children(recursive=True))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    reader.join()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out.get("stdout", ""), out.get("stderr", ""))
    return done, children


def assert_nothing_left(children: set[int], service_url: str) -> None:
    for pid in children:
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        assert "gpuscope.demo." not in cmd, f"left running: {pid} {cmd}"
    for p in psutil.process_iter(["cmdline"]):
        assert service_url not in " ".join(p.info["cmdline"] or []), f"left running: {p.pid}"


def test_headless_json_is_the_diagnosis_of_the_service_and_cleans_up():
    done, children = run_demo_watching_children("--headless", "--duration", "10", "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == "gpuscope.diagnosis/1"
    assert report["pid"] in children and "gpuscope.demo.service" in report["command"]
    memory = report["memory"]
    # as many samples as a verdict needs (how many more a loaded machine takes is its own business)
    assert memory["source"] in ("rss", "gpu") and memory["samples"] >= LeakThresholds().min_samples
    assert memory["growth_bytes_per_s"] > 0 and memory["end_bytes"] > memory["start_bytes"]
    assert report["verdict"] == "leak"
    assert [s["number"] for s in report["steps"]] == [1, 2, 3, 4, 5, 6, 7]
    throughput = report["steps"][2]
    assert throughput["status"] != "skipped" and throughput["evidence"]["profile"] == "rag"
    # The retriever's leak, named by memray running inside the service (through its probe).
    top = report["suspects"][0]
    assert (top["function"], top["method"]) == ("_remember", "memray") and top["file"].endswith("demo/service.py")
    assert top["share"] > 0.9 and top["bytes"] > 0
    # Both children were seen, and neither outlived the run.
    assert len(children) >= 2
    url = re.search(r"http://127\.0\.0\.1:\d+", done.stderr).group(0)
    assert_nothing_left(children, url)


def test_headless_text_report():
    done, children = run_demo_watching_children("--headless", "--duration", "6")
    assert done.returncode == 0, done.stderr
    assert re.match(r"# gpuscope diagnosis of PID \d+$", done.stdout.splitlines()[0])
    assert "## 7. Code path" in done.stdout
    url = re.search(r"http://127\.0\.0\.1:\d+", done.stderr).group(0)
    assert_nothing_left(children, url)


def test_console_without_a_terminal_is_one_line_and_starts_nothing():
    done, children = run_demo_watching_children(timeout=30)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "gpuscope demo --headless" in done.stderr
    assert not children


def test_demo_modules_import_no_ui_and_no_torch():
    code = (
        "import sys, gpuscope.demo.service, gpuscope.demo.load, gpuscope.demo.run\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'torch', 'numpy'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
