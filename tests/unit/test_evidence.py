"""The evidence behind a diagnosis, as the operator reads it: short lines with units, moments as
clock times with their age, the same lines in the console's wizard and in the incident report."""

from __future__ import annotations

import re
import time
from dataclasses import replace

from textual.widgets import OptionList

from frames import T0, FakeSource, frame, live, rows
from gpuscope.core.diagnosis.attribution import Attribution, Rung, Site
from gpuscope.core.diagnosis.steps import DeviceEvidence, Evidence, Series, diagnose
from gpuscope.core.diagnosis.evidence import VERDICT, evidence_lines
from gpuscope.core.serving.model import ServingSnapshot, Signals, StageStats
from gpuscope.core.session.journal import Journal
from gpuscope.core.session.recording import open_recording
from gpuscope.core.session.report import build_report
from gpuscope.core.target.stacks import Suspect
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.textlines import TextLines

NOW = T0 + 18.0  # the reader looks 18 s after the window ended
GIB = 1 << 30


def _snapshot(t: float, p95: float, ttft: float, tps: float, retriever: float) -> ServingSnapshot:
    return ServingSnapshot(
        time=t, source="scrape", target="http://127.0.0.1:8000/metrics", profile="rag", window_s=30.0,
        signals=Signals(e2e_latency_p95_s=p95, ttft_p95_s=ttft, tokens_per_s=tps, requests_per_s=3.3333333333333335,
                        kv_cache_usage=0.41666666666666663),
        stages=(StageStats("retriever", p95_s=retriever, share=0.6180339887498949),
                StageStats("llm", p95_s=0.31415926535897931, share=0.3819660112501051)),
        as_of=t)


def rich_evidence(pid: int = 4242) -> Evidence:
    """A minute of a process whose GPU memory and RSS climb, numbers with every digit a float has,
    a degrading service, a tracker that ran inside the process and saw a site's held bytes rise."""
    times = tuple(t / 3 for t in range(-180, 1))  # on the clock of the window's end: -60 .. 0
    gpu = tuple(58 * GIB + 3.14159265358979e6 * (t + 60) for t in times)
    rss = tuple(9 * GIB + 1.2345678901234e6 * (t + 60) + (7e5 if round(t * 3) % 5 == 0 else 0.0) for t in times)
    held = tuple(int(1e6 * 1.0000001 * k) for k in range(30))
    attribution = Attribution(
        pid=pid,
        suspects=(Suspect("Retriever.search", "/srv/rag.py", 41, 123_456_789, 0.9333333333333333, "memray"),),
        rungs=(Rung("torch-history", "skipped", "torch is not imported in the process"),
               Rung("memray", "used", "in process through gpuscope's probe: 3 allocation sites")),
        method="memray", confidence="high",
        times=tuple(k * 0.5 for k in range(30)), sites=(Site("Retriever.search", "/srv/rag.py", 41, held),),
        window=(T0 - 40.123456789, T0 - 25.987654321),
        cost={"rss_before": 9 * GIB, "rss_tracking": 9 * GIB + 12_345_678, "rss_after": 9 * GIB + 1_234_567,
              "seconds": 14.135802468, "from": "gpuscope's own packages", "sees": "Python allocations", "cut_short": True},
    )
    return Evidence(
        pid=pid, command="python rag_worker.py", duration_s=60.0,
        rss=Series(times, rss), gpu=Series(times, gpu),
        device=DeviceEvidence(0, "NVIDIA H200", 141 * GIB, Series(times, tuple(v + 5 * GIB for v in gpu))),
        processes=rows(),
        serving_start=_snapshot(T0 - 60, 0.41234567891, 0.0912345678, 1234.5678901, 0.0123456789),
        serving_end=_snapshot(T0, 0.98765432109, 0.2345678901, 812.34567891, 0.0876543210),
        attribution=attribution,
        instrumented=((-40.123456789, -25.987654321),),
        ended_at=T0,
    )


# -- the lines themselves ------------------------------------------------------------------------

