"""Every form of secret gpuscope masks: nothing of the secret remains, the rest stays readable.

A command line of another user is shown to whoever runs gpuscope, recorded in journals and
snapshots and pasted into tickets by way of the report: a credential in it must not survive any
of that. Each case is an argv (or a free text), the secret values that must vanish, and the words
around them that must stay.
"""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from gpuscope.core.common.redact import MASK, redact_args, redact_command, redact_text

from conftest import SYSTEM_PYTHON
from helpers import ROOT, fake_nvml_env, gpuscope_cmd

GHP = "ghp_" + "A1b2C3d4E5" * 4  # 40 characters after the prefix, as GitHub issues them
SK = "sk-" + "Zx9" * 16
SK_PROJ = "sk-proj-" + "Qw7_" * 12
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvbi1jYWxsIn0.c2lnbmF0dXJlLXZhbHVl"

ARGV_CASES = [
    # (argv, secrets that must vanish, words that must stay)
    (["serve", "--api-key", "AK-1", "--port", "80"], ["AK-1"], ["serve", "--api-key", "--port 80"]),
    (["serve", "--key", "K3y-value", "--workers", "2"], ["K3y-value"], ["--key", "--workers 2"]),
    (["ssh-keygen", "--passphrase", "Phr4se!"], ["Phr4se!"], ["ssh-keygen", "--passphrase"]),
    (["redis-server", "--pass", "Pa55"], ["Pa55"], ["redis-server", "--pass"]),
    (["tool", "--pw", "Pw0rd", "-v"], ["Pw0rd"], ["--pw", "-v"]),
    (["client", "--jwt", JWT], [JWT, "c2lnbmF0dXJl"], ["client", "--jwt"]),
    (["client", "--bearer", "BeaRer-T0k"], ["BeaRer-T0k"], ["--bearer"]),
    (["client", "--cookie", "session=S3ss; csrf=Cs7f"], ["S3ss", "Cs7f"], ["client", "--cookie"]),
    (["client", "--password=Hunter2", "--user", "bob"], ["Hunter2"], ["--password=", "--user bob"]),
    (["client", "--secret", "Shh"], ["Shh"], ["--secret"]),
    (["aws-tool", "--access-key", "AccK3y", "--region", "eu"], ["AccK3y"], ["--access-key", "--region eu"]),
    (["aws-tool", "--secret-access-key", "wJalrXUt/K7MDENG"], ["wJalrXUt/K7MDENG"], ["--secret-access-key"]),
    (["app", "--client-secret", "CliS3c", "--hf-token", "hf_tok", "--auth-token", "AuthT"], ["CliS3c", "hf_tok", "AuthT"],
     ["--client-secret", "--hf-token", "--auth-token"]),
    (["serve", "--token=a b c", "--port", "1"], ["a b c", "b c"], ["--token=", "--port 1"]),
    (["mysql", "-uroot", "-pSup3rPW", "sales"], ["Sup3rPW"], ["mysql", "-uroot", "-p", "sales"]),
    (["/usr/bin/mysqldump", "-pDumpPW", "db"], ["DumpPW"], ["mysqldump", "db"]),
    (["sshpass", "-p", "SshPW", "ssh", "host"], ["SshPW"], ["sshpass", "ssh host"]),
    (["redis-cli", "-a", "RedisPW", "ping"], ["RedisPW"], ["redis-cli", "ping"]),
    (["curl", "-u", "alice:CurlPW", "https://h/x"], ["CurlPW"], ["curl", "alice:", "https://h/x"]),
    (["curl", "-H", "Authorization: Bearer HdrT0ken", "https://h/"], ["HdrT0ken"], ["curl", "Authorization:", "https://h/"]),
    (["curl", "-H", "X-Api-Key: ApiK3yV", "https://h/"], ["ApiK3yV"], ["X-Api-Key:", "https://h/"]),
    (["curl", "-H", "Cookie: sid=C00kie; theme=dark", "https://h/"], ["C00kie", "dark"], ["Cookie:", "https://h/"]),
    (["curl", "-b", "sid=Bc00kie", "https://h/"], ["Bc00kie"], ["curl", "https://h/"]),
    (["psql", "postgres://app:PgPW@db:5432/x"], ["PgPW"], ["postgres://app:", "@db:5432/x"]),
    (["psql", "postgres://user:P@ss@w0rd@db.internal/x"], ["P@ss@w0rd", "ss@w0rd", "w0rd"], ["postgres://user:", "@db.internal/x"]),
    (["app", "--dsn", "user:P@ss@w0rd@tcp(db:3306)/x"], ["P@ss@w0rd", "w0rd"], ["--dsn", "user:", "@tcp(db:3306)/x"]),
    (["fetch", "https://store/x?sv=2022&sig=SasSig%3D&se=1"], ["SasSig"], ["https://store/x?sv=2022&sig=", "&se=1"]),
    (["fetch", "https://h/cb?token=QTok&page=2"], ["QTok"], ["https://h/cb?token=", "&page=2"]),
    (["fetch", "https://s3/b/k?X-Amz-Signature=abc123def&X-Amz-Date=20240101"], ["abc123def"],
     ["X-Amz-Signature=", "X-Amz-Date=20240101"]),
    (["fetch", "https://h/api?access_token=AcT0k&signature=S1gn&key=GoogK"], ["AcT0k", "S1gn", "GoogK"], ["https://h/api?"]),
    (["run", GHP], [GHP, GHP[4:]], ["run", "ghp_"]),
    (["run", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"], ["11ABCDEFG0123456789"], ["github_pat_"]),
    (["run", SK], [SK[3:]], ["run"]),
    (["run", SK_PROJ], [SK_PROJ[8:]], ["run", "sk-proj-"]),
    (["bot", "xoxb-1234567890-0987654321-AbCdEfGhIjKl"], ["1234567890-0987654321"], ["bot", "xoxb-"]),
    (["aws", "AKIAIOSFODNN7EXAMPLE"], ["IOSFODNN7EXAMPLE"], ["aws"]),
    (["client", "--header", f"Authorization: Bearer {JWT}"], ["c2lnbmF0dXJl", "eyJzdWIi"], ["--header"]),
    (["app", JWT], ["eyJzdWIi", "c2lnbmF0dXJl"], ["app"]),
    (["env", "AWS_SECRET_ACCESS_KEY=wJalr/K7MD+EN", "HF_TOKEN=hf_x y", "PATH=/bin", "python"], ["wJalr", "hf_x y"],
     ["AWS_SECRET_ACCESS_KEY=", "HF_TOKEN=", "PATH=/bin", "python"]),
    (["env", "PGPASSWORD=PgEnvPW", "MYSQL_PWD=MyPwd", "DB_PASS=DbPass", "psql"], ["PgEnvPW", "MyPwd", "DbPass"], ["psql"]),
    (["python", "-c", '{"api_key": "JsonK3y", "model": "llama"}'], ["JsonK3y"], ['"api_key": "***"', '"model": "llama"']),
    (["sh", "-c", "mysql -pScriptPW db && curl -u bob:ScrCurl https://h --token 'T o k'"], ["ScriptPW", "ScrCurl", "T o k"],
     ["mysql", "db", "bob:", "https://h", "--token"]),
    (["docker", "run", "-e", "OPENAI_API_KEY=DockK", "img"], ["DockK"], ["docker run -e", "OPENAI_API_KEY=", "img"]),
    (["openssl", "enc", "-pass", "pass:OsslPW", "-in", "f"], ["OsslPW"], ["openssl enc -pass", "-in f"]),
]


@pytest.mark.parametrize("argv, secrets, kept", ARGV_CASES, ids=[" ".join(c[0])[:60] for c in ARGV_CASES])
def test_each_form_is_masked_and_the_rest_stays_readable(argv, secrets, kept):
    line = redact_command(argv)
    for secret in secrets:
        assert secret not in line, line
    for word in kept:
        assert word in line, line
    assert MASK in line
    # The same command line, already joined (as a recording or another tool holds it).
    joined = redact_command(shlex.join(argv))
    for secret in secrets:
        assert secret not in joined, joined


TEXT_CASES = [
    # free text: a message, a header, a URL, a config value
    ("Authorization: Bearer abcdefghijklmnop", ["abcdefghijklmnop"], ["Authorization:"]),
    ("proxy-authorization: Basic dXNlcjpwYXNzd29yZA==", ["dXNlcjpwYXNz"], ["proxy-authorization:"]),
    ("cannot reach http://bob:Sekr1t@prom:9090/api: refused", ["Sekr1t"], ["http://bob:", "@prom:9090/api: refused"]),
    ("redis://:RedisURLpw@cache:6379/0", ["RedisURLpw"], ["redis://:", "@cache:6379/0"]),
    ("Set-Cookie: sid=SetC00k; HttpOnly", ["SetC00k"], ["Set-Cookie:"]),
    ('{"password":"JsPw","token": "JsTok","n":1}', ["JsPw", "JsTok"], ['"n":1']),
    ("{'secret': 'PySecret', 'x': 2}", ["PySecret"], ["'x': 2"]),
    ("run --token=\"a b c\" --port 9", ["a b c", " b ", "c\""], ["--token=", "--port 9"]),
]


@pytest.mark.parametrize("text, secrets, kept", TEXT_CASES, ids=[c[0][:50] for c in TEXT_CASES])
def test_free_text_forms(text, secrets, kept):
    shown = redact_text(text)
    for secret in secrets:
        assert secret not in shown, shown
    for word in kept:
        assert word in shown, shown


@pytest.mark.parametrize("argv", [
    ["vllm", "serve", "m", "--max-tokens", "100", "--tokenizer", "t", "--keyfile", "k.pem"],
    ["python", "-u", "train.py", "--bos-token", "<s>", "--max-new-tokens", "64"],
    ["docker", "run", "-p", "8080:80", "-v", "/srv/data:/data", "-v", "/run/key:/key", "nginx:1.25@sha256:0123abcd"],
    ["ansible-playbook", "--ask-pass", "site.yml", "--no-password"],
    ["git", "clone", "git@github.com:org/repo.git"],
    ["curl", "https://example.com/path?page=2&sort=name"],
    ["python", "-m", "sklearn-tool", "--mode", "sk-short"],
])
def test_ordinary_command_lines_are_left_alone(argv):
    assert redact_args(argv) == argv


def test_another_users_secrets_are_masked_in_ps_json(other_user, tmp_path):
    """End to end: a process of another user with secrets in its argv, read from /proc by `gpuscope ps`."""
    proc = other_user.popen(
        [SYSTEM_PYTHON, "-c", "import time; print('ready', flush=True); time.sleep(60)",
         "--api-key", "PsApiK3y", "--token=a b c", "-H", "Authorization: Bearer PsBearer99", GHP,
         "postgres://u:P@ss@w0rd@db/x"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    scenario = tmp_path / "nvml.json"  # on the (fake) GPU: always a row of its own, however busy the node
    scenario.write_text(json.dumps({"devices": [{"name": "GPU", "total": 2**34, "compute": [{"pid": proc.pid, "used": 2**30}]}]}))
    out = subprocess.run(gpuscope_cmd() + ["ps", "--json"], capture_output=True, text=True, timeout=60,
                         env=fake_nvml_env(scenario), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    row = next(r for r in json.loads(out.stdout) if r["pid"] == proc.pid)
    for secret in ("PsApiK3y", "a b c", "PsBearer99", GHP[4:], "P@ss", "w0rd"):
        assert secret not in out.stdout
    assert "--api-key ***" in row["command"] and "postgres://u:***@db/x" in row["command"]
    assert row["user"] == other_user.name


def test_gpuscope_config_masks_passwords_in_urls_in_text_and_json(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        '[service]\nmetrics_url = ["http://scraper:ScrapePW@127.0.0.1:8000/metrics?token=QueryTok"]\n'
        '[prometheus]\nurl = "https://alice:P@ss@w0rd@prom.internal:9090"\ntoken = "TokenValue"\n'
    )
    text = subprocess.run(gpuscope_cmd() + ["--config", str(config), "config"], capture_output=True, text=True, timeout=60)
    data = subprocess.run(gpuscope_cmd() + ["--config", str(config), "config", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert text.returncode == 0 and data.returncode == 0, text.stderr + data.stderr
    for out in (text.stdout, data.stdout):
        for secret in ("ScrapePW", "QueryTok", "P@ss", "w0rd", "TokenValue"):
            assert secret not in out
    settings = json.loads(data.stdout)["settings"]
    assert settings["prometheus.url"]["value"] == "https://alice:***@prom.internal:9090"
    assert settings["service.metrics_url"]["value"] == ["http://scraper:***@127.0.0.1:8000/metrics?token=***"]
    assert "prometheus.url = \"https://alice:***@prom.internal:9090\"" in text.stdout
