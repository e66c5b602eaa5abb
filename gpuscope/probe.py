"""gpuscope's probe: a tiny agent inside a Python service that answers gpuscope's questions.

    from gpuscope import probe
    probe.start()          # once, at start-up; idempotent; never raises

(or run the service under `gpuscope run -- python serve.py ...`, or attach it to a running
process with `gpuscope run --inject --pid PID`). The probe is a daemon thread that serves a Unix
socket; it does no work until asked. It never imports torch and never initialises CUDA: it looks
at `sys.modules.get("torch")` and calls CUDA APIs only once `torch.cuda.is_initialized()` (even
`torch.cuda.is_available()` can initialise the driver and break later forks). Standard library
only; memray is imported only when a `memray_track` request asks for it.

Where: `$XDG_RUNTIME_DIR/gpuscope/probe-<pid>.sock` when XDG_RUNTIME_DIR is a directory of this
user, else `<tempdir>/gpuscope-<uid>/probe-<pid>.sock`. The folder is 0700 and the socket 0600;
if another user took the folder's name first, the probe uses a private folder of its own beside
it, `<folder>-XXXXXXXX`. Only the service's user and root can connect, and the probe checks the
peer of every connection (SO_PEERCRED): anyone else gets one error line and is hung up on.
`<pid>` is the PID as the service sees it (in a container, its namespace PID). The socket is
removed by `stop()` and at exit; a socket left by a process that died (SIGKILL) is removed by the
client (`gpuscope.core.target.probe_client`).

Protocol: newline-delimited JSON over the socket, one request at a time per connection, any number
of requests per connection. A request is one line, an object with "op" and the op's arguments
(at most 64 KiB); each gets exactly one reply line:

    {"ok": true, "result": {...}}            or            {"ok": false, "error": "one sentence"}

A line that is not such an object gets an error reply and the connection stays usable; a line over
64 KiB gets an error reply and the connection is closed. Frames are `[function, file, line]`,
innermost first, everywhere. Ops:

- `hello` -> {pid, python, executable, probe, protocol, torch (version or null), cuda:
  {initialized, available (null until initialised: asking could initialise it), devices:
  [{index, name, total_memory}]}, history (recording started by the probe), memray (importable),
  memray_capture (a capture is running now)}.
- `stats` -> {devices: [{index, allocated, reserved, active, inactive_split, allocated_peak,
  reserved_peak, active_peak, allocations, num_alloc_retries, num_ooms}]} from
  `torch.cuda.memory_stats(i)` for every device; a key this torch does not have is null.
- `history_start` {max_entries?} -> `torch.cuda.memory._record_memory_history(enabled="state",
  context="state", stacks="python", max_entries=...)`: stacks of live blocks from now on (blocks
  allocated earlier have none). -> {recording: true, max_entries}.
- `history_stop` -> stops recording (only if the probe started it) -> {recording: false}. Recording
  also stops when the connection that started it closes (a client that was killed leaves nothing on).
- `snapshot` {limit?} -> takes `torch.cuda.memory._snapshot()`, keeps its live blocks
  ("active_allocated") in a compact form (at most 2 snapshots kept) -> {id, blocks, bytes,
  truncated, groups: [{bytes, count, frames}]} (the live blocks grouped by allocating stack,
  largest first, at most `limit` groups).
- `diff` {before?, after?, limit?} -> the blocks alive in snapshot `after` that were not alive in
  `before` (default: the two latest), grouped by stack -> {before, after, bytes, count, groups,
  omitted_groups}. That is memory allocated between the snapshots and still held.
- `memray_track` {seconds, limit?} -> runs `memray.Tracker(<private temp file>,
  native_traces=False, file_format=AGGREGATED_ALLOCATIONS)` in this thread for that long (stopped
  early if the client hangs up, or by `track_stop`: then `stopped_early` is true), then {seconds, records: [{size, count, frames}], bytes, count,
  omitted}: the allocations made meanwhile that are still alive, one record per stack (memray's
  grouping), largest first. The probe's own frames are left out. With `interval` (seconds) every
  allocation is recorded (not aggregated; tracking stops early past 256 MiB of capture) and the
  reply adds `times` (memory snapshots, seconds since tracking began) and, per record, `held`:
  the bytes that stack held at each of those times. With `memray_path` (gpuscope's own
  packages), memray is imported from there when the process cannot import its own (without
  rich, where the service has none: `_stub_rich`), used again by later captures, and its
  libraries' read-only pages are dropped from the RSS after each (`drop_clean_pages`). Every reply
  says where memray came from (`from`) and the process's RSS `before`, while `tracking` and
  `after` (the tracker's state freed, glibc asked to return free pages: `malloc_trim`, asked
  again once the reply is sent and what reading the capture built is freed), and `heap`
  {times, bytes, blocks}: the least bytes malloc had in use (as `track_progress` reports them) and
  the least blocks Python's small-object allocator had handed out (`sys.getallocatedblocks()`:
  its arenas are not malloc's) since the point before, each read every 20 ms while tracking, at
  each of its points (on the clock of `times`).
- `tracemalloc_track` {seconds, interval?, frames?, limit?} -> the standard library's tracker
  (Python-domain allocations only: memory allocated by C/C++/Rust code directly, a FAISS index,
  a tokenizer's buffers, is not seen), started for that long and stopped again; a snapshot every
  `interval` s -> {seconds, times, records: [{size, count: null, frames, held}], bytes, omitted,
  stopped_early, rss, heap}. Frames are named after the function defined around their line in the source file.
  Refused when the service runs tracemalloc itself.
- `track_progress` (on another connection, while a `memray_track` or `tracemalloc_track` runs) ->
  {tracking, method, times, heap, rss, blocks, rss_before, sites}: what the running capture has
  seen so far, a point every second: the least bytes malloc had in use since the point before
  (`heap`, glibc's mallinfo2, read every 20 ms; null without it), the least blocks Python's
  small-object allocator had handed out (`blocks`), the RSS, and the RSS before the tracker
  started (`rss_before`); for tracemalloc also the held bytes of the sites that gained most (`sites`: [{frames,
  held}]). memray's held bytes per site are in its capture, read only when tracking ends.
  -> {tracking: false} when no capture runs.
- `track_stop` (on another connection) -> the running capture stops now and its request replies
  with what it has (its reply says `stopped_early`). -> {stopping: true|false}.

Without torch, or before CUDA is initialised, the torch ops answer "CUDA not available: ...".
Safety: every request is contained (an exception becomes an error reply); replies are bounded
(groups, frames per stack, 8 MiB per reply); at most 2 snapshots and 16 connections at a time;
one snapshot/diff/history op at a time and one memray capture at a time in the process.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import select
import shutil
import socket
import stat
import struct
import sys
import tempfile
import threading
import time

PROBE_VERSION = "1.0"
PROTOCOL = 1
MAX_REQUEST = 64 * 1024
MAX_REPLY = 8 * 1024 * 1024
MAX_CLIENTS = 16
MAX_FRAMES = 64  # frames kept per stack, innermost first
MAX_GROUPS = 500
DEFAULT_GROUPS = 50
MAX_SNAPSHOTS = 2
MAX_BLOCKS = 500_000  # live blocks kept per snapshot
DEFAULT_HISTORY_ENTRIES = 100_000
MAX_HISTORY_ENTRIES = 1_000_000
MAX_TRACK_S = 600.0
IDLE_TIMEOUT_S = 600.0  # a connection that says nothing for this long is closed

_lock = threading.Lock()
_server = None  # the running _Server, if any
_last_error = None


def runtime_dir(environ=None, uid=None):
    """The folder this process's probe socket goes in (not created here)."""
    environ = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
                return os.path.join(xdg, "gpuscope")
        except OSError:
            pass
    return os.path.join(tempfile.gettempdir(), "gpuscope-%d" % uid)


