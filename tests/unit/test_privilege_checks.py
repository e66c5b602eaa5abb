"""Whose rights a process has (`owner_of`, read from real processes) and whether gpuscope may act as them."""

import io
import os
import subprocess
import sys

import pytest

from gpuscope.core.target import privilege
from gpuscope.core.target.privilege import NotPermitted, Owner, owner_of, require_can_act_as

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")


def started(preexec=None, **kwargs):
    """A child waiting on its input, with its ids applied (Popen returns once it has exec'd)."""
    return subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, preexec_fn=preexec, **kwargs)


def ended(child):
    child.stdin.close()
    child.wait(timeout=30)


def test_my_own_process_is_mine():
    me = owner_of(os.getpid())
    assert me == Owner(os.getuid(), os.getgid(), tuple(os.getgroups()))
    assert me.is_me()
    assert not Owner(os.geteuid() + 1, 0).is_me()


@root_only
def test_another_users_process_is_theirs_with_their_groups():
    child = started(user=NOBODY, group=NOBODY, extra_groups=[NOBODY, 100])
    try:
        owner = owner_of(child.pid)
    finally:
        ended(child)
    assert owner == Owner(NOBODY, NOBODY, (100, NOBODY))
    assert not owner.is_me()


@root_only
@pytest.mark.parametrize("kind", ["uid", "gid"])
def test_a_process_with_lent_rights_is_refused(kind):
    def lend():
        if kind == "uid":
            os.setresuid(NOBODY, 0, 0)  # the real uid nobody's, the effective one root's: a setuid program
        else:
            os.setresgid(NOBODY, 0, 0)

    child = started(lend)
    try:
        with pytest.raises(NotPermitted, match=f"real {kind} {NOBODY}, effective 0"):
            owner_of(child.pid)
    finally:
        ended(child)


def test_a_process_that_is_gone_cannot_be_read():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(OSError):
        owner_of(child.pid)


@pytest.mark.parametrize("status", [
    "Uid:\t1\t1\t1\nGid:\t1\t1\t1\t1\n",  # three ids
    "Uid:\t1\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\n",  # five
    "Gid:\t1\t1\t1\t1\n",  # no Uid line
    "Uid:\t1\t1\t1\t1\n",  # no Gid line
    "Uid:\t1\tx\t1\t1\nGid:\t1\t1\t1\t1\n",  # not numbers
])
def test_a_status_that_does_not_read_as_a_process_is_a_lookup_error(monkeypatch, status):
    monkeypatch.setattr(privilege, "open", lambda *a, **k: io.StringIO(status), raising=False)
    with pytest.raises(ProcessLookupError):
        owner_of(1)


def test_a_status_is_read_for_its_ids_and_groups_only(monkeypatch):
    status = "Name:\tx\nUid:\t7\t7\t7\t7\nGid:\t8\t8\t8\t8\nGroups:\t8 9\nNgid:\t0\n"
    monkeypatch.setattr(privilege, "open", lambda *a, **k: io.StringIO(status), raising=False)
    assert owner_of(1) == Owner(7, 8, (8, 9))


def test_gpuscope_acts_as_itself_or_as_anyone_when_root_and_otherwise_refuses(monkeypatch):
    me = os.geteuid()
    require_can_act_as(Owner(me, 0), 1)
    monkeypatch.setattr(privilege.os, "geteuid", lambda: 0)
    require_can_act_as(Owner(NOBODY, NOBODY), 1)
    monkeypatch.setattr(privilege.os, "geteuid", lambda: 1000)
    require_can_act_as(Owner(1000, 1000), 1)
    with pytest.raises(NotPermitted, match="belongs to uid 65534 and gpuscope runs as uid 1000"):
        require_can_act_as(Owner(NOBODY, NOBODY), 42)


def test_a_status_is_read_only_to_its_first_64_kib(monkeypatch):
    status = "Name:\t" + "x" * (64 * 1024) + "\nUid:\t7\t7\t7\t7\nGid:\t8\t8\t8\t8\n"
    monkeypatch.setattr(privilege, "open", lambda *a, **k: io.StringIO(status), raising=False)
    with pytest.raises(ProcessLookupError):
        owner_of(1)
