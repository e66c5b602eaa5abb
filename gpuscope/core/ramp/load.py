"""The load a ramp drives: requests it sends itself at a paced rate, or the user's own load command.

- `HttpRequests`: one request a slot, to one URL: GET without a body; POST with a body file's
  bytes, or with a template's text in which `{n}` is the request's number (so that every request
  differs, as real traffic does);
- `ChatRequests`: OpenAI-compatible `/v1/chat/completions`: conversations of `turns` turns, each
  turn sent with the whole conversation so far (the context a chat service keeps) and the
  answer added to it;
- `LoadCommand`: the user's load tool, started for each step with `{rate}` in its command
  replaced by the step's rate (requests per second), and stopped (its process group) when the
  step ends.

Workers share one pacer that hands out send times at the step's rate; a slot is taken only when
a worker is free, so with every worker busy (the service queueing) the offered load stops
growing instead of piling up requests in gpuscope. What each request took, measured from its
first byte sent to its last byte read, goes to a `ClientTally` read once an interval.

Everything the service sends is bounded: the answer's size (MAX_ANSWER_BYTES, read in chunks),
each request's time (`timeout_s`, the whole exchange), and what a chat answer adds to its
conversation (MAX_MESSAGE_CHARS, MAX_CONVERSATION_CHARS in all).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gpuscope.errors import UsageError
from gpuscope.core.common.json_depth import too_large
from gpuscope.core.common.printable import printable_line
from gpuscope.core.common.redact import redact_command, redact_text

MAX_ANSWER_BYTES = 4 << 20
MAX_ANSWER_DEPTH = 64  # a chat completion nests under 10 deep (logprobs included)
MAX_MESSAGE_CHARS = 16 << 10  # of an answer kept in its conversation
MAX_CONVERSATION_CHARS = 64 << 10  # of all the answers one conversation keeps (one per worker)
MAX_LATENCIES = 50_000  # kept per interval (a uniform sample beyond: the quantiles stay unbiased)
MAX_BODY_BYTES = 8 << 20  # a --body file
CHUNK = 1 << 16
MAX_WORKERS = 1024
STOP_TIMEOUT_S = 5.0
LATE_S = 0.02  # a slot woken for later than this (and a period) is let go

CHAT_PROMPTS = (
    "Summarise why GPU memory grows after a deploy.",
    "Which requests fill the KV cache fastest?",
    "Explain the difference between P95 and P99 latency.",
    "What does a rising queue depth say about capacity?",
    "How should a retriever cache be bounded?",
    "Why does time to first token rise under load?",
)


class LoadError(UsageError):
    """A load that cannot be driven as given (or an answer it cannot read): one plain line."""


@dataclass(frozen=True)
class Outcome:
    """One request's end: how long it took, whether it succeeded, the tokens it was answered with."""

    latency_s: float
    ok: bool
    tokens: int | None = None
    error: str | None = None
    turn: int | None = None  # its turn in its conversation (chat), from 1


@dataclass(frozen=True)
class ClientInterval:
    """What the client saw in one interval."""

    sent: int
    ok: int
    errors: int
    latencies: tuple[float, ...]  # of the successful requests (a uniform sample past MAX_LATENCIES)
    tokens: int | None
    turns: int  # conversation turns completed (chat)
    last_error: str | None

    def quantile(self, q: float) -> float | None:
        """The q-quantile of the successful requests' latencies (the nearest rank), None without any."""
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        rank = max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.999999) - 1))
        return ordered[rank]


