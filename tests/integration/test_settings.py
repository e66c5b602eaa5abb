"""The settings: config file, environment and flags, which wins, and `gpuscope config`."""

import json
import subprocess

import pytest

from gpuscope import theme_files
from gpuscope.cli import build_parser, setting_flags
from gpuscope.commands.common import console_theme, serving_source
from gpuscope.config import Config, ConfigError, Settings, load_config, resolve
from gpuscope.core.leak import LeakThresholds
from gpuscope.errors import UsageError

from helpers import gpuscope_cmd

FILE = """\
[console]
refresh_s = 2
theme = "gpuscope-light"

[service]
metrics_url = "http://127.0.0.1:9/metrics"

[prometheus]
token = "s3cret-token"
job = "vllm"

[alerts]
fast_rate = 2e6
"""


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(FILE)
    return path


def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(config_file):
    config = load_config(config_file)
    file_only = resolve(config, env={})
    assert (file_only["console.refresh_s"].value, file_only["console.refresh_s"].origin) == (2.0, "file")
    assert file_only["console.refresh_s"].detail == f"{config_file}, line 2"
    assert (file_only["slo.ttft_p95_s"].value, file_only["slo.ttft_p95_s"].origin) == (0.8, "default")
    assert file_only["service.metrics_url"].value == ("http://127.0.0.1:9/metrics",)

    env = {"GPUSCOPE_REFRESH": "3", "GPUSCOPE_THEME": "gpuscope-ansi"}
    with_env = resolve(config, env=env)
    assert (with_env["console.refresh_s"].value, with_env["console.refresh_s"].origin) == (3.0, "environment")
    assert with_env["console.theme"].detail == "GPUSCOPE_THEME"

    with_flag = resolve(config, env=env, flags={"console.refresh_s": 0.5, "console.theme": None})
    assert (with_flag["console.refresh_s"].value, with_flag["console.refresh_s"].origin) == (0.5, "flag")
    assert with_flag["console.refresh_s"].detail == "--refresh"
    assert with_flag["console.theme"].origin == "environment"  # no --theme given


def test_the_theme_last_chosen_counts_only_when_no_one_set_one(tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path)}
    assert resolve(Config(), env=env)["console.theme"].value == "gpuscope-dark"
    theme_files.remember("gpuscope-light", env)
    chosen = resolve(Config(), env=env)["console.theme"]
    assert (chosen.value, chosen.origin) == ("gpuscope-light", "remembered")
    assert resolve(Config(), env={**env, "GPUSCOPE_THEME": "x"})["console.theme"].value == "x"


def test_secrets_are_never_shown(config_file):
    token = resolve(load_config(config_file), env={})["prometheus.token"]
    assert token.shown == "(set, hidden)" and "s3cret" not in repr(token.shown)


@pytest.mark.parametrize(
    "text, where, message",
    [
        ("[console]\nrefresh_s = 0.1\n", "line 2: console.refresh_s", "at least 0.25"),
        ("[console]\nrefresh_s = 'fast'\n", "line 2: console.refresh_s", "expected a number of seconds"),
        ("[console]\n\ntheme = 3\n", "line 3: console.theme", "expected a theme name"),
        ("[console]\ncolour = 'x'\n", "line 2: console.colour", "unknown key"),
        ("[service]\nmetrics_url = []\n", "line 2: service.metrics_url", "a URL or a list of URLs"),
        ("[service]\nurl = 'x'\n", "line 2: service.url", "unknown key"),
        ("[prometheus]\njob = 7\n", "line 2: prometheus.job", "non-empty string"),
        ("[alerts]\nfast_rate = -1\n", "line 2: alerts.fast_rate", "positive number"),
        ("[alerts]\nmin_confidence = 2\n", "line 2: alerts.min_confidence", "from 0 to 1"),
        ("[alerts]\nrate_margin = 0.5\n", "line 2: alerts.rate_margin", "unknown key"),
        ("[display]\nx = 1\n", "line 1: display", "unknown setting"),
    ],
)
def test_a_bad_value_names_the_file_line_and_key(tmp_path, text, where, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    line = str(caught.value)
    assert line.startswith(f"{path}, {where}: ") and message in line, line


def test_a_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match="GPUSCOPE_REFRESH: expected a number of seconds"):
        resolve(load_config(), env={"GPUSCOPE_REFRESH": "soon"})


def settings_of(argv, env=None):
    """The settings `main` builds for this command line."""
    args = build_parser(argv).parse_args(argv)
    return Settings.load(args.config, setting_flags(args), {} if env is None else env)


