"""Pure: spec.autoscaling's part of an iteration's plan, from what the iteration observed to the
serving replicas, status.autoscaling, its Events and the pods a step down removes.

The decision itself is adaptive/scaling.size_fleet (the adaptive policy's model, pure, shared
with `replay` and the benchmarks); this module reads its inputs out of the status, the routers'
activity and the adaptive pass's last reading, and says what comes of it:

- `spec.replicas` is not read while autoscaling is on: a change of it (`kubectl scale`) is
  reported once as a Warning Event (ReplicasIgnored), never applied behind the operator's back.
- An HorizontalPodAutoscaler (KEDA's among them) that scales this object owns the count: the
  fleet is not sized (AutoscalerConflict, a Warning), spec.replicas as the HPA writes it runs.
- Scale to zero is the same controller's floor: while the deployment idles (standby.py's Idle or
  Waking) the count a wake starts is what the held requests need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoglm_api.profiles import Mode
from autoglm_api.standby import Activity
from autoglm_operator.adaptive import scaling
from autoglm_operator.adaptive.capacity import Capacity
from autoglm_operator.adaptive.decision import HysteresisState, iso_time, parse_iso
from autoglm_operator.adaptive.demand import demand_of
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.reconcile.standby import Event
from autoglm_operator.resource.pods import PodView
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec, ModePolicy

CONFLICT = "AutoscalerConflict"
REPLICAS_IGNORED = "ReplicasIgnored"
# The standby states in which the deployment runs its floor or is starting from it.
AT_FLOOR = ("Idle", "Waking")
PINNED = {ModePolicy.STREAMING: Mode.STREAMING, ModePolicy.BATCHING: Mode.BATCHING}


@dataclass(frozen=True)
class FleetPlan:
    replicas: int  # the serving replicas while awake (standby's Serving runs these)
    status: Mapping[str, Any] | None = None  # status.autoscaling; None: autoscaling is off
    events: tuple[Event, ...] = ()
    decision: scaling.FleetDecision | None = None
    fleet_input: scaling.FleetInput | None = None


def plan_fleet(
    spec: AutoGLMDeploymentSpec,
    status: Mapping[str, Any],
    samples: Samples | None,
    activity: Activity,
    pods: Sequence[PodView],
    scalers: Sequence[str],
    now: float,
) -> FleetPlan:
    """The serving replicas for this moment and status.autoscaling. `status` is the object's
    status as last written; `samples` the adaptive pass's last reading (None: none recent)."""
    settings = spec.autoscaling
    if not settings.enabled:
        return FleetPlan(spec.replicas)
    current = dict(status.get("autoscaling") or {})
    if scalers:
        return _conflict(spec, current, scalers, len(pods))
    events: list[Event] = []
    ignored = current.get("ignoredReplicas")
    if isinstance(ignored, int) and ignored != spec.replicas:
        events.append(Event(REPLICAS_IGNORED, (
            f"spec.replicas changed to {spec.replicas}, but autoscaling is on: the fleet is "
            f"sized between minReplicas {settings.min_replicas} and maxReplicas "
            f"{settings.max_replicas}. Change those, or set autoscaling.enabled false to size "
            "it by hand."), warning=True))
    inp = fleet_input(spec, status, samples, activity, pods, now)
    decision = scaling.size_fleet(inp, settings, _memory(current), now)
    if decision.scaled:
        events.append(Event(decision.reason, decision.message))
    return FleetPlan(decision.desired, _status(decision, inp, spec), tuple(events), decision, inp)


def _conflict(spec: AutoGLMDeploymentSpec, current: Mapping[str, Any], scalers: Sequence[str],
              running: int) -> FleetPlan:
    """An HPA scales this object: it owns spec.replicas. Until it first writes them, the count
    the fleet had stays (spec.replicas is still the value autoscaling did not read, maybe one a
    `kubectl scale` left); from then on spec.replicas runs (ignoredReplicas unset)."""
    message = (f"autoscaling is not applied: HorizontalPodAutoscaler "
               f"{', '.join(sorted(scalers))} scales this object and owns spec.replicas; "
               "remove it, or turn autoscaling off.")
    entering = current.get("reason") != CONFLICT
    events = (Event(CONFLICT, message, warning=True),) if entering else ()
    stale, held = current.get("ignoredReplicas"), current.get("desiredReplicas")
    waiting = isinstance(stale, int) and isinstance(held, int) and spec.replicas == stale
    replicas = held if waiting and isinstance(held, int) else spec.replicas
    return FleetPlan(replicas, {
        "desiredReplicas": replicas, "runningReplicas": running, "reason": CONFLICT,
        "message": message, "ignoredReplicas": stale if waiting else None,
    }, events)


