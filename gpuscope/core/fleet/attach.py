"""The command that opens gpuscope on a process of another node: `ssh -t {node} gpuscope --pid {pid}`
by default, `kubectl exec -it {pod} -- gpuscope --pid {pid}` or anything else in the settings'
`[fleet] attach`.

The template is split with shlex first, then each placeholder is substituted within its own word,
so a value never becomes more words; values are label values from Prometheus (other people's
text), so one that could become an option or anything but a name (a leading '-', a space, a
quote, a ';') is refused; and the command runs without a shell. Light to import: the settings
file's reader checks templates with it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Protocol

from gpuscope.core.common.printable import printable_line
from gpuscope.core.settings import FleetConfig
from gpuscope.errors import GpuscopeError


class Attachable(Protocol):
    """What a command is built from (a gpuscope.core.fleet.collector.FleetProcess)."""

    @property
    def node(self) -> str: ...

    @property
    def pod(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def pid(self) -> int: ...


DEFAULT_ATTACH = FleetConfig().attach
PLACEHOLDERS = ("node", "pod", "namespace", "pid")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# A host name, a Kubernetes node, pod or namespace name: letters, digits, '.', '_' and '-', never
# first a '-' (an option to ssh or kubectl), nothing a program could read as syntax.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
PID_LIMIT = 2**31


class AttachRefused(GpuscopeError):
    """The attach command cannot be built for this process: one line saying why."""


def check_attach_template(template: str) -> list[str]:
    """The template's words; ValueError (one line) if it is unusable: empty, not shell-like
    quoting, a placeholder gpuscope does not know, or one in the program's own name."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"cannot split it into words: {exc}") from None
    if not words:
        raise ValueError("expected a command, e.g. \"ssh -t {node} gpuscope --pid {pid}\"")
    for word in words:
        for name in _PLACEHOLDER.findall(word):
            if name not in PLACEHOLDERS:
                raise ValueError(f"unknown placeholder {{{name}}} (known: "
                                 + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS) + ")")
    if _PLACEHOLDER.search(words[0]):
        raise ValueError("the program (the first word) must not come from a placeholder")
    return words


def attach_values(process: Attachable) -> dict[str, str]:
    """The placeholders' values for `process`, each checked; AttachRefused names the bad one."""
    values = {}
    for name in ("node", "pod", "namespace"):
        value = getattr(process, name)
        if value and _NAME.fullmatch(value) is None:
            raise AttachRefused(f"refused: {name} {printable_line(value, 60)!r} is not a plain name "
                                "(letters, digits, '.', '_', '-', not starting with '-')")
        values[name] = value
    if not 0 < process.pid < PID_LIMIT:
        raise AttachRefused(f"refused: PID {process.pid} is not a process number")
    values["pid"] = str(process.pid)
    return values


def attach_argv(template: str, process: Attachable) -> list[str]:
    """The command that opens gpuscope on `process`'s node: the template's words, each placeholder
    replaced within its own word (a value never splits into more words, never goes through a
    shell). Raises AttachRefused (one line) for a bad template or an unsafe or missing value."""
    try:
        words = check_attach_template(template)
    except ValueError as exc:
        raise AttachRefused(f"the attach command {template!r}: {exc}") from None
    values = attach_values(process)

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if not values[name]:
            raise AttachRefused(f"refused: the process on {process.node or '?'} has no {name} label in Prometheus "
                                f"(the attach command needs {{{name}}})")
        return values[name]

    return [_PLACEHOLDER.sub(value, word) for word in words]


def run_attach(argv: Sequence[str]) -> int:
    """Run the attach command in this terminal (no shell) and wait for it; its exit status, or
    127 with a line on standard error when the program cannot be started."""
    try:
        return subprocess.call(list(argv))
    except OSError as exc:
        print(f"gpuscope: cannot run {printable_line(argv[0], 80)}: {exc.strerror or exc}", file=sys.stderr)
        return 127
