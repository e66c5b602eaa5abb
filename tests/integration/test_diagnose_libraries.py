"""The diagnosis of small services built on the libraries of real incidents: FAISS (a vector
index in native memory), HuggingFace tokenizers (Rust; a tiny BPE trained in the test, nothing
downloaded) and langchain-core (chat histories). Each leaks through one function, and each has a
fixed twin. Diagnosed at the default duration, three at a time, under `gpuscope run` (the probe;
memray in the environment); then as deployed, from an environment without memray: under
`gpuscope run` (the probe brings gpuscope's own memray) and without it (nothing inside the
process: stack sampling, said as low confidence), seven services in one window; with no memray
to lend at all (tracemalloc, and memray's progress); and no suspect without evidence: a FAISS
leak no memray loads into (tracemalloc cannot see native memory: said, no Python site blamed)
beside a service that does not leak, stack-sampled (no suspect named).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from gpuscope.core.diagnosis import _probe_trackers
from gpuscope.core.diagnosis import ladder as allocations
from gpuscope.core.diagnosis.steps import diagnose
from gpuscope.core.diagnosis.investigation import investigate

from helpers import canary_says, gpuscope_cmd, python_without, run_together, wait_until

pytest.importorskip("faiss")
pytest.importorskip("tokenizers")
pytest.importorskip("langchain_core")

DEFAULT_DURATION_S = 30.0

FAISS = """
import time
import numpy as np
import faiss
index = faiss.IndexFlatL2(64)
def search(query):
    if not REMEMBER and index.ntotal >= 80_000:
        index.reset()                 # the fix: a bounded index
    index.add(query)                  # every query kept in the index (native memory)
    return index.search(query[:1], 5)
print("ready", flush=True)
rng = np.random.default_rng(0)
while True:
    search(rng.random((8000, 64), dtype=np.float32)); time.sleep(0.1)
"""

TOKENIZERS = """
import time
from tokenizers import Tokenizer
from tokenizers.models import BPE
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.trainers import BpeTrainer
words = ["retrieval", "augmented", "generation", "vector", "index", "memory", "leak", "token", "cache"]
corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(40)) for i in range(300)]
tokenizer = Tokenizer(BPE(unk_token="[UNK]"))
tokenizer.pre_tokenizer = Whitespace()
tokenizer.train_from_iterator(corpus, BpeTrainer(vocab_size=120, special_tokens=["[UNK]"], show_progress=False))
kept = []
def tokenize(text):
    encoding = tokenizer.encode(text)
    if REMEMBER:
        kept.append(encoding)         # every encoding kept (offsets, ids, masks: Rust memory)
    return len(encoding.ids)
print("ready", flush=True)
text = " ".join(corpus[:40])
while True:
    tokenize(text); time.sleep(0.02)
"""

LANGCHAIN = """
import time
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage
histories = {}
def remember(session, turn):
    # The question is built here, not by the caller: every byte kept is then allocated in this
    # function (a question the caller built was half of what stayed, and memray rightly said so).
    question = f"what leaks here at turn {turn}? " * 1200
    history = histories.setdefault(session, InMemoryChatMessageHistory())
    history.add_messages([HumanMessage(question), AIMessage(question.upper())])
    if not REMEMBER and len(histories) > 50:
        histories.pop(next(iter(histories)))
print("ready", flush=True)
i = 0
while True:
    remember(f"s{i}", i); i += 1; time.sleep(0.02)
