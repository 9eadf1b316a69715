"""Real servers on loopback: `autoglm-runtime sim` subprocesses with the mode middleware."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sim_kit import ADMIN_TOKEN, StartSim

from autoglm_runtime.sim.process import SimProcess


@pytest.fixture(scope="module")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    """Start sims with a config and flags; every one is stopped when the module ends."""
    started: list[SimProcess] = []

    def start(*args: str, config: dict[str, Any] | None = None,
              env: dict[str, str] | None = None, wait_healthy: bool = True) -> SimProcess:
        folder = tmp_path_factory.mktemp("sim")
        config_file = folder / "config.json"
        config_file.write_text(json.dumps(config or {}))
        sim = SimProcess(*args, env={
            "AUTOGLM_CONFIG_FILE": str(config_file),
            "AUTOGLM_LABELS_FILE": str(folder / "labels"),
            "AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN,
            "AUTOGLM_DRAIN_GRACE_SECONDS": "20",
            **(env or {}),
        }, log_path=folder / "sim.log", wait_healthy=wait_healthy)
        started.append(sim)
        return sim.start()

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture(scope="module")
def sim_server(start_sim: StartSim) -> SimProcess:
    """A sim at 20x real time, shared by a module's tests."""
    return start_sim("--time-factor", "0.05")
