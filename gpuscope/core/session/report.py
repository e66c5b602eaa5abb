"""The incident report: a recording (journal or snapshot) as Markdown for a ticket.

The verdict and the seven steps are the most informative diagnosis recorded in the session for
its subject (one that named the culprit beats a later one whose code-path step was skipped); a
session in which nobody ran one gets the diagnosis of its likeliest subject (the process it was
recorded for, else the alert's process, else the attached one, else the fastest grower), computed
from the recorded series the way the wizard would, with the best allocation sites recorded. Charts are text (plotext), so the report pastes into any ticket as it is.

A recording holds other people's text (command lines, users, function names, label values) and
may have been crafted, so everything from it is made printable and escaped for Markdown: plain
text gets its Markdown characters backslash-escaped, code spans and blocks get a fence longer than
any run of backticks inside them (CommonMark's rule), table cells get their `|` escaped.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace

from gpuscope.core.diagnosis.steps import NAME_CHARS, Diagnosis, diagnose
from gpuscope.core.diagnosis.evidence import VERDICT, evidence_lines
from gpuscope.core.leak import LeakThresholds
from gpuscope.core.common.markdown import md_block, md_code, md_text
from gpuscope.core.node.command_display import short_command
from gpuscope.core.node.model import Frame
from gpuscope.core.diagnosis.recorded import evidence_of, with_attribution
from gpuscope.core.session.recording import Recording
from gpuscope.core.common.units import format_bytes, format_duration, format_rate
from gpuscope.core.target.stacks import OWN

CHART_WIDTH = 100
CHART_HEIGHT = 16
TOP_PROCESSES = 10
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
STATUS_WORD = {"ok": "✔ ok", "warn": "▲ warn", "alert": "✖ ALERT", "skipped": "skipped"}


def subject_pid(recording: Recording, frame: Frame) -> int | None:
    """Whom the session was about: the last diagnosed, the one it was recorded for, the alert's,
    the attached, the fastest grower."""
    diagnosed = recording.findings.subjects()
    if diagnosed:
        return diagnosed[-1]
    if recording.subject is not None:  # asked for by name (--pid): no alert elsewhere overrides it
        return recording.subject
    for alert in frame.alerts:
        pid = alert.subject(frame.processes)
        if pid is not None:
            return pid
    if frame.focus is not None:
        return frame.focus.pid
    growing = [r for r in frame.processes if r.growth_bytes_per_s]
    if growing:
        return max(growing, key=lambda r: r.growth_bytes_per_s or 0.0).pid
    return None


def diagnosis_of(recording: Recording, pid: int, thresholds: LeakThresholds) -> tuple[Diagnosis, bool]:
    """(the diagnosis, whether it was recorded) for `pid` at the end of the recording."""
    recorded = recording.findings.best_diagnosis(pid)
    if recorded is not None:
        return recorded, True
    frame = recording.frame(len(recording) - 1)
    span = recording.end - recording.start + 1.0
    evidence = evidence_of(pid, span, frame, frame.time, recording.history, recording.device_history)
    evidence = with_attribution(replace(
        evidence,
        serving_start=next((s for s in recording.serving if s.ok), None),
        serving_end=recording.serving[-1] if recording.serving else None,
    ), recording.findings.best_attribution(pid))
    return diagnose(evidence, thresholds), False


def build_report(recording: Recording, thresholds: LeakThresholds = LeakThresholds()) -> str:
    """The report. Its moments are clock times, never ages ("9 min ago"): a report is read later
    than it is written."""
    last = recording.frame(len(recording) - 1)
    out: list[str] = []
    start, end = recording.start, recording.end
    out += [
        f"# gpuscope incident report: {md_text(recording.hostname)}",
        "",
        f"- recorded: {_when(start)} to {_when(end)} ({format_duration(end - start)}, {len(recording)} samples)",
        f"- from: {md_text(recording.kind)} {md_code(recording.path.name)}, "
        f"gpuscope {md_text(recording.meta.get('gpuscope_version', '?'))}",
    ]
    if recording.damage:
        out.append(f"- note: {md_text(recording.damage)}")
    out.append("")

    pid = subject_pid(recording, last)
    if pid is None:
        out += ["## Verdict", "", "No process to diagnose: nothing grew and no alert was raised.", ""]
    else:
        d, recorded = diagnosis_of(recording, pid, thresholds)
        out += _diagnosis(d, recorded, _code_path(recording, pid))
        out += _chart_section(recording, pid, end)
        out += _suspects(recording, d, pid)
    out += _devices(recording, last)
    out += _processes(last, pid)
    out += _service(recording)
    return "\n".join(out).rstrip() + "\n"


def _code_path(recording: Recording, pid: int) -> str | None:
    """Where the process was in the stack dump recorded of it (its busiest thread's innermost frame
    of its own code), for a report whose allocation sites were not looked for; None without a dump."""
    dump = recording.findings.latest("stacks", pid)
    if dump is None or not dump.threads:
        return None
    thread = max(dump.threads, key=lambda t: (t.state != "idle", t.owns_gil, bool(t.frames)))
    frame = next((f for f in thread.frames if f.kind == OWN), thread.frames[0] if thread.frames else None)
    if frame is None:
        return None
    return (f"Code path recorded: {md_code(frame.function)} ({md_code(f'{frame.file}:{frame.line}')}) in thread "
            f"{md_text(thread.name or thread.thread_id)} ({md_text(thread.state)}), from the py-spy dump at "
            f"{_when(dump.time)}: where the process was, not what allocated (its stacks are below).")


def _diagnosis(d: Diagnosis, recorded: bool, code_path: str | None = None) -> list[str]:
    evidence = evidence_lines(d)
    how = "as diagnosed during the session" if recorded else "computed from the recording"
    growth = format_rate(d.memory.growth_bytes_per_s, na="-")
    # What the process runs first, where it runs, the interpreter last (the console's name for it)
    name = f" ({md_code(short_command(d.command.strip(), NAME_CHARS, d.runs_in))})" if d.command.strip() else ""
    out = [
        "## Verdict",
        "",
        f"**{md_text(d.verdict)}** ({md_text(d.pattern)}) in PID {d.pid}{name}: {md_text(d.memory_source.upper())} memory "
        f"{format_bytes(d.memory.start_bytes)} → {format_bytes(d.memory.end_bytes)} over {d.duration_s:.0f} s, "
        f"{growth} MB/s ({how}).",
        "",
        *evidence_block(evidence[VERDICT]),
        "",
        f"Command: {md_code(d.command.strip(), empty='not known')}",
        *(["", f"Runs in: {md_code(d.runs_in)} (its systemd unit or container)"] if d.runs_in else []),
        "",
        "## The seven steps",
        "",
    ]
    for step in d.steps:
        out.append(f"### {step.number}. {md_text(step.title)} — {md_text(STATUS_WORD.get(step.status, step.status))}")
        out.append("")
        out.append(md_text(step.finding, line_start=True))
        out += evidence_block(evidence[step.number], heading="")
        if step.next:
            out.append("")
            out.append(f"Next: {md_text(step.next)}")
        if step.number == 7 and step.status == "skipped" and code_path is not None:
            out += ["", code_path]
        out.append("")
    return out


def evidence_block(lines: tuple[str, ...], heading: str = "Evidence:") -> list[str]:
    """Evidence lines as a Markdown list (under `heading`), or nothing."""
    if not lines:
        return []
    return [*([heading] if heading else []), *(f"- {md_text(line)}" for line in lines)]


def _chart_section(recording: Recording, pid: int, end: float) -> list[str]:
    series = recording.history(pid, end - recording.start + 1.0, end)
    if series is None or len(series.ages) < 2:
        return []
    out = [f"## Memory of PID {pid}", ""]
    # One chart per kind of memory: GPU memory in GiB and RSS in MiB share no useful scale.
    for name, values in (("GPU memory", series.gpu_bytes), ("RSS", series.rss_bytes)):
        points = [(-age, v / 2**20) for age, v in zip(series.ages, values) if v is not None]
        if len(points) >= 2:
            out += [f"{name} (MiB):", "", *md_block(text_chart(points).splitlines()), ""]
    return out


def text_chart(points: list[tuple[float, float]], xlabel: str = "seconds before the end of the recording", *,
               ylim: tuple[float, float] | None = None, xticks: list[float] | None = None) -> str:
    """(x, value) points as a plotext chart without colour; x is seconds before the end by default."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(CHART_WIDTH, CHART_HEIGHT)
    plt.theme("clear")
    plt.plot([p[0] for p in points], [p[1] for p in points], marker="braille")
    if ylim is not None:
        plt.ylim(*ylim)
    if xticks is not None:
        plt.xticks(xticks)
    plt.xlabel(xlabel)
    text = _ANSI.sub("", plt.build())
    plt.clear_figure()
    return "\n".join(line.rstrip() for line in text.splitlines())


