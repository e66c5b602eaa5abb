"""The diagnosis of small services built on the libraries of real incidents: FAISS (a vector
index in native memory), HuggingFace tokenizers (Rust; a tiny BPE trained in the test, nothing
downloaded) and langchain-core (chat histories). Each leaks through one function, and each has a
fixed twin. Diagnosed at the default duration, three at a time, under `gpuscope run` (the probe;
memray in the environment).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpuscope.core.diagnosis import diagnose
from gpuscope.core.investigation import investigate

from helpers import gpuscope_cmd, run_together

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
    if not REMEMBER and index.ntotal >= 40_000:
        index.reset()                 # the fix: a bounded index
    index.add(query)                  # every query kept in the index (native memory)
    return index.search(query[:1], 5)
print("ready", flush=True)
rng = np.random.default_rng(0)
while True:
    search(rng.random((4000, 64), dtype=np.float32)); time.sleep(0.1)
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
def remember(session, question):
    history = histories.setdefault(session, InMemoryChatMessageHistory())
    history.add_messages([HumanMessage(question), AIMessage(question.upper())])
    if not REMEMBER and len(histories) > 50:
        histories.pop(next(iter(histories)))
print("ready", flush=True)
i = 0
while True:
    remember(f"s{i}", "what leaks here? " * 2000); i += 1; time.sleep(0.02)
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


@pytest.mark.parametrize("name", list(SERVICES))
def test_the_leaking_service_is_a_leak_and_its_function_is_named_first(leaking, name):
    d = leaking[name]
    assert d.verdict == "leak", d.to_text()
    assert d.suspects and d.suspects[0].function == SERVICES[name][1], d.to_text()


@pytest.mark.parametrize("name", list(SERVICES))
def test_the_fixed_service_is_not_a_leak(fixed, name):
    d = fixed[name]
    assert d.verdict != "leak", d.to_text()