def test_the_console_takes_refresh_theme_thresholds_and_service_from_the_file(config_file):
    settings = settings_of(["--config", str(config_file)])
    assert (settings.refresh_s, console_theme(settings)) == (2.0, "gpuscope-light")
    assert settings.thresholds == LeakThresholds(fast_rate=2e6)
    serving = serving_source(settings)
    assert serving.collector.target_names == ["http://127.0.0.1:9/metrics"] and serving.interval == 2.0
    # a source on the command line replaces the file's
    settings = settings_of(["--config", str(config_file), "--metrics-url", "http://127.0.0.1:10/metrics"])
    assert serving_source(settings).collector.target_names == ["http://127.0.0.1:10/metrics"]


def test_an_unknown_theme_in_the_file_is_refused_with_where_it_was_set(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[console]\ntheme = 'neon'\n")
    with pytest.raises(UsageError, match=r"unknown theme 'neon' \(console.theme from .*line 2\); available: gpuscope-ansi"):
        console_theme(settings_of(["--config", str(path)]))


def gpuscope(*args, env=None):
    return subprocess.run(gpuscope_cmd() + list(args), capture_output=True, text=True, timeout=60, env=env)


def test_gpuscope_config_prints_each_value_and_its_origin(config_file, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_THEME", "gpuscope-ansi")
    out = gpuscope("--config", str(config_file), "--refresh", "5", "config")
    assert out.returncode == 0, out.stderr
    lines = {ln.split(" = ")[0]: ln for ln in out.stdout.splitlines() if " = " in ln}
    assert lines["console.refresh_s"].split("#")[1].strip() == "flag --refresh"
    assert lines["console.theme"].split("#")[1].strip() == "environment GPUSCOPE_THEME"
    assert lines["alerts.fast_rate"].split("#")[1].strip() == f"file {config_file}, line 13"
    assert lines["slo.ttft_p95_s"].split("#")[1].strip() == "default"
    assert "(set, hidden)" in lines["prometheus.token"] and "s3cret" not in out.stdout
    assert set(lines) == set(resolve(load_config(config_file), env={}))  # every setting, each on its line

    data = json.loads(gpuscope("--config", str(config_file), "config", "--json").stdout)
    assert data["schema"] == "gpuscope.config/1" and data["file"] == str(config_file)
    assert data["settings"]["console.refresh_s"] == {"value": 2.0, "origin": "file", "detail": f"{config_file}, line 2"}
    assert data["settings"]["prometheus.token"]["value"] == "(set)"


def test_gpuscope_config_with_a_bad_file_is_one_line_and_non_zero(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[alerts]\nfast_rate = 'quick'\n")
    out = gpuscope("--config", str(path), "config")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == f"gpuscope: {path}, line 2: alerts.fast_rate: expected a positive number"
    missing = gpuscope("--config", str(tmp_path / "missing.toml"), "config")
    assert missing.returncode == 2 and "no such configuration file (set by --config)" in missing.stderr


def test_the_alert_thresholds_come_from_the_settings(tmp_path, monkeypatch):
    """[alerts] in the settings is what `diagnose`, `report` and the wizard judge growth by."""
    config = tmp_path / "config.toml"
    config.write_text("[alerts]\nfast_rate = 123456\n")
    thresholds = Settings.load(env={"GPUSCOPE_CONFIG": str(config)}).thresholds
    assert thresholds.fast_rate == 123456 and thresholds != LeakThresholds()


def test_main_reads_and_parses_the_settings_file_once(config_file, monkeypatch, capsys):
    """One Settings per run: the file read and its TOML parsed once, whatever the command asks."""
    import gpuscope.config as config_module
    from gpuscope.cli import main

    reads, parses = [], []
    read_regular, parse_toml = config_module.read_regular, config_module.parse_toml
    monkeypatch.setattr(config_module, "read_regular", lambda *a, **k: reads.append(a) or read_regular(*a, **k))
    monkeypatch.setattr(config_module, "parse_toml", lambda text: parses.append(text) or parse_toml(text))
    assert main(["config", "--config", str(config_file)]) == 0
    assert "console.refresh_s = 2" in capsys.readouterr().out
    assert (len(reads), len(parses)) == (1, 1)


def test_settings_are_immutable():
    import dataclasses

    settings = Settings.load(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.config = Config()  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.effective["console.refresh_s"] = None  # type: ignore[index]
