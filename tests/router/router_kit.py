"""Helpers for the router's loopback tests: the router as a child process, replica metrics."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx

from autoglm_runtime.profiles import MODE_PATH
from autoglm_runtime.sim.process import RouterProcess, SimProcess

ADMIN_TOKEN = "router-test-token"
MODEL = "autoglm-phone-9b"


StartSim = Callable[..., SimProcess]



StartRouter = Callable[..., RouterProcess]


def metric(base_url: str, name: str, **labels: str) -> float:
    """One sample's value from a /metrics page (0 when absent)."""
    text = httpx.get(base_url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def admitted(sim: SimProcess) -> float:
    return metric(sim.base_url, "autoglm_requests_admitted_total")


def set_mode(sim: SimProcess, mode: str) -> None:
    response = httpx.put(sim.admin_url + MODE_PATH, json={"mode": mode},
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5)
    response.raise_for_status()


def wait_for(check, timeout: float, interval: float = 0.05) -> float:  # type: ignore[no-untyped-def]
    """Seconds until check() is true; fails the test after `timeout`."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"not true within {timeout} s"
        time.sleep(interval)
    return time.monotonic() - start
