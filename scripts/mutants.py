#!/usr/bin/env python3
"""Mutation check of the core's judgements: does a test fail when a judgement is broken?

Each mutant is one small change to one function of the core (a comparison's boundary or sense
flipped, `and` made `or`, a `not` dropped, an arithmetic operator swapped, a constant moved, a
returned boolean inverted, a negation dropped), made on the syntax tree of a copy of the
repository. The tests that guard that part of the core then run against the copy (stopping at
the first failure, with a time limit per mutant): a failure or a timeout catches the mutant; a
pass lets it survive. The share caught and the survivors are printed.

Run on demand, not in CI (it runs the guarding tests once per mutant):

    python scripts/mutants.py                 # every target
    python scripts/mutants.py leak rules      # some targets
    python scripts/mutants.py --list          # the mutants, without running anything
    python scripts/mutants.py --every 3       # one mutant in three (a quicker estimate)

Some survivors are equivalent mutants (`<` made `<=` where the two never differ on real data):
read them before writing a test for them.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    """Functions of one module, and the test files that guard them."""

    module: str  # path from the repository root
    functions: tuple[str, ...]  # "name" or "Class.name"
    tests: tuple[str, ...]


TARGETS: dict[str, tuple[Target, ...]] = {
    "leak": (
        Target("gpuscope/core/leak/_held.py", ("held_trend",),
               ("tests/unit/test_guarantees_judgements.py", "tests/integration/test_leak.py")),
        Target("gpuscope/core/leak/_assessment.py", ("LeakThresholds.alert_rate",),
               ("tests/integration/test_leak.py",)),
    ),
    "diagnosis": (
        Target("gpuscope/core/diagnosis/steps.py", ("growth_ranking", "step_locate"),
               ("tests/unit/test_guarantees_judgements.py", "tests/unit/test_evidence.py",
                "tests/unit/test_steps_profiles.py")),
        Target("gpuscope/core/diagnosis/investigation.py", ("_watch_end", "schedule"),
               ("tests/unit/test_guarantees_judgements.py",)),
    ),
    "gate": (
        Target("gpuscope/core/gate/verdict.py", (), ("tests/integration/test_check.py",)),
    ),
    "rules": (
        Target("gpuscope/core/fleet/rules.py", ("ramp_expr", "slope_expr", "leak_rules", "duration"),
               ("tests/integration/test_guarantees_rules.py", "tests/integration/test_rules.py")),
    ),
    "changepoint": (
        Target("gpuscope/core/serving/changepoint.py", ("latency_jump",),
               ("tests/unit/test_guarantees_judgements.py", "tests/unit/test_changepoint.py")),
    ),
    "exporter": (
        Target("gpuscope/core/fleet/exporter.py", ("choose_exported", "_short", "parse_cgroup"),
               ("tests/integration/test_exporter.py::test_choose_exported_keeps_the_top_of_each_ranking_and_every_alert",
                "tests/integration/test_exporter.py::test_cgroup_names_the_pod_and_the_container",
                "tests/integration/test_guarantees_exporter.py")),
    ),
    "redaction": (
        Target("gpuscope/core/common/redact.py", (),
               ("tests/unit/test_redact.py", "tests/security/test_redaction_forms.py")),
    ),
    "privilege": (
        Target("gpuscope/core/target/privilege.py", (), ("tests/security/test_target_rights.py",)),
    ),
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

    def describe(self) -> str:
        return f"{self.module}:{self.line} ({self.function}) {self.what}"


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
    tree = ast.parse(path.read_text())
    out: list[Mutant] = []
    for name, function in _functions(tree, target.functions):
        nodes = [n for n in ast.walk(function) if n is not function]
        docstring = function.body[0] if function.body and isinstance(function.body[0], ast.Expr) else None
        skip = set(map(id, ast.walk(docstring))) if docstring else set()
        for node in nodes:
            if id(node) in skip or isinstance(node, ast.JoinedStr):
                continue
            for what, apply in _edits(node):
                out.append(_mutated(tree, node, apply, target, name, what))
            for what, child, apply in _unary_edits(node):
                out.append(_mutated(tree, node, apply, target, name, what, line=child.lineno))
    return out


def _mutated(tree: ast.Module, node: ast.AST, apply, target: Target, function: str, what: str,
             line: int | None = None) -> Mutant:
    """The module with `apply` made to `node` (found again, by position, in a deep copy)."""
    twin = copy.deepcopy(tree)
    original = list(ast.walk(tree))
    index = next(i for i, n in enumerate(original) if n is node)
    apply(list(ast.walk(twin))[index])
    return Mutant(target.module, function, line or getattr(node, "lineno", 0), what,
                  ast.unparse(ast.fix_missing_locations(twin)), target.tests)


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
    env = {**os.environ, "PYTHONPATH": str(copy_root), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:randomly", "-p", "no:cacheprovider",
               "--timeout", str(int(timeout)), *tests]
    try:
        done = subprocess.run(command, cwd=copy_root, env=env, capture_output=True, text=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        return "caught"
    if done.returncode == 0:
        return "survived"
    if done.returncode == 1:
        return "caught"
    return "error"  # collection failed, no test ran, or pytest itself failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--every", type=int, default=1, help="run one mutant in N (default 1: all)")
    parser.add_argument("--timeout", type=float, default=PER_MUTANT_TIMEOUT_S, help="seconds per mutant")
    args = parser.parse_args(argv)
    chosen = args.targets or list(TARGETS)
    unknown = [name for name in chosen if name not in TARGETS]
    if unknown:
        parser.error(f"no target {', '.join(unknown)} (the targets: {', '.join(TARGETS)})")
    mutants = [m for name in chosen for target in TARGETS[name] for m in mutants_of(target)][::max(1, args.every)]
    if args.list:
        for m in mutants:
            print(m.describe())
        print(f"{len(mutants)} mutants")
        return 0
    caught, survivors, errors = 0, [], []
    with tempfile.TemporaryDirectory(prefix="gpuscope-mutants-") as folder:
        copy_root = Path(folder)
        _copy_tree(copy_root)
        baseline = {tests: run_tests(copy_root, tests, args.timeout) for tests in {m.tests for m in mutants}}
        broken = [" ".join(tests) for tests, outcome in baseline.items() if outcome != "survived"]
        if broken:
            print("the guarding tests fail without any mutant:", *broken, sep="\n  ")
            return 1
        for n, m in enumerate(mutants, 1):
            path = copy_root / m.module
            original = path.read_text()
            path.write_text(m.source)
            began = time.monotonic()
            try:
                outcome = run_tests(copy_root, m.tests, args.timeout)
            finally:
                path.write_text(original)
            print(f"[{n}/{len(mutants)}] {outcome:8} {time.monotonic() - began:5.0f} s  {m.describe()}", flush=True)
            if outcome == "caught":
                caught += 1
            elif outcome == "survived":
                survivors.append(m)
            else:
                errors.append(m)
    judged = caught + len(survivors)
    print(f"\n{caught} of {judged} mutants caught ({100 * caught / judged if judged else 0:.0f} %)"
          + (f"; {len(errors)} would not run (not counted)" if errors else ""))
    for m in survivors:
        print(f"  survived: {m.describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