"""

SERVICES = {"faiss": (FAISS, "search"), "tokenizers": (TOKENIZERS, "tokenize"), "langchain-core": (LANGCHAIN, "remember")}


def run_batch(tmp_path, remember: bool) -> dict:
    procs = {}
    for name, (code, _) in SERVICES.items():
        script = tmp_path / f"{name.replace('-', '_')}_{remember}.py"
        script.write_text(textwrap.dedent(code).replace("REMEMBER", str(remember)))
        procs[name] = subprocess.Popen(gpuscope_cmd() + ["run", "--", sys.executable, str(script)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for name, proc in procs.items():
            line = proc.stdout.readline().strip()
            assert line == "ready", (name, proc.stderr.read() if proc.poll() is not None else "")
        results = run_together({n: lambda p=p: diagnose(investigate(p.pid, DEFAULT_DURATION_S)) for n, p in procs.items()})
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    return results


@pytest.fixture(scope="module")
def leaking(tmp_path_factory):
    return run_batch(tmp_path_factory.mktemp("leaking"), True)


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    return run_batch(tmp_path_factory.mktemp("fixed"), False)


def assert_named_or_said_unseen(d, name):
    """The leaking function is named first by memray, or, for FAISS, memray says it saw none of
    the growth: where the index's buffer was not reallocated while memray tracked (it grew into
    the capacity it had reserved), no site is blamed."""
    unseen = d.to_json()["evidence"].get("unseen_growth")
    if name == "faiss" and unseen is not None:
        assert unseen["tracker"] == "memray" and "filled in place" in d.steps[6].finding, d.to_text()
        assert not d.suspects, d.to_text()
    else:
        assert d.suspects and d.suspects[0].function == SERVICES[name][1], d.to_text()
        assert d.suspects[0].method == "memray", d.to_text()


@pytest.mark.parametrize("name", list(SERVICES))
def test_the_leaking_service_is_a_leak_and_its_function_is_named_first(leaking, name):
    d = leaking[name]
    assert d.verdict == "leak", d.to_text()
    assert_named_or_said_unseen(d, name)


@pytest.mark.parametrize("name", list(SERVICES))
def test_the_fixed_service_is_not_a_leak(fixed, name):
    d = fixed[name]
    assert d.verdict != "leak", d.to_text()


# -- as deployed: the service's environment has no memray ----------------------------------------

# The bounded services need 10 s of samples outside the tracker's window to be judged no-leak; nine
# services sharing the machine grow slower than alone.
WITHOUT_MEMRAY_DURATION_S = 30.0
WITHOUT_PROBE = ["langchain-core"]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    return python_without(tmp_path_factory.mktemp("service-env"), "memray")


def start_services(folder, python, services: dict, probe: bool) -> dict:
    """Start each of `services` (key -> (code, remember)) with `python`, under `gpuscope run` if
    `probe`; wait for each to say it is ready."""
    procs = {}
    for key, (code, remember) in services.items():
        script = folder / f"{'_'.join(map(str, key)).replace('-', '_')}.py"
        script.write_text(textwrap.dedent(code).replace("REMEMBER", str(remember)))
        command = [str(python), str(script)]
        procs[key] = subprocess.Popen(gpuscope_cmd() + ["run", "--", *command] if probe else command,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for key, proc in procs.items():
        line = proc.stdout.readline().strip()
        assert line == "ready", (key, proc.stderr.read() if proc.poll() is not None else "")
    return procs


def stop_services(procs: dict) -> None:
    for proc in procs.values():
        proc.kill()
        proc.wait()


# Fills a 75 MB batch over 3 s and frees it: the RSS rises and falls again, never leaks. A quarter
# of the time it works (stack samples count only threads at work, not asleep): they find it
# while its memory grows.
BATCHES = """
import time
def fill(batch):
    batch.append(b"x" * 5_000_000)  # touched: resident, unlike bytearray(n)
    busy = time.monotonic() + 0.1  # running half the time: a stack dump catches it working
    while time.monotonic() < busy:
        pass
print("ready", flush=True)
while True:
    batch = []
    for _ in range(15):
        fill(batch); time.sleep(0.1)
    del batch
    time.sleep(0.5)
