#!/usr/bin/env python3
"""Mutation check of the core's judgements: does a test fail when a judgement is broken?

Each mutant is one small change to one function of the core (a comparison's boundary or sense
flipped, `and` made `or`, a `not` dropped, an arithmetic operator swapped, a constant moved, a
returned boolean inverted, a negation dropped), made on the syntax tree of a copy of the
repository. What an f-string formats is a message's wording and is left alone, except in the
rules, whose f-strings are the PromQL they judge with. The tests that guard that part of the core then run against the copy (stopping at
the first failure, with a time limit per mutant): a failure or a timeout catches the mutant; a
pass lets it survive. The share caught and the survivors are printed.

Run on demand, not in CI (it runs the guarding tests once per mutant):

    python scripts/mutants.py                 # every target
    python scripts/mutants.py leak rules      # some targets
    python scripts/mutants.py --list          # the mutants, without running anything
    python scripts/mutants.py --every 3       # one mutant in three (a quicker estimate)
    python scripts/mutants.py --jobs 2        # two mutants at a time (each in its own copy)
    python scripts/mutants.py --survivors OUT # only those an earlier run's output OUT lists as survived
    python scripts/mutants.py leak --only _analysis.py   # only mutants whose line (as listed) has this text

Some survivors are equivalent mutants (`<` made `<=` where the two never differ on any input):
those are listed in EQUIVALENT, each with why, and left out of the count; write a test of the
behaviour for any other survivor.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    """Functions of one module, and the test files that guard them."""

    module: str  # path from the repository root
    functions: tuple[str, ...]  # "name" or "Class.name"
    tests: tuple[str, ...]
    # True: its f-strings are messages, left alone; False: they are what it judges (PromQL).
    fstrings_are_words: bool = True


# The fast tests first in each list: a run stops at the first failure.
LEAK_UNIT = ("tests/unit/test_held_rules.py", "tests/unit/test_guarantees_judgements.py", "tests/unit/test_leak_judgements.py")
DIAGNOSIS_UNIT = ("tests/unit/test_held_rules.py", "tests/unit/test_guarantees_judgements.py",
                  "tests/unit/test_diagnosis_judgements.py", "tests/unit/test_evidence.py", "tests/unit/test_steps_profiles.py")

TARGETS: dict[str, tuple[Target, ...]] = {
    "leak": (
        Target("gpuscope/core/leak/_held.py", ("held_trend", "held_floors", "held_evidence", "tracking_settled"),
               LEAK_UNIT),
        Target("gpuscope/core/leak/_assessment.py", ("LeakThresholds.alert_rate",), LEAK_UNIT),
        Target("gpuscope/core/leak/_life.py", ("warming_up", "ended_run"), LEAK_UNIT),
        Target("gpuscope/core/leak/_analysis.py", ("_judge", "_analyse_flat", "_analyse", "_combine", "_with_torch"),
               ("tests/unit/test_leak_analysis.py", "tests/unit/test_leak_flat.py", "tests/integration/test_leak.py")),
    ),
    "diagnosis": (
        Target("gpuscope/core/diagnosis/steps.py",
               ("growth_ranking", "step_locate", "rising_sites", "step_classify", "unseen_growth", "settle_seconds",
                "window_thresholds", "diagnose"),
               DIAGNOSIS_UNIT),
        Target("gpuscope/core/diagnosis/investigation.py", ("_watch_end", "schedule"),
               ("tests/unit/test_guarantees_judgements.py",)),
    ),
    "gate": (
        Target("gpuscope/core/gate/verdict.py",
               ("growth_of", "judge", "_growth_criterion", "_judge_batch", "_batch_figure", "_batch_criterion",
                "_command_criterion", "_load_criterion", "_leak_criterion", "steady_sites", "_sites_criterion",
                "grown_sites", "_per_round", "_median", "Growth.per_request", "Criterion.status", "GrownSite.excess"),
               ("tests/unit/test_gate_judgements.py",)),
    ),
    "rules": (
        Target("gpuscope/core/fleet/rules.py", ("ramp_expr", "slope_expr", "lookback_s", "leak_rules", "duration"),
               ("tests/unit/test_ramp_rule.py", "tests/unit/test_rules_text.py",
                "tests/integration/test_guarantees_rules.py"), fstrings_are_words=False),
    ),
    "changepoint": (
        Target("gpuscope/core/serving/changepoint.py", ("latency_jump", "cusum_increment"),
               ("tests/unit/test_guarantees_judgements.py", "tests/unit/test_changepoint.py")),
    ),
    "exporter": (
        Target("gpuscope/core/fleet/exporter.py", ("choose_exported", "nvml_reason"),
               ("tests/unit/test_exporter_labels.py",
                "tests/integration/test_exporter.py::test_choose_exported_keeps_the_top_of_each_ranking_and_every_alert")),
        Target("gpuscope/core/common/printable.py", ("shortened",), ("tests/unit/test_exporter_labels.py",)),
        Target("gpuscope/core/node/cgroup.py", ("parse_cgroup",),
               ("tests/unit/test_cgroup.py", "tests/unit/test_exporter_labels.py")),
    ),
    "redaction": (
        Target("gpuscope/core/common/redact.py", (), ("tests/unit/test_redact.py", "tests/security/test_redaction_forms.py")),
    ),
    "privilege": (
        Target("gpuscope/core/target/privilege.py", ("Owner.is_me", "owner_of", "require_can_act_as"),
               ("tests/unit/test_privilege_checks.py",)),
    ),
}

# Equivalent mutants: no input tells them from the original, so no test can catch them. Each is
# named by its module, function, the text of its line and the change, and is left out of the count
# (listed apart). Why each is equivalent:
_HELD, _ASSESSMENT = "gpuscope/core/leak/_held.py", "gpuscope/core/leak/_assessment.py"
_VERDICT, _ANALYSIS = "gpuscope/core/gate/verdict.py", "gpuscope/core/leak/_analysis.py"
EQUIVALENT: dict[tuple[str, str, str, str], str] = {
    (_HELD, "held_trend", "if len(points) > TREND_POINTS:", "Gt -> GtE"):
        "at exactly TREND_POINTS points the thinning step is 1: the points are kept as they are",
    (_HELD, "held_trend", "fall = max((a - b for a, b in zip(raw, raw[1:])), default=0.0)", "0.0 -> 1.0"):
        "the default is for fewer than two reads, and a trend is only judged from four",
    (_HELD, "held_trend", 'return HeldTrend("levelled", late, confidence or 0.5,', "0.5 -> 1.0"):
        "floors never fall, so a series that rose has a positive tau: the confidence is never 0 here",
    (_HELD, "tracking_settled", "drift = abs(theil_sen(floors) or 0.0) * SETTLE_HORIZON_S", "0.0 -> 1.0"):
        "a slope of 0 read as 1 B/s drifts 12 bytes over the horizon, against a bound of a megabyte",
    (_ASSESSMENT, "LeakThresholds.alert_rate", "if duration_s < self.fast_duration_s - 1e-9:", "Lt -> LtE"):
        "the 1e-9 s is room for float error in a duration: no caller's duration falls on its edge",
    (_ASSESSMENT, "LeakThresholds.alert_rate", "if duration_s < self.fast_duration_s - 1e-9:", "1e-09 -> 2e-09"):
        "the same room, doubled: durations are whole seconds or measured to the millisecond",
    (_ASSESSMENT, "LeakThresholds.alert_rate",
     "if self.slow_window_s > self.fast_duration_s and self.fast_rate > self.slow_rate:", "Gt -> GtE (#2)"):
        "equal rates give the power law an exponent of 0: the fast rate, which the other branch's min() is",
    (_VERDICT, "growth_of", "uncertainty = ROBUST_SIGMA * _median(residuals) / spread if len(points) > 2 else 0.0",
     "Gt -> GtE"): "a Theil-Sen line through two points passes through both: the residuals are 0",
    (_VERDICT, "growth_of", "uncertainty = ROBUST_SIGMA * _median(residuals) / spread if len(points) > 2 else 0.0",
     "2 -> 3"): "the median slope of three points joins two of them, so two residuals of three are 0",
    (_VERDICT, "_growth_criterion",
     'return Criterion(name, None, f"{label(series)}: no completed round to judge"), None, 0.0', "0.0 -> 1.0"):
        "the expected growth is read only for a failed criterion with an allowance; this one has neither",
    (_VERDICT, "steady_sites", "if middle <= 0 or min(amounts) < STEADY_SHARE * max(amounts):", "LtE -> Lt"):
        "a site whose median is 0 has an excess of at most 0, under MIN_SITE_EXCESS: left out anyway",
    (_VERDICT, "steady_sites", "if middle <= 0 or min(amounts) < STEADY_SHARE * max(amounts):", "0 -> 1"):
        "the same: a median of 1 byte is far under MIN_SITE_EXCESS",
    (_VERDICT, "_sites_criterion", "else None) or (rss.reference_floor if rss is not None else None) or 0",
     "0 -> 1"): "an allowance of 0.03 byte rounds to 0, and a steady site keeps at least MIN_SITE_EXCESS",
    (_ANALYSIS, "_judge", "if sketch.flat_since <= t0:", "LtE -> Lt"):
        "a horizon all alike is passed over as a shortcut; judged, it is flat (no leak, no change, no swings), "
        "which never changes what _combine chooses, and the whole series is always judged",
    (_ANALYSIS, "_judge", "view = cache(-1 if whole else i, h, functools.partial(compute, h, whole))", "1 -> 2"):
        "the whole series' key in the cache has only to differ from the horizons' indices (0 and up)",
    **{(_ANALYSIS, "_analyse_flat", line, change): "the shortcut declines a horizon more: _analyse judges it and says "
       "the same (test_leak_flat holds the two equal)"
       for line, change in (("if n < th.min_samples or span < th.min_span_s - 1e-9:", "Lt -> LtE"),
                            ("if n < th.min_samples or span < th.min_span_s - 1e-9:", "Lt -> LtE (#2)"),
                            ("if n < th.min_samples or span < th.min_span_s - 1e-9:", "Sub -> Add"),
                            ("if m < 4:", "Lt -> LtE"), ("if m < 4:", "4 -> 5"))},
    (_ANALYSIS, "_analyse_flat", "if n < th.min_samples or span < th.min_span_s - 1e-9:", "1e-09 -> 2e-09"):
        "the 1e-9 s is room for float error in a span: no series' span falls within it of ten seconds",
    (_ANALYSIS, "_analyse", "if n < th.min_samples or span < th.min_span_s - 1e-9:", "1e-09 -> 2e-09"): "the same",
    (_ANALYSIS, "_analyse", "if n < th.min_samples or span < th.min_span_s - 1e-9:", "Lt -> LtE (#2)"): "the same",
    (_ANALYSIS, "_analyse_flat",
     'a = LeakAssessment("no-leak", "flat", 0.0, min(max(_evidence(m, span, th), 0.0), 1.0), t_start, None, v, v, n,',
     "1.0 -> 2.0"): "the evidence is under 1: the bound is never reached",
    (_ANALYSIS, "_analyse",
     "a = LeakAssessment(verdict, pattern, growth, min(max(confidence, 0.0), 1.0), since, None, first, last,",
     "1.0 -> 2.0"): "every confidence is a product of factors in [0, 1]: the bound is never reached",
    (_ANALYSIS, "_analyse", 'shapes = [("line", rss_line, 0)]', "0 -> 1"): "the line's break index is never read",
    (_ANALYSIS, "_analyse", "return 0.0, 0.0", "0.0 -> 1.0 (#2)"):
        "the rise over fewer than two floors is never read: a rise is read only where three floors or more are",
    (_ANALYSIS, "_analyse", 'return view("leak", GROWING, b, confidence, since, text, duration, swinging, True)',
     "True -> False"): "a leak's change flag is never read: _combine returns a leak before it reads any",
    (_ANALYSIS, "_analyse",
     "stepped = _step_time(buckets, points[k - 1][0], base + sums.mean(0, k) + jump / 2, jump > 0)", "Gt -> GtE"):
        "the jump is never 0 here: one within the flat band (at least 0) was passed over",
    (_ANALYSIS, "_analyse", "if jump > 0:", "Gt -> GtE"): "the same",
    (_ANALYSIS, "_analyse", "return settled(k, t_start, points[k][0], sums.mean(k, m) - ys[0], step=False)",
     "Sub -> Add"): "the fits' values are relative to the first floor: ys[0] is 0",
    (_ANALYSIS, "_analyse", "if rise > tol and rate > 0:", "Gt -> GtE (#2)"):
        "a rate of 0 is a rise of 0, never over the flat band (0 bytes or more)",
    (_ANALYSIS, "_with_torch", "return a.pattern == GROWING and (a.growth_bytes_per_s or 0.0) > 0", "Gt -> GtE"):
        "a judgement of growth has a positive rate (its rise cleared the flat band, 0 bytes or more): never 0",
    (_ANALYSIS, "_with_torch", "return a.pattern == GROWING and (a.growth_bytes_per_s or 0.0) > 0", "0.0 -> 1.0"):
        "the same: read only for a judgement of growth, whose rate is a positive number",
    (_ANALYSIS, "_with_torch", "primary_rate = primary.growth_bytes_per_s or 0.0", "0.0 -> 1.0"):
        "read only when the primary series grows, when its rate is a positive number",
    (_ANALYSIS, "_with_torch",
     "allocated_flat = not growing(allocated) or (allocated.growth_bytes_per_s or 0.0) < 0.1 * primary_rate",
     "0.0 -> 1.0"): "read only when allocated grows, when its rate is a positive number",
    ("gpuscope/core/fleet/rules.py", "leak_rules",
     'out.append(f"      - record: {DCGM_RECORD}\\n        expr: {_block(expr, 10)}\\n")', "10 -> 11"):
        "a YAML block scalar indented one more space reads the same",
    ("gpuscope/core/fleet/rules.py", "leak_rules", 'f"        expr: {_block(alert_expr(src, record, h, th), 10)}\\n"',
     "10 -> 11"): "the same",
    ("gpuscope/core/fleet/exporter.py", "choose_exported",
     "sorted((p for p in procs if p.rss_bytes), key=lambda p: -(p.rss_bytes or 0)),", "0 -> 1"):
        "the ranking holds only processes whose RSS is known and not 0",
    ("gpuscope/core/target/privilege.py", "owner_of",
     'return Owner(fields["Uid"][0], fields["Gid"][0], tuple(fields.get("Groups", ())))', "0 -> 1"):
        "the uid's: all four ids are the same by then, or it has raised NotPermitted",
    ("gpuscope/core/target/privilege.py", "owner_of",
     'return Owner(fields["Uid"][0], fields["Gid"][0], tuple(fields.get("Groups", ())))', "0 -> 1 (#2)"):
        "the gid's, the same",
    ("gpuscope/core/common/redact.py", "_option",
     "if len(option) == 2 and word.startswith(option) and len(word) > 2:  # -pPW, -uuser:pw", "Gt -> GtE"):
        "a two-character word that starts with a two-character option is the option, handled just before",
    ("gpuscope/core/diagnosis/steps.py", "settle_seconds", "rate = growth_bytes_per_s or 0.0", "0.0 -> 1.0"):
        "no growth read as 1 B/s is still under min_rate: None either way",
    ("gpuscope/core/diagnosis/steps.py", "settle_seconds",
     "while lasted < th.slow_window_s * 4 and th.rate_margin * th.alert_rate(lasted) > rate:", "Lt -> LtE"):
        "lasted is 10 s x 1.25^k, never exactly four slow windows",
    ("gpuscope/core/diagnosis/steps.py", "unseen_growth",
     "if growth <= 0 or span <= 0 or not trackers or not att.sites:", "LtE -> Lt"):
        "(the growth's) with no growth, what was seen (never negative) is at least a tenth of it: None either way",
    ("gpuscope/core/diagnosis/steps.py", "unseen_growth",
     "slope, late = theil_sen(points) or 0.0, theil_sen(points[len(points) // 2:]) or 0.0", "0.0 -> 1.0"):
        "Theil-Sen answers for two points or more, and a site here has six",
    ("gpuscope/core/diagnosis/steps.py", "unseen_growth",
     "slope, late = theil_sen(points) or 0.0, theil_sen(points[len(points) // 2:]) or 0.0", "0.0 -> 1.0 (#2)"):
        "the same for the late half (three points or more)",
}

PER_MUTANT_TIMEOUT_S = 300


# -- the mutations -------------------------------------------------------------------------------

FLIP_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
SWAP_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult}


@dataclass(frozen=True)
class Mutant:
    module: str
    function: str
    line: int
    what: str
    source: str  # the whole mutated module
    tests: tuple[str, ...]
    text: str = ""  # the original line, stripped

    def describe(self) -> str:
        return f"{self.module}:{self.line} ({self.function}) {self.what}: {self.text}"

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.module, self.function, self.text, self.what


def _functions(tree: ast.Module, wanted: tuple[str, ...]) -> Iterator[tuple[str, ast.AST]]:
    """The (qualified name, node) of each wanted function; every function when none is named."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not wanted or node.name in wanted:
                yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                name = f"{node.name}.{item.name}" if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""
                if name and (not wanted or name in wanted):
                    yield name, item