class ClientTally:
    """The requests' outcomes, summed per interval (thread-safe; bounded per interval)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(1)
        self._reset()

    def _reset(self) -> None:
        self._sent = self._ok = self._errors = self._turns = 0
        self._seen = 0
        self._tokens: int | None = None
        self._latencies: list[float] = []
        self._last_error: str | None = None

    def sent(self) -> None:
        with self._lock:
            self._sent += 1

    def add(self, outcome: Outcome) -> None:
        with self._lock:
            if outcome.ok:
                self._ok += 1
                self._seen += 1
                if len(self._latencies) < MAX_LATENCIES:
                    self._latencies.append(outcome.latency_s)
                else:  # reservoir sampling: every latency equally likely to be kept
                    slot = self._rng.randrange(self._seen)
                    if slot < MAX_LATENCIES:
                        self._latencies[slot] = outcome.latency_s
                if outcome.tokens is not None:
                    self._tokens = (self._tokens or 0) + outcome.tokens
                if outcome.turn is not None:
                    self._turns += 1
            else:
                self._errors += 1
                self._last_error = outcome.error

    def take(self) -> ClientInterval:
        with self._lock:
            taken = ClientInterval(self._sent, self._ok, self._errors, tuple(self._latencies), self._tokens, self._turns,
                                   self._last_error)
            self._reset()
        return taken


# -- what is sent -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where requests go: an http(s) URL, checked before anything is sent."""

    scheme: str
    host: str
    port: int
    path: str
    shown: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LoadError(f"--target must be an http:// or https:// URL, not {printable_line(redact_text(url))!r}")
        if parts.username or parts.password:
            raise LoadError("--target: give credentials with --header 'Authorization: ...', not in the URL")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise LoadError(f"--target has a bad port: {printable_line(url)!r}") from None
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname, port, path, printable_line(redact_text(f"{parts.scheme}://{parts.netloc}{parts.path}")))

    def unreachable(self, timeout: float) -> str | None:
        """Why nothing listens there (one line), or None: asked once before the ramp starts."""
        try:
            socket.create_connection((self.host, self.port), timeout=timeout).close()
        except OSError as exc:
            return f"cannot reach --target {self.shown}: {printable_line(exc.strerror or str(exc))}"
        return None

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


@dataclass
class Conversation:
    """One chat conversation's messages so far (bounded: `turns` turns, the answers it keeps capped
    one by one and in all)."""

    messages: list[dict] = field(default_factory=list)
    turn: int = 0
    kept_chars: int = 0


class HttpRequests:
    """GET, or POST of a body file's bytes or a template's text with `{n}` the request's number."""

    mode = "http"

    def __init__(self, target: Target, *, body: bytes | None = None, template: str | None = None,
                 method: str | None = None, headers: dict[str, str] | None = None) -> None:
        if body is not None and template is not None:
            raise LoadError("give --body FILE or --template TEXT, not both")
        if template is not None and "{n}" not in template:
            raise LoadError("--template needs {n} (the request's number) somewhere: identical requests are not real traffic")
        self.target = target
        self._body = body
        self._template = template
        self.method = method or ("POST" if body is not None or template is not None else "GET")
        self.headers = dict(headers or {})
        self._count = 0
        self._lock = threading.Lock()

    def new_conversation(self) -> Conversation | None:
        return None

    def request(self, conversation: Conversation | None) -> bytes | None:
        if self._template is not None:
            with self._lock:
                self._count += 1
                n = self._count
            return self._template.replace("{n}", str(n)).encode()
        return self._body

    def answered(self, conversation: Conversation | None, body: bytes) -> tuple[int | None, int | None]:
        """(tokens, turn) of a successful answer: none for plain HTTP."""
        return None, None


class ChatRequests:
    """OpenAI-compatible chat completions, in conversations of `turns` turns that keep their context."""

    mode = "chat"
    method = "POST"

    def __init__(self, target: Target, *, model: str, turns: int, max_tokens: int,
                 headers: dict[str, str] | None = None) -> None:
        if not 1 <= turns <= 1000:
            raise LoadError(f"--turns must be from 1 to 1000, not {turns}")
        self.target = target
        self.model = model
        self.turns = turns
        self.max_tokens = max_tokens
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self._count = 0
        self._lock = threading.Lock()

    def new_conversation(self) -> Conversation:
        return Conversation()

    def request(self, conversation: Conversation | None) -> bytes:
        assert conversation is not None
        if conversation.turn >= self.turns:
            conversation.messages.clear()
            conversation.turn = conversation.kept_chars = 0
        with self._lock:
            self._count += 1
            n = self._count
        prompt = f"{CHAT_PROMPTS[n % len(CHAT_PROMPTS)]} (request {n}, turn {conversation.turn + 1})"
        conversation.messages.append({"role": "user", "content": prompt})
        return json.dumps({"model": self.model, "messages": conversation.messages, "max_tokens": self.max_tokens,
                           "stream": False}).encode()

    def answered(self, conversation: Conversation | None, body: bytes) -> tuple[int | None, int | None]:
        assert conversation is not None
        try:
            # json's parser recurses once a level, and an empty object costs 72 bytes for 3
            if (problem := too_large(body, MAX_ANSWER_DEPTH)) is not None:
                raise ValueError(problem)
            answer = json.loads(body)
            message = answer["choices"][0]["message"]
            content = message.get("content") if isinstance(message, dict) else None
            usage = answer.get("usage") if isinstance(answer, dict) else None
            tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            conversation.messages.pop()  # the turn did not happen: the next one asks again
            raise LoadError("the answer is not a chat completion (no choices[0].message)") from None
        room = max(0, min(MAX_MESSAGE_CHARS, MAX_CONVERSATION_CHARS - conversation.kept_chars))
        text = content[:room] if isinstance(content, str) else ""
        conversation.kept_chars += len(text)
        conversation.messages.append({"role": "assistant", "content": text})
        conversation.turn += 1
        return (tokens if isinstance(tokens, int) and 0 <= tokens < 1 << 31 else None), conversation.turn


