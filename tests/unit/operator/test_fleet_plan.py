"""spec.autoscaling's part of an iteration's plan (reconcile/fleet_plan.py): the replicas,
status.autoscaling and its Events from the status as last written, the adaptive pass's last
reading and the routers' activity; spec.replicas and an HPA beside it; and scaleToZero as it
applies with autoscaling on (AutoGLMDeploymentSpec.standby)."""

from __future__ import annotations

from typing import Any

import pytest

from autoglm_api.profiles import Mode
from autoglm_api.standby import Activity
from autoglm_operator.adaptive.decision import iso_time
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.reconcile import fleet_plan
from autoglm_operator.reconcile.fleet_plan import FleetPlan, plan_fleet
from autoglm_operator.resource.pods import PodView
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_operator.resource.status import AutoscalingStatus

T0 = 1_800_000_000.0  # wall-clock seconds
PROMETHEUS = {"prometheus": {"url": "http://prometheus.monitoring:9090"}}
HPA = "keda-hpa-phone-9b"


def raw_spec(replicas: int = 2, **autoscaling: Any) -> dict[str, Any]:
    """The spec as the user writes it: autoscaling on (maxReplicas 6 unless given)."""
    return {
        "replicas": replicas,
        "adaptive": PROMETHEUS,
        "autoscaling": {"enabled": True, "maxReplicas": 6, **autoscaling},
    }


def spec(replicas: int = 2, **autoscaling: Any) -> AutoGLMDeploymentSpec:
    return AutoGLMDeploymentSpec.model_validate(raw_spec(replicas, **autoscaling))


def demand(chat: float, other: float = 0.0) -> Samples:
    """The adaptive pass's last reading. At the CRD's seeds a streaming replica serves 4.1
    chats/s, so with the 20% headroom 10 chats/s (12/s) need 3."""
    return Samples(qps=chat + other, queue_depth=0.0, chat_rate=chat, other_rate=other)


def views(n: int, ready: bool = True) -> list[PodView]:
    return [PodView(f"p{i}", None, Mode.STREAMING, ready) for i in range(n)]


class Object:
    """One AutoGLMDeployment's fleet plans over time, each from the status the last one left
    (status.autoscaling put in as the iteration writes it)."""

    def __init__(self, status: dict[str, Any] | None = None) -> None:
        self.status: dict[str, Any] = dict(status or {})

    def at(
        self,
        now: float,
        the_spec: AutoGLMDeploymentSpec,
        samples: Samples | None = None,
        activity: Activity | None = None,
        pods: list[PodView] | None = None,
        scalers: tuple[str, ...] = (),
    ) -> FleetPlan:
        plan = plan_fleet(the_spec, self.status, samples, activity or Activity(),
                          views(1) if pods is None else pods, scalers, now)
        self.status["autoscaling"] = dict(plan.status) if plan.status is not None else None
        return plan

    @property
    def autoscaling(self) -> dict[str, Any]:
        current = self.status.get("autoscaling")
        assert current is not None
        return current


def reasons(plan: FleetPlan) -> list[tuple[str, bool]]:
    return [(e.reason, e.warning) for e in plan.events]


# -- off, spec.replicas, an HPA ---------------------------------------------------------------


def test_off_runs_spec_replicas_and_writes_no_status() -> None:
    off = AutoGLMDeploymentSpec.model_validate({"replicas": 3, "adaptive": PROMETHEUS})
    plan = plan_fleet(off, {}, demand(20.0), Activity(holding=500, held_since=T0), views(3),
                      (HPA,), T0)
    assert (plan.replicas, plan.status, plan.events) == (3, None, ())
    assert fleet_plan.victims(plan, 1, views(3), {}) == ()


def test_spec_replicas_is_not_read_and_a_change_of_it_is_reported_once() -> None:
    obj = Object()
    first = obj.at(T0, spec(replicas=2), demand(1.0))
    assert first.replicas == 1 and first.events == ()  # what the demand needs, not 2
    scaled = obj.at(T0 + 1, spec(replicas=5), demand(1.0))  # kubectl scale --replicas 5
    assert scaled.replicas == 1
    assert reasons(scaled) == [(fleet_plan.REPLICAS_IGNORED, True)]
    message = scaled.events[0].message
    assert "spec.replicas changed to 5" in message
    assert "minReplicas 1 and maxReplicas 6" in message
    assert obj.autoscaling["ignoredReplicas"] == 5
    assert obj.at(T0 + 2, spec(replicas=5), demand(1.0)).events == ()
    again = obj.at(T0 + 3, spec(replicas=7), demand(1.0))
    assert reasons(again) == [(fleet_plan.REPLICAS_IGNORED, True)]
    assert "changed to 7" in again.events[0].message