"""


# A machine where no debugger may call into processes (gdb harms them, lldb is not installed): a
# service started without the probe gets nothing brought in.
NO_DEBUGGER = "gdb's call killed the throwaway process (SIGSEGV)"

NO_MEMRAY = "import sys\nsys.modules['memray'] = None  # no memray loads in this process, not even gpuscope's\n"


@pytest.fixture(scope="module")
def without_memray(tmp_path_factory, bare_python):
    """Every service, leaking and fixed, with the probe, and the leaking ones without it, diagnosed
    in one window."""
    folder = tmp_path_factory.mktemp("without-memray")
    procs = {}
    try:
        for probe in (True, False):
            # Without the probe, one leaking service: stack sampling (py-spy) of several at once
            # would starve the others of the machine's CPU.
            services = {(probe, name, remember): (code, remember) for name, (code, _) in SERVICES.items()
                        if probe or name in WITHOUT_PROBE
                        for remember in ((True, False) if probe else (True,))}
            procs.update(start_services(folder, bare_python, services, probe))
        with pytest.MonkeyPatch.context() as mp:
            canary_says(mp, NO_DEBUGGER)  # nothing can be brought into those without the probe
            return run_together({key: lambda p=p: diagnose(investigate(p.pid, WITHOUT_MEMRAY_DURATION_S))
                                 for key, p in procs.items()})
    finally:
        stop_services(procs)


def rungs(d) -> dict:
    return {r["method"]: r for r in d.steps[6].evidence["rungs"]}


@pytest.mark.parametrize("name", list(SERVICES))
def test_without_memray_in_the_service_the_probe_brings_gpuscopes_and_names_the_leaking_function(without_memray, name):
    d = without_memray[(True, name, True)]
    assert d.verdict == "leak", d.to_text()
    assert_named_or_said_unseen(d, name)
    assert d.instrument is not None and d.instrument.method == "memray", d.instrument
    assert "gpuscope's own packages" in (d.instrument.loaded_from or ""), d.instrument


@pytest.mark.parametrize("name", list(SERVICES))
def test_without_memray_in_the_service_the_fixed_service_is_not_a_leak(without_memray, name):
    d = without_memray[(True, name, False)]
    assert d.verdict == "no-leak", d.to_text()


@pytest.mark.parametrize("name", WITHOUT_PROBE)
def test_without_memray_or_probe_the_leak_is_found_and_its_code_path_said_to_be_low_confidence(without_memray, name):
    """Nothing can run inside the process: memray is refused with what to do, tracemalloc needs
    the probe, and stack sampling ranks where the process was while its memory grew."""
    d = without_memray[(False, name, True)]
    assert d.verdict == "leak", d.to_text()
    found = d.steps[6].evidence
    assert found["method"] == "stack-sampling" and found["confidence"] == "low", found
    assert d.suspects and all(s.method == "stack-sampling" and s.bytes is None for s in d.suspects), d.to_text()
    by = rungs(d)
    assert by["memray"]["status"] == "failed" and "memray is not importable by the service's interpreter" in \
        by["memray"]["detail"] and "install it into the service's environment" in by["memray"]["detail"], by
    assert by["tracemalloc"]["status"] == "skipped" and "no gpuscope probe in the process" in by["tracemalloc"]["detail"]
    assert by["stack-sampling"]["status"] == "used" and "low confidence" in by["stack-sampling"]["detail"], by
    assert "low confidence" in d.to_text()


# -- no memray to lend: tracemalloc (and what it cannot see), and memray's progress -----------------

LADDER_S = 8.0


def test_with_no_memray_at_all_tracemalloc_names_the_leak_and_memray_says_how_far_it_is(
        tmp_path, bare_python, monkeypatch):
    """No memray to lend (another interpreter version): tracemalloc sees the tokenizer's Encoding
    objects grow and names the function that keeps them. memray (in the environment of a second
    service) reports how far it is while it tracks, and the sites it saw once its capture is read."""
    monkeypatch.setattr(_probe_trackers, "own_memray_path", lambda: None)  # an interpreter gpuscope cannot lend to
    procs = start_services(tmp_path, bare_python, {("bare", "tokenizers"): (TOKENIZERS, True)}, probe=True)
    procs.update(start_services(tmp_path, sys.executable, {("memray", "tokenizers"): (TOKENIZERS, True)}, probe=True))
    progress: list[tuple[str, float]] = []
    seen: list[tuple[str, int]] = []
    try:
        for proc in procs.values():
            wait_until(lambda p=proc: allocations.probe_client.probe_path(p.pid), timeout=10, what="the probe")
        found = run_together({
            "bare": lambda: allocations.attribute(procs[("bare", "tokenizers")].pid, LADDER_S),
            "memray": lambda: allocations.attribute(procs[("memray", "tokenizers")].pid, LADDER_S,
                                                    progress=lambda *a: progress.append(a),
                                                    sites_seen=lambda *a: seen.append(a)),
        })
    finally:
        stop_services(procs)
    tokenizers = found["bare"]
    memray_rung = next(r for r in tokenizers.rungs if r.method == "memray")
    assert memray_rung.status == "failed" and "memray is not importable" in memray_rung.detail, tokenizers.rungs
    assert tokenizers.method == "tracemalloc" and tokenizers.confidence == "medium", tokenizers.rungs
    assert tokenizers.suspects[0].function == "tokenize", tokenizers.suspects[:3]
    # the probe's own work (its replies, its socket) is never a suspect
    assert not any(s.file.endswith("gpuscope/probe.py") for s in tokenizers.suspects), tokenizers.suspects
    memray = found["memray"]
    assert memray.method == "memray" and memray.suspects[0].function == "tokenize", memray.rungs
    tracking = [f for rung, f in progress if rung == "memray"]
    assert tracking[-1] == 1.0 and any(0.2 < f < 0.99 for f in tracking), tracking
    assert tracking == sorted(tracking), tracking
    assert len(seen) == 1 and seen[0][0] == "memray" and seen[0][1] >= len(memray.suspects), seen


# -- no suspect without evidence ------------------------------------------------------------------

# A window of its own: beside the nine services above, the machine's load leaves them too little
# time after the tracker (reading memray's capture takes longer) for verdicts that hold on 2 cores.
NO_EVIDENCE_DURATION_S = 24.0


@pytest.fixture(scope="module")
def without_evidence(tmp_path_factory, bare_python):
    """In one window: the leaking FAISS service where no memray loads at all (only tracemalloc,
    which cannot see the index's native memory), and a batch service that does not leak, without
    the probe (nothing runs inside it: stack sampling)."""
    folder = tmp_path_factory.mktemp("without-evidence")
    procs = {}
    try:
        procs.update(start_services(folder, bare_python, {("tracemalloc", "faiss"): (NO_MEMRAY + FAISS, True)},
                                    probe=True))
        procs.update(start_services(folder, bare_python, {("sampling", "batches"): (BATCHES, False)}, probe=False))
        with pytest.MonkeyPatch.context() as mp:
            canary_says(mp, NO_DEBUGGER)
            return run_together({key: lambda p=p: diagnose(investigate(p.pid, NO_EVIDENCE_DURATION_S))
                                 for key, p in procs.items()})
    finally:
        stop_services(procs)


def test_a_native_leak_tracemalloc_cannot_see_is_said_to_be_outside_pythons_allocator(without_evidence):
    d = without_evidence[("tracemalloc", "faiss")]
    assert d.verdict == "leak", d.to_text()
    # tracemalloc ran to its end: whether a few bytes of some Python site grew meanwhile (used) or
    # none did (failed) is the interpreter's business; an error in the rung is neither.
    tracemalloc = rungs(d)["tracemalloc"]
    if tracemalloc["status"] == "failed":
        assert tracemalloc["detail"].startswith("no Python allocation site grew while tracing"), tracemalloc
    else:
        assert tracemalloc["status"] == "used" and re.match(
            r"in process through gpuscope's probe: \d+ allocation sites whose memory grew while tracing",
            tracemalloc["detail"]), tracemalloc
    unseen = d.to_json()["evidence"].get("unseen_growth")
    assert unseen is not None, d.to_text()
    assert unseen["tracker"] == "tracemalloc" and unseen["tracked_bytes_per_s"] < 0.1 * unseen["memory_bytes_per_s"]
    code_path = d.steps[6]
    assert "the growth is outside Python's allocator: native code" in code_path.finding, code_path
    assert "pip install memray" in code_path.next, code_path
    # no Python site of tracemalloc's is named as the cause
    assert not any(s.method == "tracemalloc" for s in d.suspects), d.to_text()


def test_stack_samples_of_a_service_that_does_not_leak_name_no_suspect(without_evidence):
    d = without_evidence[("sampling", "batches")]
    assert d.verdict != "leak", d.to_text()
    sampling = rungs(d)["stack-sampling"]
    assert sampling["status"] == "used", sampling["detail"]  # it did rank where time went
    assert d.suspects == () and d.to_json()["suspects"] == [], d.to_text()
    assert "stack samples show where the process spent its time, not what allocated memory" in d.steps[6].finding
    assert "## Suspects" not in d.to_text()
