"""Envoy, the picker and sims on loopback; every process a module starts is stopped when it
ends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from gateway_kit import ADMIN_TOKEN, StartGateway, StartSim

from autoglm_runtime.sim.process import SimProcess
from testkit.gateway import Gateway, start_gateway


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
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartGateway]:
    """start(sims, *router_flags, **gateway_config): the picker, then Envoy in front of it."""
    started: list[Gateway] = []

    def start(sims: list[SimProcess], *router_flags: str, **config: Any) -> Gateway:
        gateway = start_gateway([s.base_url for s in sims], "--poll-interval", "0.2",
                                "--log-level", "info", *router_flags,
                                folder=tmp_path_factory.mktemp("gateway"), **config)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()
