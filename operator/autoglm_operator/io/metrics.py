"""The operator's own Prometheus metrics: replicas, standby, the fleet's size (autoscaling),
adaptive decisions, flips, query cost.

Served by start_server() on AUTOGLM_OPERATOR_METRICS_PORT (default 8081; 0 turns it off), bound
to AUTOGLM_OPERATOR_METRICS_ADDR (default every interface).
Series are labelled by deployment (namespace, name); forget() drops them when one is deleted.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server as _start_http_server

from autoglm_operator.adaptive import scaling
from autoglm_operator.adaptive.signals import Availability, Reading
from autoglm_operator.reconcile.fleet_plan import CONFLICT
from autoglm_operator.resource.status import StandbyStatus

DEFAULT_PORT = 8081
PORT_ENV = "AUTOGLM_OPERATOR_METRICS_PORT"
ADDR_ENV = "AUTOGLM_OPERATOR_METRICS_ADDR"
_DEPLOYMENT = ["namespace", "name"]

# Every status.standby.state, so a state's series reads 0, not absent, while it is not current.
STANDBY_STATES: tuple[str, ...] = get_args(StandbyStatus.model_fields["state"].annotation)

# Every status.autoscaling.reason (adaptive/scaling.py, and the HPA conflict), so a reason's
# series reads 0, not absent, while it is not current.
AUTOSCALING_REASONS: tuple[str, ...] = (
    scaling.SCALED_UP, scaling.SCALED_DOWN, scaling.FLEET_FITS_DEMAND,
    scaling.SCALE_UP_STABILIZING, scaling.SCALE_DOWN_STABILIZING, scaling.SCALE_DOWN_PACED,
    scaling.FLIP_COOLDOWN, scaling.DEMAND_UNKNOWN, scaling.AT_MAX_REPLICAS, scaling.IDLE,
    CONFLICT,
)
# The Events an iteration posts that are a step of the fleet's size, by direction.
SCALE_EVENTS = {scaling.SCALED_UP: "up", scaling.SCALED_DOWN: "down"}

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
        self.pod_entries = Counter(
            "autoglm_operator_pod_entries",
            "What the executor did to single pods beside flips: Slept, Woke (scale to zero), "
            "MarkedForRemoval (a step down's victim), by result (done, failed).",
            [*_DEPLOYMENT, "action", "result"],
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
        # autoscaling: status.autoscaling as series, for the dashboard's "Fleet size" row and
        # AutoGLMFleetAtMaxReplicas.
        self.fleet_desired = Gauge(
            "autoglm_operator_autoscaling_desired_replicas",
            "Serving replicas the fleet is sized to (status.autoscaling.desiredReplicas); "
            "absent with autoscaling off.",
            _DEPLOYMENT,
            registry=registry,
        )
        self.fleet_running = Gauge(
            "autoglm_operator_autoscaling_running_replicas",
            "Serving pods that run now (status.autoscaling.runningReplicas).",
            _DEPLOYMENT,
            registry=registry,
        )
        self.fleet_needed = Gauge(
            "autoglm_operator_autoscaling_needed_replicas",
            "The fewest replicas, within minReplicas and maxReplicas, that serve the demand plus "
            "headroom (status.autoscaling.neededReplicas).",
            _DEPLOYMENT,
            registry=registry,
        )
        self.fleet_demand = Gauge(
            "autoglm_operator_autoscaling_demand_requests_per_second",
            "Requests/s measured, both traffic classes (status.autoscaling.demand); absent while "
            "the demand is unknown.",
            _DEPLOYMENT,
            registry=registry,
        )
        self.fleet_goodput = Gauge(
            "autoglm_operator_autoscaling_expected_goodput_requests_per_second",
            "Requests/s the desired fleet serves within the SLOs at the demand plus headroom "
            "(status.autoscaling.expectedGoodput); absent while the demand is unknown.",
            _DEPLOYMENT,
            registry=registry,
        )
        self.fleet_reason = Gauge(
            "autoglm_operator_autoscaling_reason",
            "1 for the deployment's status.autoscaling.reason (FleetFitsDemand, AtMaxReplicas, "
            "ScaleDownStabilizing, ...), 0 for the others; absent with autoscaling off.",
            [*_DEPLOYMENT, "reason"],
            registry=registry,
        )
        self.fleet_scale_events = Counter(
            "autoglm_operator_autoscaling_scale_events",
            "Steps of the fleet's size (the ScaledUp and ScaledDown Events), by direction.",
            [*_DEPLOYMENT, "direction"],
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

    def observe_pod_entries(self, namespace: str, name: str, outcomes: Sequence[Any]) -> None:
        """The executor's PodOutcomes of one iteration."""
        for outcome in outcomes:
            result = "done" if outcome.done else "failed"
            self.pod_entries.labels(namespace, name, outcome.action, result).inc()

    def observe_fleet(
        self,
        namespace: str,
        name: str,
        autoscaling: Mapping[str, Any] | None,
        events: Sequence[str],
    ) -> None:
        """status.autoscaling as written, as the autoscaling gauges; None (autoscaling off)
        drops them. `events`: the Event reasons the iteration posted; ScaledUp and ScaledDown
        count as scale events. A field the status lacks (the demand while it is unknown, the
        needed replicas under an HPA conflict) drops its series."""
        for reason in events:
            direction = SCALE_EVENTS.get(reason)
            if direction is not None:
                self.fleet_scale_events.labels(namespace, name, direction).inc()
        if autoscaling is None:
            _drop(self._fleet_gauges, namespace, name)
            return
        for gauge, key in ((self.fleet_desired, "desiredReplicas"),
                           (self.fleet_running, "runningReplicas"),
                           (self.fleet_needed, "neededReplicas"),
                           (self.fleet_demand, "demand"),
                           (self.fleet_goodput, "expectedGoodput")):  # fmt: skip
            value = _number(autoscaling.get(key))
            if value is None:
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, name)
            else:
                gauge.labels(namespace, name).set(value)
        current = autoscaling.get("reason")
        for reason in AUTOSCALING_REASONS:
            self.fleet_reason.labels(namespace, name, reason).set(1 if reason == current else 0)

    @property
    def _fleet_gauges(self) -> tuple[Gauge, ...]:
        return (self.fleet_desired, self.fleet_running, self.fleet_needed, self.fleet_demand,
                self.fleet_goodput, self.fleet_reason)

    def forget(self, namespace: str, name: str) -> None:
        per_deployment: tuple[Counter | Gauge | Histogram, ...] = (
            self.decisions,
            self.flips,
            self.repairs,
            self.metrics_available,
            self.replicas,
            self.ready_replicas,
            self.wake_seconds,
            self.standby_state,
            self.standby_held,
            *self._fleet_gauges,
            self.fleet_scale_events,
            self.pod_entries,
        )
        _drop(per_deployment, namespace, name)


def _number(value: Any) -> float | None:
    """A status figure (an int, or a decimal string such as "2.500") as a float; None when
    absent or not a finite number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


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
