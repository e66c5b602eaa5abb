"""Another user's process never gets gpuscope's (root's) rights, and its folders are never followed.

The other user starts a hostile Python: its argv[0] (`exec -a`) names a script of its own, and a
`sitecustomize.py` on its PYTHONPATH. Both record the effective uid of whoever runs them. After
gpuscope's attach check, its injection check and a whole `gpuscope diagnose` against that process,
no record says 0: what ran of the target's, ran as the target's owner.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from gpuscope.core.diagnosis import _memray_attach
from gpuscope.core.diagnosis import ladder as allocations

from gpuscope.core.target import inject

from gpuscope.core.target import privilege
from gpuscope.core.target import interpreter as introspection

from helpers import gpuscope_cmd
from conftest import SYSTEM_PYTHON

# Waits in short sleeps, as a service waiting for requests does: a script queued for its main
# thread (sys.remote_exec, lldb's pending call) runs between two of them.
IDLE = "import time\nprint('ready', flush=True)\nfor _ in range(12000):\n    time.sleep(0.05)\n"


def start_hostile(other_user, argv0: str):
    """The other user's Python: argv[0] a script of its own, or a sitecustomize on its PYTHONPATH, or
    a copy of the interpreter in a virtual environment of its own with a .pth file."""
    home = other_user.home
    evil = home / "evil"
    evil.write_text(f"#!/bin/sh\nid -u >> {home}/argv0-ran\nexit 1\n")
    evil.chmod(0o755)
    site = home / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import os\nwith open({str(home / 'sitecustomize-ran')!r}, 'a') as f:\n    f.write('%d\\n' % os.geteuid())\n"
    )
    # A copy of the interpreter beside a pyvenv.cfg of its own: /proc/PID/exe is that user's file,
    # and whoever runs it runs the .pth files of its site-packages.
    venv = home / "venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy(os.path.realpath(SYSTEM_PYTHON), venv / "bin" / "python3")
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    packages = venv / "lib" / f"python{version}" / "site-packages"
    packages.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(os.path.realpath(SYSTEM_PYTHON))}\n")
    (packages / "evil.pth").write_text(
        f"import os; open({str(home / 'pth-ran')!r}, 'a').write('%d\\n' % os.geteuid())\n"
    )
    for path in (evil, site, site / "sitecustomize.py", *venv.rglob("*"), venv):
        other_user.own(path)
    args = {"evil argv[0]": str(evil), "sitecustomize": SYSTEM_PYTHON, "venv copy": str(venv / "bin" / "python3")}[argv0]
    executable = args if argv0 == "venv copy" else SYSTEM_PYTHON
    proc = other_user.popen([args, "-c", IDLE], executable=executable, stdout=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(site)})
    assert privilege.read_until(proc.stdout, time.monotonic() + 20, line=True).strip() == "ready"
    return proc


def runs_recorded(other_user) -> dict[str, list[int]]:
    """Who ran the hostile files: {file: [effective uid of each run]}."""
    out = {}
    for name in ("argv0-ran", "sitecustomize-ran", "pth-ran"):
        path = other_user.home / name
        if path.exists():
            out[name] = [int(line) for line in path.read_text().split()]
    return out


def assert_never_as_root(other_user, before: dict[str, list[int]]):
    after = runs_recorded(other_user)
    ran = {name: uids[len(before.get(name, [])):] for name, uids in after.items()}
    assert all(uid == other_user.uid for uids in ran.values() for uid in uids), f"ran as root: {ran}"
    return ran


@pytest.mark.parametrize("argv0", ["evil argv[0]", "sitecustomize", "venv copy"])
def test_the_attach_check_runs_the_targets_interpreter_only_as_its_owner(other_user, argv0):
    target = start_hostile(other_user, argv0)
    before = runs_recorded(other_user)
    with pytest.raises(allocations.AttachRefused, match="memray is not importable"):
        allocations.check_attach(target.pid)
    ran = assert_never_as_root(other_user, before)
    assert sum(map(len, ran.values())) >= 1  # the check did run it: as the other user
    assert target.poll() is None


@pytest.mark.parametrize("argv0", ["evil argv[0]", "sitecustomize", "venv copy"])
def test_the_injection_check_runs_the_targets_interpreter_only_as_its_owner(other_user, argv0):
    target = start_hostile(other_user, argv0)
    before = runs_recorded(other_user)
    interpreter = introspection.target_interpreter(target.pid)
    assert interpreter.owner.uid == other_user.uid and interpreter.path.startswith(("/usr/", str(other_user.home)))
    introspection._SAFE_INJECTION.clear()
    debugger, _ = introspection.injection_debugger(interpreter)  # the canary: a throwaway process of that interpreter
    if debugger is not None:
        # A debugger calls into processes here: the injection runs to its end, and the probe starts inside.
        injected = inject.inject_probe(target.pid, anyway=True, timeout=20)
        assert injected.method == debugger and os.stat(injected.path).st_uid == other_user.uid
    else:
        # Every debugger harms processes here: refused for that reason, after every check of the target ran.
        with pytest.raises(inject.InjectRefused, match="injection is unsafe on this machine"):
            inject.inject_probe(target.pid, anyway=True, timeout=20)
    assert_never_as_root(other_user, before)
    assert target.poll() is None and psutil.Process(target.pid).status() != psutil.STATUS_STOPPED


@pytest.mark.parametrize("argv0", ["evil argv[0]", "sitecustomize", "venv copy"])
def test_a_whole_diagnosis_of_the_hostile_process_runs_nothing_of_it_as_root(other_user, argv0):
    target = start_hostile(other_user, argv0)
    before = runs_recorded(other_user)
    # 12 s: 70 % of it is the ladder's, and bringing the probe in through a debugger takes 4-5 s of
    # that on a busy machine; a capture needs time left after it (else it is skipped, and said).
    out = subprocess.run(gpuscope_cmd() + ["diagnose", "--pid", str(target.pid), "--duration", "12", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rungs = {r["method"]: r for r in json.loads(out.stdout)["steps"][6]["evidence"]["rungs"]}
    if rungs.get("probe", {}).get("status") == "used":
        # The probe was brought in (the throwaway check ran the owner's interpreter as its owner):
        # gpuscope's memray ran inside, lent to the process.
        assert rungs["memray"]["detail"].startswith("in process through gpuscope's probe"), rungs
    else:
        assert rungs["memray"]["detail"].startswith("memray is not importable"), rungs  # the check ran it: as its owner
    assert_never_as_root(other_user, before)
    assert target.poll() is None


def test_a_gpuscope_that_is_not_root_refuses_to_run_another_users_interpreter(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    with pytest.raises(privilege.NotPermitted, match="belongs to uid 0 and gpuscope runs as uid 4242: .*as root"):
        privilege.require_can_act_as(privilege.Owner(0, 0), 1)


def test_commands_run_for_the_target_have_its_ids_no_terminal_and_a_clean_environment(other_user):
    owner = privilege.Owner(other_user.uid, other_user.gid)
    code = ("import json, os; print(json.dumps([os.geteuid(), os.getegid(), os.getgroups(), os.getcwd(), "
            "os.getsid(0) == os.getpid(), sorted(os.environ)]))")
    out = privilege.run_as(owner, [SYSTEM_PYTHON, "-c", code], env={"PATH": privilege.SAFE_PATH}, timeout=20)
    assert out is not None and out.returncode == 0, out
    assert json.loads(out.stdout) == [other_user.uid, other_user.gid, [], "/", True, ["LC_CTYPE", "PATH"]] or \
        json.loads(out.stdout) == [other_user.uid, other_user.gid, [], "/", True, ["PATH"]]


def test_output_and_time_of_a_command_for_the_target_are_bounded(other_user):
    owner = privilege.Owner(other_user.uid, other_user.gid)
    chatty = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    started = time.monotonic()
    assert privilege.run_as(owner, [SYSTEM_PYTHON, "-c", chatty], env={}, timeout=1.5, limit=1000) is None
    out = privilege.run_as(owner, [SYSTEM_PYTHON, "-c", "print('y' * 1_000_000)"], env={}, timeout=20, limit=1000)
    assert out is not None and len(out.stdout) == 1000
    assert time.monotonic() - started < 15


# -- folders shared with the target ------------------------------------------------------------------


def as_other(other_user, code: str) -> subprocess.CompletedProcess:
    proc = other_user.popen([SYSTEM_PYTHON, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=20)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_capture_folder_belongs_to_the_target_inside_a_private_one(other_user):
    with privilege.SharedFolder("memray", privilege.Owner(other_user.uid, other_user.gid)) as folder:
        folder.hand_over()
        outer, inner = os.lstat(folder.private), os.lstat(folder.shared)
        assert (outer.st_uid, stat.S_IMODE(outer.st_mode)) == (0, 0o711)
        assert (inner.st_uid, inner.st_gid, stat.S_IMODE(inner.st_mode)) == (other_user.uid, other_user.gid, 0o700)
        assert as_other(other_user, f"import os; os.listdir({folder.private!r})").returncode != 0
        written = as_other(other_user, f"open({folder.shared + '/capture.bin'!r}, 'w').write('x')")
        assert written.returncode == 0, written.stderr  # the target writes its capture there
    assert not os.path.exists(folder.private)


def test_nobody_else_can_plant_anything_in_a_folder_shared_with_another_process(other_user):
    with privilege.SharedFolder("memray", privilege.Owner(0, 0)) as folder:
        folder.hand_over()
        for where in (folder.private, folder.shared):
            planted = as_other(other_user, f"import os; os.symlink('/etc/shadow', {where + '/capture.bin'!r})")
            assert planted.returncode != 0 and "Permission denied" in planted.stderr
            assert not os.path.lexists(os.path.join(where, "capture.bin"))


@pytest.mark.parametrize("plant, why", [("symlink", "a symbolic link: not followed"), ("fifo", "not a regular file"),
                                        ("root's file", "owned by uid 0, not by the process's owner")])
def test_a_capture_planted_by_the_target_is_not_followed_or_read(other_user, tmp_path, plant, why):
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    with privilege.SharedFolder("memray", privilege.Owner(other_user.uid, other_user.gid)) as folder:
        folder.hand_over()
        capture = os.path.join(folder.shared, "capture.bin")
        if plant == "symlink":
            made = as_other(other_user, f"import os; os.symlink({str(secret)!r}, {capture!r})")
        elif plant == "fifo":
            made = as_other(other_user, f"import os; os.mkfifo({capture!r})")
        else:
            made = subprocess.CompletedProcess([], 0)
            Path(capture).write_text("forged")  # a file the target does not own (as if linked to)
        assert made.returncode == 0, made.stderr
        started = time.monotonic()
        with pytest.raises(allocations.AttachRefused, match=f"capture.bin in the folder shared with the process is {why}"):
            _memray_attach._read_capture(folder, ())
        assert time.monotonic() - started < 5  # a FIFO is not waited on
    assert secret.read_text() == "root only"


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    return gone.pid


def test_folders_left_by_a_killed_gpuscope_are_swept_without_following_links(other_user, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    stale = tmp / f"gpuscope-memray-{dead_pid()}-abc123"
    (stale / "shared").mkdir(parents=True)
    (stale / "shared" / "capture.bin").write_text("stacks")
    os.symlink(victim, stale / "shared" / "link")
    other_user.own(stale / "shared")
    live = tmp / f"gpuscope-memray-{os.getppid()}-live"  # a gpuscope that still runs
    live.mkdir()
    planted = tmp / f"gpuscope-inject-{dead_pid()}-planted"  # not ours
    planted.mkdir()
    other_user.own(planted)
    linked = tmp / f"gpuscope-inject-{dead_pid()}-link"
    os.symlink(victim, linked)
    assert privilege.sweep_stale_folders(str(tmp)) == [str(stale)]
    assert sorted(p.name for p in tmp.iterdir()) == sorted([live.name, planted.name, linked.name])
    assert (victim / "keep").read_text() == "precious"


# -- processes that are not plainly their user's, or not Python ----------------------------------------

SECRET_GROUP = "gpuscope-secret"


def secret_group() -> int:
    """A group of its own (like `shadow`): a file only it may read stands for /etc/shadow."""
    try:
        return grp.getgrnam(SECRET_GROUP).gr_gid
    except KeyError:
        pass
    out = subprocess.run([shutil.which("groupadd") or "/usr/sbin/groupadd", SECRET_GROUP], capture_output=True,
                         text=True)
    if out.returncode not in (0, 9):  # 9: made meanwhile by a concurrent run
        raise RuntimeError(f"groupadd failed: {out.stderr.strip()}")
    return grp.getgrnam(SECRET_GROUP).gr_gid


@pytest.fixture
def root_folder():
    """A folder of root's the other user may pass through (pytest's own tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="gpuscope-root-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_setgid_python(other_user, tmp_path):
    """The other user runs a setgid program (a copy of Python, group `SECRET_GROUP`, as an
    administrator would install one) with argv[0] a script of its own named like a Python, which
    copies the group's secret file wherever it runs with that group."""
    gid = secret_group()
    vault = tmp_path / "vault"
    vault.mkdir()
    vault.chmod(0o755)
    secret = vault / "shadow"
    secret.write_text("root:$6$secret-hash\n")
    os.chown(secret, 0, gid)
    secret.chmod(0o640)
    programs = tmp_path / "programs"
    programs.mkdir()
    programs.chmod(0o755)
    setgid_python = programs / "python3"
    shutil.copy(os.path.realpath(SYSTEM_PYTHON), setgid_python)
    os.chown(setgid_python, 0, gid)
    setgid_python.chmod(0o2755)
    scripts = other_user.home / "bin"
    scripts.mkdir()
    other_user.own(scripts)
    argv0 = scripts / "python3"
    leaked = other_user.home / "leaked"
    argv0.write_text(f"#!/bin/sh\ncat {secret} >> {leaked} 2>/dev/null\nid -g >> {other_user.home}/argv0-ran\nexit 1\n")
    argv0.chmod(0o755)
    other_user.own(argv0)
    proc = other_user.popen([str(argv0), "-c", IDLE], executable=str(setgid_python), stdout=subprocess.PIPE, text=True)
    assert privilege.read_until(proc.stdout, time.monotonic() + 20, line=True).strip() == "ready"
    ids = {line.split(":")[0]: line.split()[1:] for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
           if line.startswith(("Uid:", "Gid:"))}
    assert ids["Gid"][:3] == [str(other_user.gid), str(gid), str(gid)]  # a real setgid process
    return proc, leaked


