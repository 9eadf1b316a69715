"""Scale to zero and warm standby as planned (reconcile/standby.py): the replicas to run, the
pods to sleep or wake and status.standby, from the routers' demand and the clock."""

from __future__ import annotations

from typing import Any

from autoglm_api.standby import Demand, RouterDemand, annotation_key, demand_of
from autoglm_operator.reconcile.standby import PodState, StandbyPlan, plan_standby
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

T0 = 1_800_000_000.0  # wall-clock seconds
NO_DEMAND = Demand()
IDLE, SLEEP = 900, 300


def spec(floor: int = 0, sleep: bool = False, enabled: bool = True) -> AutoGLMDeploymentSpec:
    return AutoGLMDeploymentSpec.model_validate({
        "replicas": 2,
        "scaleToZero": {"enabled": enabled, "idleSeconds": IDLE, "floor": floor,
                        "sleep": {"enabled": sleep, "idleSeconds": SLEEP}},
    })


def pods(n: int = 2, ready: bool = True, asleep: bool = False) -> list[PodState]:
    return [PodState(f"p{i}", ready, asleep) for i in range(n)]


class Clock:
    """A deployment's standby plans over time, each from the status the last one wrote."""

    def __init__(self, the_spec: AutoGLMDeploymentSpec) -> None:
        self.spec = the_spec
        self.status: dict[str, Any] | None = None

    def at(self, now: float, demand: Demand = NO_DEMAND,
           running: list[PodState] | None = None, scalers: tuple[str, ...] = ()) -> StandbyPlan:
        plan = plan_standby(self.spec, demand, self.status,
                            pods() if running is None else running, now, scalers)
        self.status = dict(plan.status) if plan.status is not None else None
        return plan


def test_off_runs_the_spec_replicas_and_wakes_what_slept() -> None:
    plan = plan_standby(spec(enabled=False), Demand(), None, pods(asleep=True), T0)
    assert plan.replicas == 2
    assert plan.wake == ("p0", "p1")
    assert plan.status is None


def test_an_idle_deployment_scales_to_zero_after_the_window_and_says_why() -> None:
    clock = Clock(spec())
    first = clock.at(T0)
    assert (first.replicas, clock.status and clock.status["state"]) == (2, "Serving")
    assert clock.at(T0 + IDLE - 1).replicas == 2
    idle = clock.at(T0 + IDLE)
    assert idle.replicas == 0
    assert [e.reason for e in idle.events] == ["ScaledToZero"]
    assert clock.status is not None and clock.status["state"] == "Idle"
    assert "scaled from 2 to 0" in clock.status["message"]


def test_requests_keep_it_serving() -> None:
    clock = Clock(spec())
    clock.at(T0)
    for minute in range(1, 60):
        now = T0 + 60 * minute
        plan = clock.at(now, Demand(last_request_at=now - 30))
        assert plan.replicas == 2 and not plan.events


def test_a_held_request_wakes_it_and_the_wait_is_reported() -> None:
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    arrived = T0 + IDLE + 100
    held = Demand(last_request_at=arrived, holding=3, held_since=arrived)
    waking = clock.at(arrived + 0.5, held, running=[])
    assert waking.replicas == 2
    assert [e.reason for e in waking.events] == ["Waking"]
    assert "3 request(s) held" in waking.events[0].message
    starting = clock.at(arrived + 30, held, running=pods(ready=False))
    assert starting.replicas == 2 and not starting.events
    woke = clock.at(arrived + 41.25, held, running=pods(1))
    assert [e.reason for e in woke.events] == ["Woke"]
    assert clock.status is not None
    assert clock.status["lastWakeMillis"] == 41250
    released = Demand(last_request_at=arrived, last_wait_seconds=41.5)
    clock.at(arrived + 42, released, running=pods(2))
    assert clock.status["state"] == "Serving"
    assert clock.status["lastHeldWaitMillis"] == 41500
    # A whole window from the wake, not from the last request before it.
    assert clock.at(arrived + 41.25 + IDLE - 1, released).replicas == 2
    assert clock.at(arrived + 41.25 + IDLE, released).replicas == 0


def test_a_wake_no_replica_finishes_goes_back_when_nobody_waits() -> None:
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    arrived = T0 + IDLE + 10
    clock.at(arrived, Demand(last_request_at=arrived, holding=1, held_since=arrived), [])
    gave_up = Demand(last_request_at=arrived)  # the router answered 503 past its bound
    assert clock.at(arrived + IDLE - 1, gave_up, []).replicas == 2
    back = clock.at(arrived + IDLE, gave_up, [])
    assert back.replicas == 0
    assert [e.reason for e in back.events] == ["WakeAbandoned"]