def _suspects(recording: Recording, d: Diagnosis, pid: int) -> list[str]:
    out: list[str] = []
    if d.suspects:
        out += ["## Suspects (the code that allocated the memory that stayed)", "",
                "| # | function | where | bytes | share | method |", "|---|---|---|---|---|---|"]
        for i, s in enumerate(d.suspects[:10], start=1):
            size = format_bytes(s.bytes) if s.bytes is not None else "?"
            out.append(f"| {i} | {md_code(s.function, in_table=True)} | {md_text(f'{s.file}:{s.line}')} | {size} "
                       f"| {s.share * 100:.0f}% | {md_text(s.method)} |")
        out.append("")
        for i, s in enumerate(d.suspects[:3], start=1):
            if s.stack:
                out += [f"Stack of suspect {i} (innermost first):", ""]
                out += md_block([f"{f.function}  {f.file}:{f.line}" for f in s.stack[:20]])
                out += [""]
    dump = recording.findings.latest("stacks", pid)
    if dump is not None:
        out += [f"## Stacks of PID {pid} at {_when(dump.time)} ({md_text(dump.mode)} py-spy dump)", ""]
        lines = []
        for thread in dump.threads:
            lines.append(f"thread {thread.name or thread.thread_id} ({thread.state})")
            lines += [f"    {f.function}  {f.file}:{f.line}" for f in thread.frames[:15]]
        out += [*md_block(lines), ""]
    return out


