"""Pure: scale to zero and warm standby, from the routers' demand and the clock.

A deployment with `spec.scaleToZero` on moves between four states, kept in `status.standby`
(so an operator restart resumes them):

- Serving: `spec.replicas` run awake.
- Asleep: they still run, asleep (vLLM sleep mode), after `sleep.idleSeconds` without a
  request; a request wakes the replica it reaches, and any demand wakes them all.
- Idle: `floor` replicas run (asleep, with sleep on), after `idleSeconds` without a request.
- Waking: demand arrived while Idle; `spec.replicas` start again, and the router holds the
  requests until the first is ready.

Demand is what the routers report (autoglm_api.standby): the latest request any of them
received, and the requests they hold. Time is wall-clock Unix seconds, as the routers write it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from autoglm_api.standby import Demand
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

SLEEPING_ANNOTATION = "autoglm.io/sleeping"  # on a pod the operator put to sleep: the level
CONFLICT = "AutoscalerConflict"  # status.standby.state while an HPA owns the replica count


class State(StrEnum):
    SERVING = "Serving"
    ASLEEP = "Asleep"
    IDLE = "Idle"
    WAKING = "Waking"


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


def plan_standby(
    spec: AutoGLMDeploymentSpec,
    demand: Demand,
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

    state = _state(current.get("state"))
    since = _seconds(current.get("since")) or now
    last_request = demand.last_request_at
    # Demand newer than the state: a request came after the replicas went down or to sleep.
    demanded = demand.holding > 0 or (last_request is not None and last_request > since)
    # The idle clock starts at the later of the last request and the last time the deployment
    # started serving, so one just turned on, or just woken, gets a whole window.
    serving_since = _seconds(current.get("servingSince")) or since
    quiet_since = max(serving_since, last_request or serving_since)
    # A held request is demand now, whatever its arrival time: never idle while one waits.
    idle_for = 0.0 if demand.holding else now - quiet_since
    ready = sum(1 for p in pods if p.ready)
    status = dict(current)
    status["lastRequestTime"] = _iso(last_request) if last_request is not None else None
    status["heldRequests"] = demand.holding
    if demand.last_wait_seconds is not None:
        status["lastHeldWaitMillis"] = round(demand.last_wait_seconds * 1000)

    def enter(new: State, reason: str, message: str, **fields: Any) -> StandbyPlan:
        status.update(state=new.value, since=_iso(now), reason=reason, message=message, **fields)
        if new is State.SERVING:
            status["servingSince"] = _iso(now)
        return StandbyPlan(replicas_of(new), sleep_of(new), wake_of(new), status,
                           (Event(reason, message),))

    def replicas_of(at: State) -> int:
        return settings.floor if at is State.IDLE else spec.replicas

    def sleep_of(at: State) -> tuple[str, ...]:
        sleeps = at is State.ASLEEP or (at is State.IDLE and settings.sleep.enabled)
        return tuple(p.name for p in pods if sleeps and p.ready and not p.asleep)

    def wake_of(at: State) -> tuple[str, ...]:
        return asleep if at in (State.SERVING, State.WAKING) else ()

    sleep_after = settings.sleep.idle_seconds if settings.sleep.enabled else None
    if state is None:
        return enter(State.SERVING, "Serving", f"{spec.replicas} replicas serve; scale to "
                     f"{settings.floor} after {settings.idle_seconds}s without a request.")
    if state is State.WAKING:
        if ready:
            waited = now - (_seconds(current.get("wakeStartTime")) or since)
            woke = enter(State.SERVING, "Woke",
                         f"{ready} replica(s) ready {waited:.1f}s after the demand that woke "
                         "the deployment.", lastWakeMillis=round(waited * 1000))
            return replace(woke, woke_after=waited)
        if not demand.holding and idle_for >= settings.idle_seconds:
            return enter(State.IDLE, "WakeAbandoned",
                         f"No replica became ready and no request came for {idle_for:.0f}s: "
                         f"back to {settings.floor} replicas.")
        return StandbyPlan(spec.replicas, (), wake_of(state), status)
    if demanded and state in (State.ASLEEP, State.IDLE):
        started = demand.held_since or last_request or now
        if state is State.ASLEEP or ready:
            return enter(State.SERVING, "Woke", f"Demand woke {len(asleep)} sleeping "
                         "replica(s).", wakeStartTime=_iso(started))
        held = f"{demand.holding} request(s) held; " if demand.holding else ""
        return enter(State.WAKING, "Waking", f"{held}scaling from {settings.floor} to "
                     f"{spec.replicas} replicas.", wakeStartTime=_iso(started))
    if state is not State.IDLE and idle_for >= settings.idle_seconds:
        return enter(State.IDLE, "ScaledToZero" if settings.floor == 0 else "ScaledToFloor",
                     f"No request for {idle_for:.0f}s (idleSeconds {settings.idle_seconds}): "
                     f"scaled from {spec.replicas} to {settings.floor} replicas.")
    if state is State.SERVING and sleep_after is not None and idle_for >= sleep_after:
        return enter(State.ASLEEP, "Slept",
                     f"No request for {idle_for:.0f}s (sleep.idleSeconds {sleep_after}): "
                     f"{ready} replica(s) put to sleep (level {settings.sleep.level}).")
    return StandbyPlan(replicas_of(state), sleep_of(state), wake_of(state), status)


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