Requests = HttpRequests | ChatRequests


# -- the paced workers ------------------------------------------------------------------------------


class Pacer:
    """Send times at `rate` per second; a slot is taken only when a worker asks for one. Idle
    workers hold slots ahead of time; a new rate cancels them (they ask again), so that the old
    rate's slots never add to the new one's. The new rate's first slot is a new period after the
    last slot used, not at once: a step up sends no two requests back to back (a burst that a
    small pool queues, a P99 broken by the step change itself). A slot its worker wakes for
    more than a period (and LATE_S) late is let go, as a slot is when no worker is free: a client
    that could not run for a while (a starved machine) sends less, not a burst that queues the
    service and breaks its P99 at a load it carries. What was sent is what is counted."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._period: float | None = None
        self._next = time.monotonic()
        self._last_used: float | None = None
        self._generation = 0
        self._stopped = False

    def set_rate(self, rate: float) -> None:
        with self._changed:
            self._period = 1.0 / rate if rate > 0 else None
            now = time.monotonic()
            after_last = self._last_used + self._period if self._last_used is not None and self._period else now
            self._next = max(now, after_last)
            self._generation += 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def wait(self) -> bool:
        """Wait for the next slot: False when stopped."""
        with self._changed:
            while not self._stopped:
                if self._period is None:
                    self._changed.wait()
                    continue
                now = time.monotonic()
                slot = max(self._next, now)
                self._next = slot + self._period
                generation = self._generation
                while not self._stopped and generation == self._generation and time.monotonic() < slot:
                    self._changed.wait(slot - time.monotonic())
                if self._stopped:
                    return False
                if generation == self._generation and time.monotonic() - slot > max(self._period, LATE_S):
                    continue  # woken that late (a starved client): let the slot go rather than send a burst
                if generation == self._generation:
                    self._last_used = slot if self._last_used is None else max(self._last_used, slot)
                    return True
            return False


class RequestLoad:
    """Workers sending `requests` at the pacer's rate; outcomes to `tally`."""

    def __init__(self, requests: Requests, tally: ClientTally, *, workers: int, timeout_s: float) -> None:
        if not 1 <= workers <= MAX_WORKERS:
            raise LoadError(f"--concurrency must be from 1 to {MAX_WORKERS}, not {workers}")
        self.requests = requests
        self.tally = tally
        self.timeout_s = timeout_s
        self.pacer = Pacer()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=f"gpuscope-ramp-{i}", daemon=True) for i in range(workers)]
        self._connections: set[http.client.HTTPConnection] = set()
        self._sockets: set[socket.socket] = set()  # of the exchanges in flight (an answer may hold one its connection let go)
        self._lock = threading.Lock()

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def set_rate(self, rate: float) -> None:
        self.pacer.set_rate(rate)

    def stop(self) -> None:
        """Stop at once: no request is sent after this returns, and those in flight are cut off."""
        self._stop.set()
        self.pacer.stop()
        with self._lock:
            for connection in list(self._connections):
                _shut(connection.sock)
            for sock in list(self._sockets):
                _shut(sock)

    def _work(self) -> None:
        connection: http.client.HTTPConnection | None = None
        conversation = self.requests.new_conversation()
        try:
            while self.pacer.wait():
                if connection is None:
                    connection = self.requests.target.connect(self.timeout_s)
                    with self._lock:
                        self._connections.add(connection)
                outcome, reuse = self._send(connection, conversation)
                if self._stop.is_set():
                    return  # cut off by stop(): not an outcome of the service
                self.tally.add(outcome)
                if not reuse:
                    with self._lock:
                        self._connections.discard(connection)
                    connection.close()
                    connection = None
        finally:
            if connection is not None:
                connection.close()

    def _send(self, connection: http.client.HTTPConnection, conversation: Conversation | None) -> tuple[Outcome, bool]:
        requests = self.requests
        turn = None
        started = time.monotonic()
        deadline = started + self.timeout_s
        # The deadline is on the whole exchange, not each read: a server that sends a byte a second
        # is cut off. The socket is kept here, as the answer may hold it once the connection lets go.
        held: list[socket.socket] = []
        def cut() -> None:
            for sock in held or [connection.sock]:
                _shut(sock)

        cutter = threading.Timer(self.timeout_s, cut)
        cutter.daemon = True
        try:
            body = requests.request(conversation)
            self.tally.sent()
            cutter.start()
            connection.request(requests.method, requests.target.path, body=body, headers=requests.headers)
            if connection.sock is not None:
                held.append(connection.sock)
                with self._lock:
                    self._sockets.add(connection.sock)
            response = connection.getresponse()
            data = _read_bounded(response, deadline)
            latency = time.monotonic() - started
            if not 200 <= response.status < 300:
                if conversation is not None and conversation.messages:
                    conversation.messages.pop()  # the turn did not happen
                reason = printable_line(response.reason or "")[:80]
                return Outcome(latency, False, error=f"HTTP {response.status} {reason}".rstrip()), not response.will_close
            tokens, turn = requests.answered(conversation, data)
            return Outcome(latency, True, tokens, turn=turn), not response.will_close
        except LoadError as exc:
            return Outcome(time.monotonic() - started, False, error=str(exc)), False
        except (OSError, http.client.HTTPException) as exc:
            if conversation is not None and conversation.messages and conversation.messages[-1].get("role") == "user":
                conversation.messages.pop()
            late = time.monotonic() >= deadline
            what = f"no answer within {self.timeout_s:g} s" if late else f"{type(exc).__name__}: {printable_line(str(exc))[:120]}"
            return Outcome(time.monotonic() - started, False, error=what), False
        finally:
            cutter.cancel()
            with self._lock:
                self._sockets.difference_update(held)


