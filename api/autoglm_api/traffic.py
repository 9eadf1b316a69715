"""Which class a request belongs to: interactive (a person waits on its first token) or batch.

One rule for the router's choice of mode, the middleware's priority and the replicas'
`traffic_class` metric label, so the policy sizes each mode for the demand the router sends it.
A client declares its class with OpenAI's `service_tier` or, when it cannot set body fields,
with the TRAFFIC_CLASS_HEADER; otherwise a streamed chat (Chat Completions or Responses) is
interactive and the rest is batch.
The phone agent streams every step, so it is interactive without saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from autoglm_api.paths import CHAT_PATH, RESPONSES_PATH
from autoglm_api.profiles import Mode

TRAFFIC_CLASS_HEADER = "x-autoglm-traffic-class"
# OpenAI's tiers: flex is deferrable work, priority the fastest service.
BATCH_TIERS = frozenset({"flex"})
INTERACTIVE_TIERS = frozenset({"priority"})
# The tiers vLLM's Responses API takes; any other value is removed before the engine sees it.
VLLM_SERVICE_TIERS = frozenset({"auto", "default", "flex", "scale", "priority"})


class TrafficClass(StrEnum):
    # The label values predate declared classes: "streamed_chat" is the interactive class.
    STREAMED_CHAT = "streamed_chat"
    OTHER = "other"

    @property
    def preferred_mode(self) -> Mode:
        return Mode.STREAMING if self is TrafficClass.STREAMED_CHAT else Mode.BATCHING

    @property
    def interactive(self) -> bool:
        return self is TrafficClass.STREAMED_CHAT


CHATS = frozenset({CHAT_PATH, RESPONSES_PATH})
_DECLARED = {"interactive": TrafficClass.STREAMED_CHAT, "batch": TrafficClass.OTHER}


def traffic_class(path: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> TrafficClass:
    """`service_tier` flex or priority, else the header (`batch` or `interactive`), else
    whether the request is a streamed chat. `headers` has lower-case names."""
    tier = body.get("service_tier")
    tier = tier if isinstance(tier, str) else None
    if tier in BATCH_TIERS:
        return TrafficClass.OTHER
    if tier in INTERACTIVE_TIERS:
        return TrafficClass.STREAMED_CHAT
    declared = _DECLARED.get((headers.get(TRAFFIC_CLASS_HEADER) or "").strip().lower())
    if declared is not None:
        return declared
    streamed_chat = path in CHATS and body.get("stream") is True
    return TrafficClass.STREAMED_CHAT if streamed_chat else TrafficClass.OTHER