def _too_precise(line: str) -> list[str]:
    """Decimal numbers with more than three significant digits (a file's line number or a clock
    time is not a measurement)."""
    line = re.sub(r"\S+\.py:\d+", "", line)
    line = re.sub(r"\d{4}-\d\d-\d\d|\d\d:\d\d(:\d\d)?", "", line)
    found = []
    for number in re.findall(r"\d+\.\d+", line):
        digits = number.replace(".", "").lstrip("0")
        if len(digits) > 3:
            found.append(number)
    return found


def test_lines_are_short_rounded_with_units_and_moments_are_clock_times_with_their_age():
    d = diagnose(rich_evidence())
    lines = evidence_lines(d, NOW)
    every = [line for n in sorted(lines) for line in lines[n]]
    assert all(lines[n] for n in (VERDICT, 1, 2, 3, 4, 5, 6, 7)), lines  # each step has its numbers
    for line in every:
        assert not _too_precise(line), line
        assert len(line) < 200, line
        assert not re.search(r"-\d[\d.]* ?(s|min|h) ago", line), line  # never a negative age
        assert "{" not in line and "'" not in line[:1], line  # not a dict or a repr
    text = "\n".join(every)
    clock = time.strftime("%H:%M:%S", time.localtime(T0))
    assert f"{clock} (18 s ago)" in text, text  # the window's end, as a clock time and an age
    assert re.search(r"since \d\d:\d\d:\d\d \(\d[\d.]* (s|min) ago\)", text), text  # when the growth began
    assert "GiB" in text and "MB/s" in text and " ms" in text
    assert "capture reached its size cap" in text  # what the tracker could not keep is said


def test_a_moment_ahead_of_the_readers_clock_is_just_now_never_a_negative_age():
    d = diagnose(rich_evidence())
    text = "\n".join(line for lines in evidence_lines(d, T0 - 5.0).values() for line in lines)
    assert "just now" in text and not re.search(r"-\d[\d.]* ?(s|min|h) ago", text), text


def test_the_evidence_survives_a_recording_and_its_json_keeps_the_contract(tmp_path):
    d = diagnose(rich_evidence())
    out = d.to_json()
    assert list(out) == ["schema", "pid", "command", "runs_in", "duration_s", "verdict", "pattern", "memory", "steps", "suspects",
                         "evidence", "instrument"]
    assert out["evidence"]["decided_by"] in ("memory trend", "allocation sites", "both")
    assert out["evidence"]["excluded_s"][0] < 0 and out["instrument"]["from"] == "gpuscope's own packages"
    assert out["instrument"]["cut_short"] is True and out["evidence"]["sites"][0]["function"] == "Retriever.search"
    recording = _recorded(tmp_path, d)
    assert recording.findings.best_diagnosis(d.pid) == d


def _recorded(tmp_path, d):
    path = tmp_path / "s.gpuscope"
    journal = Journal(path)
    journal.frame(frame())
    journal.event("diagnosis", d, T0 + 1)
    journal.close()
    return open_recording(path)


# -- the same lines in the wizard and in the report ------------------------------------------------