def socket_path(pid=None, environ=None):
    return os.path.join(runtime_dir(environ), "probe-%d.sock" % (os.getpid() if pid is None else pid))


def last_error():
    """Why the last `start()` did not start a probe (None if it did)."""
    return _last_error


def running():
    """The socket path of this process's probe, or None."""
    server = _server
    return server.path if server is not None and server.pid == os.getpid() else None


def start(path=None, quiet=False):
    """Start the probe (once per process). Returns its socket path, or None if it could not start
    (then `last_error()` says why, and one line goes to stderr unless `quiet`). Never raises."""
    global _server, _last_error
    with _lock:
        if _server is not None and _server.pid == os.getpid():
            return _server.path
        try:
            if path:
                target = path
                _prepare_folder(os.path.dirname(path))
            else:
                target = os.path.join(_prepare_folder(runtime_dir(), beside=True), "probe-%d.sock" % os.getpid())
            if _answering(target):
                # Another copy of this module (loaded by file path by `gpuscope run` or an
                # injection) already serves this PID: one probe per process is enough.
                _last_error = None
                return target
            _server = _Server(target)
            _server.start()
        except Exception as exc:  # the host must never be hurt by its probe
            _server = None
            _last_error = "%s: %s" % (type(exc).__name__, exc) if str(exc) else type(exc).__name__
            if not quiet:
                try:
                    sys.stderr.write("gpuscope probe: not started (%s)\n" % _last_error)
                except Exception:
                    pass
            return None
        _last_error = None
        return _server.path


