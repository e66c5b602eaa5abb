"""Where gpuscope keeps its files, by the XDG base directories: settings and themes in the
config folder; sessions, exports and the remembered theme in the state folder."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def config_dir(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpuscope"


def state_dir(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpuscope"


def exports_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where the console writes what the operator exports (snapshots, diagnoses)."""
    return state_dir(env) / "exports"
