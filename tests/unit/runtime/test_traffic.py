"""The one traffic-class rule the router, the middleware's priority and the metric label share."""

from __future__ import annotations

from typing import Any

import pytest

from autoglm_api.traffic import TRAFFIC_CLASS_HEADER, TrafficClass, traffic_class

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
INTERACTIVE, BATCH = TrafficClass.STREAMED_CHAT, TrafficClass.OTHER


@pytest.mark.parametrize(("path", "body", "header", "expected"), [
    # Undeclared: a streamed chat (the phone agent's every step) is interactive.
    (CHAT, {"stream": True}, None, INTERACTIVE),
    (RESPONSES, {"stream": True}, None, INTERACTIVE),
    (CHAT, {}, None, BATCH),
    (COMPLETIONS, {"stream": True}, None, BATCH),
    (CHAT, {"stream": "yes"}, None, BATCH),
    # service_tier first: flex is batch work, priority is interactive, on any path.
    (CHAT, {"stream": True, "service_tier": "flex"}, "interactive", BATCH),
    (COMPLETIONS, {"service_tier": "priority"}, "batch", INTERACTIVE),
    # Tiers that say nothing of the class fall through to the header, then to `stream`.
    (CHAT, {"stream": True, "service_tier": "auto"}, None, INTERACTIVE),
    (CHAT, {"service_tier": "default"}, "interactive", INTERACTIVE),
    (CHAT, {"stream": True, "service_tier": "scale"}, " Batch ", BATCH),
    (CHAT, {"stream": True, "service_tier": ["flex"]}, None, INTERACTIVE),
    (CHAT, {"stream": True}, "bulk", INTERACTIVE),
])  # fmt: skip
def test_service_tier_then_the_header_then_stream_decide_the_class(
    path: str, body: dict[str, Any], header: str | None, expected: TrafficClass
) -> None:
    headers = {TRAFFIC_CLASS_HEADER: header} if header is not None else {}
    assert traffic_class(path, body, headers) is expected


def test_each_class_prefers_its_mode() -> None:
    assert INTERACTIVE.preferred_mode.value == "streaming"
    assert BATCH.preferred_mode.value == "batching"
