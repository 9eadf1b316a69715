"""Scale to zero and warm standby as planned (reconcile/standby.py): the replicas to run, the
pods to sleep or wake and status.standby, from the routers' activity and the clock; and the
routers' reports read together (autoglm_api.standby.activity_of)."""

from __future__ import annotations

from typing import Any

import pytest

from autoglm_api.standby import Activity, Reading, RouterReport, activity_of, decode_report
from autoglm_operator.reconcile.standby import PodState, StandbyPlan, plan_standby
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

T0 = 1_800_000_000.0  # wall-clock seconds
NO_DEMAND = Activity()
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

    def at(self, now: float, demand: Activity = NO_DEMAND,
           running: list[PodState] | None = None, scalers: tuple[str, ...] = ()) -> StandbyPlan:
        plan = plan_standby(self.spec, demand, self.status,
                            pods() if running is None else running, now, scalers)
        self.status = dict(plan.status) if plan.status is not None else None
        return plan


def test_off_runs_the_spec_replicas_and_wakes_what_slept() -> None:
    plan = plan_standby(spec(enabled=False), Activity(), None, pods(asleep=True), T0)
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
        plan = clock.at(now, Activity(last_request_at=now - 30))
        assert plan.replicas == 2 and not plan.events


def held(at: float, count: int = 1) -> Activity:
    return Activity(holding=count, held_since=at)


def test_a_held_request_wakes_one_replica_and_the_wait_is_reported() -> None:
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    arrived = T0 + IDLE + 100
    waking = clock.at(arrived + 1, held(arrived, 3), running=[])
    assert waking.replicas == 1  # one replica first, the rest as demand asks
    assert [e.reason for e in waking.events] == ["Waking"]
    assert "3 request(s) held" in waking.events[0].message
    starting = clock.at(arrived + 30, held(arrived, 3), running=pods(1, ready=False))
    assert starting.replicas == 1 and not starting.events
    woke = clock.at(arrived + 41.25, held(arrived, 3), running=pods(1))
    assert [e.reason for e in woke.events] == ["Woke"]
    assert woke.replicas == 1 and woke.woke_after == pytest.approx(41.25)
    assert clock.status is not None
    assert clock.status["lastWakeMillis"] == 41250 and clock.status["wokenReplicas"] == 1
    released = Activity(last_request_at=arrived + 42, last_wait_seconds=41.5)
    assert clock.at(arrived + 42, released, running=pods(1)).replicas == 1
    assert clock.status["state"] == "Serving"
    assert clock.status["lastHeldWaitMillis"] == 41500
    # A whole window from the last request, then back to zero.
    assert clock.at(arrived + 42 + IDLE - 1, released, running=pods(1)).replicas == 1
    assert clock.at(arrived + 42 + IDLE, released, running=pods(1)).replicas == 0


def test_a_woken_deployment_grows_when_its_first_replica_is_full() -> None:
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    now = T0 + IDLE + 10
    clock.at(now, held(now - 2), running=[])
    clock.at(now + 60, held(now - 2), running=pods(1))
    cap = min(spec().admission_caps(streamed_chat=False).values())
    below = clock.at(now + 61, Activity(last_request_at=now + 61, inflight=cap - 1),
                     running=pods(1))
    assert below.replicas == 1 and not below.events
    full = clock.at(now + 62, Activity(last_request_at=now + 62, inflight=cap), running=pods(1))
    assert full.replicas == 2
    assert [e.reason for e in full.events] == ["ScaledUp"]
    assert clock.status is not None and clock.status["wokenReplicas"] is None
    # Once grown it stays at spec.replicas until idle.
    assert clock.at(now + 63, Activity(last_request_at=now + 63)).replicas == 2


def test_a_request_still_held_as_its_replica_turns_ready_grows_nothing() -> None:
    """The routers see a replica ready a moment after the operator does: the request held
    through the cold start is no sign that the replica is full."""
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    now = T0 + IDLE + 10
    clock.at(now, held(now - 2), running=[])
    clock.at(now + 60, held(now - 2), running=pods(1))
    assert clock.at(now + 61, held(now - 2), running=pods(1)).replicas == 1


