"""How a command line reads in a narrow column: what runs first, where it runs, the interpreter last.

`/srv/envs/rag/.venv/bin/python -m gpuscope.demo.service --port 8000` cut to a column shows the
interpreter's path and nothing of what it runs. `display_command` puts the script or module
first, then the systemd unit or container the process runs in (`gpuscope.core.node.cgroup`), the
interpreter last (`-m gpuscope.demo.service --port 8000 · rag.service · /srv/envs/rag/.venv/bin/python`),
and always returns one line, whatever characters the command line holds.

It is given a command already redacted (`redact.redact_command`), and only moves words around:
a secret masked there stays masked here.
"""

from __future__ import annotations

import shlex

from gpuscope.core.target.interpreter import is_python
from gpuscope.core.common.printable import printable, shortened

SEPARATOR = " · "
# Interpreter options that take the next word as their value (python -W ignore, -X dev).
_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


def display_command(command: str, runs_in: str = "") -> str:
    """`command` for one line of a table: a Python program's script (by its file name) or module
    first with its arguments, then `runs_in` (its unit or container, if any), then the
    interpreter; any other command as it is, then `runs_in`. Control characters, newlines
    included, become visible ones (`printable`)."""
    shown = printable(command)
    where = [printable(runs_in)] if runs_in else []
    try:
        words = shlex.split(shown)
    except ValueError:
        words = []  # unbalanced quotes: not a command line we can take apart
    if not words or not is_python(words[0].rsplit("/", 1)[-1], None):
        return SEPARATOR.join([shown, *where])
    interpreter = words[0]
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-m", "-c") and i + 1 < len(words):
            lead = [word, words[i + 1]]
            rest = words[i + 2 :]
            break
        if word in _OPTIONS_WITH_VALUE:
            i += 2
            continue
        if word.startswith("-") and word != "-":
            i += 1
            continue
        lead = [word.rsplit("/", 1)[-1] or word]
        rest = words[i + 1 :]
        break
    else:
        return SEPARATOR.join([shown, *where])  # the interpreter alone (a REPL): nothing to put first
    return SEPARATOR.join([" ".join(_quote(w) for w in lead + rest), *where, _quote(interpreter)])


def _quote(word: str) -> str:
    return shlex.quote(word) if word == "" or any(c.isspace() for c in word) else word


def short_command(command: str, chars: int, runs_in: str = "") -> str:
    """`display_command(command, runs_in)` in at most `chars` characters, cut with an ellipsis: a
    name that says what the process runs, for a line that has room for little else."""
    return shortened(display_command(command, runs_in), chars)
