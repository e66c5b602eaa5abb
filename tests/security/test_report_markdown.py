"""The incident report stays well-formed Markdown whatever a recording holds.

A recording carries other people's text (and may have been crafted): backticks that would close a
code span or a fenced block, pipes that would split a table cell, links, HTML, emphasis, escape
sequences. The report is parsed back with a CommonMark parser (markdown-it, GFM tables on) and
must have exactly the structure gpuscope wrote: its headings, its tables' cells, its code spans
holding the text that was recorded, no link, no HTML, no control character.
"""

from __future__ import annotations

import unicodedata
from dataclasses import replace

import pytest
from markdown_it import MarkdownIt

from gpuscope.core.diagnosis.attribution import Attribution, Rung
from gpuscope.core.session.format import session_meta
from gpuscope.core.session.journal import Journal
from gpuscope.core.node.model import Device
from gpuscope.core.common.printable import printable
from gpuscope.core.session.recording import open_recording
from gpuscope.core.common.markdown import md_block, md_code, md_text
from gpuscope.core.session.report import build_report
from gpuscope.core.serving.model import ServingSnapshot, Signals, StageStats
from gpuscope.core.target.stacks import StackDump, StackFrame, Suspect, ThreadStack

from frames import T0, frame, rows

OSC_TITLE = "\x1b]0;pwned\x07"
COMMAND = (f"run ``` `x` | y {OSC_TITLE} [link](http://evil.example) <img src=x onerror=alert(1)> "
           "*bold* _u_ $x$ ~~s~~ &amp; # not a heading")
RUNS_IN = f"a|b`{OSC_TITLE}.service"  # a recording may say anything there
PARSER = MarkdownIt("commonmark").enable("table")


def tokens(markdown: str) -> list:
    out = []
    for token in PARSER.parse(markdown):
        out.append(token)
        out += token.children or []
    return out


def recording(tmp_path, command: str, name: str = "session.gpuscope"):
    """A recorded session of PID 4242 growing, every text field of it hostile."""
    path = tmp_path / name
    journal = Journal(path, meta=session_meta("journal", pid=4242))
    base = frame(
        hostname=f"node`{OSC_TITLE}",
        chart=None,
        focus=replace(frame().focus, command=command, runs_in=RUNS_IN),
        nvml=replace(frame().nvml, devices=(Device(0, "GPU *x* | y", memory_used=2**30, memory_total=2**34),)),
    )
    for i in range(30):
        procs = tuple(replace(r, command=command, user="ev|l`", runs_in=RUNS_IN, rss_bytes=2**30 + i * 8 * 2**20)
                      if r.pid == 4242 else r
                      for r in rows())
        journal.frame(replace(base, time=T0 + i, processes=procs))
        journal.serving(ServingSnapshot(
            time=T0 + i, source="scrape", target="http://h/metrics", profile="rag", window_s=30.0,
            signals=Signals(e2e_latency_p95_s=0.2), stages=(StageStats("ret|riever `x`", 0.1, 0.2, 0.3, 1.0),),
            as_of=T0 + i,
        ))
    fence_line = StackFrame("```", "/srv/b.py", 9)
    journal.event("allocations", Attribution(4242, (
        Suspect("grow`er|x", "/srv/b.py", 9, 2**20, 1.0, "memray", stack=(fence_line, StackFrame("main", "/srv/b.py", 1))),
    ), (Rung("memray", "used", "ok"),), "memray", "high"), t=T0 + 25)
    journal.event("stacks", StackDump(4242, T0 + 20, "blocking", False, (
        ThreadStack(1, "Main`Thread", 11, True, True, (StackFrame("fn```\n## forged heading", "/srv/a.py", 3),)),
    )), t=T0 + 20)
    journal.close()
    return open_recording(path)


