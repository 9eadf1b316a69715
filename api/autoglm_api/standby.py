"""The scale-to-zero contract: how the operator reads a router's demand, and how a replica sleeps
and wakes.

The operator asks each router pod for its report (GET DEMAND_PATH on the router's ops port),
as it asks each runtime for its mode: the router writes nothing to the Kubernetes API, so the
process that parses every client's bytes holds no right beyond reading pods. A report says what
the router holds and relays now, in ages measured on its own clock (no two hosts' clocks are
compared); the operator dates each report by when it read it.

A sleeping replica keeps its pod, its GPUs and its place in the Service, with vLLM's weights
offloaded and its KV cache dropped (sleep mode). The operator puts it to sleep through the
admin API; a request that reaches it wakes it (the middleware wakes the engine first), and
routers send requests to a sleeping replica only when no awake one can take them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

SLEEP_PATH = "/autoglm/v1/sleep"  # admin API: POST {"level": 1}
WAKE_PATH = "/autoglm/v1/wake"  # admin API: POST
SLEEPING_METRIC = "autoglm_sleeping"  # gauge on the runtime's /metrics: 1 while asleep
DEMAND_PATH = "/autoglm/v1/demand"  # the router's ops port: GET, a RouterReport as JSON
# A held request is demand once it has waited this long with its client still there: a client
# that connects and leaves at once wakes nothing.
WAKE_AFTER_SECONDS = 1.0
# The largest report the operator reads; a real one is about 150 bytes.
REPORT_LIMIT_BYTES = 4096


@dataclass(frozen=True)
class RouterReport:
    """What one router holds and relays now. Ages are seconds at the moment of the report."""

    holding: int = 0  # requests held for WAKE_AFTER_SECONDS or more, their clients still there
    held_for: float | None = None  # how long the oldest of those has waited
    inflight: int = 0  # inference requests relayed now (streams included)
    # Since the router last started or finished relaying an inference request; None: it has
    # relayed none since it started (a restarted router holds no stale demand).
    idle_for: float | None = None
    last_wait: float | None = None  # how long its last released request was held

    def encode(self) -> bytes:
        return json.dumps({
            "holding": self.holding,
            "heldForSeconds": _rounded(self.held_for),
            "inflight": self.inflight,
            "idleForSeconds": _rounded(self.idle_for),
            "lastWaitSeconds": _rounded(self.last_wait),
        }, separators=(",", ":")).encode()


def decode_report(data: bytes, max_count: int) -> RouterReport | None:
    """A router's report, or None when it is not one. Counts above `max_count` (what a router
    may hold or relay at all) and negative or non-finite ages are refused, not trusted: the
    router is the most exposed process, and its report only ever keeps GPUs awake."""
    if len(data) > REPORT_LIMIT_BYTES:
        return None
    try:
        fields = json.loads(data)
        report = RouterReport(
            holding=_count(fields["holding"], max_count),
            held_for=_age(fields.get("heldForSeconds")),
            inflight=_count(fields["inflight"], max_count),
            idle_for=_age(fields.get("idleForSeconds")),
            last_wait=_age(fields.get("lastWaitSeconds")),
        )
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None  # RecursionError: JSON nested deeper than the parser goes, within the limit
    if report.holding and report.held_for is None:
        return None
    return report


@dataclass(frozen=True)
class Activity:
    """Every router's report together, dated on the operator's clock (Unix seconds)."""

    last_request_at: float | None = None  # the latest start or end of an inference request
    holding: int = 0
    held_since: float | None = None  # when the oldest request held now arrived
    inflight: int = 0
    last_wait_seconds: float | None = None  # of the router whose request ended latest

    @property
    def busy(self) -> bool:
        """A request is held or relayed now: the deployment is not idle, whatever the clock."""
        return self.holding > 0 or self.inflight > 0


@dataclass(frozen=True)
class Reading:
    report: RouterReport
    read_at: float  # Unix seconds on the operator's clock


def activity_of(readings: list[Reading], now: float, stale_after: float) -> Activity:
    """The routers' reports together. A report older than `stale_after` (a router that stopped
    answering: its process died, its node is lost) still dates its last request, but what it
    held or relayed then counts no more: a lost router never keeps the deployment awake."""
    if not readings:
        return Activity()
    fresh = [r for r in readings if now - r.read_at <= stale_after]
    dated = [(r.read_at - r.report.idle_for, r) for r in readings if r.report.idle_for is not None]
    latest = max(dated, key=lambda pair: pair[0], default=None)
    held = [r.read_at - r.report.held_for for r in fresh
            if r.report.holding and r.report.held_for is not None]
    return Activity(
        last_request_at=None if latest is None else latest[0],
        holding=sum(r.report.holding for r in fresh),
        held_since=min(held, default=None),
        inflight=sum(r.report.inflight for r in fresh),
        last_wait_seconds=None if latest is None else latest[1].report.last_wait,
    )


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _count(value: Any, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ValueError(f"not a count in [0, {limit}]: {value!r}")
    return value


def _age(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number of seconds: {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"not an age: {value!r}")
    return float(value)
