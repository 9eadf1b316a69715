"""Helpers for the router's loopback tests: the router as a child process, replica metrics."""

from __future__ import annotations

from collections.abc import Callable

from testkit.probe import metric
from testkit.processes import RouterProcess, SimProcess

__all__ = ["ADMIN_TOKEN", "MODEL", "RouterProcess", "StartRouter", "StartSim", "admitted",
           "metric"]

ADMIN_TOKEN = "router-test-token"
MODEL = "autoglm-phone-9b"


StartSim = Callable[..., SimProcess]



StartRouter = Callable[..., RouterProcess]


def admitted(sim: SimProcess) -> float:
    return metric(sim.base_url, "autoglm_requests_admitted_total")
