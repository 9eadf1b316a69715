"""Fleet sizing (adaptive/scaling.py, spec.autoscaling): how many replicas the demand needs,
how the count moves (at once up, slowly down, never within a flip's cooldown), what unknown
demand and an idle deployment do, that status messages stay put, and which pod a step down
removes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import scaling
from autoglm_operator.adaptive.capacity import Capacity
from autoglm_operator.adaptive.demand import Demand
from autoglm_operator.adaptive.scaling import Candidate, FleetDecision, FleetInput, FleetMemory
from autoglm_operator.resource.spec import AutoscalingSettings, ServiceLevelObjectives

T0 = 1_800_000_000.0
# Round figures: a streaming replica serves 4 chats/s, a batching one 10 requests/s; the most a
# replica admits is 64 (batching), so 65 requests held need two.
CAPACITY = Capacity(streaming=4.0, batching=10.0)
CAPS = {Mode.STREAMING: 8, Mode.BATCHING: 64}
UNKNOWN = None


def settings(**fields: Any) -> AutoscalingSettings:
    """spec.autoscaling as a user writes it (camelCase), on, maxReplicas 8 unless given."""
    return AutoscalingSettings.model_validate({"enabled": True, "maxReplicas": 8, **fields})


def seen(
    chat: float | None = 0.0,
    other: float = 0.0,
    *,
    busy: int = 0,
    quiet_for: float | None = None,
    running: int = 1,
    min_streaming: int = 1,
    last_flip: float | None = None,
    idle: bool = False,
) -> FleetInput:
    """What one decision reads; chat None: the demand is unknown (no recent metrics)."""
    return FleetInput(
        demand=None if chat is None else Demand(chat, other),
        busy=busy,
        quiet_for=quiet_for,
        running=running,
        capacity=CAPACITY,
        caps=CAPS,
        slo=ServiceLevelObjectives(),
        min_streaming=min_streaming,
        last_flip=last_flip,
        cooldown_seconds=120,
        idle=idle,
    )


class Fleet:
    """One deployment's sizing decisions over time, each from the memory the last one left
    (as status.autoscaling carries it)."""

    def __init__(self, the_settings: AutoscalingSettings, desired: int | None = None) -> None:
        self.settings = the_settings
        self.memory = FleetMemory(desired=desired)

    def at(self, now: float, inp: FleetInput) -> FleetDecision:
        decision = scaling.size_fleet(inp, self.settings, self.memory, now)
        self.memory = decision.memory
        return decision

    def changes(
        self, start: float, seconds: int, inp: Callable[[float], FleetInput]
    ) -> list[tuple[float, int]]:
        """A decision every second (the reconcile loop's pace): when the count changed, to
        what."""
        out: list[tuple[float, int]] = []
        last = self.memory.desired
        for second in range(seconds + 1):
            now = start + second
            desired = self.at(now, inp(now)).desired
            if desired != last:
                out.append((now - start, desired))
                last = desired
        return out


def needed(inp: FleetInput, the_settings: AutoscalingSettings | None = None) -> int:
    return scaling.needed(inp, the_settings or settings())[0]


# -- how many the demand needs ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("chat", "headroom", "replicas"),
    [
        (3.0, 0, 1),  # one replica serves 4/s
        (4.0, 0, 1),  # exactly at its capacity
        (4.5, 0, 2),
        (8.0, 0, 2),
        (3.5, 20, 2),  # 4.2/s with the headroom: more than one serves
        (10.0, 20, 3),  # 12/s: three serve exactly that
        (10.5, 20, 4),  # 12.6/s
        (8.0, 50, 3),  # the same demand, more headroom: one more
    ],
)
def test_the_fleet_is_the_smallest_that_serves_the_demand_plus_headroom(
    chat: float, headroom: int, replicas: int
) -> None:
    the_settings = settings(headroomPercent=headroom)
    count, fit = scaling.needed(seen(chat), the_settings)
    assert count == replicas
    assert fit is not None and fit.replicas == replicas and fit.meets
    assert fit.demand == pytest.approx(chat * (1 + headroom / 100))
    raised = Demand(chat * (1 + headroom / 100), 0.0)
    if replicas > 1:  # one fewer would not serve it
        assert not scaling.fit(replicas - 1, raised, seen(chat)).meets


def test_the_fleet_grows_with_the_demand_and_stops_at_max_replicas() -> None:
    counts = [needed(seen(tenth / 10)) for tenth in range(0, 400, 5)]
    assert counts[0] == 1  # no demand: the floor
    assert counts == sorted(counts)  # never fewer for more demand
    assert set(counts) == set(range(1, 9))  # every size on the way, up to maxReplicas 8


def test_batch_jobs_are_served_by_batching_replicas_beside_the_streaming_floor() -> None:
    count, fit = scaling.needed(seen(0.0, 10.0), settings())
    # 12 jobs/s: one batching replica (10/s) and the streaming one minStreamingReplicas keeps.
    assert (count, fit and fit.batching) == (2, 1)
    # Two kept streaming: a third replica, for the jobs the one batching replica cannot take.
    assert needed(seen(0.0, 10.0, min_streaming=2)) == 3


@pytest.mark.parametrize(
    ("busy", "replicas"),
    [(0, 1), (64, 1), (65, 2), (130, 3), (1000, 8)],
)
def test_requests_held_or_relayed_now_set_a_floor(busy: int, replicas: int) -> None:
    """A burst the minute's rates have not seen yet: the fewest replicas that admit it all
    (64 a replica), within maxReplicas."""
    assert needed(seen(1.0, busy=busy)) == replicas
    assert needed(seen(UNKNOWN, busy=busy)) == replicas


def test_min_and_max_replicas_bound_the_count() -> None:
    assert needed(seen(0.0), settings(minReplicas=2)) == 2
    assert needed(seen(0.0), settings(minReplicas=0)) == 1  # a serving fleet runs one
    count, fit = scaling.needed(seen(40.0), settings(maxReplicas=4))
    assert count == 4
    assert fit is not None and not fit.meets  # short of the demand, and it says so below


def test_demand_beyond_max_replicas_scales_to_the_most_and_reports_it() -> None:
    fleet = Fleet(settings(maxReplicas=4), desired=2)
    up = fleet.at(T0, seen(40.0, running=2))
    assert (up.desired, up.reason, up.scaled) == (4, scaling.SCALED_UP, True)
    at_max = fleet.at(T0 + 1, seen(40.0, running=4))
    assert (at_max.desired, at_max.reason, at_max.scaled) == (4, scaling.AT_MAX_REPLICAS, False)
    assert "short: maxReplicas is 4" in at_max.message


def test_bounds_changed_by_the_user_apply_to_the_remembered_count_at_once() -> None:
    lowered = Fleet(settings(maxReplicas=4), desired=6).at(T0, seen(10.0, running=6))
    assert lowered.desired == 4
    raised = Fleet(settings(minReplicas=3), desired=1).at(T0, seen(0.0))
    assert raised.desired == 3


# -- up ---------------------------------------------------------------------------------------


def test_a_shortfall_scales_up_at_once_by_max_step_counted_from_what_was_asked() -> None:
    """The replicas asked for a second ago are not ready yet (one pod runs throughout): the
    next step is counted from them, so the fleet never overshoots by waiting."""
    fleet = Fleet(settings(scaleUp={"maxStep": 2}), desired=1)
    steps = [fleet.at(T0 + s, seen(25.0, running=1)) for s in range(5)]  # 30/s: 8 replicas
    assert [d.desired for d in steps] == [3, 5, 7, 8, 8]
    assert [d.reason for d in steps] == [scaling.SCALED_UP] * 4 + [scaling.FLEET_FITS_DEMAND]
    assert "scaling up from 1 to 3" in steps[0].message


def test_a_larger_fleet_waits_out_the_scale_up_window_when_one_is_set() -> None:
    fleet = Fleet(settings(scaleUp={"stabilizationSeconds": 30}), desired=1)
    waiting = fleet.at(T0, seen(10.0))
    assert (waiting.desired, waiting.needed, waiting.reason) == (
        1, 3, scaling.SCALE_UP_STABILIZING)
    assert fleet.memory.higher_since == T0
    assert fleet.at(T0 + 29, seen(10.0)).desired == 1
    up = fleet.at(T0 + 30, seen(10.0))
    assert (up.desired, up.reason) == (3, scaling.SCALED_UP)


def test_a_dip_restarts_the_scale_up_window() -> None:
    fleet = Fleet(settings(scaleUp={"stabilizationSeconds": 30}), desired=1)
    fleet.at(T0, seen(10.0))
    assert fleet.at(T0 + 20, seen(1.0)).reason == scaling.FLEET_FITS_DEMAND
    assert fleet.changes(T0 + 25, 40, lambda now: seen(10.0)) == [(30, 3)]


def test_a_flip_does_not_hold_a_scale_up() -> None:
    decision = Fleet(settings(), desired=1).at(T0, seen(10.0, last_flip=T0 - 1))
    assert (decision.desired, decision.reason) == (3, scaling.SCALED_UP)


# -- down -------------------------------------------------------------------------------------


def test_scale_down_waits_the_window_then_steps_one_a_period() -> None:
    """Defaults: fewer wanted for 300 s, then one replica at a time, 60 s apart."""
    fleet = Fleet(settings(), desired=4)
    first = fleet.at(T0, seen(1.0, running=4))
    assert (first.desired, first.needed, first.reason) == (4, 1, scaling.SCALE_DOWN_STABILIZING)
    assert fleet.memory.lower_since == T0
    assert fleet.changes(T0 + 1, 500, lambda now: seen(1.0, running=4)) == [
        (299, 3), (359, 2), (419, 1)]  # T0 + 300, + 360, + 420


def test_a_step_down_between_two_periods_says_it_is_paced() -> None:
    fleet = Fleet(settings(), desired=3)
    fleet.at(T0, seen(1.0))
    assert fleet.at(T0 + 300, seen(1.0)).reason == scaling.SCALED_DOWN
    paced = fleet.at(T0 + 330, seen(1.0))
    assert (paced.desired, paced.reason) == (2, scaling.SCALE_DOWN_PACED)
    assert fleet.memory.last_scale_down == T0 + 300


def test_scale_down_takes_max_step_at_a_time() -> None:
    fleet = Fleet(settings(scaleDown={"maxStep": 2}), desired=6)
    assert fleet.changes(T0, 500, lambda now: seen(1.0, running=6)) == [
        (300, 4), (360, 2), (420, 1)]


def test_demand_back_during_the_window_restarts_it() -> None:
    fleet = Fleet(settings(), desired=3)
    assert fleet.changes(T0, 200, lambda now: seen(1.0)) == []
    back = fleet.at(T0 + 201, seen(10.0))  # needs 3 again
    assert (back.desired, back.reason) == (3, scaling.FLEET_FITS_DEMAND)
    assert fleet.memory.lower_since is None
    assert fleet.changes(T0 + 202, 400, lambda now: seen(1.0)) == [(300, 2), (360, 1)]


def test_no_step_down_within_the_cooldown_of_a_flip() -> None:
    """cooldownSeconds 120: a flip at T0 + 250 holds the step due at T0 + 300 until T0 + 370."""
    fleet = Fleet(settings(), desired=3)
    flipped = T0 + 250
    fleet.at(T0, seen(1.0))
    held = fleet.at(T0 + 300, seen(1.0, last_flip=flipped))
    assert (held.desired, held.reason) == (3, scaling.FLIP_COOLDOWN)
    assert "cooldownSeconds (120s)" in held.message
    assert fleet.at(T0 + 369, seen(1.0, last_flip=flipped)).reason == scaling.FLIP_COOLDOWN
    down = fleet.at(T0 + 370, seen(1.0, last_flip=flipped))
    assert (down.desired, down.reason) == (2, scaling.SCALED_DOWN)


# -- unknown demand, idle ---------------------------------------------------------------------


def test_unknown_demand_holds_the_count() -> None:
    fleet = Fleet(settings(), desired=3)
    assert fleet.changes(T0, 1000, lambda now: seen(UNKNOWN, running=3)) == []
    held = fleet.at(T0 + 1001, seen(UNKNOWN, running=3))
    assert (held.desired, held.reason) == (3, scaling.DEMAND_UNKNOWN)
    assert "demand unknown" in held.message
    # Routers that saw a request within the scale-down window: still no sign of less demand.
    assert fleet.at(T0 + 1002, seen(UNKNOWN, quiet_for=299)).reason == scaling.DEMAND_UNKNOWN


def test_unknown_demand_still_grows_for_the_requests_held() -> None:
    decision = Fleet(settings(), desired=1).at(T0, seen(UNKNOWN, busy=130))
    assert (decision.desired, decision.reason) == (3, scaling.SCALED_UP)


@pytest.mark.parametrize("floor", [1, 2])
def test_routers_quiet_for_the_window_mean_no_demand_whatever_the_metrics(floor: int) -> None:
    """No recent metrics must not keep a fleet up for good: routers that saw no request for
    scaleDown.stabilizationSeconds are zero demand, and it goes to minReplicas."""
    fleet = Fleet(settings(minReplicas=floor), desired=4)
    last_request = T0 - 300

    def quiet(now: float) -> FleetInput:
        return seen(UNKNOWN, quiet_for=now - last_request, running=4)

    # Fewer have been wanted since the last request: the first step comes as the routers have
    # been quiet for the window, not a second window later.
    first = fleet.at(T0, quiet(T0))
    assert (first.needed, first.desired, first.reason) == (floor, 3, scaling.SCALED_DOWN)
    assert "no request for the scale-down window" in first.message
    changes = fleet.changes(T0 + 1, 1000, quiet)
    assert changes[-1][1] == floor
    assert [count for _, count in changes] == list(range(2, floor - 1, -1))  # a step at a time


def test_idle_the_count_a_wake_starts_is_what_the_held_requests_need() -> None:
    fleet = Fleet(settings(minReplicas=0), desired=3)
    nothing_held = fleet.at(T0, seen(UNKNOWN, idle=True, running=0))
    assert (nothing_held.desired, nothing_held.reason) == (1, scaling.IDLE)
    held = fleet.at(T0 + 1, seen(UNKNOWN, busy=130, idle=True, running=0))
    assert (held.desired, held.reason) == (3, scaling.IDLE)
    assert "a wake starts 3 replica(s)" in held.message
    # At once, whatever maxStep: starting from zero, every held request waits for them.
    assert Fleet(settings(scaleUp={"maxStep": 1}), desired=1).at(
        T0, seen(UNKNOWN, busy=300, idle=True, running=0)).desired == 5
    assert Fleet(settings(maxReplicas=2)).at(
        T0, seen(UNKNOWN, busy=1000, idle=True, running=0)).desired == 2


# -- status messages --------------------------------------------------------------------------

# Inputs that stay the same from one second to the next (the routers' quiet time aside, which
# grows with the clock): each leaves the fleet waiting, or settled, for a while; keyed by the
# reason it reports.
STEADY: dict[str, tuple[AutoscalingSettings, FleetMemory, Callable[[float], FleetInput]]] = {
    scaling.SCALE_DOWN_STABILIZING: (settings(), FleetMemory(3), lambda now: seen(1.0)),
    scaling.SCALE_DOWN_PACED: (
        settings(), FleetMemory(3, lower_since=T0 - 1000, last_scale_down=T0 - 10),
        lambda now: seen(1.0)),
    scaling.FLIP_COOLDOWN: (
        settings(), FleetMemory(3, lower_since=T0 - 1000),
        lambda now: seen(1.0, last_flip=T0 - 10)),
    scaling.SCALE_UP_STABILIZING: (
        settings(scaleUp={"stabilizationSeconds": 60}), FleetMemory(1), lambda now: seen(10.0)),
    scaling.DEMAND_UNKNOWN: (
        settings(), FleetMemory(3), lambda now: seen(UNKNOWN, busy=130, quiet_for=None)),
    "quiet routers": (
        settings(), FleetMemory(3, last_scale_down=T0 - 10),
        lambda now: seen(UNKNOWN, quiet_for=now - T0 + 400)),
    scaling.AT_MAX_REPLICAS: (settings(maxReplicas=4), FleetMemory(4), lambda now: seen(40.0)),
    scaling.FLEET_FITS_DEMAND: (settings(), FleetMemory(3), lambda now: seen(10.0, busy=5)),
    scaling.IDLE: (
        settings(minReplicas=0), FleetMemory(1),
        lambda now: seen(UNKNOWN, busy=130, idle=True, running=0)),
}


@pytest.mark.parametrize("case", sorted(STEADY))
def test_the_message_does_not_change_from_one_second_to_the_next(case: str) -> None:
    """status.autoscaling is written when it changes: a message that moved every second would
    write it every second."""
    the_settings, memory, inp = STEADY[case]
    fleet = Fleet(the_settings)
    fleet.memory = memory
    before = fleet.at(T0, inp(T0))
    after = fleet.at(T0 + 1, inp(T0 + 1))
    assert before.reason == (scaling.SCALE_DOWN_PACED if case == "quiet routers" else case)
    assert (after.reason, after.desired, after.message) == (
        before.reason, before.desired, before.message)


def test_requests_in_flight_that_do_not_set_the_count_stay_out_of_the_message() -> None:
    fleet = Fleet(settings(), desired=3)
    assert fleet.at(T0, seen(10.0, busy=5)).message == fleet.at(T0 + 1, seen(10.0, busy=9)).message


def test_requests_held_that_set_the_count_are_named_in_the_message_without_metrics() -> None:
    decision = Fleet(settings(), desired=3).at(T0, seen(UNKNOWN, busy=260))
    assert decision.desired == 5
    assert "260 held or in flight need 5" in decision.message


def test_requests_held_that_set_the_count_are_named_in_the_message() -> None:
    """10 chats/s need 3; 260 requests held need 5: the message must say why 5, not only that
    5 serve the demand."""
    decision = Fleet(settings(), desired=3).at(T0, seen(10.0, busy=260))
    assert decision.desired == 5
    assert "260 held or in flight need 5" in decision.message


# -- victims ----------------------------------------------------------------------------------


def pod(name: str, mode: Mode = Mode.STREAMING, ready: bool = True,
        inflight: int | None = 0) -> Candidate:
    return Candidate(name, mode, ready, inflight)


def test_a_pod_that_is_not_ready_goes_first() -> None:
    pods = [pod("idle"), pod("starting", ready=False, inflight=None), pod("busy", inflight=6)]
    assert scaling.victims(pods, 2, seen(1.0)) == ("starting",)


def test_then_one_of_the_mode_the_smaller_fleet_has_too_many_of() -> None:
    # Chats only: two streaming replicas serve it, the batching one goes, busy as it is.
    pods = [pod("s1", inflight=0), pod("s2", inflight=1), pod("b1", Mode.BATCHING, inflight=6)]
    assert scaling.victims(pods, 2, seen(5.0)) == ("b1",)
    # Batch jobs: two keep one batching replica, so a streaming one goes, the idler of them.
    pods = [pod("b1", Mode.BATCHING, inflight=0), pod("s1", inflight=5), pod("s2", inflight=3)]
    assert scaling.victims(pods, 2, seen(0.0, 10.0)) == ("s2",)


def test_the_streaming_floor_is_never_the_victim() -> None:
    """minStreamingReplicas streaming replicas stay, whatever the demand (or without one)."""
    pods = [pod("s1", inflight=0), pod("b1", Mode.BATCHING, inflight=3),
            pod("b2", Mode.BATCHING, inflight=5)]
    assert scaling.victims(pods, 2, seen(UNKNOWN)) == ("b1",)
    assert scaling.victims(pods, 2, seen(5.0)) == ("b1",)
    assert scaling.victims(pods, 1, seen(UNKNOWN)) == ("b1", "b2")


def test_then_the_fewest_in_flight_and_an_unknown_count_last() -> None:
    pods = [pod("four", inflight=4), pod("one", inflight=1), pod("unread", inflight=None)]
    assert scaling.victims(pods, 2, seen(1.0)) == ("one",)
    assert scaling.victims(pods, 1, seen(1.0)) == ("one", "four")
    assert scaling.victims(pods, 1, seen(UNKNOWN)) == ("one", "four")


def test_no_victim_without_a_surplus() -> None:
    pods = [pod("a"), pod("b")]
    assert scaling.victims(pods, 2, seen(1.0)) == ()
    assert scaling.victims(pods, 3, seen(1.0)) == ()


def test_the_windows_survive_a_restart_in_the_memory_status_keeps() -> None:
    """A restarted operator reads lowerSince and lastScaleDownTime back: a window already
    waited out is not waited again, and a step just taken is not repeated early."""
    waited = FleetMemory(3, lower_since=T0 - 400)
    assert scaling.size_fleet(seen(1.0), settings(), waited, T0).reason == scaling.SCALED_DOWN
    stepped = FleetMemory(2, lower_since=T0 - 400, last_scale_down=T0 - 30)
    assert scaling.size_fleet(seen(1.0), settings(), stepped, T0).reason == \
        scaling.SCALE_DOWN_PACED


def test_a_pinned_mode_is_sized_for_what_that_mode_serves() -> None:
    """modePolicy Streaming: every replica streams, so batch jobs take streaming capacity and
    the fleet is no smaller than the best split's."""
    free = scaling.needed(seen(10.0, other=10.0), settings(maxReplicas=16))[0]
    pinned = scaling.needed(
        replace(seen(10.0, other=10.0), pinned=Mode.STREAMING), settings(maxReplicas=16))
    assert pinned[1] is not None and pinned[1].batching == 0 and pinned[1].meets
    assert pinned[0] > free


def test_between_equals_the_newest_pod_goes() -> None:
    """It has homed the fewest sessions and has the coldest prefix cache."""
    pods = [Candidate("a-old", Mode.STREAMING, True, 0, "2026-12-07T10:00:00Z"),
            Candidate("z-new", Mode.STREAMING, True, 0, "2026-12-07T11:00:00Z"),
            Candidate("m-mid", Mode.STREAMING, True, 0, "2026-12-07T10:30:00Z")]
    assert scaling.victims(pods, 2, seen(1.0)) == ("z-new",)
    assert scaling.victims(pods, 1, seen(1.0)) == ("z-new", "m-mid")