def test_an_hpa_on_the_object_owns_the_count_and_is_reported_once() -> None:
    obj = Object()
    refused = obj.at(T0, spec(replicas=2), demand(20.0), scalers=(HPA,))
    assert refused.replicas == 2  # spec.replicas as the HPA writes it, not the 6 demand needs
    assert reasons(refused) == [(fleet_plan.CONFLICT, True)]
    assert HPA in refused.events[0].message
    assert obj.autoscaling["reason"] == fleet_plan.CONFLICT
    assert obj.autoscaling["desiredReplicas"] == 2
    assert obj.autoscaling["runningReplicas"] == 1
    # The HPA scales the object: spec.replicas runs, no second Warning, nor ReplicasIgnored.
    hpa_scaled = obj.at(T0 + 1, spec(replicas=4), demand(20.0), scalers=(HPA,))
    assert (hpa_scaled.replicas, hpa_scaled.events) == (4, ())
    assert fleet_plan.victims(hpa_scaled, 4, views(5), {}) == ()


def test_an_hpa_arriving_keeps_the_sized_count_until_it_writes_spec_replicas() -> None:
    """spec.replicas is still what autoscaling did not read (here a `kubectl scale` to 9): an
    HPA's arrival must not start 9 replicas for the seconds before its first write."""
    obj = Object()
    obj.at(T0, spec(replicas=9), demand(10.0), pods=views(3))
    assert obj.autoscaling["desiredReplicas"] == 3 and obj.autoscaling["ignoredReplicas"] == 9
    arrived = obj.at(T0 + 1, spec(replicas=9), demand(10.0), pods=views(3), scalers=(HPA,))
    assert arrived.replicas == 3 and reasons(arrived) == [(fleet_plan.CONFLICT, True)]
    assert obj.at(T0 + 2, spec(replicas=9), demand(10.0), scalers=(HPA,)).replicas == 3
    written = obj.at(T0 + 3, spec(replicas=2), demand(10.0), scalers=(HPA,))
    assert (written.replicas, written.events) == (2, ())
    # From its first write on the HPA's count runs, whatever it writes next.
    assert obj.at(T0 + 4, spec(replicas=9), demand(10.0), scalers=(HPA,)).replicas == 9


def test_sizing_resumes_from_the_running_pods_once_the_hpa_is_gone() -> None:
    obj = Object()
    obj.at(T0, spec(replicas=4), demand(10.0), pods=views(4), scalers=(HPA,))
    # desiredReplicas 4 was the HPA's: the fleet starts from the 2 pods that run now.
    resumed = obj.at(T0 + 1, spec(replicas=4), demand(10.0), pods=views(2))
    assert resumed.replicas == 3
    assert reasons(resumed) == [("ScaledUp", False)]
    assert "scaling up from 2 to 3" in resumed.events[0].message


# -- status.autoscaling -----------------------------------------------------------------------


def test_a_scale_up_writes_its_status_and_a_normal_event() -> None:
    obj = Object()
    plan = obj.at(T0, spec(), demand(10.0), pods=views(1))
    assert plan.replicas == 3
    status = obj.autoscaling
    assert {k: status[k] for k in (
        "desiredReplicas", "runningReplicas", "neededReplicas", "reason", "demand",
        "expectedGoodput", "batchingReplicas", "lastScaleTime", "lastScaleDownTime",
        "lowerSince", "higherSince", "ignoredReplicas",
    )} == {
        "desiredReplicas": 3, "runningReplicas": 1, "neededReplicas": 3, "reason": "ScaledUp",
        "demand": "10.000", "expectedGoodput": "12.000", "batchingReplicas": 0,
        "lastScaleTime": iso_time(T0), "lastScaleDownTime": None, "lowerSince": None,
        "higherSince": None, "ignoredReplicas": 2,
    }
    assert reasons(plan) == [("ScaledUp", False)]
    assert plan.events[0].message == status["message"]
    assert "scaling up from 1 to 3" in status["message"]
    AutoscalingStatus.model_validate(status)  # every field is the CRD's (none pruned)


