"""The core never imports a UI library, headless commands import neither the TUI nor torch, no
command imports the command line, no module imports itself back, and every error is a
GpuscopeError. (pyproject's [tool.importlinter] contracts hold the layers; `lint-imports`.)"""

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import gpuscope
import gpuscope.commands
import gpuscope.core
from gpuscope.errors import GpuscopeError

FORBIDDEN = ("textual", "rich", "plotext", "torch", "gpuscope.tui")
CORE_MODULES = sorted(
    m.name
    for package in (gpuscope.core, gpuscope.commands)
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
)


def loaded_after(code: str) -> list[str]:
    probe = code + "\nimport sys\nprint(','.join(m for m in %r if m in sys.modules))\n" % (FORBIDDEN,)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1:] or [""]
    return [m for m in last[0].split(",") if m]


@pytest.mark.parametrize("module", CORE_MODULES + ["gpuscope.cli", "gpuscope.errors", "gpuscope.theme_files"])
def test_core_modules_import_no_ui(module):
    assert loaded_after(f"import {module}") == []


HEADLESS = [["--help"], ["ps", "--json"], ["ps"], ["config"], ["config", "--json"], ["config", "--refresh", "2"],
            ["rules"], ["metrics", "--help"], ["diagnose", "--help"], ["demo", "--help"], ["snapshot", "--help"],
            ["check", "--help"], ["exporter", "--help"], ["stacks", "--help"], ["report", "/nonexistent"]]


@pytest.mark.parametrize("argv", HEADLESS)
def test_headless_commands_import_no_tui_or_torch(argv):
    code = (
        "import contextlib, io\nfrom gpuscope.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass"
    )
    assert loaded_after(code) == []


@pytest.mark.parametrize("module", [m for m in CORE_MODULES if m.startswith("gpuscope.commands.")])
def test_no_command_imports_the_command_line(module):
    probe = f"import sys, {module}\nprint('gpuscope.cli' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def modules_after_main(argv: list[str], prefix: str) -> set[str]:
    """The modules named `prefix...` loaded once `gpuscope.cli.main(argv)` has run (its output
    discarded), in a fresh interpreter."""
    code = (
        "import contextlib, io, sys\nfrom gpuscope.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass\n"
        f"print(','.join(sorted(m for m in sys.modules if m.startswith({prefix!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.strip().splitlines()[-1].split(","))


def test_a_command_imports_only_its_own_module():
    """Parsing `ps` does not import the other commands' modules (nor what they need)."""
    loaded = modules_after_main(["ps", "--json"], "gpuscope.commands.")
    assert loaded == {"gpuscope.commands.common", "gpuscope.commands.console", "gpuscope.commands.ps"}


def test_no_import_cycles():
    """No module imports, directly or through others, a module that imports it (lazy imports too)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("gpuscope")
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = []
    for module in sorted(imports):  # a cycle through `module`: a path back to it
        seen, todo = set(), list(imports[module])
        while todo:
            other = todo.pop()
            if other == module:
                cycles.append(module)
                break
            if other not in seen:
                seen.add(other)
                todo.extend(imports[other])
    assert cycles == []


# The probe runs inside other people's processes as a copy of probe.py alone (gpuscope.core.target.inject):
# it imports nothing of gpuscope, so its one error class cannot derive from GpuscopeError.
STANDALONE = {"gpuscope.probe", "gpuscope._probe_boot.sitecustomize"}


def test_every_error_gpuscope_raises_is_a_gpuscope_error():
    names = [m.name for m in pkgutil.walk_packages(gpuscope.__path__, "gpuscope.")]
    assert "gpuscope.core.common.atomic" in names and "gpuscope.demo.run" in names
    strays = []
    for name in names:
        if name in STANDALONE or name == "gpuscope.__main__":
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name
                    and not issubclass(value, GpuscopeError)):
                strays.append(f"{name}.{value.__name__}")
    assert strays == []


@pytest.mark.parametrize("module", [m for m in CORE_MODULES if m.startswith("gpuscope.core.")])
def test_the_core_imports_nothing_above_it(module):
    """The core takes plain values: it never loads the settings file's reader, the command line,
    the commands, the TUI or the demo (lint-imports checks the same statically)."""
    above = ("gpuscope.config", "gpuscope.cli", "gpuscope.commands", "gpuscope.tui", "gpuscope.demo")
    probe = f"import sys, {module}\nprint(','.join(m for m in sys.modules if m.startswith({above!r})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr


def test_help_imports_nothing_but_the_parser():
    """`gpuscope --help` answers from the parser alone: no settings, no core beyond printing."""
    loaded = modules_after_main(["--help"], "gpuscope")
    assert "gpuscope.config" not in loaded and len(loaded) <= 10, sorted(loaded)
