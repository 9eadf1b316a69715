"""Helpers for the gateway tier: real Envoy (testkit.gateway) in front of `autoglm-router
--ext-proc-port` and `testkit.sim` replicas, all on loopback."""

from __future__ import annotations

from collections.abc import Callable

import openai

from testkit.gateway import Gateway
from testkit.processes import SimProcess

ADMIN_TOKEN = "gateway-test-token"
MODEL = "autoglm-phone-9b"

StartSim = Callable[..., SimProcess]
StartGateway = Callable[..., Gateway]


def client(gateway: Gateway, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="EMPTY", max_retries=0,
                         timeout=timeout)


def address(sim: SimProcess) -> str:
    return f"127.0.0.1:{sim.port}"
