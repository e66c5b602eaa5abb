"""The command line: contracts and one-line errors, run as a real subprocess."""

import json
import os
import subprocess
import uuid
from pathlib import Path

from gpuscope import __version__
from gpuscope.core.node.cgroup import parse_cgroup

from helpers import IDLER, fake_nvml_env, gpuscope_cmd, wait_until


def run(*args, **kw):
    return subprocess.run(gpuscope_cmd() + list(args), capture_output=True, text=True, timeout=60, **kw)


def one_line_error(out, code):
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuscope: "), out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


def test_version_and_help():
    assert run("--version").stdout.strip() == f"gpuscope {__version__}"
    out = run("--help")
    assert out.returncode == 0 and "ps" in out.stdout and "demo" in out.stdout and "--pid" in out.stdout


def test_no_such_pid_is_one_line_before_any_console(spawn_python):
    child = spawn_python(IDLER)
    child.kill()
    child.wait()
    line = one_line_error(run("--pid", str(child.pid)), 1)
    assert f"no process with PID {child.pid}" in line


def test_bad_option_values_are_one_line():
    assert "PID must be" in one_line_error(run("--pid", "abc"), 2)
    assert "at least 0.25" in one_line_error(run("--refresh", "0.01"), 2)
    assert "invalid choice" in one_line_error(run("frobnicate"), 2)
    assert "available: gpuscope-ansi, gpuscope-dark, gpuscope-high-contrast, gpuscope-light" in one_line_error(
        run("--theme", "neon"), 2
    )
    assert "go with --prometheus" in one_line_error(run("--job", "vllm"), 2)
    assert "not allowed with argument" in one_line_error(run("--metrics-url", "http://x", "--prometheus", "http://y"), 2)


def test_without_a_terminal_the_console_points_to_the_headless_commands():
    line = one_line_error(run(stdin=subprocess.DEVNULL), 1)
    assert "gpuscope ps --json" in line


# ps lists the 20 largest Python processes: 256 MB keeps the child among them however many other
# (smaller) Python processes the machine runs.
BIG_IDLER = "ballast = b'x' * (256 << 20)\n" + IDLER


def test_ps_text_and_json_list_a_child_without_its_secrets(spawn_python, tmp_path):
    child = spawn_python(BIG_IDLER, "--token=abc123", "password=hunter2")
    # A node without a driver, whatever this machine has: the fake NVML plays it.
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"init_error": "LibraryNotFound"}))
    env = fake_nvml_env(scenario)
    text = run("ps", env=env)
    assert text.returncode == 0 and str(child.pid) in text.stdout
    rows = json.loads(run("ps", "--json", env=env).stdout)
    mine = [r for r in rows if r["pid"] == child.pid]
    assert mine and mine[0]["gpu"] is None and mine[0]["gpu_memory_bytes"] is None and mine[0]["rss_bytes"] > 0
    assert "abc123" not in text.stdout + json.dumps(rows) and "hunter2" not in text.stdout + json.dumps(rows)
    assert text.stderr.count("NVML unavailable") == 1 and "NVML unavailable" not in text.stdout  # said once, not where scripts read


def _place_in_a_unit(pid: int) -> Path | None:
    """Move `pid` into a new cgroup named as a systemd service, where this user may (root, with a
    cgroup hierarchy mounted writable); the cgroup's folder, or None."""
    name = f"gpuscope-test-{uuid.uuid4().hex[:8]}.service"
    for root in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        folder = Path(root) / name
        try:
            folder.mkdir()
        except OSError:
            continue
        try:
            if not (folder / "cgroup.procs").exists():  # a plain folder (the tmpfs above v1's hierarchies)
                raise OSError
            (folder / "cgroup.procs").write_text(str(pid))
        except OSError:
            folder.rmdir()
            continue
        return folder
    return None


def test_ps_says_where_a_real_process_runs(spawn_python):
    child = spawn_python(BIG_IDLER)
    folder = _place_in_a_unit(child.pid)
    try:
        with open(f"/proc/{child.pid}/cgroup", "rb") as f:
            expected = parse_cgroup(f.read()).name
        if folder is not None:  # otherwise: wherever this machine runs it (often nowhere named)
            assert expected == folder.name
        rows = json.loads(run("ps", "--json").stdout)
        mine = [r for r in rows if r["pid"] == child.pid]
        assert mine and all(r["runs_in"] == expected for r in mine), mine
        text = run("ps").stdout
        line = next(line for line in text.splitlines() if line.split()[:1] == [str(child.pid)])
        assert f"  {expected or '-'}  " in line and "RUNS IN" in text.splitlines()[0]
    finally:
        child.kill()
        child.wait()
        if folder is not None:
            wait_until(lambda: _removed(folder), timeout=10, what="the test's cgroup to be removed")


def _removed(folder: Path) -> bool:
    try:
        os.rmdir(folder)
    except OSError:
        return not folder.exists()
    return True


def test_global_flags_are_taken_before_or_after_the_command(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[console]\nrefresh_s = 3\n")
    for argv in (["--config", str(config), "config", "--json"], ["config", "--config", str(config), "--json"],
                 ["config", "--json", "--config", str(config)]):
        out = run(*argv)
        assert out.returncode == 0, (argv, out.stderr)
        assert json.loads(out.stdout)["settings"]["console.refresh_s"]["value"] == 3.0, argv
    # After the command, a flag wins over the same flag before it; a flag not repeated is kept.
    out = run("--refresh", "2", "--theme", "gpuscope-light", "config", "--refresh", "5", "--json")
    settings = json.loads(out.stdout)["settings"]
    assert settings["console.refresh_s"]["value"] == 5.0 and settings["console.theme"]["value"] == "gpuscope-light"
    out = run("config", "--no-journal", "--theme", "gpuscope-ansi", "--json")
    settings = json.loads(out.stdout)["settings"]
    assert settings["journal.enabled"]["value"] is False and settings["console.theme"]["value"] == "gpuscope-ansi"
    # ... and checked there as well
    assert "at least 0.25" in one_line_error(run("config", "--refresh", "0.01"), 2)
    assert "unknown theme 'neon'" in one_line_error(run("rules", "--theme", "neon"), 2)


def test_every_command_honours_config(tmp_path):
    """A bad --config is refused by every command, wherever the flag is."""
    missing = str(tmp_path / "missing.toml")
    for argv in (["ps", "--config", missing], ["--config", missing, "ps"],
                 ["metrics", "--metrics-url", "http://127.0.0.1:9/metrics", "--config", missing],
                 ["rules", "--config", missing], ["report", str(tmp_path / "none.gpuscope"), "--config", missing]):
        assert "no such configuration file (set by --config)" in one_line_error(run(*argv), 2), argv


def test_a_command_s_own_error_is_one_line_with_its_exit_status(tmp_path):
    """Errors raised deep in the core (here the recording's) reach the user as one line, once."""
    bad = tmp_path / "bad.gpuscope"
    bad.write_bytes(b"not a recording\n")
    line = one_line_error(run("report", str(bad)), 1)
    assert str(bad) in line
