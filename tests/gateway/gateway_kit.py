"""Helpers for the gateway tier: real Envoy (testkit.gateway) in front of `autoglm-router
--ext-proc-port` and `autoglm-runtime sim` replicas, all on loopback."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import openai

from autoglm_runtime.sim.process import RouterProcess, SimProcess
from testkit.gateway import EnvoyProcess

ADMIN_TOKEN = "gateway-test-token"
MODEL = "autoglm-phone-9b"

StartSim = Callable[..., SimProcess]


@dataclass
class Gateway:
    """Envoy and the picker behind it (the router process, also serving HTTP)."""

    envoy: EnvoyProcess
    picker: RouterProcess

    @property
    def base_url(self) -> str:
        return self.envoy.base_url

    def client(self, timeout: float = 30) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="EMPTY", max_retries=0,
                             timeout=timeout)


StartGateway = Callable[..., Gateway]


def address(sim: SimProcess) -> str:
    return f"127.0.0.1:{sim.port}"
