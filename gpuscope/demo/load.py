"""A bounded load generator for the demo RAG service.

    python -m gpuscope.demo.load --url http://127.0.0.1:PORT [--rate R] [--concurrency C] [--duration S]

A few worker threads share one pacer, so the total rate and the number of requests in flight
are both capped whatever the service does. Every query is unique (words + a counter), which is
what makes the retriever's per-query cache leak. Failures (the service still starting, a
timeout) are counted and followed by a short back-off, never fatal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import threading
import time
import urllib.request
from urllib.parse import urlencode

from gpuscope.demo.lifecycle import stop_on_signals, watch_parent

DEFAULT_RATE = 10.0
DEFAULT_CONCURRENCY = 6
MAX_RATE = 200.0
MAX_CONCURRENCY = 32

WORDS = (
    "why is gpu memory growing on node after deploy kv cache usage high p95 latency "
    "tokens per second dropped retriever slow reranker timeout embedding index stale "
    "shard replica restart batch size context window prompt length allocator fragment "
    "cuda out of memory leak warmup steady state prefill decode queue depth"
).split()

# The service is on loopback: never route it through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Pacer:
    """Hands out send times at most `rate` per second. A slot is taken only when a worker asks,
    so time spent with every worker busy is never paid back later as a burst."""

    def __init__(self, rate: float) -> None:
        self.period = 1.0 / rate
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def wait(self, stop: threading.Event) -> bool:
        with self._lock:
            now = time.monotonic()
            slot = max(self._next, now)
            self._next = slot + self.period
        return not stop.wait(max(0.0, slot - now))


class Stats:
    def __init__(self) -> None:
        self.sent = self.ok = self.errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()

    def record(self, error: str | None) -> None:
        with self._lock:
            self.sent += 1
            if error is None:
                self.ok += 1
            else:
                self.errors += 1
                self.last_error = error


def make_queries(seed: int | None = None):
    """Unique queries forever: three random words plus a per-process counter."""
    rng = random.Random(seed)
    tag = f"{os.getpid():x}"
    lock = threading.Lock()
    counter = itertools.count(1)

    def next_query() -> str:
        with lock:
            n = next(counter)
            words = rng.sample(WORDS, 3)
        return f"{' '.join(words)} q{tag}n{n}"

    return next_query


def worker(url: str, pacer: Pacer, stop: threading.Event, stats: Stats, next_query, timeout: float) -> None:
    while pacer.wait(stop):
        target = f"{url}/query?{urlencode({'q': next_query()})}"
        try:
            with _OPENER.open(target, timeout=timeout) as resp:
                json.load(resp)
            stats.record(None)
        except (OSError, ValueError) as exc:  # URLError, refused, reset, timeout, bad JSON
            reason = getattr(exc, "reason", None) or exc
            stats.record(f"{type(exc).__name__}: {reason}")
            stop.wait(random.uniform(0.2, 0.6))  # back off; the service may still be starting


def run(url: str, rate: float, concurrency: int, duration: float | None, timeout: float = 10.0,
        stop: threading.Event | None = None) -> Stats:
    stop = stop or threading.Event()
    stats = Stats()
    pacer = Pacer(rate)
    next_query = make_queries()
    threads = [
        threading.Thread(target=worker, args=(url.rstrip("/"), pacer, stop, stats, next_query, timeout),
                         name=f"load-{i}", daemon=True)
        for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    deadline = None if duration is None else time.monotonic() + duration
    while not stop.is_set():
        left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
        if left <= 0:
            break
        stop.wait(left)
    stop.set()
    # Workers may sit in a request for up to `timeout`; they are daemons, so do not wait long.
    end = time.monotonic() + 1.0
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    return stats


def _positive(kind, limit: float):
    def parse(text: str):
        value = kind(text)
        if not 0 < value <= limit:
            raise argparse.ArgumentTypeError(f"must be in (0, {limit:g}], not {text}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuscope.demo.load", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--rate", type=_positive(float, MAX_RATE), default=DEFAULT_RATE, help="requests/s in total")
    p.add_argument("--concurrency", type=_positive(int, MAX_CONCURRENCY), default=DEFAULT_CONCURRENCY,
                   help="requests in flight at most")
    p.add_argument("--duration", type=_positive(float, 7 * 86400), default=None, help="seconds (default: until stopped)")
    p.add_argument("--timeout", type=_positive(float, 300), default=10.0, help="seconds per request")
    args = p.parse_args(argv)

    stop = threading.Event()
    stop_on_signals(stop)
    watch_parent(stop)
    stats = run(args.url, args.rate, args.concurrency, args.duration, args.timeout, stop)
    tail = f" (last error: {stats.last_error})" if stats.last_error else ""
    print(f"load: {stats.sent} sent, {stats.ok} ok, {stats.errors} errors{tail}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
