"""The core never imports a UI library, and headless commands import neither the TUI nor torch."""

import pkgutil
import subprocess
import sys

import pytest

import gpuscope.commands
import gpuscope.core

FORBIDDEN = ("textual", "rich", "textual_plotext", "plotext", "torch", "gpuscope.tui")
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


@pytest.mark.parametrize("argv", [["--help"], ["ps", "--json"], ["ps"], ["config"], ["config", "--json"]])
def test_headless_commands_import_no_tui_or_torch(argv):
    code = (
        "import contextlib, io\nfrom gpuscope.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass"
    )
    assert loaded_after(code) == []
