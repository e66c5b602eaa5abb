"""Everything another user or an endpoint sends is bounded in bytes, items and time before any work
on it, and no step is quadratic in what was sent.

Each attack runs in a child process under an address-space limit (a quadratic step ends there in
MemoryError or a timeout instead of taking the machine) that reports its CPU time, and its peak
of Python memory (tracemalloc) in a second run. The bounds asserted are far above what the work takes and far
below what the quadratic steps took (seconds to minutes, gigabytes); precise figures are printed
by benchmarks/hostile_input.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from gpuscope.core.target import probe_client
from test_crafted_recordings import good_frames, write
from test_hostile_endpoints import answer, clean_env, run_gpuscope
from metrics_server import RawServer

LIMIT_AS = 2 << 30
CPU_S = 5.0  # each attack: well under a second here; the quadratic steps took seconds to minutes
PEAK_MB = 100.0  # Python memory at its peak, beyond what was sent

HARNESS = """
import json, resource, sys, time, tracemalloc
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
{setup}
def attempt():
    try:
        return repr(work())
    except Exception as exc:
        return type(exc).__name__ + ": " + str(exc)[:300]
started = time.process_time()
result = attempt()
seconds = time.process_time() - started
tracemalloc.start()  # a second time, for its memory: tracemalloc slows what it watches
base = tracemalloc.get_traced_memory()[0]
attempt()
peak = tracemalloc.get_traced_memory()[1] - base
print(json.dumps({{"seconds": seconds, "peak_mb": peak / 2**20, "result": result}}))
"""


def measured(setup: str, timeout: float = 60.0) -> dict:
    """Run `work()` (defined by `setup`, whose own cost is not counted) in a child under LIMIT_AS."""
    code = HARNESS.format(limit=LIMIT_AS, setup=textwrap.dedent(setup))
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": float("inf"), "peak_mb": float("nan"), "result": "timed out"}
    if done.returncode != 0 or not done.stdout.strip():
        return {"seconds": float("inf"), "peak_mb": float("nan"), "result": done.stderr[-500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_bounded(run: dict) -> None:
    assert run["seconds"] < CPU_S and run["peak_mb"] < PEAK_MB, run


# -- probe replies -----------------------------------------------------------------------------------


def test_a_probes_held_bytes_over_twenty_thousand_times_are_judged_in_bounded_work():
    """20,000 points (318 KB of reply) took 2.5 GB: every pair of points was kept."""
    run = measured("""
        from gpuscope.core.leak import held_trend
        times = [float(i) for i in range(20_000)]
        held = [float(i * 100_000 + (i % 7) * 30_000) for i in range(20_000)]
        def work():
            return held_trend(times, held).kind
    """)
    assert_bounded(run)
    assert run["result"] == "'rising'"


def test_a_progress_reply_of_a_million_points_is_passed_over_in_bounded_work():
    run = measured("""
        from gpuscope.core.diagnosis._probe_trackers import settled_of
        n = 1_000_000
        progress = {"tracking": True, "times": [i / 1000 for i in range(n)], "rss": [float(i) for i in range(n)],
                    "heap": [float(i) for i in range(n)], "sites": [{"held": [float(i) for i in range(n)]}] * 10}
        def work():
            return settled_of(progress)
    """, timeout=120)
    assert_bounded(run)
    assert run["result"] == "None"


def test_twenty_thousand_points_in_a_trend_as_a_baseline_or_an_answer_sends_them():
    run = measured("""
        from gpuscope.core.leak.growth import theil_sen
        from gpuscope.core.leak._analysis import kendall_tau
        points = [(float(i), float(3 * i + (i % 5))) for i in range(20_000)]
        def work():
            return round(theil_sen(points), 1), round(kendall_tau(points), 2)
    """)
    assert_bounded(run)
    assert run["result"] == "(3.0, 1.0)"


def test_theil_sen_is_unchanged_up_to_its_bound_and_close_beyond_it():
    from gpuscope.core.leak.growth import MAX_PAIRWISE_POINTS, theil_sen

    def exact(points):
        slopes = sorted((v2 - v1) / (t2 - t1) for i, (t1, v1) in enumerate(points)
                        for t2, v2 in points[i + 1:] if t2 != t1)
        mid = len(slopes) // 2
        return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2

    noisy = [(float(t), 5.0 * t + ((t * 7919) % 113) - 56) for t in range(MAX_PAIRWISE_POINTS)]
    assert theil_sen(noisy) == exact(noisy)
    denser = [(float(t), 5.0 * t + ((t * 7919) % 113) - 56) for t in range(2000)]
    assert abs(theil_sen(denser) - exact(denser)) < 0.05 * 5.0


class HostileProbe:
    """A probe socket that answers every request line with `reply(op)` (bytes, no newline)."""

    def __init__(self, folder: str, reply, piece: int = 0) -> None:
        self.path = os.path.join(folder, "probe.sock")
        self.reply = reply
        self.piece = piece  # send the reply this many bytes at a time (0: at once)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(4)
        self.server.settimeout(0.2)
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            buffer = b""
            while not self.closing.is_set():
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    data = self.reply(json.loads(line)["op"]) + b"\n"
                    try:
                        if not self.piece:
                            conn.sendall(data)
                        for at in range(0, len(data) if self.piece else 0, self.piece or 1):
                            conn.sendall(data[at:at + self.piece])
                            self.closing.wait(0.0002)  # each piece read on its own
                    except OSError:
                        return

    def close(self) -> None:
        self.closing.set()
        self.server.close()
        self.thread.join(5)


@pytest.fixture
def probe_folder():
    with tempfile.TemporaryDirectory(prefix="hostile-probe-") as folder:
        yield folder


def test_a_deeply_nested_probe_reply_is_one_refusal_in_any_thread(probe_folder):
    """json's parser recursed once a level: RecursionError in the console's thread (a traceback on
    screen) where a ProbeError is what every caller handles."""
    probe = HostileProbe(probe_folder, lambda op: b'{"ok":true,"result":' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    raised: list[BaseException] = []
    hooked: list[BaseException] = []
    previous, threading.excepthook = threading.excepthook, lambda hook: hooked.append(hook.exc_value)

    def ask() -> None:
        with probe_client.ProbeClient(probe.path, timeout=10) as client:
            try:
                client.stats()
            except probe_client.ProbeError as exc:
                raised.append(exc)

    try:
        thread = threading.Thread(target=ask)
        thread.start()
        thread.join(30)
    finally:
        threading.excepthook = previous
        probe.close()
    assert not hooked, hooked
    assert len(raised) == 1 and "nested more than" in str(raised[0]), raised


# 16 MiB of the values that cost most once parsed for their size: 72 bytes for the 3 of "{},"; and
# empty strings, which the depth check itself cut into 5.5 million pieces.
SMALL_VALUES = {"empty-objects": b"{},", "empty-strings": b'"",', "empty-arrays": b"[],"}


@pytest.mark.parametrize("value", SMALL_VALUES.values(), ids=SMALL_VALUES.keys())
def test_a_probe_reply_of_16_mib_of_small_values_is_refused_in_bounded_work(probe_folder, value):
    """16 MiB of empty objects took 420 MB once parsed; of empty strings, 929 MB before it."""
    body = b'{"ok":true,"result":{"x":[' + value * ((probe_client.MAX_REPLY - 64) // len(value)) + b'0]}}'
    probe = HostileProbe(probe_folder, lambda op: body)
    try:
        run = measured(f"""
            from gpuscope.core.target.probe_client import ProbeClient
            def work():
                with ProbeClient({probe.path!r}, timeout=60) as client:
                    return len(client.stats()["x"])
        """, timeout=120)
    finally:
        probe.close()
    assert_bounded(run)
    assert run["result"].startswith("ProbeError: ") and "values" in run["result"], run


def test_a_probe_reply_near_its_cap_sent_in_small_pieces_is_read_in_one_pass(probe_folder):
    """16 MiB in 4 KiB pieces: the whole reply so far was searched for its end, and copied, once a
    piece (4,000 times 8 MB on average)."""
    body = b'{"ok":true,"result":{"pad":"' + b"a" * (probe_client.MAX_REPLY - 64) + b'"}}'
    probe = HostileProbe(probe_folder, lambda op: body, piece=4096)
    try:
        run = measured(f"""
            from gpuscope.core.target.probe_client import ProbeClient
            def work():
                with ProbeClient({probe.path!r}, timeout=60) as client:
                    return len(client.stats()["pad"])
        """, timeout=120)
    finally:
        probe.close()
    assert run["seconds"] < CPU_S, run
    assert run["result"] == repr(probe_client.MAX_REPLY - 64)


def test_a_tracker_reply_of_400_000_times_is_refused_in_one_line(probe_folder):
    n = 400_000  # 2 x 3 MB: under the reply's cap
    times = json.dumps([i / 1000 for i in range(n)]).encode()
    reply = (b'{"ok":true,"result":{"times":' + times + b',"records":[{"frames":[["f","/srv/app.py","x"]],'
             b'"size":1e400,"count":"many","held":' + times + b'}]}}')
    probe = HostileProbe(probe_folder, lambda op: reply)
    try:
        run = measured(f"""
            import os
            from gpuscope.core.diagnosis._probe_trackers import probe_tracemalloc_suspects
            from gpuscope.core.target.probe_client import ProbeClient
            def work():
                with ProbeClient({probe.path!r}, timeout=60) as client:
                    return probe_tracemalloc_suspects(client, os.getpid(), 0.1)
        """, timeout=120)
    finally:
        probe.close()
    assert run["seconds"] < CPU_S, run
    assert run["result"].startswith("ProbeError: ") and "at most" in run["result"], run


def test_a_tracker_reply_of_the_wrong_types_gives_what_can_be_read(probe_folder):
    """Numbers as text, infinite sizes, frames of the wrong shape: each value is read as what it
    must be, never a ValueError or OverflowError from deep inside the diagnosis."""
    reply = json.dumps({"ok": True, "result": {
        "times": [0.0, 1.0, 2.0, 3.0],
        "records": [
            {"frames": [["grow", "/srv/app.py", "12"], "x", [1, 2, 3]], "size": 1e308 * 10, "count": "many",
             "held": [0, "1", None, 1e999]},
            {"frames": [["grow", "/srv/app.py", 12]], "size": 4096, "count": 2, "held": [0, 1024, 2048, 4096]},
            "not a record",
        ], "omitted": "lots"}}, allow_nan=True).encode()
    probe = HostileProbe(probe_folder, lambda op: reply)
    try:
        with probe_client.ProbeClient(probe.path, timeout=10) as client:
            from gpuscope.core.diagnosis._probe_trackers import probe_tracemalloc_suspects

            tracked = probe_tracemalloc_suspects(client, os.getpid(), 0.1)
    finally:
        probe.close()
    assert tracked.times == (0.0, 1.0, 2.0, 3.0)
    assert [(s.line, s.held) for s in tracked.sites] == [(12, (0, 1024, 2048, 4096)), (0, (0, 0, 0, 0))]


def test_a_chat_answer_nested_deep_is_one_failed_request_in_the_rampers_thread():
    """The service under a ramp answers what it likes: an answer nested 200,000 deep raised
    RecursionError in a load worker's thread (its traceback on screen, the worker gone)."""
    from gpuscope.core.ramp.load import ChatRequests, LoadError, Target

    requests = ChatRequests(Target.parse("http://127.0.0.1:1/v1/chat/completions"), model="m", turns=2,
                            max_tokens=1)
    conversation = requests.new_conversation()
    requests.request(conversation)
    nested = b'{"choices":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    raised: list[BaseException] = []

    def answer() -> None:
        try:
            requests.answered(conversation, nested)
        except BaseException as exc:  # noqa: BLE001 -- whatever it raises is what the test looks at
            raised.append(exc)

    thread = threading.Thread(target=answer)
    thread.start()
    thread.join(30)
    assert len(raised) == 1 and isinstance(raised[0], LoadError), raised
    assert not conversation.messages  # the turn did not happen: the next one asks again


