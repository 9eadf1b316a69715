"""What the adaptive pass reads, pure data: the metric values of one deployment at one instant
(Samples), one Prometheus round with what it could not get and why (Reading, QueryOutcome), and
the reasons of the MetricsAvailable condition (Availability).

io.prom produces them; the policy, the pass's planning, the operator's metrics and replay read
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True)
class Samples:
    """Deployment-wide metric values at one instant; None where the value is unknown.

    qps and queue_depth are totals over the deployment's pods; reporting_replicas is how many
    pods those totals cover (per-replica figures divide by it, so a pod Prometheus has not yet
    scraped neither adds load nor dilutes it). problem says why values are missing, for messages.
    """

    qps: float | None = None
    gpu_memory_percent: float | None = None
    queue_depth: float | None = None
    kv_cache_percent: float | None = None
    ttft_p95_seconds: float | None = None
    reporting_replicas: int | None = None
    problem: str | None = None
    # Demand by traffic class (requests/s arriving, admitted or not) and, per mode, requests/s
    # completed, requests in flight or queued, and the share of what its replicas received that
    # was its own class (streaming: streamed chats; batching: the rest): the learning of each
    # mode's capacity. An unknown share (an older runtime or trace) learns as if unmixed.
    chat_rate: float | None = None
    other_rate: float | None = None
    streaming_completions: float | None = None
    batching_completions: float | None = None
    streaming_busy: float | None = None
    batching_busy: float | None = None
    streaming_own_share: float | None = None
    batching_own_share: float | None = None


class Availability(StrEnum):
    """Reasons for the MetricsAvailable condition."""

    OK = "QueriesSucceeded"
    PARTIAL = "PartialData"
    UNREACHABLE = "PrometheusUnreachable"
    QUERY_ERROR = "QueryError"
    NO_DATA = "NoData"
    STALE = "StaleData"
    NO_PODS = "NoPods"


@dataclass(frozen=True)
class QueryOutcome:
    name: str
    query: str
    value: float | None = None
    failure: Availability | None = None
    detail: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Reading:
    """One Prometheus round for one deployment: the samples and what went wrong, if anything."""

    samples: Samples | None
    availability: Availability
    message: str
    outcomes: Mapping[str, QueryOutcome] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def available(self) -> bool:
        return self.availability in (Availability.OK, Availability.PARTIAL)
