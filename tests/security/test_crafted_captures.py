"""A memray capture written by another user's process is that user's file: a crafted one crashes
memray's reader (a segmentation fault; `reader-segfault.bin` is a real aggregated capture with four
bytes changed). gpuscope parses captures in a child process with the owner's rights and bounded
memory and time, so the crash is that child's, reported in one line; root's gpuscope goes on.

`aggregated.bin` is the unchanged capture (`memray run --aggregate` of a program that keeps
bytearrays from a function `f`), read the same way.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

import pytest

from conftest import SYSTEM_PYTHON
from gpuscope.core.diagnosis import _memray_attach
from gpuscope.core.diagnosis._shared import AttachRefused
from gpuscope.core.target import privilege
from helpers import SUPPORT

CAPTURES = SUPPORT / "fixtures" / "memray"


def planted(other_user, folder: privilege.SharedFolder, fixture: str) -> None:
    """The other user writes the capture into its folder, as its process would."""
    source = other_user.home / fixture
    shutil.copy(CAPTURES / fixture, source)
    other_user.own(source)
    proc = other_user.popen([SYSTEM_PYTHON, "-c", "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])",
                             str(source), f"{folder.shared}/capture.bin"], stderr=subprocess.PIPE, text=True)
    assert proc.wait(timeout=20) == 0, proc.stderr.read()


def test_a_capture_that_crashes_memrays_reader_is_one_refusal_and_gpuscope_goes_on(other_user):
    with privilege.SharedFolder("memray", privilege.Owner(other_user.uid, other_user.gid)) as folder:
        folder.hand_over()
        planted(other_user, folder, "reader-segfault.bin")
        with pytest.raises(AttachRefused, match=r"memray's reader failed on the capture \(.*\): the capture is "
                                                r"damaged or crafted"):
            _memray_attach._read_capture_counted(folder, ())
        # gpuscope (this process) is still here, and reads the next capture.
        planted(other_user, folder, "aggregated.bin")
        suspects, stacks = _memray_attach._read_capture_counted(folder, ())
    assert stacks >= 1 and any(s.function == "f" for s in suspects)


def test_a_capture_is_read_with_its_owners_rights(other_user):
    """The reader runs as the capture's owner: a capture its owner may not read (mode 000) is not
    read with root's rights, which may read anything; it stays "not written yet"."""
    with privilege.SharedFolder("memray", privilege.Owner(other_user.uid, other_user.gid)) as folder:
        folder.hand_over()
        planted(other_user, folder, "aggregated.bin")
        capture = f"{folder.shared}/capture.bin"
        subprocess.run(["chmod", "000", capture], check=True, timeout=10)  # as if the owner locked it away
        assert _memray_attach._read_capture_counted(folder, ()) is None
        subprocess.run(["chmod", "600", capture], check=True, timeout=10)
        assert _memray_attach._read_capture_counted(folder, ()) is not None


def test_a_reader_answer_nested_deep_is_one_refusal_in_any_thread():
    """The reader runs as the capture's owner, who may make it say anything: an answer nested
    200,000 deep raised RecursionError in the diagnosis's thread (its code-path search ended)."""
    nested = '{"complete":true,"stacks":1,"records":' + "[" * 200_000 + "]" * 200_000 + "}"
    raised: list[BaseException] = []

    def read() -> None:
        try:
            _memray_attach._records_read(nested, ())
        except BaseException as exc:  # noqa: BLE001 -- whatever it raises is what the test looks at
            raised.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(30)
    assert len(raised) == 1 and isinstance(raised[0], AttachRefused), raised
    assert "no usable answer" in str(raised[0])
