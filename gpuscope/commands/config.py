"""`gpuscope config [--json]`: every setting's effective value and where it came from.

    gpuscope config --refresh 2
    # file: /home/me/.config/gpuscope/config.toml
    console.refresh_s = 2                 # flag --refresh
    console.theme = "gpuscope-light"      # file /home/me/.config/gpuscope/config.toml, line 3
    slo.ttft_p95_s = 0.8                  # default
    ...

Secrets (the Prometheus token and password) are shown as set or not set, never their value;
every other value passes through redact_text, so a password in a URL (`http://user:pw@host`) or
a token-shaped value is masked in the text and in --json alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from gpuscope.config import SECRET_KEYS, Settings, config_path
from gpuscope.core.common.redact import redact_text



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print every setting's effective value and where it came from: a flag (e.g. gpuscope config --refresh 2), "
        "the environment, the config file or the default."
    )
    parser.add_argument("--json", action="store_true", help="a JSON object, for scripts")


def run(args: argparse.Namespace, settings: Settings) -> int:
    config, effective = settings.config, settings.effective
    if args.json:
        json.dump(
            {
                "schema": "gpuscope.config/1",
                "file": str(config.path) if config.path else None,
                "settings": {
                    key: {
                        "value": _json_value(s.key, s.value),
                        "origin": s.origin,
                        "detail": s.detail or None,
                    }
                    for key, s in effective.items()
                },
            },
            sys.stdout,
            indent=1,
        )
        sys.stdout.write("\n")
        return 0
    where = str(config.path) if config.path else f"{config_path()} (not found: defaults apply)"
    lines = [f"# file: {where}"]
    assigned = [f"{s.key} = {redact_text(s.shown)}" for s in effective.values()]
    width = max(len(a) for a in assigned)
    for text, s in zip(assigned, effective.values()):
        origin = s.origin + (f" {s.detail}" if s.detail else "")
        lines.append(f"{text:<{width}}  # {origin}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _json_value(key: str, value: object) -> object:
    if key in SECRET_KEYS:
        return None if value is None else "(set)"
    return _redacted(value)


def _redacted(value: object) -> object:
    """`value` for JSON with every string in it redacted (a list of URLs, a profile's table)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, (tuple, list)):
        return [_redacted(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _redacted(v) for k, v in value.items()}
    return value
