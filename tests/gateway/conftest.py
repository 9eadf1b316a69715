"""Envoy, the picker and sims on loopback; every process a module starts is stopped when it
ends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from gateway_kit import ADMIN_TOKEN, Gateway, StartGateway, StartSim, address

from autoglm_runtime.sim.process import RouterProcess, ServerProcess, SimProcess, free_port
from testkit.gateway import EnvoyProcess


@pytest.fixture(scope="module")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    started: list[SimProcess] = []

    def start(mode: str, *args: str, config: dict[str, Any] | None = None) -> SimProcess:
        folder = tmp_path_factory.mktemp("sim")
        config_file = folder / "config.json"
        config_file.write_text(json.dumps({"initialMode": mode, **(config or {})}))
        sim = SimProcess("--time-factor", "0.05", *args, env={
            "AUTOGLM_CONFIG_FILE": str(config_file),
            "AUTOGLM_LABELS_FILE": str(folder / "labels"),
            "AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN,
            "AUTOGLM_DRAIN_GRACE_SECONDS": "20",
        }, log_path=folder / "sim.log")
        started.append(sim)
        return sim.start()

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture(scope="module")
def start_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartGateway]:
    """start_gateway(sims, *router_flags, **gateway_config): the router with its picker, then
    Envoy in front of it; the override_host shape gets the sims as the pool's endpoints."""
    started: list[ServerProcess] = []

    def start(sims: list[SimProcess], *router_flags: str, **config: Any) -> Gateway:
        folder = tmp_path_factory.mktemp("gateway")
        picker_port = free_port()
        router = RouterProcess([s.base_url for s in sims], "--ext-proc-port", str(picker_port),
                               "--poll-interval", "0.2", "--log-level", "info", *router_flags,
                               log_path=folder / "router.log")
        started.append(router)
        router.start(timeout=20.0)
        config.setdefault("pool", [address(s) for s in sims])
        envoy = EnvoyProcess(picker_port=picker_port, config_dir=folder,
                             log_path=folder / "envoy.log", **config)
        started.append(envoy)
        envoy.start(timeout=20.0)
        return Gateway(envoy, router)

    yield start
    for process in reversed(started):
        process.stop()