def test_the_desired_count_is_carried_by_the_status_not_the_running_pods() -> None:
    """Replicas asked for take a minute to start: the next iteration reads desiredReplicas
    back, so it neither scales up twice nor forgets what it asked for."""
    obj = Object()
    obj.at(T0, spec(), demand(10.0), pods=views(1))
    later = obj.at(T0 + 1, spec(), demand(10.0), pods=views(1, ready=False))
    assert (later.replicas, later.events) == (3, ())
    assert obj.autoscaling["reason"] == "FleetFitsDemand"
    assert obj.autoscaling["lastScaleTime"] == iso_time(T0)
    # Without that status (a fresh object) the count would start from the one pod.
    assert plan_fleet(spec(), {}, demand(1.0), Activity(), views(1), (), T0).replicas == 1


def test_the_scale_down_windows_are_carried_by_the_status() -> None:
    obj = Object({"autoscaling": {"desiredReplicas": 3, "reason": "FleetFitsDemand",
                                  "ignoredReplicas": 2}})
    waiting = obj.at(T0, spec(), demand(1.0), pods=views(3))
    assert waiting.replicas == 3
    assert obj.autoscaling["reason"] == "ScaleDownStabilizing"
    assert obj.autoscaling["lowerSince"] == iso_time(T0)
    assert obj.autoscaling["neededReplicas"] == 1
    assert obj.at(T0 + 299, spec(), demand(1.0), pods=views(3)).replicas == 3
    down = obj.at(T0 + 300, spec(), demand(1.0), pods=views(3))
    assert (down.replicas, reasons(down)) == (2, [("ScaledDown", False)])
    assert obj.autoscaling["lastScaleDownTime"] == iso_time(T0 + 300)
    paced = obj.at(T0 + 330, spec(), demand(1.0), pods=views(2))
    assert (paced.replicas, paced.events) == (2, ())
    assert obj.autoscaling["reason"] == "ScaleDownPaced"
    assert obj.at(T0 + 360, spec(), demand(1.0), pods=views(2)).replicas == 1


def test_a_flip_in_status_holds_a_step_down() -> None:
    flipped = {"lastFlips": [{"pod": "p0", "time": iso_time(T0 + 250), "mode": "batching"}]}
    obj = Object({"adaptiveState": flipped,
                  "autoscaling": {"desiredReplicas": 3, "lowerSince": iso_time(T0 - 1000)}})
    held = obj.at(T0 + 300, spec(), demand(1.0), pods=views(3))
    assert held.replicas == 3 and obj.autoscaling["reason"] == "FlipCooldown"
    assert obj.at(T0 + 370, spec(), demand(1.0), pods=views(3)).replicas == 2  # cooldown 120 s


def test_the_learned_capacity_in_status_sizes_the_fleet() -> None:
    """5 chats/s (6/s with the headroom): 2 replicas at the seeds' 4.1/s each, 3 at a learned
    2.5/s."""
    assert Object().at(T0, spec(), demand(5.0)).replicas == 2
    learned = {"adaptiveState": {"capacity": {"streamingMilli": 2500, "batchingMilli": 11500}}}
    assert Object(learned).at(T0, spec(), demand(5.0)).replicas == 3


def test_requests_the_routers_hold_and_relay_raise_the_count() -> None:
    """64 admitted a replica at most (the batching profile's cap): 100 held and 30 relayed
    need 3, whatever the metrics say."""
    busy = Activity(last_request_at=T0, holding=100, held_since=T0 - 2, inflight=30)
    plan = Object().at(T0, spec(), demand(1.0), busy)
    assert plan.replicas == 3


def test_no_metrics_hold_the_count_until_the_routers_are_quiet_for_the_window() -> None:
    status = {"autoscaling": {"desiredReplicas": 3}}
    recent = Activity(last_request_at=T0 - 10)
    held = Object(status).at(T0, spec(), None, recent, views(3))
    assert held.replicas == 3 and held.status and held.status["reason"] == "DemandUnknown"
    assert held.status["demand"] is None and held.status["expectedGoodput"] is None
    quiet = Activity(last_request_at=T0 - 300)
    obj = Object(status)
    first = obj.at(T0, spec(), None, quiet, views(3))
    assert first.status and first.status["neededReplicas"] == 1
    assert first.replicas == 2 and first.status["reason"] == "ScaledDown"
    # A stream still relayed is a request: no quiet, whatever the last one's time.
    streaming = Activity(last_request_at=T0 - 3000, inflight=1)
    busy = Object(status).at(T0, spec(), None, streaming, views(3))
    assert busy.status and busy.status["reason"] == "DemandUnknown"