# -- Prometheus answers ------------------------------------------------------------------------------


def test_the_json_depth_check_is_linear_in_an_unterminated_string_of_escaped_quotes():
    """A 200 KB body froze the console: the string pattern retried from every escaped quote."""
    run = measured("""
        from gpuscope.core.common.json_depth import nests_deeper
        body = b'"' + b'\\\\"' * (8 << 19)  # 8 MiB, Prometheus answers' cap
        def work():
            return nests_deeper(body, 16)
    """)
    assert_bounded(run)
    assert run["result"] == "False"


@pytest.mark.parametrize("value", SMALL_VALUES.values(), ids=SMALL_VALUES.keys())
def test_a_prometheus_answer_of_8_mib_of_small_values_is_refused_in_bounded_work(value):
    body = (b'{"status":"success","data":{"resultType":"vector","result":['
            + value * ((8 << 20) // len(value) - 40) + b"0]}}")
    with RawServer(answer("200 OK", body, "application/json")) as server:
        run = measured(f"""
            from gpuscope.core.fleet.collector import open_client
            client = open_client({server.url("/")!r})
            def work():
                return len(client.query("up"))
        """)
    assert_bounded(run)
    assert "does not answer like a Prometheus server" in run["result"], run


def crafted_prometheus(series: dict):
    """Prometheus's query API answering every query with the one `series` (made to be refused)."""
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [series]}},
                      allow_nan=True).encode()

    def respond(request, conn, closing) -> None:
        answer("200 OK", body, "application/json")(request, conn, closing)

    return respond


