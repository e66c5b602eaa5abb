"""The probe's folder and socket on a node shared with another user.

The other user may take the probe folder's name first, plant `probe-<pid>.sock` names for other
users' processes, or (where a mode was loosened) connect to a probe: none of it may stop a probe,
hide one from gpuscope, pass for one, or get an answer.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gpuscope import probe
from gpuscope.core.target import privilege
from gpuscope.core.target import probe_client
from gpuscope.core.node.torch_memory import MAX_PROBES

from helpers import ROOT
from conftest import SYSTEM_PYTHON

PROBED = "import time\nfrom gpuscope import probe\nprint(probe.start(), flush=True)\nwhile True:\n    time.sleep(0.2)\n"
IDLE = "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.2)\n"


@pytest.fixture
def shared_tmp():
    """A temporary folder like /tmp (1777) that the test can look into and remove afterwards."""
    folder = tempfile.mkdtemp(prefix="gpuscope-test-tmp-")
    os.chmod(folder, 0o1777)
    yield Path(folder)
    subprocess.run(["rm", "-rf", "--one-file-system", folder], timeout=30)


def start_root_python(code: str, env: dict[str, str]) -> subprocess.Popen:
    base = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], env={**base, **env}, stdout=subprocess.PIPE, text=True)


def first_line(proc) -> str:
    return privilege.read_until(proc.stdout, time.monotonic() + 20, line=True).strip()


LISTENER = """
import os, socket, sys, time
socks = []
for path in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(8)
    s.setblocking(False)
    socks.append(s)
print("ready", flush=True)
while True:
    for s in socks:
        try:
            conn, _ = s.accept()
        except BlockingIOError:
            continue
        conn.settimeout(1)
        try:
            data = conn.recv(1000)
        except OSError:
            data = b""
        with open(sys.argv[1], "a") as f:
            f.write("%s %r\\n" % (s.getsockname(), data))
    time.sleep(0.05)
