"""What `gpuscope check` tells: a one-screen text summary, the `gpuscope.check/1` JSON, JUnit XML
(one test case per round and per criterion) and Markdown for a CI job summary or a PR comment.

Function names and file names come from the service (its allocation sites) and the command lines
from the user: every text is made printable (control characters replaced) before it is written to
a terminal, a table cell or XML.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from gpuscope.core.gate.verdict import RESULT_SCHEMA, Baseline, CheckRun, Round, Verdict, label
from gpuscope.core.common.units import format_size

_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
SITES_HEADING = "memory allocated during a round and still held at its end; memray inside the service, through gpuscope's probe"
CHART_SERIES = 4  # charts in the Markdown summary at most (RSS and the first GPUs)
CHART_MIN_SPAN = 0.1


def printable(text: object) -> str:
    return _UNPRINTABLE.sub("?", str(text)).replace("\n", " ").replace("\r", " ")


# -- JSON --------------------------------------------------------------------------------------------


def to_json(run: CheckRun, verdict: Verdict, baseline: Baseline | None, tolerance_pct: float) -> dict:
    """The `gpuscope.check/1` object. Sizes in bytes, times in seconds; null where unknown.

        {"schema": "gpuscope.check/1", "verdict": "pass"|"fail", "command": "... (redacted)",
         "settings": {"mode": "load"|"time", "rounds", "warmup_rounds", "load", "round_s", "settle_s"},
         "tolerance_pct": 3.0, "baseline": {"path", "created", "command", "rounds"} | null,
         "rounds": [{"round": 1..N (0: the reference; below 0: earlier warm-ups), "warmup", "completed",
                     "duration_s", "load_exit", "memory": {"rss" | "gpu<i>": {"floor", "peak"}},
                     "requests", "p95_s", "sites": [{"function", "file", "line", "bytes", "count"}] | null,
                     "note", "growth": {series: floor minus the previous round's},
                     "growth_per_request": {series: ...}, "failed": why this round failed | null}],
         "growth": {series: {"per_round_bytes", "noise_bytes", "uncertainty_bytes", "reference_floor_bytes", "requests_per_round",
                             "per_request_bytes", "allowance_bytes", "baseline": {...the same} | null}},
         "criteria": [{"name": "command" | "load" | "<series>-growth" | "leak" | "sites",
                       "status": "pass" | "fail" | "skipped", "message", "figures": {...}}],
         "sites_grown": [{"function", "file", "line", "bytes_per_round", "baseline_bytes_per_round"}],
         "exit_status": the service's, when it exited | null, "stopped": why the rounds ended early | null,
         "notes": [...]}
    """
    rounds = []
    previous: dict[str, int | None] = {}
    for r in run.rounds:
        growth = {s: _delta(previous.get(s), r.floor(s)) for s in r.memory} if r.number > 0 else {}
        per_request = {s: (g / r.requests if g is not None and r.requests else None) for s, g in growth.items()}
        rounds.append({**r.to_json(), "growth": growth, "growth_per_request": per_request,
                       "failed": verdict.round_failures.get(r.number)})
        if r.completed:
            previous = {s: r.floor(s) for s in r.memory}
    return {
        "schema": RESULT_SCHEMA,
        "verdict": "pass" if verdict.passed else "fail",
        "command": run.command,
        "settings": dict(run.settings),
        "tolerance_pct": tolerance_pct,
        "baseline": None if baseline is None else {
            "path": baseline.path, "created": baseline.created, "command": baseline.command,
            "rounds": len(baseline.judged),
        },
        "rounds": rounds,
        "growth": {
            s: {**g.to_json(), "allowance_bytes": _int(verdict.allowance.get(s)),
                "baseline": verdict.baseline_growth[s].to_json() if s in verdict.baseline_growth else None}
            for s, g in verdict.growth.items()
        },
        "criteria": [c.to_json() for c in verdict.criteria],
        "sites_grown": [g.to_json() for g in verdict.sites],
        "exit_status": run.exit_status,
        "stopped": run.stopped,
        "notes": list(_notes(run)),
    }


# -- text --------------------------------------------------------------------------------------------


def to_text(run: CheckRun, verdict: Verdict, baseline: Baseline | None) -> str:
    failed = len(verdict.failed)
    judged = [c for c in verdict.criteria if c.passed is not None]
    head = "PASS" if verdict.passed else f"FAIL ({failed} of {len(judged)} {'criterion' if len(judged) == 1 else 'criteria'} failed)"
    out = [f"gpuscope check: {head}", f"service: {printable(run.command)}", f"rounds: {printable(_rounds_line(run))}"]
    out.append(f"baseline: {printable(_baseline_line(baseline))}")
    out.append("")
    out += _table(run, verdict) if run.rounds else ["no round ran"]
    out.append("")
    width = max(len(c.name) for c in verdict.criteria)
    for c in verdict.criteria:
        out.append(f"{c.status.upper():7} {c.name:{width}}  {printable(c.message)}")
    if verdict.sites and not verdict.passed:
        out += ["", f"Sites that grew ({SITES_HEADING}):"]
        out += [f"  {format_size(g.excess, sign=True, na='—')}/round  {printable(g.site.function)}  {printable(g.site.where)}"
                f"{'' if not baseline else f'  (baseline {format_size(g.baseline_per_round)}/round)'}"
                for g in verdict.sites]
    notes = list(_notes(run))
    if notes:
        out += ["", "notes:"] + [f"  {printable(n)}" for n in notes]
    return "\n".join(out) + "\n"


def _rows(run: CheckRun, verdict: Verdict) -> list[list[str]]:
    """The rounds table, cell by cell, its header first."""
    series = run.series()
    header = ["round", "time"]
    for s in series:
        header += [f"{label(s)} floor", "growth"]
    header += ["requests", "per request", "P95", ""]
    rows = [header]
    previous: dict[str, int | None] = {}
    for r in run.rounds:
        row = [_round_name(r, run), f"{r.duration_s:.1f} s"]
        per_request = "—"
        for s in series:
            floor = r.floor(s) if r.completed else None
            growth = _delta(previous.get(s), floor) if r.number > 0 else None
            row += [format_size(floor, na="—"), format_size(growth, sign=True, na='—')]
            if s == series[0] and growth is not None and r.requests:
                per_request = format_size(growth / r.requests, sign=True, na='—')
        row += ["—" if r.requests is None else str(r.requests), per_request,
                "—" if r.p95_s is None else f"{r.p95_s:.3f} s"]
        if not r.completed:
            row.append(printable(r.note or "cut short"))
        else:
            row.append("grew too much" if r.number in verdict.round_failures else "")
        rows.append(row)
        if r.completed:
            previous = {s: r.floor(s) for s in r.memory}
    return rows


def _table(run: CheckRun, verdict: Verdict) -> list[str]:
    rows = _rows(run, verdict)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


# -- JUnit XML ---------------------------------------------------------------------------------------


def to_junit(run: CheckRun, verdict: Verdict, baseline: Baseline | None) -> str:
    """JUnit XML: a test case per round (rounds the check did not reach are skipped) and per criterion."""
    cases: list[ET.Element] = []
    planned = _setting_count(run, "rounds")
    reached = {r.number for r in run.rounds}
    for r in run.rounds:
        case = _case("gpuscope.check.rounds", _round_name(r, run), r.duration_s)
        why = verdict.round_failures.get(r.number)
        if why:
            _child(case, "failure", why, type="round")
        ET.SubElement(case, "system-out").text = _xml(_round_figures(r))
        cases.append(case)
    for number in range(1, planned + 1):
        if number not in reached:
            case = _case("gpuscope.check.rounds", f"round {number}", 0.0)
            _child(case, "skipped", f"not run: {run.stopped or 'the check stopped'}")
            cases.append(case)
    for c in verdict.criteria:
        case = _case("gpuscope.check.criteria", c.name, 0.0)
        if c.passed is False:
            detail = c.message
            if c.name.endswith("-growth") or c.name in ("leak", "sites"):
                detail += "".join(f"\n{format_size(g.excess, sign=True, na='—')}/round  {g.site.function}  {g.site.where}" for g in verdict.sites)
            _child(case, "failure", c.message, type="gate", text=detail)
        elif c.passed is None:
            _child(case, "skipped", c.message)
        else:
            ET.SubElement(case, "system-out").text = _xml(c.message)
        cases.append(case)
    failures = sum(1 for c in cases if c.find("failure") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    total_time = f"{sum(r.duration_s for r in run.rounds):.3f}"
    counts: dict[str, str] = {"tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": str(skipped), "time": total_time}
    # junit-10.xsd (Jenkins xUnit) allows no `skipped` on <testsuites>: only on the suite
    root = ET.Element("testsuites", {"name": "gpuscope check", **{k: v for k, v in counts.items() if k != "skipped"}})
    suite = ET.SubElement(root, "testsuite", {"name": "gpuscope check", **counts})
    props = ET.SubElement(suite, "properties")
    for name, value in (("command", run.command), ("baseline", baseline.path if baseline else "none"),
                        ("verdict", "pass" if verdict.passed else "fail")):
        ET.SubElement(props, "property", name=name, value=_xml(value))
    suite.extend(cases)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _case(classname: str, name: str, seconds: float) -> ET.Element:
    return ET.Element("testcase", classname=classname, name=_xml(name), time=f"{seconds:.3f}")


def _child(case: ET.Element, tag: str, message: str, *, type: str | None = None, text: str | None = None) -> None:  # noqa: A002
    attrs = {"message": _xml(message)}
    if type:
        attrs["type"] = type
    element = ET.SubElement(case, tag, attrs)
    if text:
        element.text = _xml(text)


def _xml(text: object) -> str:
    """XML 1.0 has no place for most control characters, even escaped."""
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "?", str(text))


def _round_figures(r: Round) -> str:
    parts = [f"{label(s)} floor {format_size(m.floor)}, peak {format_size(m.peak)}" for s, m in r.memory.items()]
    if r.requests is not None:
        parts.append(f"{r.requests} requests")
    if r.p95_s is not None:
        parts.append(f"P95 {r.p95_s:.3f} s")
    if r.load_exit is not None:
        parts.append(f"load exit status {r.load_exit}")
    lines = ["; ".join(parts)]
    if r.sites:
        lines.append(f"sites ({SITES_HEADING}):")
        lines += [f"  {format_size(s.bytes)}  {s.function}  {s.where}" for s in r.sites[:5]]
    if r.note:
        lines.append(f"note: {r.note}")
    return "\n".join(lines)


# -- Markdown ----------------------------------------------------------------------------------------


def to_markdown(run: CheckRun, verdict: Verdict, baseline: Baseline | None) -> str:
    """For a job summary or a PR comment: the verdict, the criteria, the rounds, the sites, a chart."""
    word = "PASS" if verdict.passed else "FAIL"
    out = [f"## gpuscope check: **{word}**", ""]
    out.append(f"Service `{_code(run.command)}`, {_md(_rounds_line(run))}; baseline: {_md(_baseline_line(baseline))}.")
    out += ["", "| criterion | result | detail |", "|---|---|---|"]
    for c in verdict.criteria:
        result = {"pass": "pass", "fail": "**FAIL**", "skipped": "skipped"}[c.status]
        out.append(f"| {c.name} | {result} | {_md(c.message)} |")
    out += [""]
    rows = _rows(run, verdict) if run.rounds else [["no round ran"]]
    for i, row in enumerate(rows):
        out.append("| " + " | ".join(_md(cell) for cell in row) + " |")
        if i == 0:
            out.append("|" + "---|" * len(row))
    out.append("")
    if verdict.sites and not verdict.passed:
        out += ["### Sites that grew", "", f"{SITES_HEADING.capitalize()}, per round:", "",
                "| function | where | per round | baseline |", "|---|---|---|---|"]
        out += [f"| `{_code(g.site.function)}` | `{_code(g.site.where)}` | {format_size(g.excess, sign=True, na='—')} | "
                f"{format_size(g.baseline_per_round)} |" for g in verdict.sites]
        out.append("")
    charts = _charts(run)
    if charts:
        out += ["### Memory floor per round", ""] + charts
    notes = list(_notes(run))
    if notes:
        out += ["Notes:", ""] + [f"- {_md(n)}" for n in notes] + [""]
    return "\n".join(out)


def _charts(run: CheckRun) -> list[str]:
    from gpuscope.core.session.report import text_chart  # noqa: PLC0415 - plotext only for the Markdown summary

    out: list[str] = []
    for series in run.series()[:CHART_SERIES]:
        floors = ((r.number, r.floor(series)) for r in run.rounds if r.completed and r.number >= 0)
        points = [(float(number), floor / 2**20) for number, floor in floors if floor is not None]
        if len(points) < 2:
            continue
        # A flat service must look flat: the axis spans at least CHART_MIN_SPAN of the floor.
        low, high = min(p[1] for p in points), max(p[1] for p in points)
        pad = max(0.0, CHART_MIN_SPAN * high - (high - low)) / 2
        chart = text_chart(points, xlabel="round (0: the reference)", ylim=(max(0.0, low - pad), high + pad),
                           xticks=[p[0] for p in points])
        out += [f"{label(series)} floor (MiB) by round:", "", "```text", chart, "```", ""]
    return out


def _md(text: object) -> str:
    return printable(text).replace("|", "\\|")


def _code(text: object) -> str:
    return printable(text).replace("`", "'").replace("|", "\\|")


# -- shared words ------------------------------------------------------------------------------------


def _setting_count(run: CheckRun, key: str) -> int:
    value = run.settings.get(key)
    return value if isinstance(value, int) else 0


def _rounds_line(run: CheckRun) -> str:
    s = run.settings
    warm = _setting_count(run, "warmup_rounds")
    head = f"{s.get('rounds')} (+{warm} warm-up)" if warm else f"{s.get('rounds')} (no warm-up)"
    if s.get("load"):
        each = f"each one run of the load command `{s['load']}`"
    else:
        each = f"each {s.get('round_s')} s of the service's own work"
    return f"{head}, {each}, floor over the last {s.get('settle_s')} s"


def _baseline_line(baseline: Baseline | None) -> str:
    if baseline is None:
        return "none (compared with a service that does not grow)"
    when = f", {baseline.created}" if baseline.created else ""
    return f"{baseline.path} ({len(baseline.judged)} rounds{when})"


def _round_name(r: Round, run: CheckRun) -> str:
    if r.number > 0:
        return f"round {r.number}"
    if r.number == 0 and not run.settings.get("warmup_rounds"):
        return "round 0 (idle)"
    return f"round {r.number} (warm-up)"


def _notes(run: CheckRun) -> Sequence[str]:
    notes = list(run.notes)
    for r in run.rounds:
        if r.note and r.completed:
            notes.append(r.note)
    return tuple(dict.fromkeys(notes))


def _delta(before: int | None, now: int | None) -> int | None:
    return None if before is None or now is None else now - before


def _int(x: float | None) -> int | None:
    return None if x is None else round(x)
