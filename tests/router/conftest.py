"""Sims and routers on loopback; every process a module starts is stopped when it ends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from router_kit import ADMIN_TOKEN, RouterProcess, StartRouter, StartSim

from autoglm_runtime.sim.process import SimProcess


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
