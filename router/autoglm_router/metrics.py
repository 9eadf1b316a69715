"""The router's own metrics, in its own registry (one per app, so tests can build many)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The router's own work is sub-millisecond when healthy; the tail shows event-loop stalls.
ADDED_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# A held request waits for a sleeping replica (about a second) or a new pod (minutes: the
# model loads), up to --hold-seconds.
HOLD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600)
OUTCOMES = ("ok", "client_error", "upstream_error", "refused", "unreachable", "client_gone",
            "aborted", "routed")
PLACEMENTS = ("hit", "moved", "new")
RETRY_REASONS = ("connect_error", "draining", "queue_full")
DECISION_REASONS = ("hashed", "bounded", "least_loaded", "least_fresh", "spilled", "waking")
HOLD_OVERFLOWS = ("full", "client_full", "timeout")


@dataclass(frozen=True)
class RouterMetrics:
    registry: CollectorRegistry
    requests: Counter
    retries: Counter
    decisions: Counter
    placements: Counter
    ttft: Histogram
    added_latency: Histogram
    inflight: Gauge
    replicas: Gauge
    held: Gauge
    hold_seconds: Histogram
    hold_overflows: Counter


def router_metrics() -> RouterMetrics:
    registry = CollectorRegistry()
    retries = Counter("autoglm_router_retries", "Requests sent to a second replica, by reason.",
                      ["reason"], registry=registry)
    for reason in RETRY_REASONS:
        retries.labels(reason)
    placements = Counter(
        "autoglm_router_session_placements",
        "Requests with a session or conversation key: same replica as its last turn (hit), "
        "another (moved), or first seen (new).",
        ["placement"], registry=registry,
    )
    for placement in PLACEMENTS:
        placements.labels(placement)
    added_latency = Histogram(
        "autoglm_router_added_latency_seconds",
        "Time the router itself adds: request in to upstream request out (request), "
        "first upstream byte to first client byte (first_byte).",
        ["phase"], buckets=ADDED_LATENCY_BUCKETS, registry=registry,
    )
    for phase in ("request", "first_byte"):
        added_latency.labels(phase)
    decisions = Counter(
        "autoglm_router_decisions",
        "Routing decisions by reason: hashed (the key's home), bounded (moved on by the load "
        "bound), least_loaded (no key), least_fresh (a chat with no streaming replica: the "
        "fewest requests sent within the last fresh_seconds), spilled (every preferred replica "
        "at its cap), waking (every replica asleep: the one all routers wake).",
        ["reason"], registry=registry,
    )
    for reason in DECISION_REASONS:
        decisions.labels(reason)
    hold_overflows = Counter(
        "autoglm_router_hold_overflows",
        "Held requests answered 503 past the hold queue's bound: full at arrival, its client's "
        "share full at arrival (client_full), or held --hold-seconds (timeout).",
        ["reason"], registry=registry,
    )
    for reason in HOLD_OVERFLOWS:
        hold_overflows.labels(reason)
    return RouterMetrics(
        registry=registry,
        requests=Counter(
            "autoglm_router_requests",
            "Requests by traffic class, the serving replica's mode and outcome.",
            ["traffic_class", "mode", "outcome"], registry=registry,
        ),
        retries=retries,
        decisions=decisions,
        placements=placements,
        ttft=Histogram(
            "autoglm_router_upstream_ttft_seconds",
            "From sending upstream to the first response body byte, by traffic class.",
            ["traffic_class"], buckets=TTFT_BUCKETS, registry=registry,
        ),
        added_latency=added_latency,
        inflight=Gauge("autoglm_router_inflight", "Requests open on each replica.",
                       ["replica"], registry=registry),
        replicas=Gauge("autoglm_router_replicas",
                       "Replicas taking requests, by mode (unknown: no autoglm_mode).",
                       ["mode"], registry=registry),
        held=Gauge("autoglm_router_held_requests",
                   "Requests held now, waiting for a replica (the hold queue): what KEDA "
                   "activates a deployment at zero on.",
                   registry=registry),
        hold_seconds=Histogram(
            "autoglm_router_hold_seconds",
            "How long each held request waited, until released to a replica or past "
            "--hold-seconds.",
            buckets=HOLD_BUCKETS, registry=registry,
        ),
        hold_overflows=hold_overflows,
    )