def test_a_wake_whose_requests_left_goes_back_at_once() -> None:
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    arrived = T0 + IDLE + 10
    assert clock.at(arrived + 1, held(arrived), []).replicas == 1
    # Its client left (or it waited out its hold) before the replica was ready.
    back = clock.at(arrived + 3, Activity(), pods(1, ready=False))
    assert back.replicas == 0
    assert [e.reason for e in back.events] == ["WakeAbandoned"]


def test_a_start_longer_than_the_hold_goes_on_for_the_clients_that_come_back() -> None:
    """A held request answered 503 at the hold's bound (180 s) comes back after its
    Retry-After: the wake goes on for it, up to an idle window from the wake's start."""
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    arrived = T0 + IDLE + 10
    clock.at(arrived + 1, held(arrived), [])
    timed_out = arrived + 180 + 1  # the router answered it 503 at 180 s
    starting = clock.at(timed_out, Activity(), pods(1, ready=False))
    assert starting.replicas == 1 and not starting.events
    # Its retry is held again, and the replica, ready at 240 s, serves it.
    clock.at(arrived + 191, held(arrived + 190), pods(1, ready=False))
    woke = clock.at(arrived + 240, held(arrived + 190), pods(1))
    assert [e.reason for e in woke.events] == ["Woke"]
    # Nobody came back: the start is given up an idle window after the wake began.
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    clock.at(arrived + 1, held(arrived), [])
    assert clock.at(arrived + IDLE - 1, Activity(), pods(1, ready=False)).replicas == 1
    back = clock.at(arrived + IDLE, Activity(), pods(1, ready=False))
    assert back.replicas == 0 and [e.reason for e in back.events] == ["WakeAbandoned"]


def test_a_request_served_during_the_wake_keeps_it() -> None:
    """The replica's readiness reaches the operator after the router released the request to
    it: a request since the wake started is not an abandoned wake."""
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + IDLE)
    arrived = T0 + IDLE + 10
    clock.at(arrived + 1, held(arrived), [])
    served = Activity(last_request_at=arrived + 5, inflight=1)
    assert clock.at(arrived + 5, served, pods(1, ready=False)).replicas == 1
    assert clock.status is not None and clock.status["state"] == "Waking"


def test_a_stream_in_flight_outlasts_the_idle_window() -> None:
    clock = Clock(spec())
    clock.at(T0)
    streaming = Activity(last_request_at=T0 + 1, inflight=1)
    assert clock.at(T0 + IDLE * 3, streaming).replicas == 2
    done = Activity(last_request_at=T0 + IDLE * 3)  # it ended: the window starts there
    assert clock.at(T0 + IDLE * 4 - 1, done).replicas == 2
    assert clock.at(T0 + IDLE * 4, done).replicas == 0


def test_a_held_request_keeps_a_serving_deployment_from_idling() -> None:
    clock = Clock(spec())
    clock.at(T0)
    assert clock.at(T0 + IDLE * 2, held(T0 + IDLE * 2 - 5)).replicas == 2


def test_the_idle_clock_survives_routers_that_restarted() -> None:
    """A restarted router has relayed nothing: the last request status recorded still dates
    the window."""
    clock = Clock(spec())
    clock.at(T0)
    clock.at(T0 + 100, Activity(last_request_at=T0 + 100))
    assert clock.at(T0 + 100 + IDLE - 1, Activity()).replicas == 2
    assert clock.at(T0 + 100 + IDLE, Activity()).replicas == 0


def test_sleep_comes_first_then_zero_and_demand_wakes_the_sleepers() -> None:
    clock = Clock(spec(sleep=True))
    clock.at(T0)
    slept = clock.at(T0 + SLEEP)
    assert slept.replicas == 2
    assert slept.sleep == ("p0", "p1")
    assert slept.lowers(2)
    assert [e.reason for e in slept.events] == ["Slept"]
    # Marked asleep by the executor: not asked again.
    assert clock.at(T0 + SLEEP + 1, running=pods(asleep=True)).sleep == ()
    now = T0 + SLEEP + 60
    woke = clock.at(now, Activity(last_request_at=now), running=pods(asleep=True))
    assert woke.wake == ("p0", "p1")
    assert woke.replicas == 2
    assert clock.status is not None and clock.status["state"] == "Serving"


