"""Real servers on loopback: `testkit.sim` subprocesses with the mode middleware."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sim_kit import ADMIN_TOKEN, StartSim

from testkit.processes import SimProcess
from testkit.sims import sim_starter


@pytest.fixture(scope="module")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    """Start sims with a config and flags; every one is stopped when the module ends."""
    with sim_starter(tmp_path_factory, env={"AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN,
                                            "AUTOGLM_DRAIN_GRACE_SECONDS": "20"}) as start:
        yield start


@pytest.fixture(scope="module")
def sim_server(start_sim: StartSim) -> SimProcess:
    """A sim at 20x real time, shared by a module's tests."""
    return start_sim("--time-factor", "0.05")