def _read_bounded(response: http.client.HTTPResponse, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = response.read(CHUNK)
        if time.monotonic() >= deadline:  # cut off by the deadline (an end of file then is no answer)
            raise TimeoutError("the answer took too long")
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise LoadError(f"an answer over {MAX_ANSWER_BYTES >> 20} MiB")
        chunks.append(chunk)


def _shut(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def read_body_file(path: str) -> bytes:
    """A --body file, read once and bounded; LoadError (one line) when it cannot be."""
    try:
        with open(path, "rb") as f:
            if not os.path.isfile(path):
                raise LoadError(f"--body {path}: not a regular file")
            data = f.read(MAX_BODY_BYTES + 1)
    except OSError as exc:
        raise LoadError(f"--body {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BODY_BYTES:
        raise LoadError(f"--body {path}: over {MAX_BODY_BYTES >> 20} MiB")
    return data


def parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or any(c in text for c in "\r\n"):
        raise LoadError(f"--header must read 'Name: value', not {printable_line(redact_text(text))!r}")
    return name.strip(), value.strip()


# -- the user's load command ------------------------------------------------------------------------


class LoadCommand:
    """`/bin/sh -c CMD` with `{rate}` replaced, one run a step, in a process group of its own."""

    def __init__(self, template: str, output: int | None = 2) -> None:
        if "{rate}" not in template:
            raise LoadError("--load-command needs {rate} in it (replaced by each step's requests per second)")
        self.template = template
        self.shown = redact_command(template)
        self._output = output
        self._proc: subprocess.Popen | None = None
        self.problem: str | None = None

    def set_rate(self, rate: float) -> None:
        self.stop()
        command = self.template.replace("{rate}", f"{rate:g}")
        try:
            self._proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=self._output,
                                          stderr=self._output, start_new_session=True)
        except OSError as exc:
            self.problem = f"the load command could not start: {exc.strerror or exc}"

    def failed(self) -> str | None:
        """Why the load command's run ended before its step did (a non-zero status), else None."""
        proc = self._proc
        if proc is not None and proc.poll() not in (None, 0):
            return f"the load command exited with status {proc.returncode}"
        return self.problem

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(STOP_TIMEOUT_S if signum == signal.SIGTERM else 1.0)
                return
            except subprocess.TimeoutExpired:
                continue


