"""Helpers for the router's loopback tests: the router as a child process, replica metrics."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from autoglm_runtime.profiles import MODE_PATH
from autoglm_runtime.sim.process import RouterProcess, SimProcess
from testkit.probe import metric

__all__ = ["ADMIN_TOKEN", "MODEL", "RouterProcess", "StartRouter", "StartSim", "admitted",
           "metric", "set_mode"]

ADMIN_TOKEN = "router-test-token"
MODEL = "autoglm-phone-9b"


StartSim = Callable[..., SimProcess]



StartRouter = Callable[..., RouterProcess]


def admitted(sim: SimProcess) -> float:
    return metric(sim.base_url, "autoglm_requests_admitted_total")


def set_mode(sim: SimProcess, mode: str) -> None:
    response = httpx.put(sim.admin_url + MODE_PATH, json={"mode": mode},
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5)
    response.raise_for_status()