def test_a_hostile_recording_makes_a_well_formed_report(tmp_path):
    report = build_report(recording(tmp_path, COMMAND))
    assert [c for c in report if unicodedata.category(c) in ("Cc", "Cf", "Cs") and c != "\n"] == []
    parsed = tokens(report)
    assert not [t for t in parsed if t.type in ("html_inline", "html_block", "link_open", "image")]
    headings = [_shown(parsed[i + 1]) for i, t in enumerate(parsed) if t.type == "heading_open"]
    assert headings[0] == "gpuscope incident report: node`␛]0;pwned␇"
    assert "forged heading" not in " ".join(headings) and "not a heading" not in " ".join(headings)
    assert [h for h in headings if h.startswith(("Verdict", "The seven steps", "Stacks of", "GPUs", "Processes", "Service"))]
    shown = printable(COMMAND)
    spans = [t.content for t in parsed if t.type == "code_inline"]
    assert shown in spans  # "Command: ..." holds the whole command line, backticks and all
    assert shown[:79] + "…" in spans  # and so does its table cell, pipe included

    table_rows = _table_rows(parsed)
    process_row = next(r for r in table_rows if r[0] == "4242")
    assert len(process_row) == 8 and process_row[1] == "ev|l`" and process_row[6] == printable(RUNS_IN)
    gpu_row = next(r for r in table_rows if r[0] == "0" and len(r) == 5)
    assert gpu_row[1] == "GPU *x* | y"
    assert ["ret|riever `x`", "0.2", "100%"] in table_rows
    fences = [t.content for t in parsed if t.type == "fence"]
    assert any("fn```␊## forged heading  /srv/a.py:3" in f for f in fences)
    assert "```  /srv/b.py:9\nmain  /srv/b.py:1\n" in fences  # the suspect's stack, whole, in one block
    suspect_row = next(r for r in table_rows if r[0] == "1")
    assert suspect_row[1] == "grow`er|x" and len(suspect_row) == 6


def _shown(inline) -> str:
    """The text an inline token shows (escapes resolved, code spans as their text)."""
    return "".join(t.content for t in inline.children if t.type in ("text", "code_inline"))


def _table_rows(parsed) -> list[list[str]]:
    """Each table row as the text of its cells (inline content, code spans as their text)."""
    out, row, cell = [], None, None
    for t in parsed:
        if t.type == "tr_open":
            row = []
        elif t.type in ("td_open", "th_open"):
            cell = []
        elif t.type in ("td_close", "th_close"):
            row.append("".join(cell))
            cell = None
        elif t.type == "tr_close":
            out.append(row)
        elif cell is not None and t.type in ("text", "code_inline"):
            cell.append(t.content)
    return out


def test_an_empty_command_is_said_not_shown_as_an_empty_code_span(tmp_path):
    report = build_report(recording(tmp_path, ""))
    assert "Command: *not known*" in report
    assert "| *(none)* |" in report


@pytest.mark.parametrize("text, expected", [
    ("a`b", "``a`b``"),
    ("``x", "``` ``x ```"),
    (" padded ", "`  padded  `"),
    ("plain", "`plain`"),
])
def test_code_spans_outnumber_the_backticks_inside(text, expected):
    assert md_code(text) == expected
    assert [t.content for t in tokens(md_code(text)) if t.type == "code_inline"] == [text]


def test_a_code_block_outlasts_any_fence_inside():
    block = "\n".join(md_block(["```", "````", "x"]))
    assert [(t.type, t.content) for t in tokens(block)] == [("fence", "```\n````\nx\n")]


@pytest.mark.parametrize("text", ["# h", "1. item", "- item", "> quote", "*em* _em_ [l](u) <b> a|b ~~s~~ $m$ &amp;", "x\\*y"])
def test_plain_text_starts_no_construct(text):
    parsed = tokens(md_text(text, line_start=True))
    assert [t.type for t in parsed] == ["paragraph_open", "inline", "text", "paragraph_close"]
    assert "".join(t.content for t in parsed if t.type == "text") == text


def test_the_diagnosis_as_text_is_well_formed_markdown_with_the_command_intact():
    from frames import leaking_evidence
    from gpuscope.core.diagnosis.steps import diagnose

    diagnosis = diagnose(leaking_evidence())
    steps = (replace(diagnosis.steps[0], status="not-a-status", finding="# forged\n## heading ```"), *diagnosis.steps[1:])
    hostile = replace(diagnosis, command=COMMAND, steps=steps,
                      suspects=(Suspect("grow`er|x", "/srv/b.py", 9, 2**20, 1.0, "memray"),))
    text = hostile.to_text()
    parsed = tokens(text)
    assert [t.tag for t in parsed if t.type == "heading_open"] == ["h1"] + ["h2"] * (len(steps) + 1)
    spans = [t.content for t in parsed if t.type == "code_inline"]
    assert printable(COMMAND) in spans and "grow`er|x" in spans
    assert not any(t.type in ("link_open", "html_inline", "html_block", "fence") for t in parsed)
    assert "[?]" in text  # a status no gpuscope writes is shown as unknown, not a crash
    assert not any(unicodedata.category(c) == "Cc" and c != "\n" for c in text)
