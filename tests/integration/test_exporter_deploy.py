"""deploy/: the Kubernetes manifests against Kubernetes' own schemas (kubernetes-validate, strict),
every YAML file through yamllint, the ServiceMonitor against the Service it selects, and the
systemd unit through `systemd-analyze verify` where systemd is there."""

from __future__ import annotations

import subprocess
import sys

import yaml

from helpers import ROOT, gpuscope_cmd, require_tool

DEPLOY = ROOT / "deploy"
KUBERNETES = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
YAMLLINT = "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}"


def tool(name: str) -> list[str]:
    return [sys.executable, "-m", name.replace("-", "_")]


def test_manifests_are_valid_kubernetes_resources():
    done = subprocess.run([*tool("kubernetes-validate"), "--strict", "--no-warn",
                           *map(str, KUBERNETES)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "daemonset/gpuscope-exporter" in done.stdout and "service/gpuscope-exporter" in done.stdout


def test_a_wrong_field_is_caught(tmp_path):
    broken = tmp_path / "daemonset.yaml"
    broken.write_text((DEPLOY / "kubernetes" / "daemonset.yaml").read_text().replace("hostPID:", "hostPid:"))
    done = subprocess.run([*tool("kubernetes-validate"), "--strict", str(broken)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0


def test_yaml_is_clean():
    done = subprocess.run([*tool("yamllint"), "-d", YAMLLINT, str(DEPLOY)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_daemonset_runs_unprivileged_on_the_hosts_pids():
    daemonset, service = yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["hostPID"] is True and pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # The exporter's own parser accepts the arguments the manifest gives it.
    from gpuscope.cli import build_parser
    args = build_parser().parse_args([a.replace("$(NODE_NAME)", "node-1") for a in container["args"]])
    assert (args.command, args.listen, args.node_name, args.refresh) == ("exporter", "0.0.0.0:9835", "node-1", 2.0)
    monitor = yaml.safe_load((DEPLOY / "kubernetes" / "servicemonitor.yaml").read_text())
    assert monitor["kind"] == "ServiceMonitor"
    selected = monitor["spec"]["selector"]["matchLabels"].items()
    assert selected <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_the_daemonset_shares_nothing_it_need_not_and_only_prometheus_reaches_it():
    daemonset, _ = yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsUser"] not in (0, 65534) and pod["securityContext"]["runAsGroup"] != 65534
    image = pod["containers"][0]["image"]
    assert "@sha256:" in image and len(image.rsplit(":", 1)[1]) == 64
    policy = yaml.safe_load((DEPLOY / "kubernetes" / "networkpolicy.yaml").read_text())
    assert policy["kind"] == "NetworkPolicy"
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(daemonset).items()
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"} and policy["spec"]["egress"] == []
    [rule] = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [9835] and rule["from"]  # someone in particular, not everyone


def pod_labels(daemonset: dict) -> dict:
    return daemonset["spec"]["template"]["metadata"]["labels"]


def test_the_systemd_unit_is_confined():
    lines = [ln.strip() for ln in (DEPLOY / "systemd" / "gpuscope-exporter.service").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    settings: dict[str, list[str]] = {}
    for line in lines:
        name, sep, value = line.partition("=")
        if sep:
            settings.setdefault(name, []).append(value)
    assert "SupplementaryGroups" not in settings
    assert int(settings["LimitNOFILE"][0]) >= 1024
    for name, value in [("RestrictNamespaces", "yes"), ("ProtectKernelModules", "yes"), ("DevicePolicy", "closed"),
                        ("NoNewPrivileges", "yes"), ("DynamicUser", "yes")]:
        assert settings[name] == [value], name
    assert settings["SystemCallFilter"] and all(a.startswith("char-nvidia") for a in settings["DeviceAllow"])


def test_systemd_unit_verifies(tmp_path):
    analyze = require_tool("systemd-analyze")
    unit = (DEPLOY / "systemd" / "gpuscope-exporter.service").read_text()
    installed = gpuscope_cmd()[0]
    assert "ExecStart=/usr/local/bin/gpuscope " in unit
    # Verified with the path of the gpuscope installed here (systemd checks it is executable).
    copy = tmp_path / "gpuscope-exporter.service"
    copy.write_text(unit.replace("/usr/local/bin/gpuscope", installed))
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    args = unit.split("ExecStart=/usr/local/bin/gpuscope ", 1)[1].splitlines()[0].split()
    from gpuscope.cli import build_parser
    assert build_parser().parse_args(args).listen == "127.0.0.1:9835"
