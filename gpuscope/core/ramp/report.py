"""A ramp's result as text, the `gpuscope.ramp/1` JSON, Markdown with a chart, and JUnit XML.

Every figure is the result's own (gpuscope.core.ramp.result): these only say it. The chart is
text (plotext, no colour), so the Markdown pastes into any ticket or CI job summary as it is.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET

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


def _step_cells(s: Step) -> list[str]:
    service = s.service
    return [str(s.number), f"{s.rate:g}", f"{s.throughput_rps:.2f}", format_latency(s.client_p99_s, na="N/A"),
            format_latency(service.e2e_latency_p99_s, na="N/A") if service else "N/A",
            f"{s.error_rate:.1%}" if s.error_rate is not None else "N/A",
            f"{service.queue_depth:.0f}" if service and service.queue_depth is not None else "N/A",
            format_bytes(s.memory_per_request_bytes, sign=True) if s.memory_per_request_bytes is not None else "N/A"]


def _step_row(s: Step) -> str:
    widths = (4, 8, 8, 9, 9, 7, 6, 9)
    return " ".join(f"{c:>{w}}" for c, w in zip(_step_cells(s), widths)) + ("  break" if s.broke else "")


STEP_HEADER = f"{'step':>4} {'asked/s':>8} {'served/s':>8} {'P99 cli':>9} {'P99 svc':>9} {'errors':>7} {'queue':>6} {'mem/req':>9}"


def to_text(result: RampResult) -> str:
    lines = [f"gpuscope ramp of {printable(result.target)} ({result.mode}): {headline(result)}",
             f"stopped: {result.stop_reason}" if result.knee is not None else "",
             f"the stop rule judged the {result.p99_source}'s P99 "
             f"({'the service histograms' if result.p99_source == 'service' else 'measured by gpuscope'})"]
    if result.knee is not None and result.knee.moved:
        lines.append("at the knee: " + "; ".join(_moved(m) for m in result.knee.moved))
    lines += memory_lines(result)
    lines += ["", STEP_HEADER, *(_step_row(s) for s in result.steps)]
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
    lines += ["## Steps", "", "| step | asked/s | served/s | P99 client | P99 service | errors | queue | memory/request |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in result.steps:
        broke = " (break)" if s.broke else ""
        lines.append("| " + " | ".join(md_text(c) for c in _step_cells(s)) + broke + " |")
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
        ET.SubElement(case, "system-out").text = _xml(_step_row(s))
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