def fleet_input(
    spec: AutoGLMDeploymentSpec,
    status: Mapping[str, Any],
    samples: Samples | None,
    activity: Activity,
    pods: Sequence[PodView],
    now: float,
) -> scaling.FleetInput:
    """What the sizing reads, out of the status as last written (the learned capacity and the
    flips in status.adaptiveState, the standby state) and what the iteration observed."""
    state = _hysteresis(status.get("adaptiveState"))
    flips = [t for t, _ in state.last_flips.values()]
    standby = (status.get("standby") or {}).get("state")
    return input_of(spec, samples, activity, len(pods), state.capacity,
                    max(flips, default=None), standby, now)


def input_of(
    spec: AutoGLMDeploymentSpec,
    samples: Samples | None,
    activity: Activity,
    running: int,
    capacity: Capacity | None,
    last_flip: float | None,
    standby: str | None,
    now: float,
) -> scaling.FleetInput:
    """The sizing's input from its parts (the benchmarks build them without a status)."""
    last_request = activity.last_request_at
    return scaling.FleetInput(
        demand=demand_of(samples),
        busy=activity.holding + activity.inflight,
        quiet_for=None if activity.busy or last_request is None else now - last_request,
        running=running,
        capacity=capacity or Capacity.seeded(spec.adaptive),
        caps=spec.admission_caps(streamed_chat=False),
        slo=spec.adaptive.slo,
        min_streaming=spec.adaptive.min_streaming_replicas,
        last_flip=last_flip,
        cooldown_seconds=spec.adaptive.cooldown_seconds,
        idle=spec.standby().enabled and standby in AT_FLOOR,
        pinned=PINNED.get(spec.mode_policy),
    )


def victims(
    plan: FleetPlan, running: int, pods: Sequence[PodView], inflight: Mapping[str, int]
) -> tuple[str, ...]:
    """The pods a step down to `running` replicas removes (scaling.victims), planned in the
    iteration that steps down (the mark must land before the Deployment shrinks; a rollout's
    surge is no step down); none when the fleet goes to its floor (every pod goes)."""
    stepping_down = plan.decision is not None and plan.decision.reason == scaling.SCALED_DOWN
    if plan.fleet_input is None or not stepping_down or running <= 0 or running >= len(pods):
        return ()
    candidates = [scaling.Candidate(p.name, p.mode or Mode.STREAMING, p.ready,
                                    inflight.get(p.name), p.created) for p in pods]
    return scaling.victims(candidates, running, plan.fleet_input)


def _hysteresis(raw: Any) -> HysteresisState:
    try:
        return HysteresisState.from_status(raw if isinstance(raw, Mapping) else None)
    except ValueError:
        return HysteresisState()


def _memory(current: Mapping[str, Any]) -> scaling.FleetMemory:
    desired = current.get("desiredReplicas")
    return scaling.FleetMemory(
        desired=desired if isinstance(desired, int) and current.get("reason") != CONFLICT
        else None,
        lower_since=parse_iso(current.get("lowerSince")),
        higher_since=parse_iso(current.get("higherSince")),
        last_scale=parse_iso(current.get("lastScaleTime")),
        last_scale_down=parse_iso(current.get("lastScaleDownTime")),
    )


def _status(decision: scaling.FleetDecision, inp: scaling.FleetInput,
            spec: AutoGLMDeploymentSpec) -> dict[str, Any]:
    memory, fit = decision.memory, decision.fit

    def when(t: float | None) -> str | None:
        return None if t is None else iso_time(t)

    demand = inp.demand
    return {
        "desiredReplicas": decision.desired,
        "runningReplicas": inp.running,
        "neededReplicas": decision.needed,
        "reason": decision.reason,
        "message": decision.message,
        "demand": None if demand is None else f"{demand.total:.3f}",
        "expectedGoodput": None if fit is None else f"{fit.goodput:.3f}",
        "batchingReplicas": None if fit is None else fit.batching,
        "lowerSince": when(memory.lower_since),
        "higherSince": when(memory.higher_since),
        "lastScaleTime": when(memory.last_scale),
        "lastScaleDownTime": when(memory.last_scale_down),
        "ignoredReplicas": spec.replicas,
    }
