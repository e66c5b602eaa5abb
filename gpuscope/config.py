"""gpuscope's settings file: TOML, read once per command.

Where: `$GPUSCOPE_CONFIG` if set (then the file must exist), else
`$XDG_CONFIG_HOME/gpuscope/config.toml`, else `~/.config/gpuscope/config.toml`; no file is the
same as an empty one.

    [prometheus]                      # defaults for --prometheus; the environment wins:
    url = "http://prometheus:9090"    #   GPUSCOPE_PROMETHEUS_TOKEN (bearer), or
    token = "..."                     #   GPUSCOPE_PROMETHEUS_USER + GPUSCOPE_PROMETHEUS_PASSWORD
    user = "..."                      #   (basic auth)
    password = "..."

    [profiles.vllm]                   # override any metric of a built-in profile ...
    ttft = "my_ttft_seconds"
    [profiles.mysvc]                  # ... or add one (see gpuscope.core.profiles)
    detect = ["mysvc_*"]
    e2e = "mysvc_request_seconds"

    [slo]                             # when the console colours a latency as breaching
    ttft_p95_s = 0.8
    e2e_latency_p95_s = 4.0

A bad file is one `ConfigError` line naming the file, the line when it is known, and the key.
Sections are checked here; what a section's keys mean is checked by the module that uses them
(profiles by gpuscope.core.profiles), through `Config.error()` so every message looks the same.
New settings: add their section to `SECTIONS` and a reader for it.

No UI imports; secrets are never part of a repr or a message.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ENV_CONFIG = "GPUSCOPE_CONFIG"
SECTIONS = ("prometheus", "profiles", "slo")
PROMETHEUS_KEYS = ("url", "token", "user", "password")


class ConfigError(Exception):
    """A configuration problem, as one line: `<file>, line N: <key>: <what is wrong>`."""


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpuscope" / "config.toml"


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    url: str | None = None
    token: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class SloConfig:
    """Service-level objectives: a P95 above these is shown as a breach. Defaults from practice."""

    ttft_p95_s: float = 0.8
    e2e_latency_p95_s: float = 4.0


@dataclass(frozen=True)
class Config:
    """The parsed file. `profiles` is the raw `[profiles.*]` tables (validated by profiles.py)."""

    path: Path | None = None
    text: str = field(default="", repr=False)
    prometheus: PrometheusConfig = PrometheusConfig()
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    slo: SloConfig = SloConfig()

    def error(self, keys: tuple[str, ...], message: str) -> ConfigError:
        """A ConfigError for the value at `keys` (e.g. ("profiles", "vllm", "ttft"))."""
        where = str(self.path) if self.path else "configuration"
        line = find_line(self.text, keys)
        if line is not None:
            where += f", line {line}"
        return ConfigError(f"{where}: {'.'.join(keys)}: {message}")


def find_line(text: str, keys: tuple[str, ...]) -> int | None:
    """The line (1-based) where `keys` is set in TOML `text`, if it can be found.

    Looks for `last = ...` inside the `[a.b]` table made of the other keys (or at the top level
    of the file for one key), then for a `[a.b.last]` table header. Enough for error messages;
    not a TOML parser.
    """
    *table, last = keys
    header = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
    key = re.compile(rf"^\s*[\"']?{re.escape(last)}[\"']?\s*=")
    current: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        h = header.match(line)
        if h:
            current = [part.strip().strip("\"'") for part in h[1].split(".")]
            if current == list(keys):
                return number
            continue
        if current == table and key.match(line):
            return number
    return None


def load_config(path: Path | None = None, env: Mapping[str, str] = os.environ) -> Config:
    """Read and check the settings file. Raises ConfigError (one line) when it is unusable."""
    explicit = path is not None or bool(env.get(ENV_CONFIG))
    path = path or config_path(env)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{path}: no such configuration file (set by {ENV_CONFIG})") from None
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: cannot read the configuration file: {reason}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None

    shell = Config(path=path, text=text)
    for name, value in data.items():
        if name not in SECTIONS:
            raise shell.error((name,), f"unknown setting (known: {', '.join(SECTIONS)})")
        if not isinstance(value, dict):
            raise shell.error((name,), "expected a table, e.g. [" + name + "]")
    return Config(
        path=path,
        text=text,
        prometheus=_prometheus(shell, data.get("prometheus", {})),
        profiles=data.get("profiles", {}),
        slo=_slo(shell, data.get("slo", {})),
    )


def _slo(shell: Config, table: Mapping[str, Any]) -> SloConfig:
    known = SloConfig.__slots__
    values: dict[str, float] = {}
    for key, value in table.items():
        if key not in known:
            raise shell.error(("slo", key), f"unknown key (known: {', '.join(known)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise shell.error(("slo", key), "expected a positive number of seconds")
        values[key] = float(value)
    return SloConfig(**values)


def _prometheus(shell: Config, table: Mapping[str, Any]) -> PrometheusConfig:
    values: dict[str, str] = {}
    for key, value in table.items():
        if key not in PROMETHEUS_KEYS:
            raise shell.error(("prometheus", key), f"unknown key (known: {', '.join(PROMETHEUS_KEYS)})")
        if not isinstance(value, str) or not value:
            raise shell.error(("prometheus", key), "expected a non-empty string")
        values[key] = value
    return PrometheusConfig(**values)
