"""Reading a memray capture another user's process wrote, in a child process of its own.

The capture is that user's file: a crafted one can crash memray's reader (a segmentation fault) or
make it use any amount of memory or time. So the reader runs here, started by gpuscope with its
own trusted interpreter, which loads memray, limits its own memory, CPU time and file writes,
then takes the capture owner's uid, gid and groups for good (no new privileges after) before it
reads a byte. The capture comes as an open descriptor, already checked to be the owner's
regular file. It writes one JSON line: the largest allocation stacks still alive, bounded.

    python -I -m gpuscope.core.diagnosis._capture_child FD UID GID GROUPS MEMORY_BYTES CPU_S
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

MAX_RECORDS = 2000  # the largest stacks: the rest weigh little in the suspects
MAX_FRAMES = 32  # innermost first: the owning frame is near the allocation
MAX_TEXT = 300  # characters of a function or file name
_PR_SET_DUMPABLE = 4  # <linux/prctl.h>: /proc/self stays this process's own after the uid change
_PR_SET_NO_NEW_PRIVS = 38


def _become(uid: int, gid: int, groups: list[int]) -> None:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    if os.geteuid() == 0 and uid != 0:
        os.setgroups(groups)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl failed")


def main(argv: list[str]) -> int:
    fd, uid, gid = int(argv[0]), int(argv[1]), int(argv[2])
    groups = [int(g) for g in argv[3].split(",") if g]
    memory, cpu = int(argv[4]), int(argv[5])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # it writes no file
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    import memray  # noqa: F401, PLC0415 -- loaded with gpuscope's rights, before the capture's owner's

    from gpuscope.probe import leaked_records  # noqa: PLC0415

    _become(uid, gid, groups)
    try:
        records = leaked_records(f"/proc/self/fd/{fd}")
    except OSError:
        print(json.dumps({"complete": False}), flush=True)  # not written to its end yet
        return 0
    kept = [[[[str(fn)[:MAX_TEXT], str(file)[:MAX_TEXT], int(line)] for fn, file, line in frames[:MAX_FRAMES]],
             int(size), int(count)] for frames, size, count in records[:MAX_RECORDS]]
    print(json.dumps({"complete": True, "stacks": len(records), "records": kept}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
