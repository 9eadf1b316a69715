"""The abuse suite's servers: the real router and sims through their CLIs on loopback, and a
replica that records what reached it. Every process a module starts is stopped when it ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from abuse_kit import (
    ADMIN_TOKEN,
    API_KEY,
    RecordingReplica,
    RouterProcess,
    StartGateway,
    StartRouter,
    StartSim,
)

from testkit.gateway import Gateway, start_gateway
from testkit.processes import SimProcess
from testkit.sims import sim_starter


@pytest.fixture(scope="module")
def recorder() -> Iterator[RecordingReplica]:
    replica = RecordingReplica().start()
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def start_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartRouter]:
    started: list[RouterProcess] = []

    def start(endpoints: list[str], *args: str,
              env: dict[str, str] | None = None) -> RouterProcess:
        log = tmp_path_factory.mktemp("router") / "router.log"
        router = RouterProcess(endpoints, "--poll-interval", "0.2", *args, env=env, log_path=log)
        started.append(router)
        return router.start(timeout=20.0)

    yield start
    for router in started:
        router.stop()


@pytest.fixture(scope="module")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    with sim_starter(tmp_path_factory, "--time-factor", "0.02",
                     env={"AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN}) as start:
        yield start


@pytest.fixture(scope="module")
def sim(start_sim: StartSim) -> SimProcess:
    return start_sim()


@pytest.fixture(scope="module")
def keyed_sim(start_sim: StartSim) -> SimProcess:
    return start_sim(env={"VLLM_API_KEY": API_KEY})


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartGateway]:
    """start(endpoints, *router_flags, env=None, **gateway_config): the router with its endpoint
    picker, and real Envoy in front of it (testkit.gateway)."""
    started: list[Gateway] = []

    def start(endpoints: list[str], *router_flags: str, env: dict[str, str] | None = None,
              **config: Any) -> Gateway:
        gateway = start_gateway(endpoints, "--poll-interval", "0.2", *router_flags, env=env,
                                folder=tmp_path_factory.mktemp("gateway"), **config)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()
