"""Theme files: TOML in the built-in themes/ folder and in the user's config folder.

This module only reads and checks the files (no UI imports), so `--theme` can be validated
before a console starts; the TUI turns the checked values into Textual themes. The theme last
chosen in the console is remembered in the XDG state directory.

A theme file: `name`, `dark` (true/false), `ansi` (true: the colours are the terminal's own
16-colour palette, `ansi_red`, `ansi_bright_blue`, ..., so the terminal's colour scheme decides
how they look), the Textual colours (`primary` is required) and [variables] for gpuscope's own.

A theme file is read only if it is a regular file of at most MAX_THEME_BYTES; one that is not
(a FIFO, a device, a huge or deeply nested file) is reported as broken and left out, never
blocking or breaking the commands that list themes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuscope.core.common.atomic import RefusedPath, private_folder, read_regular, write_private
from gpuscope.core.common.toml_text import parse_toml
from gpuscope.folders import config_dir, state_dir
from gpuscope.errors import UsageError

DEFAULT_THEME = "gpuscope-dark"
COLOUR_KEYS = (
    "primary", "secondary", "accent", "foreground", "background", "surface", "panel", "boost", "success", "warning",
    "error",
)
# The terminal's own palette (what `ansi = true` themes use); any other colour is #RRGGBB.
ANSI_NAMES = tuple(
    f"ansi_{bright}{colour}"
    for bright in ("", "bright_")
    for colour in ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")
) + ("ansi_default",)
# App-specific colours every theme gets (a theme file may override them under [variables]).
VARIABLE_DEFAULTS = {
    "gpuscope-gpu": "#76B900",
    "gpuscope-rss": "#4FA3E0",
    "gpuscope-growth": "#E5C07B",
}
# What Textual's own CSS needs of a theme with native ANSI colours (it has no default for them).
ANSI_VARIABLE_DEFAULTS = {"ansi-background": "ansi_black", "ansi-foreground": "ansi_white"}
_HEX = re.compile(r"^#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})$")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
MAX_THEME_BYTES = 64 * 1024  # a theme is a few hundred bytes


class ThemeFileError(UsageError):
    pass


@dataclass(frozen=True)
class ThemeSpec:
    """A theme as built in or read from a theme file: its colours and variables, not yet Textual's."""

    name: str
    dark: bool
    ansi: bool
    colours: dict[str, str]
    variables: dict[str, str] = field(default_factory=dict)
    path: Path | None = None


def builtin_dir() -> Path:
    """The shipped themes: inside the installed package, or at the top of a source checkout."""
    here = Path(__file__).resolve().parent
    packaged = here / "themes"
    return packaged if packaged.is_dir() else here.parent / "themes"


def user_dir(env: Mapping[str, str] = os.environ) -> Path:
    return config_dir(env) / "themes"


def remembered_path(env: Mapping[str, str] = os.environ) -> Path:
    return state_dir(env) / "theme"


def remembered(env: Mapping[str, str] = os.environ) -> str | None:
    """The theme last chosen in the console, if any (a missing or unreadable file: none)."""
    try:
        name = read_regular(remembered_path(env), 1024).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):  # RefusedPath among them: a FIFO or a device there is no choice
        return None
    return name if _NAME.fullmatch(name) else None


def remember(name: str, env: Mapping[str, str] = os.environ) -> None:
    """Keep the console's choice for next time. Raises OSError when the state folder is not writable
    (or RefusedPath when it is not ours alone: see gpuscope.core.common.atomic.private_folder)."""
    path = remembered_path(env)
    private_folder(path.parent)
    write_private(path, name + "\n", replace=True)


def _colour(value: object, where: str) -> str:
    if not isinstance(value, str) or not (_HEX.match(value) or value in ANSI_NAMES):
        raise ThemeFileError(f"{where}: {value!r} is not a colour (use #RRGGBB, or ansi_red, ansi_bright_blue, ...)")
    return value


def load_theme_file(path: Path) -> ThemeSpec:
    try:
        text = read_regular(path, MAX_THEME_BYTES).decode("utf-8")
    except RefusedPath as exc:
        raise ThemeFileError(f"cannot use the theme file: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ThemeFileError(f"{path}: cannot read ({exc})") from None
    try:
        data = parse_toml(text)
    except ValueError as exc:
        raise ThemeFileError(f"{path}: not valid TOML ({exc})") from None
    name = data.pop("name", path.stem)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ThemeFileError(f"{path}: name must be letters, digits, '-', '_' or '.'")
    dark = data.pop("dark", True)
    ansi = data.pop("ansi", False)
    for key, flag in (("dark", dark), ("ansi", ansi)):
        if not isinstance(flag, bool):
            raise ThemeFileError(f"{path}: {key} must be true or false")
    variables = data.pop("variables", {})
    if not isinstance(variables, dict):
        raise ThemeFileError(f"{path}: [variables] must be a table")
    unknown = sorted(set(data) - set(COLOUR_KEYS))
    if unknown:
        raise ThemeFileError(f"{path}: unknown key {unknown[0]!r} (known: name, dark, ansi, {', '.join(COLOUR_KEYS)}, [variables])")
    if "primary" not in data:
        raise ThemeFileError(f"{path}: 'primary' is required")
    colours = {k: _colour(v, f"{path}: {k}") for k, v in data.items()}
    checked = {k: _colour(v, f"{path}: variables.{k}") for k, v in variables.items()}
    defaults = {**VARIABLE_DEFAULTS, **(ANSI_VARIABLE_DEFAULTS if ansi else {})}
    return ThemeSpec(name=name, dark=dark, ansi=ansi, colours=colours, variables={**defaults, **checked}, path=path)


def load_themes(env: Mapping[str, str] = os.environ) -> tuple[dict[str, ThemeSpec], list[str]]:
    """All themes (user files override built-ins of the same name) and one line per broken file."""
    themes: dict[str, ThemeSpec] = {}
    problems: list[str] = []
    for folder in (builtin_dir(), user_dir(env)):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                spec = load_theme_file(path)
            except ThemeFileError as exc:
                problems.append(str(exc))
                continue
            themes[spec.name] = spec
    return themes, problems