GOOD_LABELS = {"node": "n1", "pid": "42", "start_time": "1700000000"}


@pytest.mark.parametrize("series", [
    pytest.param({"metric": {**GOOD_LABELS, "gpuscope_query": ["rss"]}, "value": [1, "1"],
                  "values": [[1, "1"], [2, "2"]]}, id="unhashable-list"),
    pytest.param({"metric": {**GOOD_LABELS, "pid": 42}, "value": [1, "1"], "values": [[1, "1"], [2, "2"]]},
                 id="int-label"),
    pytest.param({"metric": GOOD_LABELS, "value": [1, "1"], "values": [[float("nan"), "1"], [2, "2"]]}, id="nan-time"),
    pytest.param({"metric": GOOD_LABELS, "value": [1, "1"], "values": [[1, "1", 3], [2, "2", 4]]},
                 id="three-per-sample"),
    pytest.param({"metric": GOOD_LABELS, "value": [1, "1"], "values": [[1, "1"], [float("inf"), "2"]]},
                 id="infinite-time"),
])
def test_crafted_prometheus_answers_give_one_line_to_diagnose_node(series):
    with RawServer(crafted_prometheus(series)) as server:
        run = run_gpuscope("diagnose", "--prometheus", server.url("/"), "--node", "n1", "--pid", "42",
                           "--duration", "60", env=clean_env())
    assert run.returncode not in (0, -9), run
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "does not answer like a Prometheus server" in run.stderr, run.stderr


