"""The journal's promise on kill -9 (at most the last second lost): each sample is committed as
soon as the writer has it, never held back for company. A real journal in a child process takes
five samples and then nothing more; each is on disk before the process is killed, whatever the
machine's speed, and still there after SIGKILL, with no damage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from gpuscope.core.session.recording import open_recording
from helpers import SUPPORT, wait_until

SAMPLES = 5  # not a multiple of any batch size a writer would wait for (2, 4, ...)

WRITER = """
    import sys, time
    from dataclasses import replace
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from frames import T0, frame
    from gpuscope.core.session.journal import Journal
    journal = Journal(Path(sys.argv[1]))
    for i in range(int(sys.argv[3])):
        journal.frame(replace(frame(), time=T0 + i))
        time.sleep(0.1)
    print("sent", flush=True)
    time.sleep(600)  # nothing more comes: what is not committed by now is waiting for company
"""


def _frames(path) -> int:
    try:
        return len(open_recording(path))
    except Exception:  # not written yet, or its first transaction not yet committed
        return 0


def test_every_sample_is_committed_without_waiting_for_more_and_survives_kill_9(tmp_path):
    path = tmp_path / "session.gpuscope"
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER))
    proc = subprocess.Popen([sys.executable, str(script), str(path), str(SUPPORT), str(SAMPLES)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "sent"
        wait_until(lambda: _frames(path) == SAMPLES, timeout=30, what=f"all {SAMPLES} samples committed")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert os.path.exists(f"{path}-wal")  # killed: never closed, the WAL never folded back
    rec = open_recording(path)
    assert len(rec) == SAMPLES and rec.damage is None
