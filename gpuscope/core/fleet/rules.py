"""gpuscope's leak test as Prometheus rules, from the same thresholds as the console's detector.

The console judges the *floor* of a memory series (the minimum of each slice of a window) and
calls growth a leak when the floor's slope reaches `LeakThresholds.alert_rate(h)` for growth that
has lasted h, steadily (a ramp, not one step). The rules do the same at a few fixed horizons h:

- the floors: `min_over_time(X[h/F] offset k*h/F)` for k = 0..F-1 (F = the detector's min_floors);
- the trend: `deriv` of the floor over the horizon (a subquery of the floor at the floor's step);
- ramp, not step: every floor above the one before, no single floor-to-floor rise carrying more
  than max_jump_share of the horizon's rise, and the rise at least flat_bytes;
- a leak at h: the trend at least rate_margin x alert_rate(h), on a ramp.

What PromQL cannot carry (said in the README): the slope is least squares over the floors, not
Theil-Sen; there is no noise estimate (min_z) and no confidence; a ramp that stopped is silent
once its newest floor stops rising, not after the detector's plateau test; a sawtooth slower
than a horizon's floors looks like growth to that horizon while it fills; torch's cache-growth
is not told from a leak; and a horizon cannot be shorter than a few scrapes, so the fast rule
(5 MB/s for 10 s) becomes "the rate for 5 minutes" at the shortest horizon.

Sources: the exporter's per-process GPU memory and RSS, and dcgm-exporter's per-GPU framebuffer
(`DCGM_FI_DEV_FB_USED`, MiB) for nodes where no gpuscope exporter answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuscope.core.leak import LeakThresholds

HORIZONS_S = (300, 1800, 7200, 21600)  # 5 min, 30 min, 2 h, 6 h
MIB = 1048576
DCGM_RECORD = "gpuscope:dcgm_gpu_memory_used_bytes"


@dataclass(frozen=True)
class Source:
    name: str  # the alert's name part
    series: str  # the metric (or recorded series) whose floor is judged
    what: str  # for the summary


SOURCES = (
    Source("ProcessGpuMemory", "gpuscope_process_gpu_memory_bytes",
           "PID {{ $labels.pid }} ({{ $labels.command }}) on {{ $labels.node }} GPU{{ $labels.gpu }}"),
    Source("ProcessResidentMemory", "gpuscope_process_resident_memory_bytes",
           "PID {{ $labels.pid }} ({{ $labels.command }}) on {{ $labels.node }} (RSS)"),
    Source("GpuMemory", DCGM_RECORD, "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} (dcgm-exporter)"),
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
    step = duration(horizon_s / floors)
    return f"deriv(min_over_time({series}[{step}])[{duration(horizon_s)}:{step}])"


def ramp_expr(series: str, horizon_s: int, th: LeakThresholds) -> str:
    """The floor rose at every step, no step carried most of it, and it rose by flat_bytes or more."""
    floors = th.min_floors
    width_s = horizon_s // floors
    width = duration(width_s)
    f = [_floor(series, width, (floors - 1 - k) * width_s) for k in range(floors)]  # oldest first
    rise = f"({f[-1]} - {f[0]})"
    parts = [f"{rise} > {th.flat_bytes:g}"]
    for k in range(1, floors):
        jump = f"({f[k]} - {f[k - 1]})"
        parts.append(f"{jump} > 0")
        parts.append(f"{jump} < {th.max_jump_share:g} * {rise}")
    return "\n  and ".join(f"({p})" for p in parts)


def _q(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def _block(text: str, indent: int) -> str:
    pad = " " * indent
    return "|-\n" + "\n".join(pad + line for line in text.splitlines())


def leak_rules(th: LeakThresholds, horizons_s: tuple[int, ...] = HORIZONS_S) -> list[str]:
    out: list[str] = []
    dcgm = (f"DCGM_FI_DEV_FB_USED * {MIB}\n  unless on (Hostname)\n"
            "  label_replace(gpuscope_gpu_memory_used_bytes, \"Hostname\", \"$1\", \"node\", \"(.*)\")")
    out.append(f"      - record: {DCGM_RECORD}\n        expr: {_block(dcgm, 10)}\n")
    for src in SOURCES:
        for h in horizons_s:
            hname = duration(h)
            record = f"gpuscope:{_snake(src.series)}:floor_deriv{hname}"
            out.append(f"      - record: {record}\n        expr: {_q(slope_expr(src.series, h, th.min_floors))}\n")
            threshold = th.rate_margin * th.alert_rate(h)
            expr = f"{record} > {threshold:.6g}\nand\n{ramp_expr(src.series, h, th)}"
            out.append(
                f"      - alert: GpuscopeLeak{src.name}\n"
                f"        expr: {_block(expr, 10)}\n"
                f"        for: {duration(h // th.min_floors)}\n"  # one floor: a ramp seen twice
                f"        labels:\n          severity: warning\n          horizon: {_q(hname)}\n"
                f"        annotations:\n"
                f"          summary: {_q(f'Memory leak: {src.what} grows steadily')}\n"
                f"          description: {_q(_leak_text(hname, threshold))}\n"
            )
    return out


def _snake(series: str) -> str:
    return series.replace("gpuscope:", "").replace("gpuscope_", "")


def _leak_text(hname: str, threshold: float) -> str:
    return (f"Its memory floor (minima over {hname} in slices) rose steadily at {{{{ $value | humanize }}}}B/s "
            f"for {hname}, at or above the leak rate for that long ({threshold / 1e6:.3g} MB/s). "
            "gpuscope --pid {{ $labels.pid }} on the node tells where it comes from.")


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
    (`horizons_s`: the leak test's horizons, each a multiple of min_floors seconds)."""
    head = (
        "# Prometheus rules from `gpuscope rules`: gpuscope's leak test over the floor of memory series\n"
        f"# (alert rate {th.fast_rate / 1e6:g} MB/s for {th.fast_duration_s:g} s ... {th.slow_bytes / 1e9:g} GB over "
        f"{th.slow_window_s / 3600:g} h, never under {th.min_rate / 1e6:g} MB/s),\n"
        "# and the serving classics (P99 jump, TTFT and end-to-end SLO burn).\n"
        "groups:\n"
        "  - name: gpuscope-leak\n    rules:\n"
    )
    serving = "  - name: gpuscope-serving\n    rules:\n"
    return head + "".join(leak_rules(th, horizons_s)) + serving + "".join(serving_rules(ttft_p95_s, e2e_latency_p95_s))
