"""Start a server (the sim, `python -m testkit.sim`; the router) as a child process on a free
loopback port, for tests and benchmarks. Only the standard library: `make cluster-down` imports
it (through testkit.localcluster) with the system Python."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, never one this process handed out before: the
    port is free again once the probe's socket closes, so two calls in a row (before either
    server binds) could otherwise return the same one."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


class ServerProcess:
    """A server in its own process, so its CPU use and signals are separate from the caller's.

    Subclasses name the command; start() waits until /health answers 200 (or, with
    wait_healthy False, until the server listens at all)."""

    kind = "server"

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        wait_healthy: bool = True,
    ) -> None:
        self.port = free_port()
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.wait_healthy = wait_healthy
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def health_url(self) -> str:
        return self.base_url + "/health"

    def start(self, timeout: float = 30.0) -> Self:
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command(), env=self.env, stdout=out, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.process.returncode} at start")
            try:
                with urllib.request.urlopen(self.health_url, timeout=1) as response:
                    if response.status == 200 or not self.wait_healthy:
                        return self
            except urllib.error.HTTPError:
                if not self.wait_healthy:
                    return self  # listening; 503 while the model loads
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"{self.kind} on port {self.port} not healthy within {timeout} s")

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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SimProcess(ServerProcess):
    """`python -m testkit.sim`; args are the sim's own flags. Its admin API is on a port of its
    own, as the launcher serves it beside the engine."""

    kind = "sim"

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 log_path: Path | None = None, wait_healthy: bool = True) -> None:
        super().__init__(*args, env=env, log_path=log_path, wait_healthy=wait_healthy)
        self.admin_port = free_port()

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "testkit.sim", "--host", "127.0.0.1",
                "--port", str(self.port), "--admin-port", str(self.admin_port), *self.args]


class RouterProcess(ServerProcess):
    """`autoglm-router` in front of `endpoints`; args are its other flags. Its /health and
    /metrics are on a port of their own, apart from the API."""

    kind = "router"

    def __init__(self, endpoints: list[str], *args: str, env: dict[str, str] | None = None,
                 log_path: Path | None = None, wait_healthy: bool = True) -> None:
        super().__init__(*args, env=env, log_path=log_path, wait_healthy=wait_healthy)
        self.endpoints = list(endpoints)
        self.metrics_port = free_port()

    @property
    def ops_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def health_url(self) -> str:
        return self.ops_url + "/health"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "autoglm_router.cli", "--host", "127.0.0.1",
                "--port", str(self.port), "--metrics-port", str(self.metrics_port), *self.args]
        for endpoint in self.endpoints:
            argv += ["--endpoint", endpoint]
        return argv
