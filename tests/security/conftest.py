"""Fixtures for the security tests: a second, unprivileged user and processes run as that user.

gpuscope is run with sudo on nodes shared by many users, so these tests play the other user: a
real account (made with `useradd` when missing; the tests run as root in CI), a folder it owns, and
its own processes, started with its uid and gid and no supplementary groups.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

OTHER_USER = "gpuscope-other"
# The other user's interpreter must be one it may execute: a system Python, not one under /root.
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)


@dataclass
class OtherUser:
    name: str
    uid: int
    gid: int
    home: Path  # a folder of its own, 0755, removed after the test
    children: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, args, **kwargs) -> subprocess.Popen:
        """Start `args` as this user, in its folder, with a minimal environment unless one is given."""
        kwargs.setdefault("cwd", str(self.home))
        kwargs.setdefault("env", {"PATH": "/usr/bin:/bin", "HOME": str(self.home)})
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(args, user=self.uid, group=self.gid, extra_groups=[], **kwargs)
        self.children.append(proc)
        return proc

    def own(self, path: Path) -> Path:
        os.chown(path, self.uid, self.gid)
        return path


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    out = subprocess.run([useradd, "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                         capture_output=True, text=True)
    if out.returncode not in (0, 9):  # 9: made meanwhile by a concurrent run
        raise RuntimeError(f"useradd failed: {out.stderr.strip()}")
    return pwd.getpwnam(OTHER_USER)


@pytest.fixture
def other_user():
    if os.geteuid() != 0:
        if os.environ.get("GPUSCOPE_REQUIRE_TOOLS"):
            pytest.fail("the security tests need root (to make a second user and act as root among users)")
        pytest.skip("needs root: makes a second user")
    if SYSTEM_PYTHON is None:
        pytest.skip("no system Python the second user may run")
    entry = _ensure_user()
    home = Path(tempfile.mkdtemp(prefix="gpuscope-other-"))
    os.chmod(home, 0o755)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    user = OtherUser(OTHER_USER, entry.pw_uid, entry.pw_gid, home)
    yield user
    for proc in user.children:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    shutil.rmtree(home, ignore_errors=True)
