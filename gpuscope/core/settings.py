"""The settings gpuscope's parts take, as plain immutable values.

The settings file (`gpuscope.config` reads it, with the environment and the command line) becomes
a `Config`; the collectors, the leak watch and the views take these values and never read a file,
the environment or the command line themselves. A bad value is one `ConfigError` line that names
where it was written (`Config.error`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscope.core.leak import LeakThresholds
from gpuscope.errors import UsageError


class ConfigError(UsageError):
    """A configuration problem, as one line: `<file>, line N: <key>: <what is wrong>`."""


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """How the console refreshes and which theme it starts in."""

    refresh_s: float = 1.0
    theme: str | None = None  # None: the theme last chosen in the console, else the default


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """The service's `/metrics` endpoints to scrape."""

    metrics_url: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """A Prometheus server to query for the service, how to log in to it, and which series are the service's."""

    url: str | None = None
    token: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    job: str | None = None
    instance: str | None = None


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """The fleet view: the command Enter runs to open gpuscope on a process of another node."""

    attach: str = "ssh -t {node} gpuscope --pid {pid}"  # the command `gpuscope.core.fleet.attach` runs


# The leak detector's thresholds a user may change; the others are the detector's own business.
ALERT_KEYS = ("fast_rate", "fast_duration_s", "slow_bytes", "slow_window_s", "min_rate", "min_confidence")


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    """When the live leak watch raises an alert; defaults are LeakThresholds' own."""

    fast_rate: float = LeakThresholds.fast_rate
    fast_duration_s: float = LeakThresholds.fast_duration_s
    slow_bytes: float = LeakThresholds.slow_bytes
    slow_window_s: float = LeakThresholds.slow_window_s
    min_rate: float = LeakThresholds.min_rate
    min_confidence: float = LeakThresholds.min_confidence

    def thresholds(self) -> LeakThresholds:
        return LeakThresholds(**{key: getattr(self, key) for key in ALERT_KEYS})


@dataclass(frozen=True, slots=True)
class SloConfig:
    """Service-level objectives: a P95 above these is shown as a breach. Defaults from practice."""

    ttft_p95_s: float = 0.8
    e2e_latency_p95_s: float = 4.0


@dataclass(frozen=True, slots=True)
class JournalConfig:
    """Session recording: on by default, bounded by age and by the total size of the files."""

    enabled: bool = True
    keep_days: float = 7.0
    max_mb: float = 512.0


@dataclass(frozen=True)
class Config:
    """The parsed file. `profiles` is the raw `[profiles.*]` tables (validated by profiles.py)."""

    path: Path | None = None
    text: str = field(default="", repr=False)
    written: frozenset[str] = frozenset()  # the "section.key" names the file sets
    console: ConsoleConfig = ConsoleConfig()
    service: ServiceConfig = ServiceConfig()
    prometheus: PrometheusConfig = PrometheusConfig()
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    slo: SloConfig = SloConfig()
    alerts: AlertsConfig = AlertsConfig()
    journal: JournalConfig = JournalConfig()
    fleet: FleetConfig = FleetConfig()

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


