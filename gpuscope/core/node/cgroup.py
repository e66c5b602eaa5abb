"""Where a process runs: its systemd unit or its container, from /proc/PID/cgroup.

`Cgroup.name` is the short form every view shows (the console's rows, alerts and diagnosis, `ps`,
the exporter's `runs_in` label):

    vllm.service                      a systemd unit, system or user (`user@UID.service/app.slice/x.service`)
    docker:0123456789ab               a Docker container (the 12 hex digits `docker ps` shows)
    ctr:0123456789ab                  any other container (containerd, CRI-O, Podman, one of unknown runtime)
    pod:1b2c3d4e/ctr:0123456789ab     a container of a Kubernetes pod (the pod UID's first 8 hex digits)
    pod:1b2c3d4e                      a pod's own cgroup, no container named
    (empty)                           anywhere else: the root, a slice, a login session, a terminal's scope

The innermost container wins (Docker in Docker shows the inner one); a unit is a `.service` other
than a user's own manager (`user@UID.service`): scopes say how a process was started (a login
session, a terminal tab, `init.scope`), not what it belongs to, and are left out. cgroup v1 (a line
per hierarchy: the unit is read from the `name=systemd` one where there is one) and v2
(`0::/path`) alike.

The file is its owner's to shape (a delegated subtree can be named anything, escape sequences
included): at most READ_LIMIT bytes and MAX_LINES lines are read, a line that does not parse is
skipped, undecodable bytes and control characters become visible ones, a unit's name is cut to
NAME_CHARS with an ellipsis. It is read once per process (PID and start time): a process moved to
another cgroup later keeps the place it was first seen in.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from gpuscope.core.common.printable import shortened

READ_LIMIT = 64 * 1024  # /proc/PID/cgroup is a few lines of ~100 bytes; more is not one
MAX_LINES = 64  # cgroup v1 has about 13 hierarchies, v2 one line
MAX_DEPTH = 64  # the innermost folders of a path looked at (real ones are under 15 deep)
NAME_CHARS = 40  # the longest name (a unit cut with an ellipsis; a container's is at most 29)
ID_CHARS = 12  # a container's id as `docker ps` shows it
POD_CHARS = 8

# A container's cgroup ends in its 64-hex id, bare (/docker/<id>, /kubepods/.../pod<uid>/<id>) or
# behind its runtime's word (docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope,
# libpod-<id>.scope).
_CONTAINER = re.compile(r"(?:([a-z][a-z0-9-]*)[-:])?([0-9a-f]{64})(?:\.scope)?")
# Kubernetes names a pod's cgroup after its UID (dashes as underscores under the systemd driver):
# kubepods-burstable-pod1b2c..._....slice, or /kubepods/besteffort/pod<uid>.
_POD = re.compile(r"(?:kubepods-(?:[a-z]+-)?)?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
                  r"(?:\.slice)?")
_USER_MANAGER = re.compile(r"user@[0-9]+\.service")


@dataclass(frozen=True, slots=True)
class Cgroup:
    """What a process's cgroup says of where it runs (every field empty where it says nothing)."""

    unit: str = ""  # a systemd service (printable, at most NAME_CHARS)
    container_id: str = ""  # 64 hex digits
    runtime: str = ""  # "docker", or "" for any other
    pod_uid: str = ""  # with dashes
    # The short form shown beside the command line (the module's docstring lists them), made once:
    # every frame shows it again.
    name: str = field(init=False)

    def __post_init__(self) -> None:
        pod = f"pod:{self.pod_uid[:POD_CHARS]}" if self.pod_uid else ""
        name = pod or self.unit
        if self.container_id:
            container = f"{'docker' if self.runtime == 'docker' else 'ctr'}:{self.container_id[:ID_CHARS]}"
            name = f"{pod}/{container}" if pod else container
        object.__setattr__(self, "name", name)


def parse_cgroup(data: bytes) -> Cgroup:
    """Where the process runs, from the bytes of its /proc/PID/cgroup (any bytes: never raises)."""
    paths: list[tuple[bool, str]] = []  # (the systemd hierarchy's, path)
    for line in data[:READ_LIMIT].split(b"\n", MAX_LINES)[:MAX_LINES]:
        fields = line.split(b":", 2)
        if len(fields) != 3 or not fields[2].startswith(b"/"):
            continue  # not `hierarchy:controllers:/path`
        systemd = fields[1] in (b"", b"name=systemd")
        paths.append((systemd, fields[2].decode("utf-8", "replace")))
    paths.sort(key=lambda p: not p[0])  # stable: the systemd hierarchy's lines first, in their order
    # The unit is the systemd hierarchy's word where there is one (another v1 controller's line
    # may place the process elsewhere).
    any_systemd = bool(paths) and paths[0][0]

    container = runtime = pod = unit = ""
    for systemd, path in paths:
        parts = path.split("/")
        for depth in range(len(parts) - 1, max(0, len(parts) - 1 - MAX_DEPTH), -1):  # innermost first
            part = parts[depth]
            if not container:
                m = _CONTAINER.fullmatch(part)
                if m:
                    prefix = m.group(1) or ""
                    container = m.group(2)
                    runtime = "docker" if prefix.startswith("docker") or parts[depth - 1] == "docker" else ""
            if not pod:
                m = _POD.fullmatch(part)
                if m:
                    pod = m.group(1).replace("_", "-")
            if (not unit and (systemd or not any_systemd) and part.endswith(".service")
                    and not _USER_MANAGER.fullmatch(part)):
                unit = shortened(part, NAME_CHARS)
        if container and pod and unit:
            break
    return Cgroup(unit=unit, container_id=container, runtime=runtime, pod_uid=pod)


def read_cgroup(pid: int) -> Cgroup:
    """`pid`'s cgroup, parsed; an empty one where it cannot be read (gone, another system)."""
    try:
        fd = os.open(f"/proc/{pid}/cgroup", os.O_RDONLY)
    except OSError:
        return Cgroup()
    try:
        data = os.read(fd, READ_LIMIT)
    except OSError:
        return Cgroup()
    finally:
        os.close(fd)
    return parse_cgroup(data)

