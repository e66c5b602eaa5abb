"""The README's keys table is the console's: every key it lists is bound to the action it names,
and every key the console binds is in it."""

import re
from pathlib import Path

from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.help import HELP
from gpuscope.tui.processes import ProcessTable

README = Path(__file__).resolve().parents[2] / "README.md"
NAMES = {
    "↓": "down", "↑": "up", "PgDn": "pagedown", "PgUp": "pageup", "Home": "home", "End": "end", "Enter": "enter",
    "Esc": "escape", "?": "question_mark", "/": "slash", "space": "space", "[": "left_square_bracket",
    "]": "right_square_bracket", "{": "left_curly_bracket", "}": "right_curly_bracket", "<": "less_than_sign",
    ">": "greater_than_sign",
}


def key_name(shown: str) -> str:
    if re.fullmatch(r"F\d+", shown):
        return shown.lower()
    if shown.startswith("Ctrl+"):
        return "ctrl+" + shown[5:].lower()
    return NAMES.get(shown, shown)


def documented() -> dict[str, set[str]]:
    """Key -> the action names its row of the README's keys table gives."""
    text = README.read_text()
    section = text[text.index("### Keys"):]
    section = section[:section.index("\n\n", section.index("| Keys |"))]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) > 10, "the keys table is missing"
    out: dict[str, set[str]] = {}
    for row in rows:
        keys, actions = row.split(" | ")[:2]
        names = {a.strip().lower() for a in re.split(r",| / ", actions)}
        for shown in re.findall(r"`([^`]+)`", keys):
            out[key_name(shown)] = names
    return out


def bound() -> dict[str, str]:
    """Key -> the description of what it does, in the console's main screen."""
    out: dict[str, str] = {}
    for binding in [*ProcessTable.BINDINGS, *GpuScopeApp.BINDINGS]:
        for key in binding.key.split(","):
            out[key.strip()] = binding.description.lower()
    return out


def test_every_documented_key_does_what_the_readme_says():
    keys = bound()
    for key, names in documented().items():
        assert key in keys, f"the README lists {key!r}, which the console does not bind"
        assert keys[key] in names, f"{key!r}: the README says {sorted(names)}, the console binds {keys[key]!r}"


def test_every_bound_key_is_documented():
    missing = set(bound()) - set(documented())
    assert not missing, f"keys bound but not in the README's table: {sorted(missing)}"


def test_the_help_and_the_readme_state_the_same_rule():
    rule = "w is for what you look at: the attached process, else a row you moved to, else the alert bar's"
    assert rule in " ".join(HELP.split())
    readme = " ".join(README.read_text().split())
    assert ("`w` diagnoses what you are looking at: the attached process, else a row you moved to, else the "
            "alert shown in the alert bar; every other key that names a process means the selected row.") in readme
