"""`gpuscope config [--json]`: every setting's effective value and where it came from.

    gpuscope --refresh 2 config
    # file: /home/me/.config/gpuscope/config.toml
    console.refresh_s = 2                 # flag --refresh
    console.theme = "gpuscope-light"      # file /home/me/.config/gpuscope/config.toml, line 3
    slo.ttft_p95_s = 0.8                  # default
    ...

Secrets (the Prometheus token and password) are shown as set or not set, never their value.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpuscope.cli import settings
from gpuscope.config import SECRET_KEYS, config_path


def run(args: argparse.Namespace) -> int:
    config, effective = settings(args)
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
    assigned = [f"{s.key} = {s.shown}" for s in effective.values()]
    width = max(len(a) for a in assigned)
    for text, s in zip(assigned, effective.values()):
        origin = s.origin + (f" {s.detail}" if s.detail else "")
        lines.append(f"{text:<{width}}  # {origin}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _json_value(key: str, value: object) -> object:
    if key in SECRET_KEYS:
        return None if value is None else "(set)"
    return list(value) if isinstance(value, tuple) else value