def _unescaped(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


async def test_the_wizard_and_the_report_show_the_same_evidence_lines(tmp_path, monkeypatch):
    app = GpuScopeApp(live(FakeSource(frame(time=NOW), evidence=rich_evidence())))  # the frame shown: 18 s later
    panels: dict[int, str] = {}
    async with app.run_test(size=(160, 60)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        screen = app.screen
        d = screen.diagnosis
        steps = screen.query_one("#steps", OptionList)
        for i in range(7):
            steps.highlighted = i
            await pilot.pause()
            panels[i + 1] = screen.query_one("#step", TextLines).text.plain
    # The wizard dates moments from the frame shown (a replay's position; live, the latest frame);
    # the report gives clock times only: it is read later than it is written.
    lines = evidence_lines(d, app.frame.time)
    dated = evidence_lines(d)
    report = _unescaped(build_report(_recorded(tmp_path, d)))
    assert " ago)" in "\n".join(lines[2]) and " ago" not in report
    for n in range(1, 8):

        for line in lines[n]:
            assert line in panels[n], (n, line, panels[n])
        for line in dated[n]:
            assert f"- {line}" in report, (n, line)
    for line in lines[VERDICT]:  # the verdict's: under the verdict in the report, on the Classify step in the wizard
        assert line in panels[6], line
    for line in dated[VERDICT]:
        assert f"- {line}" in report, line
    assert "— –" not in report and "### 3. Throughput per request — skipped" in report
    assert "since" in "\n".join(lines[2]) and "{" not in panels[1]  # no raw JSON in the panel


def test_a_diagnosis_from_a_recording_without_the_typed_evidence_still_reads(tmp_path):
    """A diagnosis recorded before its evidence was typed: its lines say what is known, no more."""
    d = diagnose(rich_evidence())
    old = replace(d, evidence=type(d.evidence)(), instrument=None)
    lines = evidence_lines(old, NOW)
    assert lines[VERDICT] and not lines[1] and not _too_precise("\n".join(lines[VERDICT]))


# `rich_evidence()`'s service numbers as recordings made before they were two Signals hold them.
PAIRED_SERVICE = {
    "profile": "rag", "p95_start_s": 0.41234567891, "p95_end_s": 0.98765432109, "ttft_p95_start_s": 0.0912345678,
    "ttft_p95_end_s": 0.2345678901, "tokens_per_s_start": 1234.5678901, "tokens_per_s_end": 812.34567891,
    "tokens_per_request": 243.70370367299998, "kv_cache_usage": 0.41666666666666663,
    "stages": [{"name": "retriever", "p95_start_s": 0.0123456789, "p95_end_s": 0.087654321, "share": 0.6180339887498949},
               {"name": "llm", "p95_start_s": 0.3141592653589793, "p95_end_s": 0.3141592653589793,
                "share": 0.3819660112501051}],
}


def test_a_recording_with_the_service_numbers_in_pairs_reads_as_it_did(tmp_path):
    """A diagnosis recorded with its service numbers as start/end pairs of fields: the same numbers,
    the same evidence lines, JSON and report as the same diagnosis recorded now."""
    from gpuscope.core.session.codec import encode

    d = diagnose(rich_evidence())
    paired = encode(d)
    paired["evidence"]["service"] = PAIRED_SERVICE
    (tmp_path / "paired").mkdir()
    path = tmp_path / "paired" / "s.gpuscope"  # the name `_recorded` gives, which the report names
    journal = Journal(path)
    journal.frame(frame())
    journal.event("diagnosis", paired, T0 + 1)
    journal.close()
    recording = open_recording(path)
    read = recording.findings.best_diagnosis(d.pid)
    assert read is not None and not recording.skipped
    service = read.evidence.service
    assert (service.start.e2e_latency_p95_s, service.end.e2e_latency_p95_s) == (0.41234567891, 0.98765432109)
    assert (service.start.tokens_per_s, service.end.tokens_per_s, service.end.kv_cache_usage) == (
        1234.5678901, 812.34567891, 0.41666666666666663)
    assert abs(service.tokens_per_request - 243.70370367299998) < 1e-9 and service.stages == d.evidence.service.stages
    assert evidence_lines(read, NOW) == evidence_lines(d, NOW) and read.to_json() == d.to_json()
    (tmp_path / "now").mkdir()
    assert build_report(recording) == build_report(_recorded(tmp_path / "now", d))


def test_a_search_from_the_console_takes_its_tracker_s_window_out_of_the_memory_trend():
    """The console adds the allocation sites to what it recorded: the window the tracker ran in is
    then on the evidence's clock, and the diagnosis never says both that no tracker ran inside the
    process and that one tracked for seconds."""
    from gpuscope.core.diagnosis.recorded import with_attribution

    ev = rich_evidence()
    recorded = replace(ev, attribution=None, instrumented=())  # as the console recorded it
    found = with_attribution(recorded, ev.attribution)
    [(start, end)] = found.instrumented
    assert abs(start + 40.123456789) < 1e-6 and abs(end + 25.987654321) < 1e-6
    verdict = "\n".join(evidence_lines(diagnose(found))[VERDICT])
    assert "tracked for" in verdict and "no tracker ran" not in verdict, verdict
    assert "before the tracker ran" in verdict
