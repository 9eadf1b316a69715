"""Helpers for the router's loopback tests: the router as a child process, replica metrics."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import httpx

from autoglm_runtime.sim.process import SimProcess, free_port

ADMIN_TOKEN = "router-test-token"
MODEL = "autoglm-phone-9b"


StartSim = Callable[..., SimProcess]


class RouterProcess:
    """`autoglm-router` in its own process on a free loopback port."""

    def __init__(self, endpoints: list[str], *args: str, log_path: Path | None = None) -> None:
        self.port = free_port()
        self.endpoints = endpoints
        self.args = args
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0, wait_healthy: bool = True) -> RouterProcess:
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        argv = [sys.executable, "-m", "autoglm_router.cli", "--host", "127.0.0.1",
                "--port", str(self.port), "--log-level", "info", *self.args]
        for endpoint in self.endpoints:
            argv += ["--endpoint", endpoint]
        self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"router exited with {self.process.returncode} at start")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return self
            except urllib.error.HTTPError:
                if not wait_healthy:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"router on port {self.port} not healthy within {timeout} s")

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""


StartRouter = Callable[..., RouterProcess]


def metric(base_url: str, name: str, **labels: str) -> float:
    """One sample's value from a /metrics page (0 when absent)."""
    text = httpx.get(base_url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def admitted(sim: SimProcess) -> float:
    return metric(sim.base_url, "autoglm_requests_admitted_total")


def set_mode(sim: SimProcess, mode: str) -> None:
    response = httpx.put(sim.base_url + "/autoglm/v1/mode", json={"mode": mode},
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5)
    response.raise_for_status()


def wait_for(check, timeout: float, interval: float = 0.05) -> float:  # type: ignore[no-untyped-def]
    """Seconds until check() is true; fails the test after `timeout`."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"not true within {timeout} s"
        time.sleep(interval)
    return time.monotonic() - start
