"""A ramp's result as text, the `gpuscope.ramp/1` JSON, Markdown with a chart, and JUnit XML.

Every figure is the result's own (gpuscope.core.ramp.result): these only say it. The chart is
text (plotext, no colour), so the Markdown pastes into any ticket or CI job summary as it is.
The step table (text and Markdown alike) has a column only where some step has its figure: no
TTFT column for a service that exports none; a step without a figure shows "-".
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuscope.core.common.markdown import md_block, md_code, md_text
from gpuscope.core.common.printable import printable
from gpuscope.core.common.units import format_bytes, format_latency
from gpuscope.core.ramp.result import Moved, RampResult, Step

CHART_WIDTH = 100
CHART_HEIGHT = 18
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def to_json(result: RampResult) -> str:
    return json.dumps(result.to_json())


def headline(result: RampResult) -> str:
    knee = result.knee
    if knee is None:
        return f"no knee found: {result.stop_reason}"
    how = "what it served, saturated" if knee.method == "saturated" else "between the last step that held and this one"
    return (f"critical throughput {knee.critical_rps:.2f} ± {knee.uncertainty_rps:.2f} requests/s "
            f"(step {knee.step}, {knee.rate:g} requests/s asked; {how})")


def _moved(m: Moved) -> str:
    def say(v: float | None) -> str:
        if v is None:
            return "N/A"
        if m.unit == "s":
            return format_latency(v)
        if m.unit == "bytes":
            return format_bytes(v)
        if m.unit == "fraction":
            return f"{v:.1%}"
        return f"{v:.1f}"

    return f"{m.name} {say(m.before)} -> {say(m.at)}"


def memory_lines(result: RampResult) -> list[str]:
    mem = result.memory
    lines = []
    if mem.per_request_bytes is not None:
        lines.append(f"memory kept per request: {format_bytes(mem.per_request_bytes, sign=True)} (RSS of the service)")
    if mem.per_turn_bytes is not None:
        lines.append(f"memory kept per conversation turn: {format_bytes(mem.per_turn_bytes, sign=True)}")
    if mem.gpu_per_request_bytes is not None:
        lines.append(f"GPU memory kept per request: {format_bytes(mem.gpu_per_request_bytes, sign=True)}")
    for s in mem.sites[:5]:
        per = f"{format_bytes(s.bytes_per_request)}/request, " if s.bytes_per_request is not None else ""
        lines.append(f"  kept by {printable(s.function)} ({printable(s.file)}:{s.line}): {per}{format_bytes(s.bytes)} "
                     f"in {s.count} allocations")
        owner = next((k for k, f in enumerate(s.stack) if f == (s.function, s.file, s.line)), -1)
        callers = s.stack[owner + 1:]
        if callers:
            lines.append("    called from " + " < ".join(f"{printable(f)} ({printable(os.path.basename(file))}:{line})"
                                                      for f, file, line in callers[:4]))
    if mem.note:
        lines.append(f"allocation sites: {mem.note}")
    return lines


@dataclass(frozen=True)
class _Column:
    """A column of the step table: its header as text and in Markdown, its width in the text, and
    the step's figure as shown (None: the step has none, shown as "-")."""

    text: str
    markdown: str
    width: int
    cell: Callable[[Step], str | None]
    always: bool = False  # shown even when no step has a figure


def _signal(name: str, say: Callable[[float], str]) -> Callable[[Step], str | None]:
    def cell(s: Step) -> str | None:
        value = s.service.get(name) if s.service is not None else None
        return None if value is None else say(value)
    return cell


def _figure(value: Callable[[Step], float | None], say: Callable[[float], str]) -> Callable[[Step], str | None]:
    def cell(s: Step) -> str | None:
        v = value(s)
        return None if v is None else say(v)
    return cell


def _signed_bytes(v: float) -> str:
    return format_bytes(v, sign=True)


STEP_COLUMNS = (
    _Column("step", "step", 4, lambda s: str(s.number), always=True),
    _Column("asked/s", "asked/s", 7, lambda s: f"{s.rate:g}", always=True),
    _Column("served/s", "served/s", 8, lambda s: f"{s.throughput_rps:.2f}", always=True),
    _Column("P95 cli", "P95 client", 7, _figure(lambda s: s.client_p95_s, format_latency)),
    _Column("P99 cli", "P99 client", 7, _figure(lambda s: s.client_p99_s, format_latency)),
    _Column("P95 svc", "P95 service", 7, _signal("e2e_latency_p95_s", format_latency)),
    _Column("P99 svc", "P99 service", 7, _signal("e2e_latency_p99_s", format_latency)),
    _Column("TTFT P95", "TTFT P95", 8, _signal("ttft_p95_s", format_latency)),
    _Column("tok/s", "tokens/s", 7, _figure(lambda s: s.generated_tokens_per_s, lambda v: f"{v:.1f}")),
    _Column("errors", "errors", 6, _figure(lambda s: s.error_rate, lambda v: f"{v:.1%}"), always=True),
    _Column("queue", "queue", 5, _signal("queue_depth", lambda v: f"{v:.0f}")),
    _Column("mem/req", "memory/request", 7, _figure(lambda s: s.memory_per_request_bytes, _signed_bytes)),
    _Column("GPU grown", "GPU memory grown", 9, _figure(lambda s: s.gpu_growth_bytes, _signed_bytes)),
)


def step_columns(steps: Sequence[Step]) -> tuple[_Column, ...]:
    """The columns some step has a figure in (a column no step has says nothing)."""
    return tuple(c for c in STEP_COLUMNS if c.always or any(c.cell(s) is not None for s in steps))


