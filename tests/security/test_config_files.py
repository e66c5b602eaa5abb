"""Settings and theme files, numbers on the command line, and standard output that fails.

Every case is one line on stderr and a non-zero exit, at once: never a traceback, never a wait
on a FIFO, never /dev/zero read into memory, and a broken theme file never breaks the commands.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from helpers import gpuscope_cmd

TIMEOUT_S = 30  # a hang fails the test instead of holding it


def gpuscope(*args: str, stdout=subprocess.PIPE, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*gpuscope_cmd(), *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=TIMEOUT_S, env=env)


def one_line(done: subprocess.CompletedProcess, code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuscope: ") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def deeply_nested(path: Path, depth: int = 3000) -> Path:
    path.write_text("x = " + "[" * depth + "\n")
    return path


# -- the settings file --------------------------------------------------------------------------------


def test_a_settings_file_nested_3000_deep_is_one_line_naming_it(tmp_path):
    config = deeply_nested(tmp_path / "deep.toml")
    line = one_line(gpuscope("--config", str(config), "config"), 2)
    assert line == f"gpuscope: {config}: not valid TOML: nested too deeply"


@pytest.mark.parametrize("key", [
    pytest.param("a" + ".a" * 500_000 + " = 1\n", id="dotted-key"),  # tomllib: over half an hour
    pytest.param("[a" + ".a" * 500_000 + "]\n", id="table-header"),  # a table a million deep
])
def test_a_settings_file_of_a_key_in_a_million_parts_is_one_line_at_once(tmp_path, key):
    config = tmp_path / "long-key.toml"
    config.write_text(key)
    line = one_line(gpuscope("--config", str(config), "config"), 2)
    assert line == f"gpuscope: {config}: not valid TOML: a dotted key of more than 64 parts"


def test_dev_zero_as_the_settings_file_is_refused_at_once():
    started = time.monotonic()
    line = one_line(gpuscope("--config", "/dev/zero", "config"), 2)
    assert "/dev/zero is a character device, not a regular file" in line and time.monotonic() - started < TIMEOUT_S


def test_a_fifo_as_the_settings_file_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    line = one_line(gpuscope("--config", str(fifo), "config"), 2)
    assert f"{fifo} is a FIFO (named pipe), not a regular file" in line
    # The same file where gpuscope looks by itself (~/.config/gpuscope/config.toml).
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    (tmp_path / "xdg" / "gpuscope").mkdir(parents=True)
    os.mkfifo(tmp_path / "xdg" / "gpuscope" / "config.toml")
    assert "FIFO" in one_line(gpuscope("config", env=env), 2)


def test_a_huge_settings_file_is_refused(tmp_path):
    config = tmp_path / "big.toml"
    config.write_text("# padding\n" * 200_000)  # 2 MB of comments
    assert "larger than 1024 KiB" in one_line(gpuscope("--config", str(config), "config"), 2)


def test_infinite_numbers_in_the_settings_file_are_refused(tmp_path):
    config = tmp_path / "inf.toml"
    for text, key in (("[journal]\nmax_mb = inf\n", "journal.max_mb"), ("[alerts]\nfast_rate = inf\n", "alerts.fast_rate"),
                      ("[console]\nrefresh_s = 1e12\n", "console.refresh_s")):
        config.write_text(text)
        line = one_line(gpuscope("--config", str(config), "config"), 2)
        assert f"line 2: {key}:" in line


# -- theme files ------------------------------------------------------------------------------------


@pytest.fixture
def broken_themes(tmp_path) -> dict:
    """A themes folder with a FIFO, a 3000-deep file and a good theme; and the remembered theme a FIFO."""
    config_home, state_home = tmp_path / "config", tmp_path / "state"
    themes = config_home / "gpuscope" / "themes"
    themes.mkdir(parents=True)
    os.mkfifo(themes / "fifo.toml")
    deeply_nested(themes / "deep.toml")
    (themes / "mine.toml").write_text('name = "mine"\nprimary = "#112233"\n')
    (state_home / "gpuscope").mkdir(parents=True)
    os.mkfifo(state_home / "gpuscope" / "theme")
    return {**os.environ, "XDG_CONFIG_HOME": str(config_home), "XDG_STATE_HOME": str(state_home)}


def test_broken_theme_files_break_no_command(broken_themes):
    done = gpuscope("--theme", "mine", "config", env=broken_themes)
    assert done.returncode == 0 and 'console.theme = "mine"' in done.stdout and done.stderr == "", done.stderr
    done = gpuscope("config", env=broken_themes)  # the remembered theme is a FIFO: not waited on, not used
    assert done.returncode == 0 and 'console.theme = "gpuscope-dark"' in done.stdout, done.stderr
    line = one_line(gpuscope("--theme", "deep", "config", env=broken_themes), 2)
    assert "unknown theme 'deep'" in line and "mine" in line


def test_the_console_lists_what_is_wrong_with_each_theme_file(broken_themes, monkeypatch):
    from gpuscope.theme_files import load_themes

    for name in ("XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(name, broken_themes[name])
    themes, problems = load_themes()
    assert "mine" in themes and "gpuscope-dark" in themes
    assert any(p.endswith("deep.toml: not valid TOML (nested too deeply)") for p in problems), problems
    assert any("fifo.toml is a FIFO (named pipe), not a regular file" in p for p in problems), problems


# -- numbers on the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("args, expected", [
    (("snapshot", "--duration", "1e12", "-o", "x.gpuscope"), "argument --duration: must be at most 86400 seconds, not 1e12"),
    (("snapshot", "--duration", "inf", "-o", "x.gpuscope"), "must be at most 86400 seconds"),
    (("snapshot", "--duration", "nan", "-o", "x.gpuscope"), "must be at least 1 seconds, not nan"),
    (("diagnose", "--pid", "1", "--duration", "1e12"), "must be at most 86400 seconds"),
    (("demo", "--headless", "--duration", "1e300"), "must be at most 86400 seconds"),
    (("--refresh", "1e12", "ps"), "argument --refresh: expected a number of seconds, at most 3600"),
    (("metrics", "--metrics-url", "http://127.0.0.1:1/metrics", "--window", "1e12"), "must be at most 604800 seconds"),
    (("stacks", "--pid", "1", "--samples", "1000000000"), "must be from 1 to 10000"),
    (("stacks", "--pid", "1", "--interval", "1e12"), "must be at most 60 seconds"),
    (("stacks", "--pid", str(2**70)), "PID must be below 2147483648"),
])
def test_numbers_past_their_range_are_one_line(tmp_path, args, expected):
    done = subprocess.run([*gpuscope_cmd(), *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path)
    assert expected in one_line(done, 2)
    assert not (tmp_path / "x.gpuscope").exists()


# -- standard output that fails ---------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("ps", "--json"), ("ps",), ("config", "--json")])
def test_standard_output_on_a_full_disk_is_one_line_and_exit_1(args):
    with open("/dev/full", "w") as full:
        done = gpuscope(*args, stdout=full)
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("# ")]  # ps's NVML note
    assert done.returncode == 1 and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert lines == ["gpuscope: cannot write the output: No space left on device"], done.stderr


def test_a_snapshot_to_standard_output_on_a_full_disk_is_one_line(tmp_path):
    with open("/dev/full", "wb") as full:
        done = gpuscope("snapshot", "--duration", "1", "-o", "-", stdout=full)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "gpuscope: cannot write standard output: the disk is full"
