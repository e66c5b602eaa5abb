"""gpuscope's settings file: TOML, read once per command.

Where: `$GPUSCOPE_CONFIG` if set (then the file must exist), else
`$XDG_CONFIG_HOME/gpuscope/config.toml`, else `~/.config/gpuscope/config.toml`; no file is the
same as an empty one.

    [console]                         # the live console
    refresh_s = 1.0                   # seconds between samples (--refresh, GPUSCOPE_REFRESH)
    theme = "gpuscope-dark"           # --theme, GPUSCOPE_THEME; else the last one chosen with t
                                      # in the console (kept in the XDG state directory)

    [service]                         # the service panel's source when no flag names one
    metrics_url = ["http://127.0.0.1:8000/metrics"]   # --metrics-url; or [prometheus] url

    [prometheus]                      # --prometheus and its defaults; the environment wins:
    url = "http://prometheus:9090"    #   GPUSCOPE_PROMETHEUS_TOKEN (bearer), or
    token = "..."                     #   GPUSCOPE_PROMETHEUS_USER + GPUSCOPE_PROMETHEUS_PASSWORD
    user = "..."                      #   (basic auth)
    password = "..."
    job = "vllm"                      # --job, --instance
    instance = "10.0.0.7:8000"

    [alerts]                          # when growing memory is called a leak (core.leak.LeakThresholds)
    fast_rate = 5e6                   # bytes/s sustained ...
    fast_duration_s = 10              # ... this long: a fast leak
    slow_bytes = 1e9                  # this much growth ...
    slow_window_s = 7200              # ... over this long: a slow leak
    min_rate = 1e4                    # bytes/s: slower growth is never a leak
    min_confidence = 0.5              # a leak needs at least this confidence

    [profiles.vllm]                   # override any metric of a built-in profile ...
    ttft = "my_ttft_seconds"
    [profiles.mysvc]                  # ... or add one (see gpuscope.core.serving.profiles)
    detect = ["mysvc_*"]
    e2e = "mysvc_request_seconds"

    [slo]                             # when the console colours a latency as breaching
    ttft_p95_s = 0.8
    e2e_latency_p95_s = 4.0

    [journal]                         # every console session records to the state directory
    enabled = true                    #   (--no-journal turns it off for one run)
    keep_days = 7                     # older session files are deleted ...
    max_mb = 512                      # ... and the oldest go first past this total

    [fleet]                           # the fleet view (f, with --prometheus): Enter runs, without
    attach = "ssh -t {node} gpuscope --pid {pid}"   # a shell, this; {node} {pod} {namespace} {pid}

A bad file is one `ConfigError` line naming the file, the line when it is known, and the key.
The file must be a regular file (a link to one is fine) of at most 1 MiB: a FIFO, a device such
as /dev/zero, or TOML nested past what the parser can follow is refused with one line, at once.
Sections are checked here; what a section's keys mean is checked by the module that uses them
(profiles by gpuscope.core.serving.profiles), through `Config.error()` so every message looks the same.
The values become gpuscope.core.settings' plain dataclasses (what the core takes). New
settings: add their section there and to `SECTIONS`, and a reader for it here. `resolve()` joins
the file with the environment and the command line's flags and says where each value came from;
`Settings.load` does all of it once per run, and the command line passes the result down.

No UI imports; secrets are never part of a repr or a message.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuscope import theme_files
from gpuscope.core.fleet.attach import check_attach_template
from gpuscope.core.common.atomic import RefusedPath, read_regular
from gpuscope.core.common.toml_text import parse_toml
from gpuscope.core.leak import LeakThresholds
from gpuscope.core.settings import (
    ALERT_KEYS,
    AlertsConfig,
    Config,
    ConfigError,
    ConsoleConfig,
    FleetConfig,
    JournalConfig,
    PrometheusConfig,
    ServiceConfig,
    SloConfig,
    find_line,
)
from gpuscope.folders import config_dir

ENV_CONFIG = "GPUSCOPE_CONFIG"
SECTIONS = ("console", "service", "prometheus", "profiles", "slo", "alerts", "journal", "fleet")
PROMETHEUS_KEYS = ("url", "token", "user", "password", "job", "instance")
SECRET_KEYS = frozenset({"prometheus.token", "prometheus.password"})
MIN_REFRESH_S = 0.25
MAX_REFRESH_S = 3600.0
MAX_FILE_BYTES = 2**20  # a settings file is a few hundred bytes; more is not one


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG]).expanduser()
    return config_dir(env) / "config.toml"


def load_config(path: Path | None = None, env: Mapping[str, str] = os.environ) -> Config:
    """Read and check the settings file. Raises ConfigError (one line) when it is unusable."""
    given_by = "--config" if path is not None else ENV_CONFIG if env.get(ENV_CONFIG) else None
    path = path or config_path(env)
    try:
        text = read_regular(path, MAX_FILE_BYTES).decode("utf-8")
    except FileNotFoundError:
        if given_by:
            raise ConfigError(f"{path}: no such configuration file (set by {given_by})") from None
        return Config()
    except RefusedPath as exc:
        raise ConfigError(f"cannot use the configuration file: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: cannot read the configuration file: {reason}") from None
    try:
        data = parse_toml(text)
    except ValueError as exc:
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
        written=frozenset(f"{name}.{key}" for name, table in data.items() for key in table),
        console=_console(shell, data.get("console", {})),
        service=_service(shell, data.get("service", {})),
        prometheus=_prometheus(shell, data.get("prometheus", {})),
        profiles=data.get("profiles", {}),
        slo=_slo(shell, data.get("slo", {})),
        alerts=_alerts(shell, data.get("alerts", {})),
        journal=_journal(shell, data.get("journal", {})),
        fleet=_fleet(shell, data.get("fleet", {})),
    )


def positive_number(value: object) -> bool:
    """A finite number above 0 (TOML also has inf and nan, and booleans are not numbers)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf


