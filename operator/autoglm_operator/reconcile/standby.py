"""Pure: scale to zero and warm standby, from the routers' activity and the clock.

A deployment with `spec.scaleToZero` on moves between four states, kept in `status.standby`
(so an operator restart resumes them), by the transitions in TRANSITIONS:

- Serving: replicas run awake: `spec.replicas`, or after a wake the one that woke first until
  the routers relay a replica's cap on it (`wokenReplicas`). With spec.autoscaling on, the spec
  this plan reads carries the fleet's size (fleet_plan.py): Serving runs it, and Waking starts
  what the held requests need.
- Asleep: `spec.replicas` still run, asleep (vLLM sleep mode), after `sleep.idleSeconds`
  without a request; a request wakes the replica it reaches, and any demand wakes them all.
- Idle: `floor` replicas run (asleep, with sleep on), after `idleSeconds` without a request.
- Waking: a request is held while Idle at zero; one replica starts, the router holds the
  requests until it is ready.

Activity is what the routers report (autoglm_api.standby): the latest start or end of an
inference request, and the requests they hold and relay now. While one is held or relayed the
deployment is never idle, so a stream longer than the idle window is never cut. Time is
wall-clock Unix seconds, as the operator dates the reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from autoglm_api.standby import Activity
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

SLEEPING_ANNOTATION = "autoglm.io/sleeping"  # on a pod the operator put to sleep: the level
# A wake's requests that end within this of the hold's bound may have timed out there (the
# routers' reports and this plan lag the bound by a second or two): their clients come back.
HOLD_END_MARGIN_SECONDS = 5.0
CONFLICT = "AutoscalerConflict"  # status.standby.state while an HPA owns the replica count


class State(StrEnum):
    SERVING = "Serving"
    ASLEEP = "Asleep"
    IDLE = "Idle"
    WAKING = "Waking"


class Trigger(StrEnum):
    """What happened since the last plan, as the plan reads it (the first that holds)."""

    READY = "Ready"  # Waking: a replica is ready
    # Waking: nothing held any more and nothing came since the wake, its requests gone before
    # their hold could end (their clients left), or an idle window after the wake began
    ABANDONED = "Abandoned"
    DEMAND = "Demand"  # Asleep or Idle: a request came, or is held
    IDLE = "Idle"  # no request held, relayed or finished for idleSeconds
    QUIET = "Quiet"  # the same for sleep.idleSeconds
    GROW = "Grow"  # Serving on the replicas a wake started, and they are full


# (state, trigger) -> the state it leads to; a pair not here changes nothing.
TRANSITIONS: dict[tuple[State, Trigger], State] = {
    (State.WAKING, Trigger.READY): State.SERVING,
    (State.WAKING, Trigger.ABANDONED): State.IDLE,
    (State.IDLE, Trigger.DEMAND): State.WAKING,
    (State.ASLEEP, Trigger.DEMAND): State.SERVING,
    (State.SERVING, Trigger.IDLE): State.IDLE,
    (State.ASLEEP, Trigger.IDLE): State.IDLE,
    (State.SERVING, Trigger.QUIET): State.ASLEEP,
    (State.SERVING, Trigger.GROW): State.SERVING,
}


@dataclass(frozen=True)
class PodState:
    name: str
    ready: bool
    asleep: bool  # the operator put it to sleep (SLEEPING_ANNOTATION) and has not woken it


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class StandbyPlan:
    replicas: int  # the serving replicas to run now
    sleep: tuple[str, ...] = ()  # pods to put to sleep
    wake: tuple[str, ...] = ()  # pods to wake
    status: Mapping[str, Any] | None = None  # status.standby; None: scaleToZero is off
    events: tuple[Event, ...] = ()
    woke_after: float | None = None  # seconds from the demand to the first ready replica, now

    def lowers(self, running: int) -> bool:
        """It stops replicas of the `running` ones or puts some to sleep: what it decided
        must hold on reports read right before."""
        return self.replicas < running or bool(self.sleep)


@dataclass(frozen=True)
class _Moment:
    """What one plan reads, derived once."""

    spec: AutoGLMDeploymentSpec
    activity: Activity
    current: Mapping[str, Any]
    pods: Sequence[PodState]
    now: float
    state: State | None
    since: float
    last_request: float | None  # the routers', else the last one status recorded
    idle_for: float  # 0 while a request is held or relayed
    ready: int

    @property
    def asleep(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pods if p.asleep)

    @property
    def woken(self) -> int | None:
        """Serving on the replicas a wake started, not yet all of spec.replicas."""
        value = self.current.get("wokenReplicas")
        if self.spec.autoscaling.enabled:
            return None  # the fleet's size grows with demand (fleet_plan.py)
        return value if isinstance(value, int) and value < self.spec.replicas else None

    def running(self, at: State, woken: int | None = None) -> int:
        """The serving replicas that run in state `at` (Serving or Asleep: `woken`, the
        replicas a wake started, while they are fewer than spec.replicas)."""
        settings = self.spec.scale_to_zero
        if at is State.IDLE:
            return settings.floor
        if at is State.WAKING:
            # With autoscaling, spec.replicas here is what the held requests need.
            return self.spec.replicas if self.spec.autoscaling.enabled else max(1, settings.floor)
        if at in (State.SERVING, State.ASLEEP) and woken is not None \
                and woken < self.spec.replicas:
            return woken
        return self.spec.replicas

    def trigger(self) -> Trigger | None:
        settings, activity, state = self.spec.scale_to_zero, self.activity, self.state
        came = self.last_request is not None and self.last_request > self.since
        if state is State.WAKING:
            if self.ready:
                return Trigger.READY
            if activity.holding or came:
                return None
            # Requests held past the hold's bound were answered 503 with Retry-After, and their
            # clients come back: a start longer than the hold goes on for them.
            waking_for = self.now - (_seconds(self.current.get("wakeStartTime")) or self.since)
            timed_out = waking_for >= self.spec.router.hold.wait_seconds - HOLD_END_MARGIN_SECONDS
            gone = not timed_out or waking_for >= settings.idle_seconds
            return Trigger.ABANDONED if gone else None
        if state in (State.ASLEEP, State.IDLE) and (activity.holding or came):
            return Trigger.DEMAND
        if state is not State.IDLE and self.idle_for >= settings.idle_seconds:
            return Trigger.IDLE
        if (state is State.SERVING and settings.sleep.enabled
                and self.idle_for >= settings.sleep.idle_seconds):
            return Trigger.QUIET
        if state is State.SERVING and self.woken is not None and self._full(self.woken):
            return Trigger.GROW
        return None

    def _full(self, running: int) -> bool:
        """The replicas a wake started are full: the routers relay a replica's cap on each
        (the smaller mode's). Not what they hold: a request held through the cold start is
        still held for a moment after its replica reports ready."""
        cap = min(self.spec.admission_caps(streamed_chat=False).values())
        return self.activity.inflight >= running * cap


def plan_standby(
    spec: AutoGLMDeploymentSpec,
    activity: Activity,
    current: Mapping[str, Any] | None,
    pods: Sequence[PodState],
    now: float,
    scalers: Sequence[str] = (),
) -> StandbyPlan:
    """The replicas to run, the pods to sleep or wake, and status.standby, for this moment.

    `current` is status.standby as last written; `scalers` names the HorizontalPodAutoscalers
    that scale this object (KEDA's among them): while one does, it owns the replica count and
    scaleToZero is refused, not half applied.
    """
    settings = spec.scale_to_zero
    asleep = tuple(p.name for p in pods if p.asleep)
    current = current or {}
    if settings.enabled and scalers:
        message = (f"scaleToZero is not applied: HorizontalPodAutoscaler "
                   f"{', '.join(sorted(scalers))} scales this object and owns its replicas; "
                   "turn scaleToZero off, or remove the autoscaler (and let it scale to zero).")
        refused = {"state": CONFLICT, "reason": CONFLICT, "message": message}
        events = () if current.get("state") == CONFLICT else (
            Event(CONFLICT, message, warning=True),)
        return StandbyPlan(spec.replicas, wake=asleep, status=refused, events=events)
    if not settings.enabled or spec.replicas == 0:
        return StandbyPlan(spec.replicas, wake=asleep)

    moment = _moment(spec, activity, current, pods, now)
    status = dict(current)
    status["lastRequestTime"] = (_iso(moment.last_request)
                                 if moment.last_request is not None else None)
    status["heldRequests"] = activity.holding
    status["inflightRequests"] = activity.inflight
    if activity.last_wait_seconds is not None:
        status["lastHeldWaitMillis"] = round(activity.last_wait_seconds * 1000)
    if moment.state is None:
        status.update(state=State.SERVING.value, since=_iso(now), servingSince=_iso(now),
                      reason="Serving", wokenReplicas=None,
                      message=f"{spec.replicas} replicas serve; scale to {settings.floor} after "
                      f"{settings.idle_seconds}s without a request.")
        return StandbyPlan(spec.replicas, status=status,
                           events=(Event("Serving", status["message"]),))
    trigger = moment.trigger()
    target = TRANSITIONS.get((moment.state, trigger)) if trigger else None
    if target is None:
        return _plan(moment, moment.state, status)
    assert trigger is not None
    reason, message, fields = _entered(moment, trigger, target)
    status.update(state=target.value, since=_iso(now), reason=reason, message=message, **fields)
    if target is State.SERVING and moment.state is not State.SERVING:
        status["servingSince"] = _iso(now)
    plan = replace(_plan(moment, target, status), events=(Event(reason, message),))
    if trigger is Trigger.READY:
        plan = replace(plan, woke_after=fields["lastWakeMillis"] / 1000)
    return plan


def _moment(spec: AutoGLMDeploymentSpec, activity: Activity, current: Mapping[str, Any],
            pods: Sequence[PodState], now: float) -> _Moment:
    since = _seconds(current.get("since")) or now
    recorded = _seconds(current.get("lastRequestTime"))
    reported = activity.last_request_at
    last_request = max((t for t in (recorded, reported) if t is not None), default=None)
    # The idle clock starts at the later of the last request and the last time the deployment
    # started serving, so one just turned on, or just woken, gets a whole window.
    serving_since = _seconds(current.get("servingSince")) or since
    quiet_since = max(serving_since, last_request or serving_since)
    return _Moment(
        spec, activity, current, pods, now, _state(current.get("state")), since, last_request,
        idle_for=0.0 if activity.busy else now - quiet_since,
        ready=sum(1 for p in pods if p.ready),
    )


def _entered(moment: _Moment, trigger: Trigger, target: State
             ) -> tuple[str, str, dict[str, Any]]:  # fmt: skip
    """The reason, the message and the status fields of entering `target` on `trigger`."""
    spec, settings, activity, now = (moment.spec, moment.spec.scale_to_zero, moment.activity,
                                     moment.now)
    if trigger is Trigger.READY:
        waited = now - (_seconds(moment.current.get("wakeStartTime")) or moment.since)
        running = moment.running(State.WAKING)
        woken = running if running < spec.replicas and not spec.autoscaling.enabled else None
        rest = (f"; the other {spec.replicas - running} start when demand asks"
                if woken is not None else "")
        return ("Woke", f"{moment.ready} replica(s) ready {waited:.1f}s after the demand that "
                f"woke the deployment{rest}.",
                {"lastWakeMillis": round(waited * 1000), "wokenReplicas": woken})
    if trigger is Trigger.ABANDONED:
        return ("WakeAbandoned", "The requests that woke the deployment left before a replica "
                "was ready (or waited out their hold and none came back within idleSeconds): "
                f"back to {settings.floor} replicas.", {"wokenReplicas": None})
    if trigger is Trigger.DEMAND:
        started = activity.held_since or moment.last_request or now
        held = f"{activity.holding} request(s) held; " if activity.holding else ""
        if target is State.SERVING:
            return ("Woke", f"Demand woke {len(moment.asleep)} sleeping replica(s).",
                    {"wakeStartTime": _iso(started)})
        if spec.autoscaling.enabled:
            return ("Waking", f"{held}starting {moment.running(State.WAKING)} replica(s), what "
                    "the held requests need; the fleet grows with the demand after.",
                    {"wakeStartTime": _iso(started)})
        return ("Waking", f"{held}starting {moment.running(State.WAKING)} of "
                f"{spec.replicas} replicas; the rest start when demand asks.",
                {"wakeStartTime": _iso(started)})
    if trigger is Trigger.IDLE:
        return ("ScaledToZero" if settings.floor == 0 else "ScaledToFloor",
                f"No request for {moment.idle_for:.0f}s (idleSeconds {settings.idle_seconds}), "
                f"none held or in flight: scaled from "
                f"{moment.running(moment.state or target, moment.woken)} "
                f"to {settings.floor} replicas.", {"wokenReplicas": None})
    if trigger is Trigger.QUIET:
        return ("Slept", f"No request for {moment.idle_for:.0f}s (sleep.idleSeconds "
                f"{settings.sleep.idle_seconds}): {moment.ready} replica(s) put to sleep "
                f"(level {settings.sleep.level}).", {})
    return ("ScaledUp", f"{activity.inflight} request(s) in flight and {activity.holding} held "
            f"fill the {moment.woken} replica(s) a wake started: scaling to {spec.replicas}.",
            {"wokenReplicas": None})


def _plan(moment: _Moment, at: State, status: dict[str, Any]) -> StandbyPlan:
    """Run what state `at` runs: its replicas, asleep or awake."""
    settings = moment.spec.scale_to_zero
    sleeps = at is State.ASLEEP or (at is State.IDLE and settings.sleep.enabled)
    sleep = tuple(p.name for p in moment.pods if sleeps and p.ready and not p.asleep)
    wake = moment.asleep if at in (State.SERVING, State.WAKING) else ()
    woken = status.get("wokenReplicas")
    replicas = moment.running(at, woken if isinstance(woken, int) else None)
    return StandbyPlan(replicas, sleep, wake, status)


def pod_states(pods: Sequence[Mapping[str, Any]], is_ready: Any) -> list[PodState]:
    return [
        PodState(p["metadata"]["name"], bool(is_ready(p)),
                 SLEEPING_ANNOTATION in ((p["metadata"].get("annotations")) or {}))
        for p in pods
    ]


def _state(value: Any) -> State | None:
    try:
        return State(value)
    except ValueError:
        return None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _seconds(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
