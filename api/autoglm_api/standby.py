"""The scale-to-zero contract: how a router reports demand, and how a replica sleeps and wakes.

Demand travels as one annotation per router pod on the AutoGLMDeployment
(`demand.autoglm.io/<router pod>`). The operator's loop reads its object from the watch every
second, so a request held at zero reaches it within a second, with no Prometheus scrape in the
wake path and no write to `spec.replicas` (which the user, or an HPA, owns). A router patches its
own key only: two routers never overwrite each other's demand.

A sleeping replica keeps its pod, its GPUs and its place in the Service, with vLLM's weights
offloaded and its KV cache dropped (sleep mode, level 1). The operator puts it to sleep through
the admin API; a request that reaches it wakes it (the middleware wakes the engine first), and
routers send requests to a sleeping replica only when no awake one can take them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

SLEEP_PATH = "/autoglm/v1/sleep"  # admin API: POST {"level": 1}
WAKE_PATH = "/autoglm/v1/wake"  # admin API: POST
SLEEPING_METRIC = "autoglm_sleeping"  # gauge on the runtime's /metrics: 1 while asleep
DEMAND_ANNOTATION_PREFIX = "demand.autoglm.io/"
# The longest an annotation's name part may be (Kubernetes' qualified-name limit).
_NAME_LIMIT = 63


@dataclass(frozen=True)
class RouterDemand:
    """What one router last reported; times are Unix seconds."""

    # The latest request it received (held or routed), or the moment it released the requests
    # it held, whichever is later: the idle window starts there.
    last_request_at: float
    holding: int = 0  # requests it holds now, waiting for a replica
    held_since: float | None = None  # when the oldest of those arrived
    last_wait_seconds: float | None = None  # how long its last released request waited

    def encode(self) -> str:
        return json.dumps({
            "lastRequestAt": round(self.last_request_at, 3),
            "holding": self.holding,
            "heldSince": None if self.held_since is None else round(self.held_since, 3),
            "lastWaitSeconds": (None if self.last_wait_seconds is None
                                else round(self.last_wait_seconds, 3)),
        }, separators=(",", ":"))


def annotation_key(router_pod: str) -> str:
    return DEMAND_ANNOTATION_PREFIX + router_pod[-_NAME_LIMIT:].lstrip("-._")


def decode(value: str) -> RouterDemand | None:
    """One router's annotation value, or None when it is not one (hand-edited, truncated)."""
    try:
        data = json.loads(value)
        at = float(data["lastRequestAt"])
        holding = int(data.get("holding") or 0)
        since = data.get("heldSince")
        wait = data.get("lastWaitSeconds")
        demand = RouterDemand(at, max(0, holding), None if since is None else float(since),
                              None if wait is None else float(wait))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    numbers = [demand.last_request_at, demand.held_since or 0.0, demand.last_wait_seconds or 0.0]
    return demand if all(math.isfinite(n) for n in numbers) else None


@dataclass(frozen=True)
class Demand:
    """Every router's report together."""

    last_request_at: float | None = None  # None: no router has reported a request
    holding: int = 0
    held_since: float | None = None
    last_wait_seconds: float | None = None  # of the router that reported most recently


def demand_of(annotations: Mapping[str, str] | None) -> Demand:
    reports = [d for key, value in (annotations or {}).items()
               if key.startswith(DEMAND_ANNOTATION_PREFIX) and (d := decode(value)) is not None]
    if not reports:
        return Demand()
    latest = max(reports, key=lambda d: d.last_request_at)
    held = [d.held_since for d in reports if d.holding and d.held_since is not None]
    return Demand(
        last_request_at=latest.last_request_at,
        holding=sum(d.holding for d in reports),
        held_since=min(held) if held else None,
        last_wait_seconds=latest.last_wait_seconds,
    )
