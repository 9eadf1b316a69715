"""Sims and routers on loopback; every process a module starts is stopped when it ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from router_kit import ADMIN_TOKEN, RouterProcess, StartRouter, StartSim

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
def start_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartRouter]:
    started: list[RouterProcess] = []

    def start(endpoints: list[str], *args: str, wait_healthy: bool = True) -> RouterProcess:
        log = tmp_path_factory.mktemp("router") / "router.log"
        router = RouterProcess(endpoints, "--log-level", "info", *args, log_path=log,
                               wait_healthy=wait_healthy)
        started.append(router)
        return router.start(timeout=20.0)

    yield start
    for router in started:
        router.stop()