def test_digits_int_cannot_read_in_prometheus_labels_are_passed_over(tmp_path):
    """str.isdigit() takes "²", int() does not: a device and a process numbered so (beside the
    process asked about) gave a ValueError traceback; those series are not an exporter's."""
    from gpuscope.core.fleet.collector import TAG

    two = {"value": [1, "1"], "values": [[1, "1"], [2, "2"]]}
    series = [{"metric": {**GOOD_LABELS, TAG: "rss"}, **two},
              {"metric": {**GOOD_LABELS, TAG: "gpu", "gpu": "\u00b2"}, **two},
              {"metric": {**GOOD_LABELS, TAG: "device", "gpu": "\u00b2"}, **two},
              {"metric": {**GOOD_LABELS, "pid": "\u00b2", "gpu": "\u00b2", "memory": "rss"}, **two}]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}}).encode()
    with RawServer(answer("200 OK", body, "application/json")) as server:
        run = run_gpuscope("diagnose", "--prometheus", server.url("/"), "--node", "n1", "--pid", "42",
                           "--duration", "60", "--json", env=clean_env())
    assert run.returncode == 0 and "Traceback" not in run.stderr, run
    diagnosis = json.loads(run.stdout)
    assert diagnosis["pid"] == 42 and diagnosis["steps"][3]["evidence"]["ranking"] == [], diagnosis["steps"][3]