def _step_row(s: Step, columns: Sequence[_Column]) -> str:
    cells = (f"{c.cell(s) or '-':>{c.width}}" for c in columns)
    return "  ".join(cells) + ("  break" if s.broke else "")


def step_table(steps: Sequence[Step]) -> list[str]:
    """The steps as text: a header, then a line per step."""
    columns = step_columns(steps)
    return ["  ".join(f"{c.text:>{c.width}}" for c in columns), *(_step_row(s, columns) for s in steps)]


def to_text(result: RampResult) -> str:
    lines = [f"gpuscope ramp of {printable(result.target)} ({result.mode}): {headline(result)}",
             f"stopped: {result.stop_reason}" if result.knee is not None else "",
             f"the stop rule judged the {result.p99_source}'s P99 "
             f"({'the service histograms' if result.p99_source == 'service' else 'measured by gpuscope'})"]
    if result.knee is not None and result.knee.moved:
        lines.append("at the knee: " + "; ".join(_moved(m) for m in result.knee.moved))
    lines += memory_lines(result)
    lines += ["", *step_table(result.steps)]
    lines += [f"note: {printable(n)}" for n in result.notes]
    return "\n".join(line for i, line in enumerate(lines) if line or i > 2) + "\n"


def chart(result: RampResult) -> str:
    """P99 (the judged one) and served throughput over the ramp, as text."""
    import plotext as plt

    points = [(i.offset_s + i.duration_s, i.p99_s * 1000) for i in result.intervals if i.p99_s is not None]
    served = [(i.offset_s + i.duration_s, i.throughput_rps) for i in result.intervals]
    if not points and not served:
        return ""
    plt.clear_figure()
    plt.plotsize(CHART_WIDTH, CHART_HEIGHT)
    plt.theme("clear")
    if points:
        plt.plot([p[0] for p in points], [p[1] for p in points], marker="braille", label="P99 ms")
    if served:
        plt.plot([p[0] for p in served], [p[1] for p in served], marker="dot", label="served/s", yside="right")
    plt.xlabel("seconds into the ramp")
    text = _ANSI.sub("", plt.build())
    plt.clear_figure()
    return text


def to_markdown(result: RampResult) -> str:
    lines = [f"# Load ramp of {md_code(result.target)}", "", f"**{md_text(headline(result))}**", ""]
    if result.knee is not None:
        lines += [f"Stopped: {md_text(result.stop_reason)}.", ""]
        if result.knee.moved:
            lines += ["What moved at the knee (the step before it, then the knee's):", ""]
            lines += [f"- {md_text(_moved(m))}" for m in result.knee.moved]
            lines.append("")
    lines += [f"The stop rule judged the {result.p99_source}'s P99.", ""]
    memory = memory_lines(result)
    if memory:
        lines += ["## Memory", ""] + [f"- {md_text(m.strip())}" for m in memory] + [""]
    text = chart(result)
    if text:
        lines += ["## P99 and throughput", "", *md_block(text.rstrip("\n").split("\n")), ""]
    columns = step_columns(result.steps)
    lines += ["## Steps", "", "| " + " | ".join(c.markdown for c in columns) + " |", "|" + "---:|" * len(columns)]
    for s in result.steps:
        broke = " (break)" if s.broke else ""
        lines.append("| " + " | ".join(md_text(c.cell(s) or "-") for c in columns) + broke + " |")
    if result.notes:
        lines += ["", *(f"- {md_text(n)}" for n in result.notes)]
    return "\n".join(lines) + "\n"


def to_junit(result: RampResult) -> str:
    """A test case per step (a failure where the P99 broke or errors passed the limit) and one for the knee."""
    cases = []
    for s in result.steps:
        case = ET.Element("testcase", classname="gpuscope.ramp.steps", name=f"step {s.number} at {s.rate:g} requests/s",
                          time=f"{s.duration_s:.3f}")
        if result.knee is not None and s.number == result.knee.step:
            ET.SubElement(case, "failure", message=_xml(result.stop_reason), type=result.stopped_by)
        ET.SubElement(case, "system-out").text = _xml("\n".join(step_table([s])))
        cases.append(case)
    knee = ET.Element("testcase", classname="gpuscope.ramp", name="knee", time=f"{result.duration_s:.3f}")
    if result.knee is None:
        ET.SubElement(knee, "skipped", message=_xml(f"no knee found: {result.stop_reason}"))
    else:
        ET.SubElement(knee, "system-out").text = _xml(headline(result) + "\n" + "\n".join(memory_lines(result)))
    cases.append(knee)
    failures = sum(1 for c in cases if c.find("failure") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    attrs = {"name": "gpuscope ramp", "tests": str(len(cases)), "failures": str(failures), "errors": "0",
             "skipped": str(skipped), "time": f"{result.duration_s:.3f}"}
    root = ET.Element("testsuites", attrs)
    suite = ET.SubElement(root, "testsuite", attrs)
    props = ET.SubElement(suite, "properties")
    for name, value in (("target", result.target), ("stopped_by", result.stopped_by),
                        ("critical_rps", f"{result.knee.critical_rps:.4f}" if result.knee else "none")):
        ET.SubElement(props, "property", name=name, value=_xml(value))
    suite.extend(cases)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _xml(text: object) -> str:
    """XML 1.0 has no place for most control characters, even escaped."""
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "?", printable(str(text), newlines=True))
