"""gpuscope's leak test as Prometheus rules, from the same thresholds as the console's detector.

The console judges the *floor* of a memory series (the minimum of each slice of a window) and
calls growth a leak when the floor's slope reaches `LeakThresholds.alert_rate(h)` for growth that
has lasted h, steadily (a ramp, not one step). The rules do the same over several windows at once
(as multi-window burn-rate alerts do): a short one that sees a fast leak within two minutes and
longer ones that see slow leaks, each carrying the whole test at its horizon h:

- the floors: `min_over_time(X[h/F] offset k*h/F)` for k = 0..F-1 (F = the detector's min_floors);
- the trend: `deriv` of the floor over the horizon (a subquery of the floor at the floor's step);
- ramp, not step: every floor above the one before by at least MIN_STEP_SHARE of the horizon's
  rise (a plateau's floors, equal but for noise, are not a ramp), no single floor-to-floor rise
  carrying more than max_jump_share of it, and the rise at least flat_bytes;
- a new high, not a refill: no floor of the LOOKBACK before the horizon was as high as the newest
  floor (a sawtooth, a cache that was emptied and fills again, rise to where they have been);
- a leak at h: all of that, with the trend at least rate_margin x alert_rate(h), for
  max(one floor, MIN_FOR_S);
- alive: the trend is recorded only while the series itself has a sample now, and the alert reads
  the recorded trend: at the first evaluation after the process's series goes stale (its exit) the
  trend ends and the alert resolves.

The alerts carry the process's `command` from `gpuscope_process_info` (the memory series do not).

What PromQL cannot carry (said in the README): the slope is least squares over the floors, not
Theil-Sen; there is no noise estimate (min_z) and no confidence; a warm-up that climbs for longer
than the short horizon and its wait looks like a leak while it climbs; torch's cache-growth is
not told from a leak; and a horizon needs a sample in each of its floors, so the one-minute
horizon needs scrapes every 5 s (at 15 s the 5-minute horizon is the first to see a leak).

Sources: the exporter's per-process GPU memory and RSS, and dcgm-exporter's per-GPU framebuffer
(`DCGM_FI_DEV_FB_USED`, MiB) for nodes where no gpuscope exporter answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuscope.core.leak import LeakThresholds

HORIZONS_S = (60, 300, 1800, 7200, 21600)  # 1 min, 5 min, 30 min, 2 h, 6 h
MIN_STEP_SHARE = 0.05  # each floor-to-floor rise carries at least this share of the horizon's rise
MIN_FOR_S = 30  # the condition holds this long before firing (a short warm-up climbs for less)
MIN_LOOKBACK_S = 600  # the new-high test looks this far before the horizon, or one horizon if longer
EVALUATION_INTERVAL = "5s"  # the short horizons' group's own: the 1-minute horizon's floors are 10 s wide
FAST_GROUP_MAX_S = 300
MIB = 1048576
DCGM_RECORD = "gpuscope:dcgm_gpu_memory_used_bytes"
PROCESS_KEY = "node, pid, start_time"  # one process: what joins its series to gpuscope_process_info


@dataclass(frozen=True)
class Source:
    name: str  # the alert's name part
    series: str  # the metric (or recorded series) whose floor is judged
    what: str  # for the summary
    process: bool  # per-process series: the alert carries the command from gpuscope_process_info


SOURCES = (
    Source("ProcessGpuMemory", "gpuscope_process_gpu_memory_bytes",
           "PID {{ $labels.pid }} ({{ $labels.command }}) on {{ $labels.node }} GPU{{ $labels.gpu }}", True),
    Source("ProcessResidentMemory", "gpuscope_process_resident_memory_bytes",
           "PID {{ $labels.pid }} ({{ $labels.command }}) on {{ $labels.node }} (RSS)", True),
    Source("GpuMemory", DCGM_RECORD, "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} (dcgm-exporter)", False),
)


def duration(seconds: float) -> str:
    """A PromQL duration: 300 -> 5m, 7200 -> 2h, 50 -> 50s."""
    s = int(round(seconds))
    for unit, size in (("h", 3600), ("m", 60)):
        if s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def _floor(series: str, width: str, offset_s: int) -> str:
    offset = f" offset {duration(offset_s)}" if offset_s else ""
    return f"min_over_time({series}[{width}]{offset})"


def slope_expr(series: str, horizon_s: int, floors: int) -> str:
    """The floor's trend over the horizon, only while the series itself is alive."""
    step = duration(horizon_s / floors)
    return f"deriv(min_over_time({series}[{step}])[{duration(horizon_s)}:{step}]) and {series}"