def _journal(shell: Config, table: Mapping[str, Any]) -> JournalConfig:
    known = JournalConfig.__slots__
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise shell.error(("journal", key), f"unknown key (known: {', '.join(known)})")
        if key == "enabled":
            if not isinstance(value, bool):
                raise shell.error(("journal", key), "expected true or false")
        elif not positive_number(value):
            raise shell.error(("journal", key), "expected a positive number")
        values[key] = value if key == "enabled" else float(value)
    return JournalConfig(**values)


def _fleet(shell: Config, table: Mapping[str, Any]) -> FleetConfig:
    values: dict[str, str] = {}
    for key, value in table.items():
        if key not in FleetConfig.__slots__:
            raise _unknown(shell, "fleet", key, FleetConfig.__slots__)
        if not isinstance(value, str):
            raise shell.error(("fleet", key), 'expected a command, e.g. "kubectl exec -it {pod} -- gpuscope --pid {pid}"')
        try:
            check_attach_template(value)
        except ValueError as exc:
            raise shell.error(("fleet", key), str(exc)) from None
        values[key] = value
    return FleetConfig(**values)


def _slo(shell: Config, table: Mapping[str, Any]) -> SloConfig:
    known = SloConfig.__slots__
    values: dict[str, float] = {}
    for key, value in table.items():
        if key not in known:
            raise shell.error(("slo", key), f"unknown key (known: {', '.join(known)})")
        if not positive_number(value):
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


def _unknown(shell: Config, section: str, key: str, known: tuple[str, ...]) -> ConfigError:
    return shell.error((section, key), f"unknown key (known: {', '.join(known)})")


def _console(shell: Config, table: Mapping[str, Any]) -> ConsoleConfig:
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "refresh_s":
            values[key] = check_refresh(value, lambda message: shell.error(("console", key), message))
        elif key == "theme":
            if not isinstance(value, str) or not value:
                raise shell.error(("console", key), "expected a theme name, e.g. \"gpuscope-light\"")
            values[key] = value
        else:
            raise _unknown(shell, "console", key, ConsoleConfig.__slots__)
    return ConsoleConfig(**values)


def check_refresh(value: object, error) -> float:
    """A refresh interval in seconds, or `error(message)` raised."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise error(f"expected a number of seconds, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_REFRESH_S <= value:
        raise error(f"expected a number of seconds, at least {MIN_REFRESH_S:g}")
    if value > MAX_REFRESH_S:
        raise error(f"expected a number of seconds, at most {MAX_REFRESH_S:g}")
    return float(value)


def _service(shell: Config, table: Mapping[str, Any]) -> ServiceConfig:
    for key, value in table.items():
        if key != "metrics_url":
            raise _unknown(shell, "service", key, ServiceConfig.__slots__)
        urls = [value] if isinstance(value, str) else value
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u for u in urls):
            raise shell.error(("service", key), 'expected a URL or a list of URLs, e.g. ["http://127.0.0.1:8000/metrics"]')
        return ServiceConfig(metrics_url=tuple(urls))
    return ServiceConfig()


def _alerts(shell: Config, table: Mapping[str, Any]) -> AlertsConfig:
    values: dict[str, float] = {}
    for key, value in table.items():
        if key not in ALERT_KEYS:
            raise _unknown(shell, "alerts", key, ALERT_KEYS)
        if not positive_number(value):
            raise shell.error(("alerts", key), "expected a positive number")
        if key == "min_confidence" and value > 1:
            raise shell.error(("alerts", key), "expected a number from 0 to 1")
        values[key] = float(value)
    alerts = AlertsConfig(**values)
    try:
        alerts.thresholds()
    except ValueError as exc:
        raise shell.error(("alerts", next(iter(table))), str(exc)) from None
    return alerts


# -- the effective settings: file, environment and flags together -------------------------------

# Settings the environment can set, and how its text becomes a value (None: taken as it is).
ENV_SETTINGS = {
    "console.refresh_s": "GPUSCOPE_REFRESH",
    "console.theme": "GPUSCOPE_THEME",
    "prometheus.token": "GPUSCOPE_PROMETHEUS_TOKEN",
    "prometheus.user": "GPUSCOPE_PROMETHEUS_USER",
    "prometheus.password": "GPUSCOPE_PROMETHEUS_PASSWORD",
}
# Settings a flag of the console sets: the flag's name.
FLAG_SETTINGS = {
    "console.refresh_s": "--refresh",
    "console.theme": "--theme",
    "service.metrics_url": "--metrics-url",
    "prometheus.url": "--prometheus",
    "prometheus.job": "--job",
    "prometheus.instance": "--instance",
    "journal.enabled": "--no-journal",
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One effective value and where it came from: "default", "file", "environment" or "flag"."""

    key: str  # "section.name"
    value: Any
    origin: str
    detail: str = ""  # the file and line, the variable or the flag

    @property
    def shown(self) -> str:
        """The value as `gpuscope config` prints it (secrets never)."""
        if self.key in SECRET_KEYS:
            return "(not set)" if self.value is None else "(set, hidden)"
        if self.value is None:
            return "(not set)"
        if isinstance(self.value, Mapping):  # a [profiles.*] table: which keys it sets
            return "{" + ", ".join(self.value) + "}"
        if isinstance(self.value, tuple):
            return "[" + ", ".join(f'"{v}"' for v in self.value) + "]"
        if isinstance(self.value, str):
            return f'"{self.value}"'
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        return f"{self.value:g}" if isinstance(self.value, float) else str(self.value)


