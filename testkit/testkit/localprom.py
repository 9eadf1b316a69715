"""Debian's Prometheus on loopback, scraping the runtime and router pods of the local cluster.

Debian builds Prometheus without Kubernetes service discovery, so targets come from a file the
pod runner keeps current (file-based discovery), labelled the way the chart's PodMonitors or
`role: pod` scrape configs label them: `namespace`, `pod`, plus `autoglm_deployment`, with the
chart's job names (`autoglm-runtime`, `autoglm-router`). The operator's
queries scope on `namespace` and `pod`, so they read the same here as on a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from testkit.localcluster import free_port, log


def serve_exposition(render: Callable[[], bytes]) -> ThreadingHTTPServer:
    """A scrape target on loopback: every GET answers `render()` in the text exposition format.
    Stop it with `.shutdown()`; `.server_address[1]` is its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(found).exists():
        raise FileNotFoundError("prometheus not found: run `make deps` (Debian package prometheus)")
    return found


@dataclass
class LocalPrometheus:
    workdir: Path
    scrape_interval: str = "1s"
    extra_static_targets: dict[str, str] = field(default_factory=dict)
    # A whole prometheus.yml instead of the pod-runner one (tests with their own targets/rules).
    custom_config: dict[str, Any] | None = None
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def targets_file(self) -> Path:
        """File-based discovery: the pod runner writes one target per runtime pod here."""
        return self.workdir / "targets.json"

    def config(self) -> dict[str, Any]:
        if self.custom_config is not None:
            return self.custom_config
        if not self.targets_file.exists():
            self.targets_file.write_text("[]")
        scrape_configs: list[dict[str, Any]] = [
            {
                "job_name": "autoglm-runtime",
                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}],
            }
        ]
        for job, target in self.extra_static_targets.items():
            scrape_configs.append({"job_name": job, "static_configs": [{"targets": [target]}]})
        return {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": "1s"},
            "scrape_configs": scrape_configs,
        }

    def start(self) -> LocalPrometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(json.dumps(self.config(), indent=2))  # YAML is a superset of JSON
        self.port = self.port or free_port()
        logfile = open(self.workdir / "prometheus.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir,
        )  # fmt: skip
        logfile.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError((self.workdir / "prometheus.log").read_text()[-3000:])
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response,
            ):
                if response.status == 200:
                    log(f"prometheus ready at {self.url}")
                    return self
            time.sleep(0.2)
        raise TimeoutError("prometheus not ready after 30s")

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
        return body["data"]["result"]  # type: ignore[no-any-return]

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> list[tuple[float, float]]:
        """One series' (time, value) points; the first series when the query returns several."""
        params = {"query": promql, "start": start, "end": end, "step": step}
        url = f"{self.url}/api/v1/query_range?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            result = json.loads(response.read())["data"]["result"]
        return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []

    def active_targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as response:
            return json.loads(response.read())["data"]["activeTargets"]  # type: ignore[no-any-return]