def lookback_s(horizon_s: int) -> int:
    return max(MIN_LOOKBACK_S, horizon_s)


def ramp_expr(series: str, horizon_s: int, th: LeakThresholds) -> str:
    """The floor rose at every step by a share of the rise, no step carried most of it, it rose by
    flat_bytes or more, and it is higher than any floor of the lookback before the horizon."""
    floors = th.min_floors
    width_s = horizon_s // floors
    width = duration(width_s)
    f = [_floor(series, width, (floors - 1 - k) * width_s) for k in range(floors)]  # oldest first
    rise = f"({f[-1]} - {f[0]})"
    parts = [f"{rise} > {th.flat_bytes:g}"]
    for k in range(1, floors):
        jump = f"({f[k]} - {f[k - 1]})"
        parts.append(f"{jump} > {MIN_STEP_SHARE:g} * {rise}")
        parts.append(f"{jump} < {th.max_jump_share:g} * {rise}")
    ramp = "\n  and ".join(f"({p})" for p in parts)
    before = (f"max_over_time(min_over_time({series}[{width}])[{duration(lookback_s(horizon_s))}:{width}] "
              f"offset {duration(horizon_s)})")
    return f"(\n  {ramp}\n)\nunless\n({before} >= {f[-1]})"


def alert_expr(src: Source, record: str, horizon_s: int, th: LeakThresholds) -> str:
    threshold = th.rate_margin * th.alert_rate(horizon_s)
    # Alive through the recorded trend (`slope_expr`): it ends with the series, and the alert with it.
    expr = f"(\n{record} > {threshold:.6g}\nand\n{ramp_expr(src.series, horizon_s, th)}\n)"
    if src.process:
        expr = f"(\n{expr}\n)\n* on ({PROCESS_KEY}) group_left (command, runs_in) gpuscope_process_info"
    return expr