def resolve(config: Config, env: Mapping[str, str] = os.environ, flags: Mapping[str, Any] | None = None) -> dict[str, Setting]:
    """Every setting's effective value: a flag, else the environment, else the file, else the default.

    `flags` maps setting keys (see FLAG_SETTINGS) to the values given on the command line (None:
    not given). Raises ConfigError for an unusable environment value."""
    flags = flags or {}
    settings: dict[str, Setting] = {}
    for section in fields(config):
        table = getattr(config, section.name)
        if not is_dataclass(table):
            continue
        for item in fields(table):
            key = f"{section.name}.{item.name}"
            value = getattr(table, item.name)
            if key in config.written:
                line = find_line(config.text, (section.name, item.name))
                setting = Setting(key, value, "file", f"{config.path}" + (f", line {line}" if line else ""))
            else:
                setting = Setting(key, value, "default")
            variable = ENV_SETTINGS.get(key)
            if variable and env.get(variable):
                setting = Setting(key, _from_env(key, variable, env[variable]), "environment", variable)
            if flags.get(key) not in (None, [], ()):
                given = flags[key]
                setting = Setting(key, tuple(given) if isinstance(given, list) else given, "flag", FLAG_SETTINGS[key])
            settings[key] = setting
    theme = settings["console.theme"]
    if theme.origin == "default":  # no one chose: the theme last picked in the console, else the default
        remembered = theme_files.remembered(env)
        settings["console.theme"] = (
            Setting(theme.key, remembered, "remembered", str(theme_files.remembered_path(env))) if remembered
            else Setting(theme.key, theme_files.DEFAULT_THEME, "default")
        )
    for name in config.profiles:
        line = find_line(config.text, ("profiles", name))
        settings[f"profiles.{name}"] = Setting(
            f"profiles.{name}", config.profiles[name], "file", f"{config.path}" + (f", line {line}" if line else "")
        )
    return settings


def _from_env(key: str, variable: str, text: str) -> Any:
    if key == "console.refresh_s":
        return check_refresh(text, lambda message: ConfigError(f"{variable}: {message}"))
    return text


@dataclass(frozen=True)
class Settings:
    """Every setting of one run, read once (`Settings.load`) and passed down to the command.

    `config` is the file as written; `effective` is each value the run uses and where it came
    from (`gpuscope config` prints it); the properties are the values the commands take."""

    config: Config
    effective: Mapping[str, Setting]

    @classmethod
    def load(cls, file: str | None = None, flags: Mapping[str, Any] | None = None,
             env: Mapping[str, str] = os.environ) -> Settings:
        """The file (`file`, else $GPUSCOPE_CONFIG, else the usual place), then the environment,
        then the flags. Raises ConfigError (one line) when any of them is unusable."""
        config = load_config(Path(file).expanduser() if file else None, env)
        return cls(config, MappingProxyType(resolve(config, env, flags)))

    def value(self, key: str) -> Any:
        return self.effective[key].value

    @property
    def refresh_s(self) -> float:
        return float(self.value("console.refresh_s"))

    @property
    def theme(self) -> str:
        return str(self.value("console.theme"))

    @property
    def thresholds(self) -> LeakThresholds:
        return self.config.alerts.thresholds()

    @property
    def slo(self) -> SloConfig:
        return self.config.slo

    @property
    def fleet(self) -> FleetConfig:
        return self.config.fleet

    @property
    def journal(self) -> JournalConfig:
        return replace(self.config.journal, enabled=bool(self.value("journal.enabled")))
