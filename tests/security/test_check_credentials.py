"""`gpuscope check` starts the command under test and its load command: neither is handed the
Prometheus credentials (or any other secret) that gpuscope itself was given in its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import gpuscope_cmd

SECRETS = {
    "GPUSCOPE_PROMETHEUS_TOKEN": "tok-0123456789",
    "GPUSCOPE_PROMETHEUS_USER": "scraper",
    "GPUSCOPE_PROMETHEUS_PASSWORD": "pw-0123456789",
    "GPUSCOPE_EXPORTER_PASSWORD": "pw-exporter-42",
}
DUMP = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


def test_the_command_under_test_and_the_load_get_none_of_gpuscopes_credentials(tmp_path):
    service_env, load_env = tmp_path / "service.json", tmp_path / "load.json"
    service = f"{DUMP}\nimport time\ntime.sleep(60)"
    load = f"{sys.executable} -c {json.dumps(DUMP)} {load_env}"
    env = {**os.environ, **SECRETS, "SERVICE_OWN_TOKEN": "kept"}
    out = subprocess.run([*gpuscope_cmd(), "check", "--no-memray", "--rounds", "1", "--load", load, "--json", "--",
                          sys.executable, "-c", service, str(service_env)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode in (0, 1), out.stderr
    for dumped in (service_env, load_env):
        seen = json.loads(dumped.read_text())
        assert not set(SECRETS) & set(seen), dumped.name
        assert not any(value in json.dumps(seen) for value in SECRETS.values())
        assert seen["SERVICE_OWN_TOKEN"] == "kept"  # the caller's own variables pass as they are
