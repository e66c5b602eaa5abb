"""`gpuscope rules [-o FILE]`: Prometheus rules carrying the leak test, from the settings.

The leak thresholds come from [alerts] and the objectives from [slo], as the console uses them.
"""

from __future__ import annotations

import argparse

from gpuscope.cli import settings
from gpuscope.commands.output import check_output, deliver
from gpuscope.core.rules import render_rules


def run(args: argparse.Namespace) -> int:
    check_output(args.output, args.force)
    config, _ = settings(args)
    text = render_rules(config.alerts.thresholds(), ttft_p95_s=config.slo.ttft_p95_s,
                        e2e_latency_p95_s=config.slo.e2e_latency_p95_s)
    deliver(text, args.output, args.force)
    return 0
