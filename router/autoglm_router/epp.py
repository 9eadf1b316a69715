"""The endpoint picker's choice, as the Gateway API Inference Extension's protocol states it (pure).

The replica comes from `routing.decide`, as for the HTTP router; this adds what the protocol
asks for: the pool narrowed to the gateway's subset hint, and ordered fallbacks (what the HTTP
router would retry on next) as `ip:port` addresses.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from autoglm_router.features import RequestFeatures
from autoglm_router.routing import Refusal, ReplicaState, Route, RoutingConfig, decide

# docs/proposals/004-endpoint-picker-protocol of gateway-api-inference-extension.
DESTINATION_HEADER = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"


def address_of(replica: str) -> str:
    """A replica's `ip:port` (its base URL's authority; `[v6]:port` for IPv6)."""
    return urlsplit(replica).netloc


def in_subset(replicas: Sequence[ReplicaState], subset: Sequence[str] | None
              ) -> list[ReplicaState]:  # fmt: skip
    """The replicas the gateway lets the picker choose from: all without a hint, else those
    whose address it lists (none for an empty list, as the protocol says)."""
    if subset is None:
        return list(replicas)
    allowed = set(subset)
    return [r for r in replicas if address_of(r.name) in allowed]


def destinations(
    features: RequestFeatures, replicas: Sequence[ReplicaState], config: RoutingConfig,
    placed: str | None = None, fallbacks: int = 0,
) -> list[Route] | Refusal:
    """The replica `decide` picks, then up to `fallbacks` more, each the one `decide` picks
    with those before it excluded (where the HTTP router would retry a refused connection or
    a draining replica)."""
    first = decide(features, replicas, config, placed=placed)
    if isinstance(first, Refusal):
        return first
    routes = [first]
    while len(routes) <= fallbacks:
        after = decide(features, replicas, config, exclude=[r.replica for r in routes])
        if isinstance(after, Refusal):
            break
        routes.append(after)
    return routes
