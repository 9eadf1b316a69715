"""The autoscaling series: OperatorMetrics.observe_fleet turns status.autoscaling as written, and
the iteration's Events, into the gauges and the counter the dashboard and
AutoGLMFleetAtMaxReplicas read; forget() and autoscaling off drop them."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from autoglm_operator.adaptive import scaling
from autoglm_operator.io.metrics import AUTOSCALING_REASONS, OperatorMetrics
from autoglm_operator.reconcile.fleet_plan import CONFLICT

AGD = {"namespace": "ns", "name": "chat"}
GAUGES = {
    "autoglm_operator_autoscaling_desired_replicas": "desiredReplicas",
    "autoglm_operator_autoscaling_running_replicas": "runningReplicas",
    "autoglm_operator_autoscaling_needed_replicas": "neededReplicas",
    "autoglm_operator_autoscaling_demand_requests_per_second": "demand",
    "autoglm_operator_autoscaling_expected_goodput_requests_per_second": "expectedGoodput",
}


def _status(**changes: Any) -> dict[str, Any]:
    """status.autoscaling as fleet_plan writes it."""
    return {
        "desiredReplicas": 3, "runningReplicas": 2, "neededReplicas": 4,
        "reason": scaling.SCALED_UP, "message": "scaling up from 2 to 3",
        "demand": "5.250", "expectedGoodput": "6.300", "batchingReplicas": 1,
        "lowerSince": None, "higherSince": "2026-01-15T10:00:00Z",
        "lastScaleTime": "2026-01-15T10:00:00Z", "lastScaleDownTime": None,
        "ignoredReplicas": 1, **changes,
    }  # fmt: skip


def _values(metrics: OperatorMetrics) -> dict[str, float | None]:
    return {name: metrics.registry.get_sample_value(name, AGD) for name in GAUGES}


def _reasons(metrics: OperatorMetrics) -> dict[str, float | None]:
    return {
        reason: metrics.registry.get_sample_value(
            "autoglm_operator_autoscaling_reason", {**AGD, "reason": reason})
        for reason in AUTOSCALING_REASONS
    }  # fmt: skip


def _events(metrics: OperatorMetrics, direction: str) -> float | None:
    return metrics.registry.get_sample_value(
        "autoglm_operator_autoscaling_scale_events_total", {**AGD, "direction": direction})


def test_status_figures_become_gauges_and_the_decimal_strings_numbers() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    metrics.observe_fleet("ns", "chat", _status(), [scaling.SCALED_UP])
    assert _values(metrics) == {
        "autoglm_operator_autoscaling_desired_replicas": 3,
        "autoglm_operator_autoscaling_running_replicas": 2,
        "autoglm_operator_autoscaling_needed_replicas": 4,
        "autoglm_operator_autoscaling_demand_requests_per_second": 5.25,
        "autoglm_operator_autoscaling_expected_goodput_requests_per_second": 6.3,
    }
    reasons = _reasons(metrics)
    assert reasons.pop(scaling.SCALED_UP) == 1
    assert set(reasons.values()) == {0}, "every other reason reads 0, not absent"


def test_every_reason_the_sizing_writes_has_a_series() -> None:
    written = {value for key, value in vars(scaling).items()
               if key.isupper() and isinstance(value, str)}  # fmt: skip
    assert set(AUTOSCALING_REASONS) == written | {CONFLICT}


def test_only_scale_steps_count_as_scale_events_by_direction() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    metrics.observe_fleet("ns", "chat", _status(), [scaling.SCALED_UP, "ReplicasIgnored"])
    metrics.observe_fleet("ns", "chat", _status(reason=scaling.FLEET_FITS_DEMAND), [])
    metrics.observe_fleet("ns", "chat", _status(reason=scaling.SCALED_DOWN),
                          [scaling.SCALED_DOWN, "Woke"])
    metrics.observe_fleet("ns", "chat", _status(reason=scaling.SCALED_UP), [scaling.SCALED_UP])
    assert (_events(metrics, "up"), _events(metrics, "down")) == (2, 1)
    assert _reasons(metrics)[scaling.SCALED_UP] == 1
    assert _reasons(metrics)[scaling.SCALED_DOWN] == 0


def test_unknown_demand_and_an_hpa_conflict_drop_the_figures_they_lack() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    metrics.observe_fleet("ns", "chat", _status(), [])
    unknown = _status(reason=scaling.DEMAND_UNKNOWN, demand=None, expectedGoodput=None)
    metrics.observe_fleet("ns", "chat", unknown, [])
    values = _values(metrics)
    assert values["autoglm_operator_autoscaling_demand_requests_per_second"] is None
    assert values["autoglm_operator_autoscaling_expected_goodput_requests_per_second"] is None
    assert values["autoglm_operator_autoscaling_desired_replicas"] == 3
    # fleet_plan's status under an HorizontalPodAutoscaler: no needed count, no demand.
    conflict = {"desiredReplicas": 5, "runningReplicas": 5, "reason": CONFLICT,
                "message": "autoscaling is not applied", "ignoredReplicas": None}
    metrics.observe_fleet("ns", "chat", conflict, [])
    values = _values(metrics)
    assert values["autoglm_operator_autoscaling_needed_replicas"] is None
    assert values["autoglm_operator_autoscaling_desired_replicas"] == 5
    assert _reasons(metrics)[CONFLICT] == 1
    # A figure that is no number (an edited status) is dropped, not an exception.
    metrics.observe_fleet("ns", "chat", _status(demand="lots", expectedGoodput="nan"), [])
    values = _values(metrics)
    assert values["autoglm_operator_autoscaling_demand_requests_per_second"] is None
    assert values["autoglm_operator_autoscaling_expected_goodput_requests_per_second"] is None


def test_autoscaling_off_drops_the_gauges_and_forget_drops_the_counter_too() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    metrics.observe_fleet("ns", "chat", _status(), [scaling.SCALED_UP])
    metrics.observe_fleet("ns", "other", _status(), [scaling.SCALED_UP])
    metrics.observe_fleet("ns", "chat", None, [])
    assert set(_values(metrics).values()) == {None}
    assert set(_reasons(metrics).values()) == {None}
    assert _events(metrics, "up") == 1, "the count of past steps stays while the object does"
    other = metrics.registry.get_sample_value(
        "autoglm_operator_autoscaling_desired_replicas", {"namespace": "ns", "name": "other"})
    assert other == 3, "another deployment's series stay"
    metrics.forget("ns", "chat")
    assert _events(metrics, "up") is None
    metrics.forget("ns", "other")
    text = b"".join(
        f"{s.name}{s.labels}".encode() for f in metrics.registry.collect() for s in f.samples
        if s.name.startswith("autoglm_operator_autoscaling"))  # fmt: skip
    assert text == b"", text
