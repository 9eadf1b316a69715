"""The operator's own Prometheus metrics: replicas, standby, adaptive decisions, flips, query
cost.

Served by start_server() on AUTOGLM_OPERATOR_METRICS_PORT (default 8081; 0 turns it off), bound
to AUTOGLM_OPERATOR_METRICS_ADDR (default every interface).
Series are labelled by deployment (namespace, name); forget() drops them when one is deleted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, get_args

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server as _start_http_server

from autoglm_operator.adaptive.signals import Availability, Reading
from autoglm_operator.resource.status import StandbyStatus

DEFAULT_PORT = 8081
PORT_ENV = "AUTOGLM_OPERATOR_METRICS_PORT"
ADDR_ENV = "AUTOGLM_OPERATOR_METRICS_ADDR"
_DEPLOYMENT = ["namespace", "name"]

# Every status.standby.state, so a state's series reads 0, not absent, while it is not current.
STANDBY_STATES: tuple[str, ...] = get_args(StandbyStatus.model_fields["state"].annotation)

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        # Long, but only declarations: one metric each, read best side by side.
        self.registry = registry
        self.decisions = Counter(
            "autoglm_operator_adaptive_decisions",
            "Adaptive pass decisions, by reason (holds included).",
            [*_DEPLOYMENT, "reason"],
            registry=registry,
        )
        self.flips = Counter(
            "autoglm_operator_mode_flips",
            "Replica mode flips, by target mode and result (applied, failed, dry_run).",
            [*_DEPLOYMENT, "to", "result"],
            registry=registry,
        )
        self.flip_seconds = Histogram(
            "autoglm_operator_mode_flip_seconds",
            "From a flip decision to the runtime confirming the new mode.",
            buckets=_SECONDS,
            registry=registry,
        )
        self.repairs = Counter(
            "autoglm_operator_mode_repairs",
            "Label/runtime disagreements found and handled (Adopted, Finished, Reverted, Failed).",
            [*_DEPLOYMENT, "action"],
            registry=registry,
        )
        self.query_seconds = Histogram(
            "autoglm_operator_prometheus_query_seconds",
            "Latency of one Prometheus query, by signal.",
            ["query"],
            buckets=_SECONDS,
            registry=registry,
        )
        self.query_errors = Counter(
            "autoglm_operator_prometheus_query_errors",
            "Failed or empty Prometheus queries, by signal and reason.",
            ["query", "reason"],
            registry=registry,
        )
        self.metrics_available = Gauge(
            "autoglm_operator_metrics_available",
            "1 while the deployment's metrics are usable for decisions, else 0.",
            _DEPLOYMENT,
            registry=registry,
        )
        # Desired and ready replicas per deployment: the chart's "replicas not ready" alert.
        self.replicas = Gauge(
            "autoglm_operator_replicas",
            "Replicas the AutoGLMDeployment asks for.",
            _DEPLOYMENT,
            registry=registry,
        )
        self.ready_replicas = Gauge(
            "autoglm_operator_ready_replicas",
            "Replicas ready to serve.",
            _DEPLOYMENT,
            registry=registry,
        )
        # scaleToZero: from the demand that woke a deployment at zero to its first ready replica.
        self.wake_seconds = Histogram(
            "autoglm_operator_scale_from_zero_seconds",
            "From the first request at zero (or asleep) to the first ready replica.",
            _DEPLOYMENT,
            buckets=(1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600),
            registry=registry,
        )
        # scaleToZero: status.standby as series, for the dashboard and AutoGLMHeldWithoutWake.
        self.standby_state = Gauge(
            "autoglm_operator_standby_state",
            "1 for the deployment's status.standby.state (Serving, Asleep, Idle, Waking, "
            "AutoscalerConflict), 0 for the others; absent with scaleToZero off.",
            [*_DEPLOYMENT, "state"],
            registry=registry,
        )
        self.standby_held = Gauge(
            "autoglm_operator_standby_held_requests",
            "Requests the routers hold, as the operator last read their demand reports "
            "(status.standby.heldRequests; a report past its age counts none).",
            _DEPLOYMENT,
            registry=registry,
        )
        self.pass_seconds = Histogram(
            "autoglm_operator_adaptive_pass_seconds",
            "Duration of one adaptive pass (read, decide, apply).",
            buckets=_SECONDS,
            registry=registry,
        )

    def observe_query(self, query: str, seconds: float, failure: Availability | None) -> None:
        self.query_seconds.labels(query).observe(seconds)
        if failure is not None:
            self.query_errors.labels(query, failure.value).inc()

    def observe_reading(self, namespace: str, name: str, reading: Reading | None) -> None:
        if reading is None:
            return
        self.metrics_available.labels(namespace, name).set(1 if reading.available else 0)
        for outcome in reading.outcomes.values():
            # Empty answers are not transport errors; count them here, where the value is judged.
            if outcome.failure is Availability.NO_DATA or outcome.failure is Availability.STALE:
                self.query_errors.labels(outcome.name, outcome.failure.value).inc()

    def observe_standby(
        self, namespace: str, name: str, standby: Mapping[str, Any] | None
    ) -> None:
        """status.standby as the standby gauges; None (scaleToZero off) drops them."""
        if standby is None:
            _drop((self.standby_state, self.standby_held), namespace, name)
            return
        current = standby.get("state")
        for state in STANDBY_STATES:
            self.standby_state.labels(namespace, name, state).set(1 if state == current else 0)
        self.standby_held.labels(namespace, name).set(int(standby.get("heldRequests") or 0))

    def forget(self, namespace: str, name: str) -> None:
        per_deployment = (
            self.decisions,
            self.flips,
            self.repairs,
            self.metrics_available,
            self.replicas,
            self.ready_replicas,
            self.wake_seconds,
            self.standby_state,
            self.standby_held,
        )
        _drop(per_deployment, namespace, name)


def _drop(metrics: tuple[Counter | Gauge | Histogram, ...], namespace: str, name: str) -> None:
    """Remove the series of one deployment (the first two labels) from each metric."""
    for metric in metrics:
        for labels in list(metric._metrics):  # prometheus_client keeps children by label tuple
            if labels[:2] == (namespace, name):
                metric.remove(*labels)


METRICS = OperatorMetrics()


def start_server(port: int | None = None, addr: str | None = None) -> int | None:
    """Serve /metrics; returns the port, or None when turned off (port 0)."""
    chosen = port if port is not None else int(os.environ.get(PORT_ENV, DEFAULT_PORT))
    if chosen == 0:
        return None
    # In a pod every interface (the scrape comes from outside); tests and demos bind loopback.
    bind = addr or os.environ.get(ADDR_ENV, "0.0.0.0")
    _start_http_server(chosen, addr=bind, registry=METRICS.registry)
    return chosen