def _edits(node: ast.AST) -> Iterator[tuple[str, callable]]:
    """(description, a function that applies the change to a copy of `node`) for one node."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in FLIP_COMPARE:
                new = FLIP_COMPARE[type(op)]
                yield (f"{type(op).__name__} -> {new.__name__}",
                       lambda n, i=i, new=new: n.ops.__setitem__(i, new()))
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield f"{type(node.op).__name__} -> {new.__name__}", lambda n, new=new: setattr(n, "op", new())
    elif isinstance(node, ast.BinOp) and type(node.op) in SWAP_BINOP:
        new = SWAP_BINOP[type(node.op)]
        yield f"{type(node.op).__name__} -> {new.__name__}", lambda n, new=new: setattr(n, "op", new())
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
        value = node.value
        moved = (value + 1) if isinstance(value, int) else (value * 2 if value else 1.0)
        yield f"{value!r} -> {moved!r}", lambda n, moved=moved: setattr(n, "value", moved)
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield f"{node.value} -> {not node.value}", lambda n: setattr(n, "value", not n.value)


def _unary_edits(parent: ast.AST) -> Iterator[tuple[str, str, callable]]:
    """Dropping a `not` or a unary minus: the child replaces the UnaryOp in its parent."""
    for field, value in ast.iter_fields(parent):
        items = value if isinstance(value, list) else [value]
        for index, child in enumerate(items):
            if isinstance(child, ast.UnaryOp) and isinstance(child.op, (ast.Not, ast.USub)):
                if isinstance(child.op, ast.USub) and isinstance(child.operand, ast.Constant):
                    continue  # a negative literal, not a negation
                what = "drop not" if isinstance(child.op, ast.Not) else "drop unary minus"

                def apply(p, field=field, index=index, is_list=isinstance(value, list)):
                    current = getattr(p, field)
                    if is_list:
                        current[index] = current[index].operand
                    else:
                        setattr(p, field, current.operand)

                yield what, child, apply


def mutants_of(target: Target) -> list[Mutant]:
    path = ROOT / target.module
    text = path.read_text()
    tree = ast.parse(text)
    lines = text.splitlines()
    out: list[Mutant] = []
    for name, function in _functions(tree, target.functions):
        nodes = [n for n in ast.walk(function) if n is not function]
        docstring = function.body[0] if function.body and isinstance(function.body[0], ast.Expr) else None
        skip = set(map(id, ast.walk(docstring))) if docstring else set()
        # What an f-string formats is the wording of a message, not a judgement.
        if target.fstrings_are_words:
            skip.update(id(n) for s in nodes if isinstance(s, ast.JoinedStr) for n in ast.walk(s))
        for node in nodes:
            if id(node) in skip:
                continue
            for what, apply in _edits(node):
                out.append(_mutated(tree, node, apply, target, name, what, lines))
            for what, child, apply in _unary_edits(node):
                out.append(_mutated(tree, node, apply, target, name, what, lines, line=child.lineno))
    # The same change twice on one line (two `<=` of one condition): the second is "(#2)", and so on.
    count: dict[tuple[str, str, str, str], int] = {}
    for i, m in enumerate(out):
        count[m.key] = count.get(m.key, 0) + 1
        if count[m.key] > 1:
            out[i] = dataclasses.replace(m, what=f"{m.what} (#{count[m.key]})")
    return out


def _mutated(tree: ast.Module, node: ast.AST, apply, target: Target, function: str, what: str,
             lines: list[str], line: int | None = None) -> Mutant:
    """The module with `apply` made to `node` (found again, by position, in a deep copy)."""
    twin = copy.deepcopy(tree)
    original = list(ast.walk(tree))
    index = next(i for i, n in enumerate(original) if n is node)
    apply(list(ast.walk(twin))[index])
    at = line or getattr(node, "lineno", 0)
    return Mutant(target.module, function, at, what, ast.unparse(ast.fix_missing_locations(twin)), target.tests,
                  lines[at - 1].strip() if 0 < at <= len(lines) else "")


# -- running them ----------------------------------------------------------------------------------

def _copy_tree(into: Path) -> None:
    for part in ("gpuscope", "tests", "pyproject.toml"):
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, into / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, into / part)


def run_tests(copy_root: Path, tests: tuple[str, ...], timeout: float) -> str:
    """"caught" (a test failed, or the time ran out), "survived" (all passed) or "error"."""
    # Without the plugins the environment may install for its own ends (they cost seconds a start):
    # only those the tests use.
    env = {**os.environ, "PYTHONPATH": str(copy_root), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-o", "addopts=", "-p", "pytest_timeout",
               "-p", "pytest_asyncio.plugin", "-p", "no:cacheprovider", "--timeout", str(int(timeout)), *tests]
    try:
        done = subprocess.run(command, cwd=copy_root, env=env, capture_output=True, text=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        return "caught"
    if done.returncode == 0:
        return "survived"
    if done.returncode == 1:
        return "caught"
    return "error"  # collection failed, no test ran, or pytest itself failed


def run_mutant(copy_root: Path, m: Mutant, timeout: float) -> str:
    path = copy_root / m.module
    original = path.read_text()
    path.write_text(m.source)
    try:
        return run_tests(copy_root, m.tests, timeout)
    finally:
        path.write_text(original)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--every", type=int, default=1, help="run one mutant in N (default 1: all)")
    parser.add_argument("--timeout", type=float, default=PER_MUTANT_TIMEOUT_S, help="seconds per mutant")
    parser.add_argument("--survivors", metavar="FILE",
                        help="run only the mutants a run's output FILE lists as survived (after adding tests)")
    parser.add_argument("--only", metavar="TEXT", action="append", default=[],
                        help="only the mutants whose description (as --list prints it: module:line (function) "
                             "change: line) contains TEXT; given twice, either")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)")
    args = parser.parse_args(argv)
    chosen = args.targets or list(TARGETS)
    unknown = [name for name in chosen if name not in TARGETS]
    if unknown:
        parser.error(f"no target {', '.join(unknown)} (the targets: {', '.join(TARGETS)})")
    every = [(name, m) for name in chosen for target in TARGETS[name] for m in mutants_of(target)]
    equivalent = [m for _, m in every if m.key in EQUIVALENT]
    if not args.targets:
        stale = set(EQUIVALENT) - {m.key for _, m in every}
        for key in sorted(stale):
            print(f"no mutant is {key} any more: drop it from EQUIVALENT")
    picked = [(name, m) for name, m in every if m.key not in EQUIVALENT
              and (not args.only or any(text in m.describe() for text in args.only))][::max(1, args.every)]
    if args.survivors:
        survived = {_unnumbered(line.strip().removeprefix("survived: "))
                    for line in Path(args.survivors).read_text().splitlines() if line.strip().startswith("survived: ")}
        picked = [(name, m) for name, m in picked if _unnumbered(m.describe()) in survived]
    if args.list:
        for _, m in picked:
            print(m.describe())
        print(f"{len(picked)} mutants ({len(equivalent)} equivalent ones left out)")
        return 0
    outcomes: dict[str, dict[str, list[Mutant]]] = {name: {"caught": [], "survived": [], "error": []} for name in chosen}
    jobs = max(1, args.jobs)
    with tempfile.TemporaryDirectory(prefix="gpuscope-mutants-") as folder:
        copies: queue.Queue[Path] = queue.Queue()
        for k in range(jobs):
            (Path(folder) / str(k)).mkdir()
            _copy_tree(Path(folder) / str(k))
            copies.put(Path(folder) / str(k))
        first = Path(folder) / "0"
        baseline = {tests: run_tests(first, tests, args.timeout) for tests in {m.tests for _, m in picked}}
        broken = [" ".join(tests) for tests, outcome in baseline.items() if outcome != "survived"]
        if broken:
            print("the guarding tests fail without any mutant:", *broken, sep="\n  ")
            return 1

        def one(m: Mutant) -> tuple[str, float]:
            copy_root = copies.get()
            began = time.monotonic()
            try:
                return run_mutant(copy_root, m, args.timeout), time.monotonic() - began
            finally:
                copies.put(copy_root)

        with ThreadPoolExecutor(jobs) as pool:
            done = pool.map(one, [m for _, m in picked])
            for n, ((name, m), (outcome, took)) in enumerate(zip(picked, done), 1):
                print(f"[{n}/{len(picked)}] {outcome:8} {took:5.0f} s  {m.describe()}", flush=True)
                outcomes[name][outcome].append(m)
    print()
    for name in chosen:
        print(f"{name:12} {_share(outcomes[name])}")
    total = {kind: [m for name in chosen for m in outcomes[name][kind]] for kind in ("caught", "survived", "error")}
    print(f"{'all':12} {_share(total)}; {len(equivalent)} equivalent mutants left out")
    for m in total["survived"]:
        print(f"  survived: {m.describe()}")
    for m in total["error"]:
        print(f"  would not run: {m.describe()}")
    return 0


def _unnumbered(described: str) -> str:
    """A mutant's description without its "(#2)": a survivor of a run is run again with its twins."""
    return re.sub(r" \(#\d+\):", ":", described, count=1)


def _share(outcomes: dict[str, list[Mutant]]) -> str:
    caught, judged = len(outcomes["caught"]), len(outcomes["caught"]) + len(outcomes["survived"])
    return (f"{caught} of {judged} mutants caught ({100 * caught / judged if judged else 0:.0f} %)"
            + (f"; {len(outcomes['error'])} would not run (not counted)" if outcomes["error"] else ""))


if __name__ == "__main__":
    raise SystemExit(main())
