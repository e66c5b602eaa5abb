"""`gpuscope rules [-o FILE]`: Prometheus rules carrying the leak test, from the settings.

The leak thresholds come from [alerts] and the objectives from [slo], as the console uses them.
"""

from __future__ import annotations

import argparse

from gpuscope.commands.output import add_output_arguments, check_output, deliver
from gpuscope.config import Settings
from gpuscope.core.fleet.rules import render_rules



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Prometheus recording and alerting rules that carry gpuscope's leak test (the floor trend over several "
        "horizons, from the [alerts] thresholds) over the exporter's series and dcgm-exporter's, and the "
        "serving classics (P99 jump, TTFT/TPOT SLO burn from [slo]). -o writes only a regular file, and "
        "replaces one only with --force."
    )
    add_output_arguments(parser, metavar="FILE", what="the rules")


def run(args: argparse.Namespace, settings: Settings) -> int:
    check_output(args.output, args.force)
    text = render_rules(settings.thresholds, ttft_p95_s=settings.slo.ttft_p95_s,
                        e2e_latency_p95_s=settings.slo.e2e_latency_p95_s)
    deliver(text, args.output, args.force)
    return 0