"""


def plant_listeners(other_user, log: Path, paths: list[str]) -> subprocess.Popen:
    """The other user listens on `paths`; whoever connects (and what they send) goes to `log`."""
    proc = other_user.popen([SYSTEM_PYTHON, "-c", LISTENER, str(log), *paths], stdout=subprocess.PIPE, text=True)
    assert first_line(proc) == "ready"
    return proc


def test_a_probe_folder_taken_first_by_another_user_neither_stops_the_probe_nor_hides_it(other_user, shared_tmp):
    taken = shared_tmp / "gpuscope-0"
    decoys = [str(shared_tmp / f"gpuscope-0-decoy{i}") for i in range(8)]  # where the probe might go next
    made = other_user.popen([SYSTEM_PYTHON, "-c", f"import os\nfor d in {[str(taken), *decoys]!r}:\n"
                             "    os.mkdir(d, 0o777)\n    os.chmod(d, 0o777)"])
    assert made.wait(20) == 0
    service = start_root_python(PROBED, {"TMPDIR": str(shared_tmp)})
    try:
        path = first_line(service)
        assert path != "None" and Path(path).parent.name.startswith("gpuscope-0-"), path
        folder = os.lstat(Path(path).parent)
        assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (0, 0o700)
        later = [str(shared_tmp / f"gpuscope-0-later{i}") for i in range(8)]  # listed first on some file systems
        assert other_user.popen([SYSTEM_PYTHON, "-c", f"import os\nfor d in {later!r}:\n    os.mkdir(d, 0o777)"]).wait(20) == 0
        log = other_user.home / "connections"
        plant_listeners(other_user, log, [str(taken / f"probe-{service.pid}.sock")])
        assert probe_client.probe_path(service.pid) == path
        with probe_client.probe_for(service.pid) as client:
            assert client.hello()["pid"] == service.pid
        assert not log.exists()  # gpuscope never connected to the planted socket
        assert os.listdir(taken) == [f"probe-{service.pid}.sock"]  # and left the other user's folder alone
    finally:
        service.kill()
        service.wait(10)


def test_names_planted_for_other_users_processes_crowd_out_no_probe(other_user):
    service = start_root_python(PROBED, {})
    planted = Path(tempfile.gettempdir()) / f"gpuscope-{other_user.uid}"
    listeners = None
    try:
        path = first_line(service)
        assert path.startswith("/"), path
        others = [p for p in sorted(psutil.pids()) if p != service.pid][: MAX_PROBES + 8]
        made = other_user.popen([SYSTEM_PYTHON, "-c", textwrap.dedent(f"""
            import os
            os.makedirs({str(planted)!r}, 0o700, exist_ok=True)  # a probe of this user's may have made it
            for i in range(3000):
                open(os.path.join({str(planted)!r}, "junk-%d" % i), "w").close()
        """)])
        assert made.wait(30) == 0
        listeners = plant_listeners(other_user, other_user.home / "connections",
                                    [str(planted / f"probe-{pid}.sock") for pid in others])
        started = time.monotonic()
        found = probe_client.list_probes(clean=False)
        assert time.monotonic() - started < 5
        assert service.pid in [p.pid for p in found[:MAX_PROBES]], found
        assert not [p for p in found if p.path.startswith(str(planted))]
        assert not (other_user.home / "connections").exists()
    finally:
        service.kill()
        service.wait(10)
        if listeners:
            listeners.kill()
            listeners.wait(10)
        subprocess.run(["rm", "-rf", "--one-file-system", str(planted)], timeout=30)


def test_a_socket_another_process_listens_on_is_not_taken_for_the_probe(tmp_path):
    run = tmp_path / "run"
    (run / "gpuscope").mkdir(parents=True, mode=0o700)
    os.chmod(run, 0o700)
    target = start_root_python(IDLE, {"XDG_RUNTIME_DIR": str(run)})
    impostor = socket.socket(socket.AF_UNIX)
    try:
        assert first_line(target) == "ready"
        path = str(run / "gpuscope" / f"probe-{target.pid}.sock")
        impostor.bind(path)  # this process, not the target, listens there
        impostor.listen(8)
        impostor.settimeout(0.2)
        assert probe_client.probe_path(target.pid) is None
        with pytest.raises(probe_client.ProbeError, match=f"not served by process {target.pid}: not its probe"):
            probe_client.ProbeClient(path, pid=target.pid)
        received = []
        while True:
            try:
                conn, _ = impostor.accept()
            except TimeoutError:
                break
            conn.settimeout(1)
            received.append(conn.recv(1000))
            conn.close()
        assert received and set(received) == {b""}  # connected to check who listens; nothing said
    finally:
        impostor.close()
        target.kill()
        target.wait(10)


CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
try:
    s.sendall(b'{"op": "hello"}\\n')  # the connection is over: no request gets through
    answered = s.recv(65536)
except OSError:
    answered = b""
sys.stdout.write(data.decode() + answered.decode())
"""


def test_the_probe_answers_another_user_with_one_refusal_even_where_modes_let_it_connect(other_user):
    folder = Path(tempfile.mkdtemp(prefix="gpuscope-test-probe-"))
    try:
        path = probe.start(path=str(folder / "probe.sock"))
        assert path, probe.last_error()
        os.chmod(folder, 0o755)  # loosened by someone: the socket's mode no longer keeps others out
        os.chmod(path, 0o666)
        other = other_user.popen([SYSTEM_PYTHON, "-c", CLIENT, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        out, err = other.communicate(timeout=20)
        assert other.returncode == 0, err
        lines = out.splitlines()
        assert len(lines) == 1 and json.loads(lines[0]) == {
            "ok": False, "error": "not permitted: this probe answers only its process's user and root"}
        with probe_client.ProbeClient(path, pid=os.getpid()) as client:  # root still may
            assert client.hello()["pid"] == os.getpid()
    finally:
        probe.stop()
        subprocess.run(["rm", "-rf", str(folder)], timeout=30)