# -- expositions -------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    pytest.param('m{i="%d",a="b"' + " " * 32_000 + "x} 1\n", id="blanks-then-a-stray-character"),
    pytest.param('m{i="%d",a="' + '\\"' * 32_000 + '"} 1\n', id="escapes"),
    pytest.param('m{i="%d",' + 'a="",' * 13_000 + "} 1\n", id="labels"),
    pytest.param("m{i=%d" + "a" * 32_000 + " 1\n", id="unusual-lines"),
])
def test_16_mib_of_hostile_exposition_lines_parse_in_bounded_work(line):
    """A label value, 32k blanks and a stray character took 9.8 s (1.3 MB of such lines hung every
    reader of /metrics); long escapes, many labels and long unusual lines cost the same way. Each
    line differs from the others (the same label set is parsed once)."""
    run = measured(f"""
        from gpuscope.core.serving.exposition import parse_exposition
        line = {line!r}
        text = "".join(line % i for i in range((16 << 20) // len(line)))  # 16 MiB
        def work():
            return parse_exposition(text).malformed
    """)
    assert_bounded(run)


# -- recordings and baselines --------------------------------------------------------------------------


@pytest.fixture
def small_tmp(tmp_path):
    """A temporary folder on a 32 MiB file system of its own: a disk that a copy could fill."""
    small = tmp_path / "small-tmp"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("no tmpfs can be mounted here to stand for a small temporary folder")
    yield small
    subprocess.run(["umount", str(small)], check=False)


def test_a_sparse_recording_of_another_user_is_read_without_filling_the_disk(tmp_path, other_user, small_tmp):
    """10 GB in size, a few KB of data: the copy it is read from keeps its holes."""
    source = write(tmp_path / "session.sqlite", good_frames())
    theirs = other_user.home / "session.sqlite"
    theirs.write_bytes(source.read_bytes())
    os.truncate(other_user.own(theirs), 10 << 30)
    code = ("from gpuscope.core.session.recording import open_recording\n"
            f"print(len(open_recording({str(theirs)!r}).times))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(small_tmp)})
    assert done.returncode == 0 and done.stdout.strip() == str(len(good_frames())), done.stderr[-2000:]
    assert not os.listdir(small_tmp)


def test_another_users_recording_larger_than_the_room_for_its_copy_is_refused_in_one_line(tmp_path, other_user,
                                                                                        small_tmp):
    theirs = other_user.home / "big.sqlite"
    theirs.write_bytes(write(tmp_path / "session.sqlite", good_frames()).read_bytes())
    with open(other_user.own(theirs), "ab") as f:
        f.write(os.urandom(64 << 20))  # data, not holes
    run = run_gpuscope("report", str(theirs), env=clean_env(TMPDIR=str(small_tmp)))
    assert run.returncode not in (0, -9), run
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "another user's recording holding" in run.stderr and "copy it to a folder of yours" in run.stderr
    assert not os.listdir(small_tmp)


def baseline_of(rounds: int) -> dict:
    return {"schema": "gpuscope.check-baseline/1", "command": "x", "created": "2026-01-01T00:00:00Z",
            "settings": {}, "rounds": [a_round(i) for i in range(rounds)]}


def a_round(number: int) -> dict:
    return {"round": number, "duration_s": 1.0, "completed": True, "requests": 10,
            "memory": {"rss": {"floor": 1_000_000 + 10 * number, "peak": 2_000_000}}}


def test_a_baseline_of_twenty_thousand_rounds_is_refused_in_bounded_work(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline_of(20_000)))
    run = measured(f"""
        from gpuscope.core.gate.verdict import load_baseline
        def work():
            return load_baseline({str(path)!r})
    """)
    assert_bounded(run)
    assert run["result"].startswith("BaselineError: ") and "20,000 rounds" in run["result"], run