def test_idle_at_zero_the_fleet_is_what_the_held_requests_need() -> None:
    status = {"standby": {"state": "Idle"}, "autoscaling": {"desiredReplicas": 2}}
    held = Activity(holding=130, held_since=T0 - 1)
    plan = Object(status).at(T0, spec(minReplicas=0), None, held, [])
    assert plan.replicas == 3 and plan.events == ()
    assert plan.status and plan.status["reason"] == "Idle"
    assert Object(status).at(T0, spec(minReplicas=0), None, Activity(), []).replicas == 1


# -- victims ----------------------------------------------------------------------------------


STEPPING_DOWN = {"autoscaling": {"desiredReplicas": 3, "lowerSince": iso_time(T0 - 1000)}}


def test_victims_of_a_step_down_are_the_cheapest_pods() -> None:
    pods = [PodView("busy", None, Mode.STREAMING, True),
            PodView("unlabelled", None, None, True),  # counts as streaming
            PodView("batch", None, Mode.BATCHING, True)]
    inflight = {"busy": 7, "unlabelled": 2, "batch": 9}
    plan = Object(STEPPING_DOWN).at(T0, spec(), demand(1.0), pods=pods)
    assert plan.replicas == 2 and reasons(plan) == [("ScaledDown", False)]
    # Chats only: the batching replica is the surplus mode, busy as it is.
    assert fleet_plan.victims(plan, 2, pods, inflight) == ("batch",)
    assert fleet_plan.victims(plan, 1, pods, inflight) == ("batch", "unlabelled")
    assert fleet_plan.victims(plan, 3, pods, inflight) == ()
    assert fleet_plan.victims(plan, 0, pods, inflight) == ()  # to the floor: every pod goes


def test_no_victim_outside_a_step_down() -> None:
    """More pods than the fleet's size without a step down (a rollout's surge pod, a pod
    still terminating): nothing is marked, or a stale mark would pick the next victim."""
    surge = [*views(3), PodView("new", None, Mode.STREAMING, False)]
    steady = Object({"autoscaling": {"desiredReplicas": 3}}).at(T0, spec(), demand(10.0),
                                                                 pods=surge)
    assert steady.replicas == 3 and steady.events == ()
    assert fleet_plan.victims(steady, 3, surge, {}) == ()
    waiting = Object({"autoscaling": {"desiredReplicas": 3}}).at(T0, spec(), demand(1.0),
                                                                  pods=surge)
    assert waiting.status and waiting.status["reason"] == "ScaleDownStabilizing"
    assert fleet_plan.victims(waiting, 3, surge, {}) == ()


# -- AutoGLMDeploymentSpec.standby() ----------------------------------------------------------


def test_standby_without_autoscaling_is_scale_to_zero_as_written() -> None:
    for floor in (0, 2):  # minReplicas (1 by default) is not read
        the_spec = AutoGLMDeploymentSpec.model_validate(
            {"replicas": 3, "scaleToZero": {"enabled": True, "floor": floor, "idleSeconds": 600}})
        assert the_spec.standby() == the_spec.scale_to_zero
        assert (the_spec.standby().enabled, the_spec.standby().floor) == (True, floor)


@pytest.mark.parametrize(
    ("scale_to_zero", "min_replicas", "enabled", "floor"),
    [
        (False, 0, True, 0),  # minReplicas 0 turns scale to zero on
        (False, 2, False, 2),
        (True, 2, True, 2),  # on, with minReplicas the floor (scaleToZero.floor is not read)
        (True, 0, True, 0),
    ],
)
def test_standby_with_autoscaling_floors_at_min_replicas(
    scale_to_zero: bool, min_replicas: int, enabled: bool, floor: int
) -> None:
    raw = raw_spec(minReplicas=min_replicas)
    raw["scaleToZero"] = {"enabled": scale_to_zero, "floor": 1, "idleSeconds": 600,
                          "sleep": {"enabled": True, "idleSeconds": 120}}
    the_spec = AutoGLMDeploymentSpec.model_validate(raw)
    standby = the_spec.standby()
    assert (standby.enabled, standby.floor) == (enabled, floor)
    assert standby.idle_seconds == 600 and standby.sleep.idle_seconds == 120  # kept as written
    assert the_spec.scale_to_zero.floor == 1  # the spec itself is unchanged