def stop():
    """Stop the probe and remove its socket (stops torch history and memray if it started them)."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None and server.pid == os.getpid():
        server.close()


def _prepare_folder(folder, beside=False):
    """The folder for the socket: `folder`, created 0700, or checked if it exists — a real folder
    of this user's (made private again if its mode let others in, and what they put in it
    meanwhile is removed). When the name is taken by someone else (another user may create
    `/tmp/gpuscope-<uid>` first), `beside` picks a private folder of this user's next to it,
    `<folder>-XXXXXXXX` (gpuscope's client looks there too); else OSError says why."""
    try:
        os.makedirs(folder, mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(folder, 0o700)
            if st.st_mode & 0o022:
                _remove_foreign(folder)
        return folder
    if beside:
        return _private_folder_beside(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError("%s is not a folder" % folder)
    raise OSError("%s belongs to another user" % folder)


MAX_NAMES = 10000  # entries of a folder looked at when searching it


def _remove_foreign(folder):
    """Remove what others put in a folder of ours while it was open to them."""
    with os.scandir(folder) as entries:
        for seen, entry in enumerate(entries):
            if seen >= MAX_NAMES:
                break
            try:
                if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
            except OSError:
                pass


def _private_folder_beside(folder):
    """A folder of this user's, 0700, named `<folder>-XXXXXXXX`: an existing one, else a new one."""
    parent, base = os.path.split(folder)
    try:
        with os.scandir(parent) as entries:
            for seen, entry in enumerate(entries):
                if seen >= MAX_NAMES:
                    break
                if entry.name.startswith(base + "-"):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700:
                        return entry.path
    except OSError:
        pass
    return tempfile.mkdtemp(prefix=base + "-", dir=parent)


def _answering(path):
    """Is a probe of this process listening on this socket? A socket nobody listens on is stale,
    and anything at that name that is not this user's socket was planted: both are removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        os.unlink(path)  # the folder is ours and private: whatever this is, it is not our probe
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(path)
        return True
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise  # busy or forbidden: not proof that it is stale
        try:
            os.unlink(path)
        except OSError:
            pass
        return False
    finally:
        sock.close()


def peer_credentials(sock):
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED), or None
    where the system does not say."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))


def _permitted(conn):
    """Only this process's own user and root may talk to the probe (the socket's mode says so
    too; this holds even if the mode or the folder's were loosened)."""
    try:
        creds = peer_credentials(conn)
    except OSError:
        return False
    return creds is None or creds[1] in (0, os.getuid(), os.geteuid())


class RequestError(Exception):
    """A request that cannot be answered; the message is the reply's one sentence."""


# -- the server -------------------------------------------------------------------------------------


class _Server:
    def __init__(self, path):
        self.path = path
        self.pid = os.getpid()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound under a passing name and renamed once it listens: a client that finds the socket
        # bound but not yet listening is refused, and takes it for a dead probe's (and removes it).
        passing = os.path.join(os.path.dirname(path), ".%d" % self.pid)  # no longer than the name
        bound = False
        try:
            self.listener.bind(passing)
            bound = True
            os.chmod(passing, 0o600)
            self.listener.listen(8)
            os.rename(passing, path)
        except Exception:
            self.listener.close()
            if bound:
                try:
                    os.unlink(passing)
                except OSError:
                    pass
            raise
        self.closing = False
        self.clients = 0
        self.conns = set()
        self.clients_lock = threading.Lock()
        self.state = _State()
        self.thread = threading.Thread(target=self._accept_loop, name="gpuscope-probe", daemon=True)

    def start(self):
        self.thread.start()
        atexit.register(self.close)

    def close(self):
        if self.closing:
            return
        self.closing = True
        if os.getpid() != self.pid:  # a forked child: the socket belongs to the parent
            return
        try:
            atexit.unregister(self.close)
        except Exception:
            pass
        # Wake the accept loop (a blocking accept() is not woken by close() on Linux), then
        # remove the socket so nobody connects again.
        try:
            poke = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            poke.settimeout(0.5)
            try:
                poke.connect(self.path)
            except OSError:
                pass
            poke.close()
        except OSError:
            pass
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.listener.close()
        except OSError:
            pass
        with self.clients_lock:
            conns = list(self.conns)
        for conn in conns:  # connected clients see the end of the stream
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.state.release()

    def _accept_loop(self):
        while not self.closing:
            try:
                conn, _ = self.listener.accept()
            except OSError as exc:
                if self.closing or exc.errno in (errno.EBADF, errno.EINVAL):
                    return
                time.sleep(0.1)  # EMFILE and friends: do not spin
                continue
            if self.closing:
                conn.close()
                return
            if not _permitted(conn):
                _refuse(conn)
                continue
            with self.clients_lock:
                busy = self.clients >= MAX_CLIENTS
                if not busy:
                    self.clients += 1
                    self.conns.add(conn)
            if busy:
                _send(conn, {"ok": False, "error": "too many gpuscope clients are connected to this probe"})
                conn.close()
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="gpuscope-probe-client", daemon=True).start()
            except Exception:
                with self.clients_lock:
                    self.clients -= 1
                    self.conns.discard(conn)
                conn.close()

    def _serve(self, conn):
        hung_up = lambda: _hung_up(conn)  # noqa: E731 - also this connection's identity in _State
        try:
            conn.settimeout(IDLE_TIMEOUT_S)
            buffer = b""
            while not self.closing:
                newline = buffer.find(b"\n")
                if newline < 0:
                    if len(buffer) > MAX_REQUEST:
                        _send(conn, {"ok": False, "error": "request longer than %d bytes: closing" % MAX_REQUEST})
                        return
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buffer += chunk
                    continue
                line, buffer = buffer[:newline], buffer[newline + 1 :]
                if len(line) > MAX_REQUEST:
                    _send(conn, {"ok": False, "error": "request longer than %d bytes: closing" % MAX_REQUEST})
                    return
                if not line.strip():
                    continue
                op, reply = self.answer(line, hung_up)
                sent = _send(conn, reply)
                if op in _TRACKERS:
                    # What reading a capture built (the held series, the reply) is freed only
                    # now: given back, or it stays in the service's RSS
                    del reply
                    give_back_freed_memory()
                if not sent:
                    return
        except Exception:
            pass  # a broken connection ends only itself
        finally:
            self.state.client_gone(hung_up)
            with self.clients_lock:
                self.clients -= 1
                self.conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def answer(self, line, hung_up=lambda: False):
        """(the op asked for, or None where the request is not one; the reply)."""
        op = None
        try:
            try:
                request = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                raise RequestError("not a JSON request: send one JSON object per line, such as {\"op\": \"hello\"}")
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                raise RequestError("a request is a JSON object with an \"op\" (hello, stats, history_start, "
                                   "history_stop, snapshot, diff, memray_track, tracemalloc_track, track_progress, track_stop)")
            handler = _OPS.get(request["op"])
            if handler is None:
                raise RequestError("unknown op %r; known: %s" % (request["op"][:40], ", ".join(sorted(_OPS))))
            op = request["op"]
            return op, {"ok": True, "result": handler(self.state, request, hung_up)}
        except RequestError as exc:
            return op, {"ok": False, "error": str(exc)}
        except Exception as exc:
            text = str(exc).strip().splitlines()
            return op, {"ok": False, "error": "%s: %s" % (type(exc).__name__, text[0][:300]) if text else type(exc).__name__}


def _send(conn, reply):
    try:
        data = json.dumps(reply, separators=(",", ":"), default=str).encode("utf-8") + b"\n"
    except Exception as exc:
        data = json.dumps({"ok": False, "error": "reply not serialisable: %s" % exc}).encode("utf-8") + b"\n"
    if len(data) > MAX_REPLY:
        data = json.dumps({"ok": False, "error": "reply larger than %d bytes: ask for fewer groups" % MAX_REPLY}).encode() + b"\n"
    try:
        conn.sendall(data)
        return True
    except OSError:
        return False


def _refuse(conn):
    """One error line to a peer that may not talk to the probe, then the end (unanswered)."""
    _send(conn, {"ok": False, "error": "not permitted: this probe answers only its process's user and root"})
    try:
        conn.setblocking(False)
        conn.recv(MAX_REQUEST)  # what it sent is dropped (closing on unread data would reset the line)
    except OSError:
        pass
    conn.close()


def readable(fd, seconds):
    """Whether `fd` (a descriptor, or anything with fileno()) has something to read, a hang-up or
    an error within `seconds`. poll, not select: select cannot watch a descriptor numbered 1024 or
    more, which a process with many open files or connections has (it raised, and was taken for
    a hang-up)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, seconds) * 1000.0))


def _hung_up(conn):
    """Has the client closed its end? (Data waiting is not a hang-up.)"""
    try:
        if not readable(conn, 0):
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


# -- what the probe knows ---------------------------------------------------------------------------


class _State:
    def __init__(self):
        self.work = threading.Lock()  # one torch snapshot/diff/history op at a time
        self.memray = threading.Lock()  # one memray capture at a time
        self.recording = False
        self.recording_for = None  # the connection that started recording (its hung_up callback)
        self.snapshots = {}  # id -> (taken, blocks, truncated)
        self.next_id = 1
        self.stop_asked = threading.Event()  # `track_stop`: the running capture ends and replies
        self.tracking = None  # the running capture's progress (a dict replaced whole, never changed)
        self.lent_from = None  # the folder memray was lent from, once it was
        self.lent_files = set()  # the files the lent memray mapped into the process (`drop_clean_pages`)

    def client_gone(self, client):
        """What a connection started ends with it: gpuscope killed mid-diagnosis leaves nothing on."""
        if self.recording and self.recording_for is client:
            with self.work:
                self.release_recording()

    def release_recording(self):
        if self.recording:
            try:
                torch = _cuda_torch()
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass
            self.recording = False
            self.recording_for = None

    def release(self):
        """Forget snapshots and stop what the probe started (at stop or exit)."""
        self.snapshots = {}
        self.release_recording()


def _int(value, default, low, high, name):
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError("%s must be a number" % name)
    return int(max(low, min(high, value)))


def _torch():
    return sys.modules.get("torch")


def _cuda_torch():
    """torch, if it is imported and has initialised CUDA; else RequestError("CUDA not available")."""
    torch = _torch()
    if torch is None:
        raise RequestError("CUDA not available: torch is not imported in this process")
    cuda = getattr(torch, "cuda", None)
    try:
        initialized = bool(cuda is not None and cuda.is_initialized())
    except Exception:
        initialized = False
    if not initialized:
        raise RequestError("CUDA not available: torch has not initialised CUDA in this process")
    return torch


def _op_hello(state, request, hung_up):
    torch = _torch()
    cuda = {"initialized": False, "available": None, "devices": []}
    if torch is not None:
        try:
            torch = _cuda_torch()
        except RequestError:
            pass
        else:
            cuda["initialized"] = True
            cuda["available"] = True
            for i in range(torch.cuda.device_count()):
                device = {"index": i, "name": None, "total_memory": None}
                try:
                    props = torch.cuda.get_device_properties(i)
                    device["name"] = getattr(props, "name", None)
                    device["total_memory"] = getattr(props, "total_memory", None)
                except Exception:
                    pass
                cuda["devices"].append(device)
    try:
        import importlib.util

        memray = importlib.util.find_spec("memray") is not None
    except Exception:
        memray = False
    return {
        "pid": os.getpid(),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "executable": sys.executable,
        "probe": PROBE_VERSION,
        "protocol": PROTOCOL,
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "cuda": cuda,
        "history": state.recording,
        "memray": memray,
        "memray_capture": state.memray.locked(),
    }


# memory_stats key names differ across versions (the docstring's "allocated" is "allocation" in C++).
_STAT_KEYS = {
    "allocated": ("allocated_bytes.all.current",),
    "reserved": ("reserved_bytes.all.current",),
    "active": ("active_bytes.all.current",),
    "inactive_split": ("inactive_split_bytes.all.current",),
    "allocated_peak": ("allocated_bytes.all.peak",),
    "reserved_peak": ("reserved_bytes.all.peak",),
    "active_peak": ("active_bytes.all.peak",),
    "allocations": ("allocation.all.current", "allocated.all.current"),
    "num_alloc_retries": ("num_alloc_retries",),
    "num_ooms": ("num_ooms",),
}


def device_stats(raw):
    """The probe's figures from one `torch.cuda.memory_stats()` dict; a missing key is None."""
    out = {}
    for name, keys in _STAT_KEYS.items():
        out[name] = None
        for key in keys:
            value = raw.get(key) if hasattr(raw, "get") else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[name] = int(value)
                break
    return out


def _op_stats(state, request, hung_up):
    torch = _cuda_torch()
    devices = []
    for i in range(torch.cuda.device_count()):
        try:
            figures = device_stats(torch.cuda.memory_stats(i))
            figures["error"] = None
        except Exception as exc:
            figures = device_stats({})
            figures["error"] = "%s: %s" % (type(exc).__name__, exc)
        figures["index"] = i
        devices.append(figures)
    return {"devices": devices}


def _op_history_start(state, request, hung_up):
    torch = _cuda_torch()
    entries = _int(request.get("max_entries"), DEFAULT_HISTORY_ENTRIES, 1, MAX_HISTORY_ENTRIES, "max_entries")
    with state.work:
        record = torch.cuda.memory._record_memory_history
        try:
            record(enabled="state", context="state", stacks="python", max_entries=entries)
        except TypeError:  # an older signature: the documented minimum
            record(enabled="state", stacks="python", max_entries=entries)
        state.recording = True
        state.recording_for = hung_up
    return {"recording": True, "max_entries": entries}


def _op_history_stop(state, request, hung_up):
    torch = _cuda_torch()
    with state.work:
        was = state.recording
        if was:
            torch.cuda.memory._record_memory_history(enabled=None)
            state.recording = False
            state.recording_for = None
    return {"recording": False, "stopped": was}


def _frames(raw):
    """Torch frames ({filename, line, name}) as [function, file, line], innermost first, bounded."""
    out = []
    for f in raw or ():
        if len(out) >= MAX_FRAMES:
            break
        if isinstance(f, dict):
            try:
                line = int(f.get("line") or 0)
            except (TypeError, ValueError):
                line = 0
            out.append((str(f.get("name") or "?"), str(f.get("filename") or "?"), line))
    return tuple(out)


def live_blocks(snapshot, limit=MAX_BLOCKS):
    """The blocks a program still holds in a `torch.cuda.memory._snapshot()`: [(device, address,
    size, frames)], and whether the list was cut at `limit`. Only "active_allocated" counts:
    "active_awaiting_free" / "active_pending_free" were freed by the program (a stream still uses
    them) and "inactive" is the allocator's cache. Identical stacks are shared, not copied."""
    blocks = []
    interned = {}
    truncated = False
    for segment in (snapshot or {}).get("segments") or ():
        if not isinstance(segment, dict):
            continue
        device = segment.get("device")
        for block in segment.get("blocks") or ():
            if not isinstance(block, dict) or block.get("state") != "active_allocated":
                continue
            if len(blocks) >= limit:
                truncated = True
                break
            frames = _frames(block.get("frames"))
            frames = interned.setdefault(frames, frames)
            blocks.append((device, int(block.get("address") or 0), int(block.get("size") or 0), frames))
    return blocks, truncated


def group_by_stack(blocks, limit=DEFAULT_GROUPS):
    """[{bytes, count, frames}] by allocating stack, largest first (at most `limit`), and how many
    groups were left out. Blocks allocated before history was recorded have an empty stack."""
    sizes = {}
    counts = {}
    for _, _, size, frames in blocks:
        sizes[frames] = sizes.get(frames, 0) + size
        counts[frames] = counts.get(frames, 0) + 1
    ranked = sorted(sizes, key=lambda k: (-sizes[k], -counts[k]))
    groups = [{"bytes": sizes[k], "count": counts[k], "frames": [list(f) for f in k]} for k in ranked[:limit]]
    return groups, max(0, len(ranked) - limit)


def diff_blocks(before, after):
    """Blocks of `after` that were not alive in `before`: allocated between them and still held.
    A block is the same block only with the same device, address, size and stack."""
    seen = set(before)
    return [b for b in after if b not in seen]


def _op_snapshot(state, request, hung_up):
    torch = _cuda_torch()
    limit = _int(request.get("limit"), DEFAULT_GROUPS, 0, MAX_GROUPS, "limit")
    with state.work:
        raw = torch.cuda.memory._snapshot()
        blocks, truncated = live_blocks(raw)
        del raw
        sid = state.next_id
        state.next_id += 1
        state.snapshots[sid] = (time.time(), blocks, truncated)
        for old in sorted(state.snapshots)[:-MAX_SNAPSHOTS]:
            del state.snapshots[old]
        groups, omitted = group_by_stack(blocks, limit)
    return {
        "id": sid,
        "blocks": len(blocks),
        "bytes": sum(b[2] for b in blocks),
        "truncated": truncated,
        "groups": groups,
        "omitted_groups": omitted,
    }


def _op_diff(state, request, hung_up):
    _cuda_torch()
    limit = _int(request.get("limit"), DEFAULT_GROUPS, 0, MAX_GROUPS, "limit")
    with state.work:
        ids = sorted(state.snapshots)
        before = request.get("before")
        after = request.get("after")
        if before is None:
            before = ids[-2] if len(ids) >= 2 else None
        if after is None:
            after = ids[-1] if ids else None
        for name, sid in (("before", before), ("after", after)):
            if isinstance(sid, bool) or not isinstance(sid, (int, type(None))):
                raise RequestError("%s must be a snapshot id (a whole number)" % name)
            if sid not in state.snapshots:
                raise RequestError("no snapshot %r to diff (%s): take two snapshots first; the probe keeps the last %d"
                                   % (sid, name, MAX_SNAPSHOTS))
        added = diff_blocks(state.snapshots[before][1], state.snapshots[after][1])
    groups, omitted = group_by_stack(added, limit)
    return {
        "before": before,
        "after": after,
        "bytes": sum(b[2] for b in added),
        "count": len(added),
        "groups": groups,
        "omitted_groups": omitted,
    }


# -- memray, in process -----------------------------------------------------------------------------


def leaked_records(path, limit=None, exclude_files=()):
    """The allocations still alive at the end of a memray capture: [(frames, bytes, count)], one per
    stack (memray merges threads), largest first; frames are (function, file, line) innermost
    first. Stacks that pass through a file of `exclude_files` are left out."""
    from memray import FileReader  # lazily: only memray captures need it

    reader = FileReader(path)
    out = []
    excluded = set(exclude_files)
    for record in reader.get_leaked_allocation_records(merge_threads=True):
        frames = tuple((str(fn), str(filename), int(line or 0)) for fn, filename, line in record.stack_trace())
        if excluded and any(f[1] in excluded for f in frames):
            continue
        out.append((frames, int(record.size), int(record.n_allocations)))
    out.sort(key=lambda r: -r[1])
    return out if limit is None else out[:limit]


def _own_files():
    files = {__file__, os.path.abspath(__file__)}
    if __file__.endswith(".pyc"):
        files.add(__file__[:-1])
    return tuple(files)


def _rss():
    """This process's resident memory now, bytes (None where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def give_back_freed_memory():
    """Ask the C allocator to return the free pages at the top of its heaps to the system
    (glibc's malloc_trim): what a tracker allocated and freed would otherwise stay in the process's
    RSS after the diagnosis. A no-op where there is no glibc."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:
        pass


_mallinfo2: list = []  # [function or None], looked up once


def _heap_in_use():
    """Bytes the C allocator has handed out and not had back (glibc's mallinfo2: in-use heap chunks
    plus mmapped ones), None without glibc 2.33+. Unlike the RSS, memory malloc keeps after a free
    is not in it. Python's small objects (its own arenas) are not in it either."""
    if not _mallinfo2:
        try:
            import ctypes

            class Info(ctypes.Structure):
                _fields_ = [(name, ctypes.c_size_t) for name in (
                    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                    "fordblks", "keepcost")]

            function = ctypes.CDLL("libc.so.6").mallinfo2
            function.restype = Info
            _mallinfo2.append(function)
        except Exception:
            _mallinfo2.append(None)
    if _mallinfo2[0] is None:
        return None
    try:
        info = _mallinfo2[0]()
        return int(info.uordblks + info.hblkhd)
    except Exception:
        return None


class _Progress:
    """What a running capture has seen, a point every `every` seconds, published whole to
    `state.tracking` for `track_progress` (read from another connection's thread)."""

    def __init__(self, state, method, every=1.0, rss_before=None):
        self.state = state
        self.method = method
        self.every = every
        self.rss_before = rss_before
        self.started = time.monotonic()
        self.next_at = self.started
        self.times, self.heap, self.rss, self.blocks = [], [], [], []
        self.low_heap = self.low_blocks = None
        state.stop_asked.clear()
        state.tracking = {"tracking": True, "method": method, "times": [], "heap": [], "rss": [], "blocks": [],
                          "rss_before": rss_before, "sites": []}

    def due(self):
        return time.monotonic() >= self.next_at

    def look(self):
        """Read the memory in use between points (every `LOOK_S`): a point keeps the least seen
        since the last, so that a buffer built and dropped between points does not hide a rise."""
        heap, blocks = _heap_in_use(), sys.getallocatedblocks()
        if heap is not None:
            self.low_heap = heap if self.low_heap is None else min(self.low_heap, heap)
        self.low_blocks = blocks if self.low_blocks is None else min(self.low_blocks, blocks)

    def point(self, sites=()):
        now = time.monotonic()
        self.next_at = now + self.every
        self.times.append(round(now - self.started, 3))
        self.look()
        self.heap.append(self.low_heap)
        self.rss.append(_rss())
        self.blocks.append(self.low_blocks)
        self.low_heap = self.low_blocks = None
        self.state.tracking = {"tracking": True, "method": self.method, "times": list(self.times),
                               "heap": list(self.heap), "rss": list(self.rss), "blocks": list(self.blocks),
                               "rss_before": self.rss_before, "sites": list(sites)}

    def asked_to_stop(self):
        return self.state.stop_asked.is_set()

    def end(self):
        self.state.tracking = None
        self.state.stop_asked.clear()


MAX_PROGRESS_SITES = 10
LOOK_S = 0.02  # the memory in use is read this often while a capture runs (glibc's mallinfo2: microseconds)


def _op_track_progress(state, request, hung_up):
    return state.tracking or {"tracking": False}


def _op_track_stop(state, request, hung_up):
    if state.tracking is None:
        return {"stopping": False}
    state.stop_asked.set()
    return {"stopping": True}


def _import_memray(path, lent_before=False):
    """memray, from the process's own environment, else from `path` (gpuscope's own packages,
    only when they were built for this interpreter: an import that fails leaves nothing behind).
    -> (module, where) or RequestError. `path` stays on sys.path until `_forget_path(path)`:
    memray imports some of its modules only when a capture is read. `lent_before`: an earlier
    capture loaded it from `path`, and it is still loaded."""
    if lent_before and isinstance(path, str) and path:
        sys.path.append(path)
        import memray

        return memray, "gpuscope's own packages (%s)" % path
    try:
        import memray

        return memray, "the service's environment"
    except ImportError:
        pass
    if not isinstance(path, str) or not path or not os.path.isdir(path):
        raise RequestError("memray is not importable in this process: install memray (or gpuscope) into the "
                           "service's environment")
    sys.path.append(path)
    stubbed = _stub_rich()
    try:
        import memray

        return memray, "gpuscope's own packages (%s)" % path
    except Exception as exc:
        _forget_path(path)
        for name in [n for n in sys.modules if n == "memray" or n.startswith("memray.")]:
            del sys.modules[name]
        raise RequestError("memray is not importable in this process, and gpuscope's own memray does not load "
                           "in it (%s: %s)" % (type(exc).__name__, exc))
    finally:
        for name in stubbed:
            sys.modules.pop(name, None)


def _stub_rich():
    """Stand-ins for the two names of `rich` that memray imports at load, for a service that has no
    rich of its own (-> the names put in sys.modules, to take out once memray is loaded). memray
    draws with them only when a capture is read with a progress bar, which the probe never asks
    for; the real rich would stay in the service: 54 modules, about 3 MB."""
    import importlib.util
    import types

    if "rich" in sys.modules:
        return []
    path = list(sys.path)
    try:
        sys.path.pop()  # gpuscope's own packages, just added: is there a rich without them?
        if importlib.util.find_spec("rich") is not None:
            return []  # the service's own rich: memray loads that, as the service would
    except (ImportError, ValueError):
        return []
    finally:
        sys.path[:] = path

    def not_here(*args, **kwargs):
        raise RuntimeError("rich is not loaded in this process: gpuscope lent memray without it")

    def plain_print(*objects, **kwargs):
        stream = kwargs.get("file") or sys.stderr
        stream.write(" ".join(str(o) for o in objects) + kwargs.get("end", "\n"))

    rich = types.ModuleType("rich")
    progress = types.ModuleType("rich.progress")
    rich.print = plain_print
    progress.Progress = progress.SpinnerColumn = not_here
    rich.progress = progress
    sys.modules["rich"], sys.modules["rich.progress"] = rich, progress
    return ["rich", "rich.progress"]


MADV_DONTNEED = 4


def _mapped_files():
    """The files mapped into this process now (its libraries among them)."""
    try:
        with open("/proc/self/maps") as maps:
            return {f[5].strip() for f in (line.split(None, 5) for line in maps) if len(f) == 6 and f[5].startswith("/")}
    except OSError:
        return set()


def drop_clean_pages(files):
    """Drop from the RSS the pages of `files` (the libraries a lent memray loaded: its own, libstdc++,
    the compression and TLS libraries it links) that are the file's bytes as on disk: read-only
    mappings with no page written (smaps' Anonymous: 0). They stay in the page cache and come back
    on their next use, unchanged; what was written (relocations, data) is never touched. Without
    this, 4 MB of memray's code stays in the service's RSS after tracking though nothing runs it."""
    if not files:
        return
    try:
        import ctypes

        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        clean, span = [], None
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:  # a mapping's header line
                    name = fields[5] if len(fields) >= 6 else ""
                    span = fields[0] if name in files and "w" not in fields[1] else None
                elif span is not None and fields and fields[0] == "Anonymous:":
                    if fields[1] == "0":
                        clean.append(span)
                    span = None
        for text in clean:
            start, end = (int(x, 16) for x in text.split("-"))
            madvise(start, end - start, MADV_DONTNEED)
    except Exception:
        pass


def _forget_path(path):
    try:
        sys.path.remove(path)
    except ValueError:
        pass


MAX_CAPTURE = 256 * 1024 * 1024  # bytes: tracking stops early when the capture grows past this


def _held_series(reader, times, exclude):
    """memray's temporal records as [(frames, held bytes at each memory snapshot, count at the end)]:
    what each stack still held at each snapshot of the capture (allocated since tracking began)."""
    by_stack = {}
    last = len(times) - 1
    for record in reader.get_temporal_allocation_records(merge_threads=True):
        frames = tuple((str(fn), str(filename), int(line or 0)) for fn, filename, line in record.stack_trace())
        if exclude and any(f[1] in exclude for f in frames):
            continue
        held = by_stack.get(frames)
        if held is None:
            held = by_stack[frames] = [[0] * (len(times) + 1), 0]
        # Changes at the snapshot an interval starts and stops, summed up once at the end: the work
        # is one step per interval, however many snapshots it spans.
        for interval in record.intervals:
            start = max(0, interval.allocated_before_snapshot)
            end = interval.deallocated_before_snapshot
            stop = len(times) if end is None else min(end, len(times))
            if start < stop:
                held[0][start] += interval.n_bytes
                held[0][stop] -= interval.n_bytes
            if end is None or end > last:
                held[1] += interval.n_allocations
    out = []
    for frames, (changes, n) in by_stack.items():
        total, series = 0, []
        for change in changes[:-1]:
            total += change
            series.append(total)
        out.append((frames, series, n))
    return out


def _op_memray_track(state, request, hung_up):
    seconds = request.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_TRACK_S:
        raise RequestError("seconds must be a number above 0 and at most %g" % MAX_TRACK_S)
    limit = _int(request.get("limit"), 200, 1, 2000, "limit")
    # With an interval: every allocation is recorded and memory snapshots taken that often, so the
    # reply says what each site held over time, not only at the end.
    interval = request.get("interval")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, (int, float))
                                 or not 0.05 <= interval <= 60):
        raise RequestError("interval must be a number of seconds from 0.05 to 60")
    # A memray lent by an earlier capture is still loaded: the client, finding it importable now,
    # sends no path.
    path = request.get("memray_path") or state.lent_from
    # What lending maps is what appears during the capture: the service's own libraries, mapped
    # before, are never among the pages dropped (with no path nothing can be lent).
    mapped_before = _mapped_files() if path else set()
    memray, where = _import_memray(path, state.lent_from is not None)
    if not state.memray.acquire(False):
        raise RequestError("a memray capture is already running in this process: try again when it ends")
    folder = None
    rss_before = _rss()
    cut_short = stopped_early = False
    progress = None
    try:
        folder = tempfile.mkdtemp(prefix="gpuscope-memray-")
        capture = os.path.join(folder, "capture.bin")
        started = time.monotonic()
        try:
            if interval is None:
                tracker = memray.Tracker(capture, native_traces=False,
                                         file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS)
            else:
                tracker = memray.Tracker(capture, native_traces=False, memory_interval_ms=int(interval * 1000),
                                         file_format=memray.FileFormat.ALL_ALLOCATIONS)
        except TypeError:
            raise RequestError("this memray is too old for this capture: install memray 1.11 or newer")
        with tracker:
            progress = _Progress(state, "memray", interval or 1.0, rss_before)
            deadline = started + float(seconds)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or hung_up():
                    break
                if progress.asked_to_stop():
                    stopped_early = True
                    break
                if interval is not None and os.path.getsize(capture) > MAX_CAPTURE:
                    cut_short = True
                    break
                if progress.due():
                    progress.point()
                else:
                    progress.look()
                time.sleep(min(LOOK_S, left))
        took = time.monotonic() - started
        rss_tracking = _rss()
        if hung_up():
            raise RequestError("cancelled: the client hung up")
        reader = memray.FileReader(capture)
        try:
            if interval is None:
                records = leaked_records(capture, exclude_files=_own_files())
                times = []
                held = {}
            else:
                snapshots = list(reader.get_memory_snapshots())
                times = [(s.time - snapshots[0].time) / 1000.0 for s in snapshots] if snapshots else []
                series = _held_series(reader, times, set(_own_files())) if times else []
                records = sorted(((f, h[-1], n) for f, h, n in series if h[-1] > 0), key=lambda r: -r[1])
                held = {f: h for f, h, _ in series}
                # Sites that hold nothing at the end may still have held much meanwhile (a cache
                # that evicts): the largest of those are kept too, for the trend.
                gone = sorted((s for s in series if s[1][-1] <= 0), key=lambda s: -max(s[1]))[: limit // 4]
                records += [(f, 0, n) for f, h, n in gone if max(h) > 0]
        finally:
            reader.close()
    finally:
        if progress is not None:
            progress.end()
        state.memray.release()
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        if where != "the service's environment":
            _forget_path(path)
    give_back_freed_memory()
    if where != "the service's environment":
        state.lent_from = path
        state.lent_files |= _mapped_files() - mapped_before
        drop_clean_pages(state.lent_files)
    kept = records[:limit]
    out = {
        "seconds": round(took, 3),
        "records": [_record_json(r, held.get(r[0]) if held else None) for r in kept],
        "bytes": sum(r[1] for r in records),
        "count": sum(r[2] for r in records),
        "omitted": len(records) - len(kept),
        "from": where,
        "cut_short": cut_short,
        "stopped_early": stopped_early,
        "rss": {"before": rss_before, "tracking": rss_tracking, "after": _rss()},
    }
    if interval is not None:
        out["times"] = [round(t, 3) for t in times]
    if progress is not None:
        out["heap"] = {"times": list(progress.times), "bytes": list(progress.heap), "blocks": list(progress.blocks)}
    return out


def _record_json(record, held):
    frames, size, count = record
    out = {"size": size, "count": count, "frames": [list(f) for f in frames[:MAX_FRAMES]]}
    if held is not None:
        out["held"] = held
    return out


# -- tracemalloc, in process: the standard library's tracker ---------------------------------------

MAX_SITES = 5000  # tracebacks followed over time
MAX_CODES = 20000  # code objects looked at to name the functions of one file


class _FunctionNames:
    """The innermost function defined around a line of a file (tracemalloc's frames have no
    function name), from the code objects of the modules loaded from that file: nothing is read
    or parsed (parsing inside the service would leave its memory megabytes larger for good).
    "<module>" outside any function; "?" where no loaded module comes from that file. A
    comprehension or a lambda belongs to the function that contains it, as everywhere in gpuscope.
    One per capture: the modules are indexed by file once, each file's functions found once."""

    def __init__(self):
        self._modules = None  # absolute path -> the dictionaries of the modules loaded from it
        self._spans = {}  # file -> [(first line, last line, name)], or None

    def at(self, filename, line):
        if filename not in self._spans:
            try:
                self._spans[filename] = self._function_spans(filename)
            except Exception:
                self._spans[filename] = None
        spans = self._spans[filename]
        if spans is None:
            return "?"
        inside = [s for s in spans if s[0] <= line <= s[1]]
        return min(inside, key=lambda s: s[1] - s[0])[2] if inside else "<module>"

    def _function_spans(self, filename):
        """[(first line, last line, name)] of the functions and methods (nested ones too) of the
        modules loaded from `filename`; None if none is."""
        import types

        if self._modules is None:
            self._modules = {}
            # Through the modules' dictionaries: a lazy module's __getattr__ never runs.
            for module in list(sys.modules.values()):
                names = vars(module) if isinstance(module, types.ModuleType) else {}
                if isinstance(names.get("__file__"), str):
                    self._modules.setdefault(os.path.abspath(names["__file__"]), []).append(names)
        found = self._modules.get(os.path.abspath(filename))
        if not found:
            return None
        todo = []
        for names in found:
            _codes_in(list(names.values()), names.get("__name__"), todo, 0)
        spans, seen = [], set()
        while todo and len(seen) < MAX_CODES:
            code = todo.pop()
            if id(code) in seen or code.co_filename != filename:
                continue
            seen.add(id(code))
            todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
            if not code.co_name.startswith("<"):
                spans.append((code.co_firstlineno, max(_lines(code), default=code.co_firstlineno), code.co_name))
        return spans


def _codes_in(values, module_name, out, depth):
    """The code objects of the functions among `values` (and of what their decorators wrap), and
    of the methods of the classes among them defined in `module_name` (nested classes to a few
    levels). Only functions, classes and their descriptors are looked into, through their
    dictionaries: no attribute hook of the service's objects runs."""
    import types

    for value in values:
        for _ in range(8):
            if not isinstance(value, types.FunctionType):
                break
            out.append(value.__code__)
            value = value.__dict__.get("__wrapped__")
        if isinstance(value, (staticmethod, classmethod)):
            _codes_in([value.__func__], module_name, out, depth)
        elif isinstance(value, property):
            _codes_in([value.fget, value.fset, value.fdel], module_name, out, depth)
        elif isinstance(value, type) and depth < 4 and vars(value).get("__module__") == module_name:
            _codes_in(list(vars(value).values()), module_name, out, depth + 1)


def _lines(code):
    """The line numbers of a code object's instructions."""
    if hasattr(code, "co_lines"):
        return [line for _, _, line in code.co_lines() if line is not None]
    import dis

    return [line for _, line in dis.findlinestarts(code)]


def _op_tracemalloc_track(state, request, hung_up):
    seconds = request.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_TRACK_S:
        raise RequestError("seconds must be a number above 0 and at most %g" % MAX_TRACK_S)
    interval = request.get("interval", 1.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0.05 <= interval <= 60:
        raise RequestError("interval must be a number of seconds from 0.05 to 60")
    limit = _int(request.get("limit"), 200, 1, 2000, "limit")
    depth = _int(request.get("frames"), 16, 1, MAX_FRAMES, "frames")
    import tracemalloc

    if not state.memray.acquire(False):
        raise RequestError("an allocation capture is already running in this process: try again when it ends")
    try:
        if tracemalloc.is_tracing():
            raise RequestError("tracemalloc is already tracing in this process (the service's own): left alone")
        rss_before = _rss()
        own = set(_own_files())
        exclude = [tracemalloc.Filter(False, f) for f in own] + [tracemalloc.Filter(False, tracemalloc.__file__)]
        series = {}  # traceback -> held bytes at each snapshot
        times = []
        stopped_early = False
        started = time.monotonic()
        progress = _Progress(state, "tracemalloc", interval, rss_before)
        tracemalloc.start(depth)
        try:
            while True:
                now = time.monotonic() - started
                snapshot = tracemalloc.take_snapshot().filter_traces(exclude)
                k = len(times)
                times.append(round(now, 3))
                for stat_ in snapshot.statistics("traceback"):
                    held = series.get(stat_.traceback)
                    if held is None:
                        if len(series) >= MAX_SITES:
                            continue
                        held = series[stat_.traceback] = [0] * k
                    held.append(stat_.size)
                for held in series.values():
                    if len(held) < k + 1:
                        held.append(0)
                del snapshot
                progress.point(_gaining(series))
                left = float(seconds) - (time.monotonic() - started)
                if left <= 0 or hung_up() or progress.asked_to_stop():
                    break
                end = time.monotonic() + min(interval, left)
                while time.monotonic() < end and not hung_up() and not progress.asked_to_stop():
                    progress.look()
                    time.sleep(max(0.0, min(LOOK_S, end - time.monotonic())))
            stopped_early = progress.asked_to_stop()
        finally:
            progress.end()
            rss_tracking = _rss()
            tracemalloc.stop()
        if hung_up():
            raise RequestError("cancelled: the client hung up")
    finally:
        state.memray.release()
    give_back_freed_memory()
    names = _FunctionNames()
    ranked = sorted(series.items(), key=lambda kv: -(kv[1][-1] or max(kv[1]) / 4))[:limit]
    records = []
    for traceback, held in ranked:
        frames = [[names.at(f.filename, f.lineno), f.filename, f.lineno] for f in reversed(traceback)]
        records.append({"size": held[-1], "count": None, "frames": frames[:MAX_FRAMES], "held": held})
    return {
        "seconds": round(time.monotonic() - started, 3),
        "times": times,
        "records": records,
        "bytes": sum(h[-1] for h in series.values()),
        "omitted": max(0, len(series) - limit),
        "stopped_early": stopped_early,
        "rss": {"before": rss_before, "tracking": rss_tracking, "after": _rss()},
        "heap": {"times": list(progress.times), "bytes": list(progress.heap), "blocks": list(progress.blocks)},
    }


def _gaining(series):
    """The sites whose held bytes gained most since tracking began, for `track_progress`."""
    gained = sorted(series.items(), key=lambda kv: -(kv[1][-1] - kv[1][0]))[:MAX_PROGRESS_SITES]
    return [{"frames": [[f.filename, f.lineno] for f in reversed(traceback)][:3], "held": list(held)}
            for traceback, held in gained if held[-1] > held[0]]


_TRACKERS = ("memray_track", "tracemalloc_track")  # ops whose reading of a capture is freed after the reply

_OPS = {
    "hello": _op_hello,
    "stats": _op_stats,
    "history_start": _op_history_start,
    "history_stop": _op_history_stop,
    "snapshot": _op_snapshot,
    "diff": _op_diff,
    "memray_track": _op_memray_track,
    "tracemalloc_track": _op_tracemalloc_track,
    "track_progress": _op_track_progress,
    "track_stop": _op_track_stop,
}


def _after_fork_in_child():
    """A forked child inherits the listening socket but not the thread: it has no probe (the
    parent's socket stays the parent's). It may call start() for a probe of its own."""
    global _server, _lock
    _lock = threading.Lock()
    server, _server = _server, None
    if server is not None:
        server.closing = True
        try:
            server.listener.close()
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
