"""Envoy, the picker and sims on loopback; every process a module starts is stopped when it
ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gateway_kit import ADMIN_TOKEN, StartGateway, StartSim

from testkit.gateway import Gateway, start_gateway
from testkit.processes import SimProcess
from testkit.sims import sim_starter


@pytest.fixture(scope="module")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    """start(mode, *args, config=None): a sim at 20x real time in `mode`."""
    with sim_starter(tmp_path_factory, "--time-factor", "0.05",
                     env={"AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN,
                          "AUTOGLM_DRAIN_GRACE_SECONDS": "20"}) as start:
        yield lambda mode, *args, config=None: start(
            *args, config={"initialMode": mode, **(config or {})})


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
