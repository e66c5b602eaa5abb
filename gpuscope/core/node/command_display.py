"""How a command line reads in a narrow column: what runs first, the interpreter after.

`/srv/envs/rag/.venv/bin/python -m gpuscope.demo.service --port 8000` cut to a column shows the
interpreter's path and nothing of what it runs. `display_command` puts the script or module
first (`-m gpuscope.demo.service --port 8000 · /srv/envs/rag/.venv/bin/python`) and always
returns one line, whatever characters the command line holds.

It is given a command already redacted (`redact.redact_command`), and only moves words around:
a secret masked there stays masked here.
"""

from __future__ import annotations

import shlex

from gpuscope.core.target.interpreter import is_python
from gpuscope.core.common.printable import printable

SEPARATOR = " · "
# Interpreter options that take the next word as their value (python -W ignore, -X dev).
_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


def display_command(command: str) -> str:
    """`command` for one line of a table: a Python program's script (by its file name) or module
    first with its arguments, then the interpreter; any other command as it is. Control
    characters, newlines included, become visible ones (`printable`)."""
    shown = printable(command)
    try:
        words = shlex.split(shown)
    except ValueError:
        return shown  # unbalanced quotes: not a command line we can take apart
    if not words:
        return shown
    interpreter = words[0]
    if not is_python(interpreter.rsplit("/", 1)[-1], None):
        return shown
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
        return shown  # the interpreter alone (a REPL): nothing to put first
    return " ".join(_quote(w) for w in lead + rest) + SEPARATOR + _quote(interpreter)


def _quote(word: str) -> str:
    return shlex.quote(word) if word == "" or any(c.isspace() for c in word) else word


def short_command(command: str, chars: int) -> str:
    """`display_command(command)` in at most `chars` characters, cut with an ellipsis: a name that
    says what the process runs, for a line that has room for little else."""
    shown = display_command(command)
    return shown if len(shown) <= chars else shown[: chars - 1] + "…"
