"""Sims a test module starts on loopback: each with its own config and labels files, every one
stopped when the module's fixture ends."""

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