@pytest.mark.parametrize("value", SMALL_VALUES.values(), ids=SMALL_VALUES.keys())
def test_a_baseline_of_16_mib_of_small_values_is_refused_in_bounded_work(tmp_path, value):
    path = tmp_path / "baseline.json"
    path.write_bytes(b'{"schema":"gpuscope.check-baseline/1","rounds":[' + value * ((16 << 20) // len(value) - 20)
                     + b"0]}")
    run = measured(f"""
        from gpuscope.core.gate.verdict import load_baseline
        def work():
            return load_baseline({str(path)!r})
    """)
    assert_bounded(run)
    assert run["result"].startswith("BaselineError: "), run


def test_the_growth_of_the_most_rounds_a_baseline_holds_is_bounded_work():
    run = measured("""
        from gpuscope.core.gate.verdict import MAX_BASELINE_ROUNDS, Round, growth_of
        rounds = [Round.from_json({"round": i, "duration_s": 1.0, "memory": {"rss": {"floor": 1000 + 10 * i}}})
                  for i in range(MAX_BASELINE_ROUNDS)]
        def work():
            return round(growth_of(rounds, "rss").per_round, 1)
    """)
    assert_bounded(run)
    assert run["result"] == "10.0"


def test_a_fifo_as_the_baseline_is_refused_before_any_round(tmp_path):
    fifo = tmp_path / "baseline.json"
    os.mkfifo(fifo)
    run = run_gpuscope("check", "--baseline", str(fifo), "--rounds", "1", "--", sys.executable, "-c", "pass",
                       env=clean_env(), timeout=30)
    assert run.returncode == 2, run
    assert "not a regular file" in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_a_deeply_nested_baseline_is_refused_in_one_line(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_bytes(b'{"schema":"gpuscope.check-baseline/1","rounds":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    from gpuscope.core.gate.verdict import BaselineError, load_baseline

    with pytest.raises(BaselineError, match="nested deeper than 16 or holds more than 1,000,000 values"):
        load_baseline(str(path))


def test_a_nodes_processes_from_prometheus_are_matched_in_linear_time():
    """Each GPU series looked for its process's RSS series among all the others: 10,000 series
    (the most an answer may hold) took 1.8 s of CPU. Work that grows linearly takes about 10 times
    as long for 10 times the series; quadratic, 100 times. The margin between them is wide, so a
    busy machine's cache misses and collections cannot blur one into the other."""
    from gpuscope.core.fleet.collector import FleetClient, _node_processes

    def served(n: int) -> bytes:
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"pid": str(i), "gpu": "0", "memory": "gpu"}, "value": [1, "1"]} for i in range(n)]}}).encode()

    bodies = {"small": served(1_000), "big": served(10_000)}
    asked = ["small"]

    def respond(request, conn, closing) -> None:
        answer("200 OK", bodies[asked[0]], "application/json")(request, conn, closing)

    best = {"small": float("inf"), "big": float("inf")}
    with RawServer(respond) as server:
        client = FleetClient(server.url("/"))
        for _ in range(5):  # in turn, so that both sizes see the same machine
            for size, n in (("small", 1_000), ("big", 10_000)):
                asked[0] = size
                started = time.thread_time()
                assert len(_node_processes(client, 'node="n1"')) == n
                best[size] = min(best[size], time.thread_time() - started)
    small, big = best["small"], best["big"]
    assert big < 30 * small, (small, big)


def test_a_theme_file_of_a_key_in_many_parts_is_refused_in_bounded_work(tmp_path):
    """64 KiB of `a.a.a... = 1` (a theme's size limit) took tomllib 9 s."""
    theme = tmp_path / "long-key.toml"
    theme.write_text("a" + ".a" * 32_000 + " = 1\n")
    run = measured(f"""
        from pathlib import Path
        from gpuscope.theme_files import load_theme_file
        def work():
            return load_theme_file(Path({str(theme)!r}))
    """)
    assert_bounded(run)
    assert run["result"].startswith("ThemeFileError: ") and "dotted key of more than 64 parts" in run["result"], run


@pytest.mark.parametrize("text, number", [
    ("42", 42), ("0", 0), ("\u00b2", None), ("\u0663", None), ("+1", None), ("-1", None), (" 1", None), ("1_0", None),
    ("", None), ("12345678901", None), (42, None), (None, None),
])
def test_a_whole_number_from_elsewhere_is_ascii_digits_or_none(text, number):
    from gpuscope.core.common.units import whole_number

    assert whole_number(text, 10) == number
