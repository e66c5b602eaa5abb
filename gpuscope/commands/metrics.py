"""`gpuscope metrics (--metrics-url URL ... | --prometheus URL [--job J] [--instance I])
[--window SECONDS] [--json]`: the service's signals now.

With --metrics-url and a window W > 0 the command watches the endpoint(s) for W seconds (a
scrape about every second, said on stderr) and computes rates and windowed quantiles from those
scrapes as Prometheus would; with --window 0, quantiles over the cumulative buckets of one
scrape, rates null. Several --metrics-url are one service: their series are summed as
`sum by (le)` sums instances, and the target is the URLs joined by ",". With --prometheus the
server already holds the history: one query.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpuscope.config import ConfigError, load_config
from gpuscope.core.serving import make_collector, observe
from gpuscope.core.serving_model import SIGNAL_NAMES, ServingSnapshot
from gpuscope.errors import Failure, UsageError

MAX_SCRAPE_WINDOW_S = 3600.0  # the command watches the endpoint this long; beyond, use Prometheus
LABELS = {
    "e2e_latency_p50_s": "e2e latency p50",
    "e2e_latency_p95_s": "e2e latency p95",
    "e2e_latency_p99_s": "e2e latency p99",
    "ttft_p95_s": "TTFT p95",
    "tpot_p95_s": "TPOT p95",
    "tokens_per_s": "tokens/s",
    "requests_per_s": "requests/s",
    "error_rate": "error rate",
    "queue_depth": "queue depth",
    "kv_cache_usage": "KV-cache usage",
}


def check_window(window_s: float, scrape: bool) -> None:
    if 0 < window_s < 1:
        raise UsageError(f"--window must be 0 or at least 1 second, not {window_s:g}")
    if scrape and window_s > MAX_SCRAPE_WINDOW_S:
        raise UsageError(
            f"--window {window_s:g} with --metrics-url would watch the endpoint for that long; "
            f"use at most {MAX_SCRAPE_WINDOW_S:g} s, or --prometheus for longer windows"
        )


def run(args: argparse.Namespace) -> int:
    check_window(args.window, bool(args.metrics_url))
    try:
        config = load_config()
        collector = make_collector(
            window_s=args.window,
            metrics_urls=args.metrics_url,
            prometheus=args.prometheus,
            job=args.job,
            instance=args.instance,
            config=config,
        )
    except (ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    snapshot = observe(collector, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if not snapshot.ok:
        hint = "check the URL, and that the service serves /metrics" if snapshot.source == "scrape" else (
            "check the URL and that Prometheus is up (and the credentials, if it needs them)"
        )
        raise Failure(f"{snapshot.state}\n{hint}")
    if args.json:
        json.dump(snapshot.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print_table(snapshot)
    return 0


def format_value(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if name.endswith("_s") and name not in ("tokens_per_s", "requests_per_s"):
        return format_seconds(value)
    if name in ("error_rate", "kv_cache_usage"):
        return f"{value * 100:.1f} %"
    if name == "queue_depth":
        return f"{value:g}"
    return f"{value:.2f}"


def format_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.3g} s"


def print_table(snapshot: ServingSnapshot) -> None:
    window = "cumulative (one scrape)" if snapshot.window_s == 0 else f"{snapshot.window_s:g} s"
    print(f"{snapshot.source}: {snapshot.target}")
    print(f"profile: {snapshot.profile or 'none detected'}   window: {window}")
    if snapshot.malformed_lines:
        print(f"# {snapshot.malformed_lines} malformed line(s) skipped", file=sys.stderr)
    print()
    width = max(len(v) for v in LABELS.values())
    for name in SIGNAL_NAMES:
        print(f"  {LABELS[name]:<{width}}  {format_value(name, snapshot.signals.get(name)):>10}")
    if snapshot.stages:
        print()
        stage_width = max(5, *(len(s.name) for s in snapshot.stages))
        print(f"  {'STAGE':<{stage_width}}  {'P50':>10}  {'P95':>10}  {'P99':>10}  {'SHARE':>7}")
        for s in snapshot.stages:
            share = "-" if s.share is None else f"{s.share * 100:.1f} %"
            print(
                f"  {s.name:<{stage_width}}  {format_seconds(s.p50_s):>10}  {format_seconds(s.p95_s):>10}"
                f"  {format_seconds(s.p99_s):>10}  {share:>7}"
            )