def _q(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def _block(text: str, indent: int) -> str:
    pad = " " * indent
    return "|-\n" + "\n".join(pad + line for line in text.splitlines())


def leak_rules(th: LeakThresholds, horizons_s: tuple[int, ...] = HORIZONS_S, *, dcgm: bool = True) -> list[str]:
    out: list[str] = []
    if dcgm:
        expr = (f"DCGM_FI_DEV_FB_USED * {MIB}\n  unless on (Hostname)\n"
                "  label_replace(gpuscope_gpu_memory_used_bytes, \"Hostname\", \"$1\", \"node\", \"(.*)\")")
        out.append(f"      - record: {DCGM_RECORD}\n        expr: {_block(expr, 10)}\n")
    for src in SOURCES:
        for h in horizons_s:
            hname = duration(h)
            record = f"gpuscope:{_snake(src.series)}:floor_deriv{hname}"
            out.append(f"      - record: {record}\n        expr: {_q(slope_expr(src.series, h, th.min_floors))}\n")
            threshold = th.rate_margin * th.alert_rate(h)
            out.append(
                f"      - alert: GpuscopeLeak{src.name}\n"
                f"        expr: {_block(alert_expr(src, record, h, th), 10)}\n"
                f"        for: {duration(max(h // th.min_floors, MIN_FOR_S))}\n"
                f"        labels:\n          severity: warning\n          horizon: {_q(hname)}\n"
                f"        annotations:\n"
                f"          summary: {_q(f'Memory leak: {src.what} grows steadily')}\n"
                f"          description: {_q(_leak_text(hname, threshold))}\n"
            )
    return out


def _snake(series: str) -> str:
    return series.replace("gpuscope:", "").replace("gpuscope_", "")


def _leak_text(hname: str, threshold: float) -> str:
    return (f"Its memory floor (minima over {hname} in slices) rose steadily to a new high at "
            f"{{{{ $value | humanize }}}}B/s for {hname}, at or above the leak rate for that long "
            f"({threshold / 1e6:.3g} MB/s). gpuscope --pid {{{{ $labels.pid }}}} on the node tells where it comes from.")


# --- serving ------------------------------------------------------------------------------------

HISTOGRAMS = {
    "e2e": "vllm:e2e_request_latency_seconds_bucket|sglang:e2e_request_latency_seconds_bucket",
    "ttft": "vllm:time_to_first_token_seconds_bucket|sglang:time_to_first_token_seconds_bucket",
    "tpot": ("vllm:time_per_output_token_seconds_bucket|vllm:inter_token_latency_seconds_bucket|"
             "sglang:time_per_output_token_seconds_bucket|sglang:inter_token_latency_seconds_bucket"),
}
JUMP_FACTOR = 2.0  # a P99 twice what it was an hour before


def _quantile(q: float, slot: str, window: str, offset: str = "") -> str:
    off = f" offset {offset}" if offset else ""
    return (f"histogram_quantile({q:g}, sum by (job, instance, le) "
            f"(rate({{__name__=~\"{HISTOGRAMS[slot]}\"}}[{window}]{off})))")


def serving_rules(ttft_p95_s: float, e2e_latency_p95_s: float) -> list[str]:
    out: list[str] = []
    for slot in ("e2e", "ttft", "tpot"):
        out.append(f"      - record: gpuscope:{slot}_p99_seconds:rate5m\n        expr: {_q(_quantile(0.99, slot, '5m'))}\n")
        expr = (f"gpuscope:{slot}_p99_seconds:rate5m > {JUMP_FACTOR:g} * "
                f"({_quantile(0.99, slot, '5m', '1h')})")
        out.append(
            f"      - alert: GpuscopeP99Jump{slot.upper()}\n        expr: {_q(expr)}\n        for: 5m\n"
            f"        labels:\n          severity: warning\n"
            f"        annotations:\n          summary: {_q(f'{slot.upper()} P99 of {{{{ $labels.job }}}} doubled within the hour')}\n"
        )
    for slot, slo in (("ttft", ttft_p95_s), ("e2e", e2e_latency_p95_s)):
        # Multi-window burn: the P95 above the objective over the last hour and still over 5 minutes.
        expr = f"({_quantile(0.95, slot, '1h')} > {slo:g})\nand\n({_quantile(0.95, slot, '5m')} > {slo:g})"
        out.append(
            f"      - alert: GpuscopeSloBurn{slot.upper()}\n        expr: {_block(expr, 10)}\n        for: 5m\n"
            f"        labels:\n          severity: warning\n"
            f"        annotations:\n          summary: {_q(f'{slot.upper()} P95 of {{{{ $labels.job }}}} above its objective ({slo:g} s) for an hour')}\n"
        )
    return out


def render_rules(th: LeakThresholds, *, ttft_p95_s: float, e2e_latency_p95_s: float,
                 horizons_s: tuple[int, ...] = HORIZONS_S) -> str:
    """The rule file (Prometheus YAML), from the leak thresholds and the serving objectives
    (`horizons_s`: the leak test's horizons, each a multiple of min_floors seconds). The horizons up
    to FAST_GROUP_MAX_S are evaluated every EVALUATION_INTERVAL, the longer ones at Prometheus's
    global evaluation interval (their floors are minutes wide)."""
    fast = tuple(h for h in horizons_s if h <= FAST_GROUP_MAX_S)
    slow = tuple(h for h in horizons_s if h > FAST_GROUP_MAX_S)
    head = (
        "# Prometheus rules from `gpuscope rules`: gpuscope's leak test over the floor of memory series\n"
        f"# (alert rate {th.fast_rate / 1e6:g} MB/s for {th.fast_duration_s:g} s ... {th.slow_bytes / 1e9:g} GB over "
        f"{th.slow_window_s / 3600:g} h, never under {th.min_rate / 1e6:g} MB/s) at horizons of "
        f"{', '.join(duration(h) for h in horizons_s)},\n"
        "# and the serving classics (P99 jump, TTFT and end-to-end SLO burn).\n"
        "groups:\n"
        f"  - name: gpuscope-leak-fast\n    interval: {EVALUATION_INTERVAL}\n    rules:\n"
    )
    text = head + "".join(leak_rules(th, fast))
    if slow:
        text += "  - name: gpuscope-leak\n    rules:\n" + "".join(leak_rules(th, slow, dcgm=False))
    serving = "  - name: gpuscope-serving\n    rules:\n"
    return text + serving + "".join(serving_rules(ttft_p95_s, e2e_latency_p95_s))
