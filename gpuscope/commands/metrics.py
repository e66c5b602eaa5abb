"""`gpuscope metrics (--metrics-url URL ... | --prometheus URL [--job J] [--instance I])
[--window SECONDS] [--watch] [--json]`: the service's signals now.

Now means now. With --metrics-url and no --window: two scrapes NOW_WINDOW_S apart, rates and
windowed quantiles from those two as Prometheus would compute them over that window (the JSON
says `window_s`). --window W > 0 watches the endpoint(s) for W seconds, a scrape about every
second; --window 0 reads one scrape: quantiles over its cumulative buckets, rates null. Several
--metrics-url are one service: their series are summed as `sum by (le)` sums instances, and the
target is the URLs joined by ",". With --prometheus the server already holds the history: one
query, over PROMETHEUS_WINDOW_S unless --window says otherwise.

--watch then keeps reading (the console's serving source, so its history and the P99 jump it
finds) and prints the signals again every refresh interval R (--refresh, or the settings file's
console.refresh_s) until Ctrl+C; with --json, one object per line. Its default window is the
larger of NOW_WINDOW_S and 3 R, scraped about every second from the start.

The settings (the file of --config or $GPUSCOPE_CONFIG: profiles, Prometheus credentials, job
and instance) are the ones the command line resolves for every command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpuscope.commands.common import DAY_S, add_service_arguments, seconds
from gpuscope.config import Settings
from gpuscope.core.serving.source import ServingSource, make_collector, observe
from gpuscope.core.serving.model import SIGNAL_NAMES, ServingSnapshot
from gpuscope.errors import Failure, UsageError

NOW_WINDOW_S = 3.0  # "now" from a /metrics endpoint: two scrapes about this far apart
NOW_READS = 2
PROMETHEUS_WINDOW_S = 30.0  # "now" from Prometheus, which scrapes every 15-60 s
MAX_SCRAPE_WINDOW_S = 3600.0  # the command watches the endpoint this long; beyond, use Prometheus
CLEAR = "\x1b[H\x1b[2J"  # --watch on a terminal: each refresh replaces the last
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



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "The service's signals now, from its /metrics endpoint or from a Prometheus server."
    add_service_arguments(parser, required=True, scrape_help="scrape this /metrics endpoint (repeatable)",
                          prometheus_help="query this Prometheus server")
    parser.add_argument(
        "--window", type=seconds(0.0, 7 * DAY_S), metavar="SECONDS",
        help="rate and quantile window (default: two scrapes 3 s apart, or 30 s of Prometheus; "
             "0: quantiles over the cumulative buckets of one scrape)",
    )
    parser.add_argument("--watch", action="store_true", help="then print again every --refresh seconds (Ctrl+C stops)")
    parser.add_argument("--json", action="store_true", help="the gpuscope.metrics/1 JSON object (one a line with --watch)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    scrape = bool(args.metrics_url)
    refresh_s = settings.refresh_s
    if args.window is not None:
        window_s = args.window
    elif not scrape:
        window_s = PROMETHEUS_WINDOW_S
    else:  # --watch keeps scraping every refresh: rates need a few of those scrapes in the window
        window_s = max(NOW_WINDOW_S, 3 * refresh_s) if args.watch else NOW_WINDOW_S
    check_window(window_s, scrape)
    job, instance = args.job, args.instance
    if not scrape:  # the flags, else the environment and the settings file
        job, instance = settings.value("prometheus.job"), settings.value("prometheus.instance")
    try:
        collector = make_collector(
            window_s=window_s,
            metrics_urls=args.metrics_url,
            prometheus=args.prometheus,
            job=job,
            instance=instance,
            config=settings.config,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    snapshot = observe(
        collector,
        # "now": two scrapes; for --watch, scrapes about a second apart from the start, as the
        # live source goes on, so that no window has a gap (rate() would then extrapolate less)
        reads=NOW_READS if args.window is None and not args.watch else None,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        keep_open=args.watch,
    )
    if not snapshot.ok:
        collector.close()
        hint = "check the URL, and that the service serves /metrics" if snapshot.source == "scrape" else (
            "check the URL and that Prometheus is up (and the credentials, if it needs them)"
        )
        raise Failure(f"{snapshot.state}\n{hint}")
    show(snapshot, args.json)
    if args.watch:
        watch(ServingSource(collector, interval=refresh_s), args.json)
    return 0


def watch(source: ServingSource, as_json: bool) -> None:
    """Print the source's newest snapshot every interval until interrupted (Ctrl+C)."""
    clear = CLEAR if not as_json and sys.stdout.isatty() else ""
    shown: ServingSnapshot | None = None
    source.start(lambda snapshot: None)  # read from the main thread, once an interval
    next_at = time.monotonic()
    try:
        while True:
            next_at += source.interval
            time.sleep(max(0.0, next_at - time.monotonic()))
            snapshot = source.latest
            if snapshot is None or snapshot is shown:
                continue
            shown = snapshot
            if not snapshot.ok:
                print(f"gpuscope: {snapshot.state}", file=sys.stderr, flush=True)
                continue
            show(snapshot, as_json, clear)
    finally:
        source.stop()


def show(snapshot: ServingSnapshot, as_json: bool, clear: str = "") -> None:
    if as_json:
        json.dump(snapshot.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(clear)
        print_table(snapshot)
    sys.stdout.flush()


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
    print(f"{snapshot.source}: {snapshot.target}" + (f"  ({snapshot.format})" if snapshot.format else ""))
    print(f"profile: {snapshot.profile or 'none detected'}   window: {window}")
    if snapshot.malformed_lines:
        print(f"# {snapshot.malformed_lines} malformed line(s) skipped", file=sys.stderr)
    if snapshot.p99_jump is not None:
        print(snapshot.p99_jump.describe())
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