def test_sleep_comes_first_then_zero_and_demand_wakes_the_sleepers() -> None:
    clock = Clock(spec(sleep=True))
    clock.at(T0)
    slept = clock.at(T0 + SLEEP)
    assert slept.replicas == 2
    assert slept.sleep == ("p0", "p1")
    assert [e.reason for e in slept.events] == ["Slept"]
    # Marked asleep by the executor: not asked again.
    assert clock.at(T0 + SLEEP + 1, running=pods(asleep=True)).sleep == ()
    now = T0 + SLEEP + 60
    woke = clock.at(now, Demand(last_request_at=now), running=pods(asleep=True))
    assert woke.wake == ("p0", "p1")
    assert woke.replicas == 2
    assert clock.status is not None and clock.status["state"] == "Serving"


def test_a_floor_with_sleep_keeps_a_warm_standby() -> None:
    clock = Clock(spec(floor=1, sleep=True))
    clock.at(T0)
    clock.at(T0 + SLEEP)
    idle = clock.at(T0 + IDLE, running=pods(asleep=True))
    assert idle.replicas == 1
    assert [e.reason for e in idle.events] == ["ScaledToFloor"]
    now = T0 + IDLE + 5
    # The standby is ready, asleep: demand wakes it and scales back up at once, no Waking.
    woke = clock.at(now, Demand(last_request_at=now, holding=1, held_since=now),
                    running=[PodState("p0", True, True)])
    assert (woke.replicas, woke.wake) == (2, ("p0",))
    assert clock.status is not None and clock.status["state"] == "Serving"


def test_an_autoscaler_on_the_object_refuses_scale_to_zero_once() -> None:
    clock = Clock(spec())
    refused = clock.at(T0 + IDLE * 3, scalers=("keda-hpa-phone",))
    assert refused.replicas == 2
    assert [(e.reason, e.warning) for e in refused.events] == [("AutoscalerConflict", True)]
    assert "keda-hpa-phone" in refused.events[0].message
    again = clock.at(T0 + IDLE * 4, scalers=("keda-hpa-phone",))
    assert again.replicas == 2 and not again.events
    resumed = clock.at(T0 + IDLE * 5)
    assert clock.status is not None and clock.status["state"] == "Serving"
    assert resumed.replicas == 2


def test_routers_demand_is_merged_from_their_annotations() -> None:
    annotations = {
        annotation_key("r-a"): RouterDemand(T0 + 5, holding=2, held_since=T0 + 1).encode(),
        annotation_key("r-b"): RouterDemand(T0 + 9, holding=1, held_since=T0 + 3,
                                            last_wait_seconds=0.5).encode(),
        annotation_key("r-c"): "not json",
        "other.io/x": "1",
    }
    demand = demand_of(annotations)
    assert demand == Demand(last_request_at=T0 + 9, holding=3, held_since=T0 + 1,
                            last_wait_seconds=0.5)
    assert demand_of(None) == Demand()


def test_a_router_pod_that_is_gone_holds_nothing_up() -> None:
    """A router that crashed while holding leaves its annotation: the plan reads only those of
    router pods that exist, and the gone one's key is listed for removal."""
    from autoglm_operator.reconcile.iteration import demand_annotations
    from autoglm_operator.reconcile.observe import Observed

    live, gone = "phone-9b-router-a", "phone-9b-router-b"
    body = {"metadata": {"annotations": {
        annotation_key(live): RouterDemand(T0).encode(),
        annotation_key(gone): RouterDemand(T0 + 5, holding=4, held_since=T0 + 1).encode(),
        "kopf.zalando.org/x": "y",
    }}}
    observed = Observed(body=body, deployment=None, children={}, secret=None, pods=[],
                        router_pods=[{"metadata": {"name": live}}])
    reports, stale = demand_annotations(observed)
    assert demand_of(reports) == Demand(last_request_at=T0)
    assert stale == (annotation_key(gone),)


def test_a_request_still_held_keeps_a_woken_deployment_up() -> None:
    """Woken, its replicas report ready before they serve (a slow engine start): the request
    still held is demand now, however long ago it arrived, so no idle window ends under it."""
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    arrived = T0 + IDLE + 1
    held = Demand(last_request_at=arrived, holding=1, held_since=arrived)
    clock.at(arrived, held, running=[])
    clock.at(arrived + 1, held)  # Woke: ready pods
    assert clock.at(arrived + 1 + IDLE * 2, held).replicas == 2
