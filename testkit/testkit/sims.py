"""Sims a test module starts on loopback: each with its own config and labels files, every one
stopped when the module's fixture ends. `later_sims` makes them without starting them: a
replica whose port is known before it is up (scale to zero, the hold)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from testkit.processes import SimProcess

if TYPE_CHECKING:
    import pytest

StartSim = Callable[..., SimProcess]


@contextlib.contextmanager
def sim_starter(tmp_path_factory: pytest.TempPathFactory, *leading_args: str,
                env: Mapping[str, str]) -> Iterator[StartSim]:
    """`start(*args, config=None, env=None, wait_healthy=True)`: a sim with `leading_args` and
    then `args`, its config file holding `config`, its environment `env` over the suite's."""
    started: list[SimProcess] = []
    suite_env = dict(env)

    def start(*args: str, config: dict[str, Any] | None = None,
              env: Mapping[str, str] | None = None, wait_healthy: bool = True) -> SimProcess:
        folder = tmp_path_factory.mktemp("sim")
        config_file = folder / "config.json"
        config_file.write_text(json.dumps(config or {}))
        sim = SimProcess(*leading_args, *args, env={
            "AUTOGLM_CONFIG_FILE": str(config_file),
            "AUTOGLM_LABELS_FILE": str(folder / "labels"),
            **suite_env,
            **(env or {}),
        }, log_path=folder / "sim.log", wait_healthy=wait_healthy)
        started.append(sim)
        return sim.start()

    try:
        yield start
    finally:
        for sim in started:
            sim.stop()


LaterSim = Callable[..., SimProcess]


@contextlib.contextmanager
def later_sims(tmp_path_factory: pytest.TempPathFactory,
               env: Mapping[str, str]) -> Iterator[LaterSim]:
    """`make(mode="streaming", *args)`: a sim at 20x real time in `mode`, with its port known
    and not started (call its start() when the replica comes up)."""
    made: list[SimProcess] = []

    def make(mode: str = "streaming", *args: str) -> SimProcess:
        folder = tmp_path_factory.mktemp("sim")
        (folder / "config.json").write_text(json.dumps({"initialMode": mode}))
        sim = SimProcess("--time-factor", "0.05", *args, env={
            "AUTOGLM_CONFIG_FILE": str(folder / "config.json"),
            "AUTOGLM_LABELS_FILE": str(folder / "labels"),
            **env,
        }, log_path=folder / "sim.log")
        made.append(sim)
        return sim

    try:
        yield make
    finally:
        for sim in made:
            sim.stop()