def test_a_setgid_programs_group_is_never_lent_to_its_users_files(other_user, root_folder):
    target, leaked = start_setgid_python(other_user, root_folder)
    with pytest.raises(privilege.NotPermitted, match="lent rights .*setuid or setgid"):
        privilege.owner_of(target.pid)
    with pytest.raises(allocations.AttachRefused, match="lent rights"):
        allocations.check_attach(target.pid)
    with pytest.raises(inject.InjectRefused, match="lent rights"):
        inject.inject_probe(target.pid, anyway=True, timeout=5)
    exe = os.readlink(f"/proc/{target.pid}/exe")
    assert introspection.interpreter_version(exe, target.pid) is None
    # 12 s: 70 % of it is the ladder's, and bringing the probe in through a debugger takes 4-5 s of
    # that on a busy machine; a capture needs time left after it (else it is skipped, and said).
    out = subprocess.run(gpuscope_cmd() + ["diagnose", "--pid", str(target.pid), "--duration", "12", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rungs = {r["method"]: r for r in json.loads(out.stdout)["steps"][6]["evidence"]["rungs"]}
    assert "lent rights" in rungs["memray"]["detail"]
    assert not leaked.exists() and not (other_user.home / "argv0-ran").exists()
    assert target.poll() is None


def test_a_file_run_for_the_owner_gains_nothing_from_its_setgid_bit(other_user, root_folder):
    tmp_path = root_folder
    gid = secret_group()
    setgid_python = tmp_path / "python3"
    shutil.copy(os.path.realpath(SYSTEM_PYTHON), setgid_python)
    os.chown(setgid_python, 0, gid)
    setgid_python.chmod(0o2755)
    owner = privilege.Owner(other_user.uid, other_user.gid)
    out = privilege.run_as(owner, [str(setgid_python), "-c", "import os; print(os.getegid())"], env={}, timeout=20)
    assert out is not None and out.returncode == 0, out
    assert int(out.stdout) == other_user.gid


def test_a_process_that_is_not_python_has_none_of_its_files_run(other_user):
    evil = other_user.home / "python3"
    evil.write_text(f"#!/bin/sh\nid -u >> {other_user.home}/argv0-ran\nexit 1\n")
    evil.chmod(0o755)
    other_user.own(evil)
    target = other_user.popen([str(evil), "600"], executable="/bin/sleep")
    deadline = time.monotonic() + 20
    while os.readlink(f"/proc/{target.pid}/exe") != os.path.realpath("/bin/sleep"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(allocations.AttachRefused, match="is not a Python interpreter"):
        allocations.check_attach(target.pid)
    with pytest.raises(inject.InjectRefused, match="not a Python"):
        inject.inject_probe(target.pid, anyway=True, timeout=5)
    assert not (other_user.home / "argv0-ran").exists()
    assert target.poll() is None
