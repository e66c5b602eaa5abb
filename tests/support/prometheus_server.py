"""A real Prometheus (Debian's package) for the tests and benchmarks: started on a free loopback
port with its data in a temporary folder, ready before it is handed over, stopped afterwards."""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from helpers import answers, free_port, require_tool, wait_until

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Prometheus:
    def __init__(self, url: str, data: Path) -> None:
        self.url = url
        self.data = data

    def get(self, path: str) -> dict:
        with _DIRECT.open(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """An instant query, now or `at` (seconds since the epoch: as Prometheus saw that moment)."""
        from urllib.parse import quote

        when = "" if at is None else f"&time={at:.3f}"
        return self.get(f"/api/v1/query?query={quote(promql)}{when}")["data"]["result"]

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None


@contextlib.contextmanager
def running_prometheus(tmp: Path, jobs: Sequence[tuple[str, str, str]]) -> Iterator[Prometheus]:
    """Prometheus (Debian's package) on a free loopback port, scraping each (job, metrics path,
    host:port) every second with its own default Accept header; stopped afterwards."""
    config = "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n" + "".join(
        f"  - job_name: {job}\n    metrics_path: {path}\n    static_configs: [{{targets: ['{target}']}}]\n"
        for job, path, target in jobs
    )
    with prometheus_with_config(tmp, config) as prom:
        yield prom


@contextlib.contextmanager
def prometheus_with_config(tmp: Path, config: str) -> Iterator[Prometheus]:
    """Prometheus (Debian's package) with this prometheus.yml, on a free loopback port, its data
    in `tmp`; stopped afterwards."""
    binary = require_tool("prometheus")
    (tmp / "prometheus.yml").write_text(config)
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    prom = Prometheus(f"http://127.0.0.1:{port}", tmp / "data")
    try:
        wait_until(lambda: answers(prom.url + "/-/ready") or proc.poll() is not None, timeout=30, what="Prometheus to be ready")
        assert proc.poll() is None, "prometheus exited at start"
        # Debian's packaged service listens on :9090; make sure this is the one started here.
        assert prom.get("/api/v1/status/flags")["data"]["storage.tsdb.path"] == str(tmp / "data")
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