def _devices(recording: Recording, last: Frame) -> list[str]:
    if last.nvml.status is not None:
        return ["## GPUs", "", f"No GPU data: {md_text(last.nvml.status)}", ""]
    out = ["## GPUs", "", "| GPU | name | used at start | used at end | total |", "|---|---|---|---|---|"]
    for d in last.nvml.devices:
        times, used = recording.devices.get(d.index, ([], []))
        first = next((u for u in used if u is not None), None)
        out.append(f"| {d.index} | {md_text(d.name)} | {format_bytes(first)} | {format_bytes(d.memory_used)} | {format_bytes(d.memory_total)} |")
    return out + [""]


def _processes(last: Frame, subject: int | None) -> list[str]:
    """The largest processes at the end, and the report's subject wherever it ranks."""
    ranked = sorted(last.processes, key=lambda r: -((r.gpu_memory_bytes or 0) + (r.rss_bytes or 0)))
    rows = ranked[:TOP_PROCESSES] + [r for r in ranked[TOP_PROCESSES:] if r.pid == subject]
    out = ["## Processes at the end (largest first, and the process this report is about)", "",
           "| PID | user | GPU | GPU memory | RSS | growth MB/s | runs in | command |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gpu = "-" if r.gpu is None else str(r.gpu)
        command = r.command.strip()
        command = command if len(command) <= 80 else command[:79] + "…"
        out.append(
            f"| {r.pid} | {md_text(r.user or '?')} | {gpu} | {format_bytes(r.gpu_memory_bytes)} | {format_bytes(r.rss_bytes)} "
            f"| {format_rate(r.growth_bytes_per_s, na='-')} | {md_code(r.runs_in, in_table=True) if r.runs_in else '-'} "
            f"| {md_code(command, in_table=True)} |"
        )
    return out + [""]


def _service(recording: Recording) -> list[str]:
    good = [s for s in recording.serving if s.ok]
    if not good:
        if recording.serving:
            return ["## Service", "", f"No serving signals: {md_text(recording.serving[-1].state)}", ""]
        return []
    first, last = good[0], good[-1]
    out = [f"## Service ({md_text(last.profile or 'unknown profile')}, {md_text(last.source)} of {md_text(last.target)})", ""]
    jump = next((s.p99_jump for s in reversed(recording.serving) if s.p99_jump is not None), None)
    if jump is not None:  # as the serving source found it during the session
        out += [f"**{md_text(jump.describe())}**", ""]
    out += ["| signal | at start | at end |", "|---|---|---|"]
    for name, value in last.signals.to_json().items():
        before = first.signals.get(name)
        if value is None and before is None:
            continue
        out.append(f"| {md_text(name)} | {_number(before)} | {_number(value)} |")
    if last.stages:
        out += ["", "| stage | p95 s | share |", "|---|---|---|"]
        for s in last.stages:
            share = "-" if s.share is None else f"{s.share * 100:.0f}%"
            out.append(f"| {md_text(s.name)} | {_number(s.p95_s)} | {share} |")
    return out + [""]


def _number(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))