def test_nothing_sleeps_while_a_request_is_in_flight() -> None:
    clock = Clock(spec(sleep=True))
    clock.at(T0)
    busy = clock.at(T0 + SLEEP * 2, Activity(last_request_at=T0, inflight=1))
    assert busy.sleep == () and not busy.events


def test_a_floor_with_sleep_keeps_a_warm_standby() -> None:
    clock = Clock(spec(floor=1, sleep=True))
    clock.at(T0)
    clock.at(T0 + SLEEP)
    idle = clock.at(T0 + IDLE, running=pods(asleep=True))
    assert idle.replicas == 1
    assert [e.reason for e in idle.events] == ["ScaledToFloor"]
    now = T0 + IDLE + 5
    # The standby is ready, asleep: demand wakes it, and no replica starts before it serves;
    # the rest start when demand fills it.
    standby = [PodState("p0", True, True)]
    waking = clock.at(now, held(now - 1), running=standby)
    assert (waking.replicas, waking.wake) == (1, ("p0",))
    woke = clock.at(now + 1, held(now - 1), running=standby)
    assert (woke.replicas, [e.reason for e in woke.events]) == (1, ["Woke"])
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


# -- the routers' reports, together -----------------------------------------------------------

STALE = 181.0


def test_reports_are_dated_on_the_operators_clock_and_summed() -> None:
    a = Reading(RouterReport(holding=2, held_for=4.0, inflight=1, idle_for=5.0), T0 + 10)
    b = Reading(RouterReport(holding=1, held_for=7.0, idle_for=1.0, last_wait=0.5), T0 + 10)
    assert activity_of([a, b], T0 + 10, STALE) == Activity(
        last_request_at=T0 + 9, holding=3, held_since=T0 + 3, inflight=1,
        last_wait_seconds=0.5)
    assert activity_of([], T0, STALE) == Activity()


def test_a_router_that_stopped_answering_holds_nothing_up_after_the_bound() -> None:
    lost = Reading(RouterReport(holding=4, held_for=1.0, inflight=2, idle_for=0.0), T0)
    assert activity_of([lost], T0 + STALE, STALE).busy
    gone = activity_of([lost], T0 + STALE + 0.1, STALE)
    assert not gone.busy and gone.holding == 0 and gone.inflight == 0
    assert gone.last_request_at == T0  # still dates the idle window


def test_a_router_that_relayed_nothing_dates_nothing() -> None:
    fresh = Reading(RouterReport(), T0)
    assert activity_of([fresh], T0, STALE).last_request_at is None


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b"{}", b'{"holding": -1, "inflight": 0}',
    b'{"holding": 1, "inflight": 0}',  # held, but for how long?
    b'{"holding": 10001, "heldForSeconds": 1, "inflight": 0}',
    b'{"holding": true, "heldForSeconds": 1, "inflight": 0}',
    b'{"holding": 0, "inflight": 0, "idleForSeconds": -5}',
    b'{"holding": 0, "inflight": 0, "idleForSeconds": NaN}',
    b'{"holding": 0, "inflight": 0, "idleForSeconds": Infinity}',
    b'{"holding": 0, "inflight": 0, "idleForSeconds": "3"}',
    b'{"holding": 0, "inflight": 1.5}',
    b'{"holding": 0, "inflight": 0, "pad": "' + b"x" * 5000 + b'"}',
])
def test_a_hostile_or_broken_report_is_refused(body: bytes) -> None:
    assert decode_report(body, max_count=10000) is None


def test_a_report_round_trips() -> None:
    report = RouterReport(holding=2, held_for=3.25, inflight=5, idle_for=0.5, last_wait=2.0)
    assert decode_report(report.encode(), max_count=10) == report
