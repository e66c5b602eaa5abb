"""Theme files: TOML in the built-in themes/ folder and in the user's config folder.

This module only reads and checks the files (no UI imports), so `--theme` can be validated
before a console starts; the TUI turns the checked values into Textual themes.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_THEME = "gpuscope-dark"
COLOUR_KEYS = (
    "primary", "secondary", "accent", "foreground", "background", "surface", "panel", "success", "warning", "error",
)
# App-specific colours every theme gets (a theme file may override them under [variables]).
VARIABLE_DEFAULTS = {
    "gpuscope-gpu": "#76B900",
    "gpuscope-rss": "#4FA3E0",
    "gpuscope-growth": "#E5C07B",
}
_HEX = re.compile(r"^#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})$")
_NAMED = re.compile(r"^(?:ansi_)?[a-z_]+$")


class ThemeFileError(Exception):
    pass


@dataclass(frozen=True)
class ThemeSpec:
    name: str
    dark: bool
    colours: dict[str, str]
    variables: dict[str, str] = field(default_factory=dict)
    path: Path | None = None


def builtin_dir() -> Path:
    """The shipped themes: inside the installed package, or at the top of a source checkout."""
    here = Path(__file__).resolve().parent
    packaged = here / "themes"
    return packaged if packaged.is_dir() else here.parent / "themes"


def user_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpuscope" / "themes"


def _colour(value: object, where: str) -> str:
    if not isinstance(value, str) or not (_HEX.match(value) or _NAMED.match(value)):
        raise ThemeFileError(f"{where}: {value!r} is not a colour (use #RRGGBB or a colour name)")
    return value


def load_theme_file(path: Path) -> ThemeSpec:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ThemeFileError(f"{path}: cannot read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ThemeFileError(f"{path}: not valid TOML ({exc})") from None
    name = data.pop("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ThemeFileError(f"{path}: name must be letters, digits, '-', '_' or '.'")
    dark = data.pop("dark", True)
    if not isinstance(dark, bool):
        raise ThemeFileError(f"{path}: dark must be true or false")
    variables = data.pop("variables", {})
    if not isinstance(variables, dict):
        raise ThemeFileError(f"{path}: [variables] must be a table")
    unknown = sorted(set(data) - set(COLOUR_KEYS))
    if unknown:
        raise ThemeFileError(f"{path}: unknown key {unknown[0]!r} (known: name, dark, {', '.join(COLOUR_KEYS)}, [variables])")
    if "primary" not in data:
        raise ThemeFileError(f"{path}: 'primary' is required")
    colours = {k: _colour(v, f"{path}: {k}") for k, v in data.items()}
    checked = {k: _colour(v, f"{path}: variables.{k}") for k, v in variables.items()}
    return ThemeSpec(name=name, dark=dark, colours=colours, variables={**VARIABLE_DEFAULTS, **checked}, path=path)


def load_themes() -> tuple[dict[str, ThemeSpec], list[str]]:
    """All themes (user files override built-ins of the same name) and one line per broken file."""
    themes: dict[str, ThemeSpec] = {}
    problems: list[str] = []
    for folder in (builtin_dir(), user_dir()):
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
