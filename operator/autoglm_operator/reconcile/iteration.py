"""Pure: the plan of one iteration of the reconcile loop, from the spec, what the cluster holds
and the reconcile memory.

`plan_iteration` is the one entry: one plan (IterationPlan) holding the adaptive pass's mode
entries (repairs, the hysteresis state to announce, the flips; plan_modes), the children to
create or apply, the pods to label or retire, whether the admin Secret needs a token, which
child to delete (pass_plan.plan_pass), and the status as planned; `settle` folds what the
executor reported (how each flip went, an API error) into that status. io/executor.py carries
the plan out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoglm_api.standby import Activity
from autoglm_operator.adaptive import pass_data, planning
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive import report as report_
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.reconcile import status as status_
from autoglm_operator.reconcile.children import router, serving
from autoglm_operator.reconcile.fleet_plan import FleetPlan, plan_fleet
from autoglm_operator.reconcile.fleet_plan import victims as fleet_victims
from autoglm_operator.reconcile.memory import ReconcileMemory, gateway_due, has_pending
from autoglm_operator.reconcile.observe import Observed
from autoglm_operator.reconcile.pass_plan import Plan, plan_pass
from autoglm_operator.reconcile.rolling import rolling_batching_target
from autoglm_operator.reconcile.router_plan import gateway_observed
from autoglm_operator.reconcile.standby import StandbyPlan, plan_standby, pod_states
from autoglm_operator.resource import pods as pods_
from autoglm_operator.resource.conditions import without_empty
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec


def plan_modes(
    inp: pass_data.PassInput,
    observation: pass_data.Observation,
    repaired: Sequence[pass_data.RepairOutcome] | None = None,
) -> pass_data.ModePlan:
    """The modes part of an iteration's plan: the repairs, the decision (policy, pure) over the
    pods as they leave them (as planned, or as `repaired` says they went), then flips in place
    or the Rolling share. InPlace and Rolling differ only in the plan this returns."""
    repairs = planning.plan_repairs(inp.pods, observation) if repaired is None else ()
    done = [r.expected for r in repairs] if repaired is None else list(repaired)
    seen = planning.seen(inp, observation, done)
    decision = planning.pass_decision(inp, seen)

    def target(decided: int | None) -> int:
        return rolling_batching_target(inp.spec, decided, inp.deployment_split)

    return planning.mode_plan(inp, repairs, seen, decision, target)


@dataclass(frozen=True)
class Inputs:
    """What one iteration observed: the object, the spec (or why it cannot be used), and,
    when the adaptive pass is due, what it read (each pod's runtime mode, the metrics)."""

    owner: serving.Owner
    observed: Observed
    spec: AutoGLMDeploymentSpec
    generation: int
    now: float  # wall-clock time, for the status's timestamps
    problem: status_.Problem | None = None  # invalid spec, missing Secret, blocked
    modes: pass_data.PassInput | None = None  # the adaptive pass is due
    observation: pass_data.Observation | None = None
    # HorizontalPodAutoscalers that scale this object (scaleToZero is refused beside one).
    scalers: tuple[str, ...] = ()
    # What the routers that exist hold and relay (scaleToZero, autoscaling), read from them
    # this iteration.
    activity: Activity = field(default_factory=Activity)
    # autoscaling: the adaptive pass's last metrics (None: none recent) and each pod's requests
    # in flight as its runtime last said.
    samples: Samples | None = None
    inflight: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class IterationPlan:
    """Everything one iteration does, in the order the executor does it: the modes (the
    repairs, the hysteresis state to announce, the flips), the children (create or apply, pods to
    label or retire, the admin Secret, a child to delete), and the status as planned."""

    inputs: Inputs
    modes: pass_data.ModePlan | None  # None: the adaptive pass is not due
    children: Plan | None  # None: nothing changed since the last pass, or a problem blocks it
    reconcile: bool  # the reconcile pass is due: its status fields are computed
    fingerprint: Any  # what the reconcile pass saw (the memory keeps it once applied)
    batching_target: int | None  # switchStrategy Rolling: the share the children step toward
    status: Settled  # the status as planned: every entry going as planned
    standby: StandbyPlan  # scaleToZero: the replicas to run, the pods to sleep or wake
    fleet: FleetPlan  # autoscaling: the serving replicas, status.autoscaling, its Events
    victims: tuple[str, ...] = ()  # pods to mark cheapest to delete before the step down


@dataclass(frozen=True)
class Settled:
    """The status one iteration leaves, and what goes with it (condition Events, the adaptive
    pass's report, the ready replicas for the gauges)."""

    status: dict[str, Any]
    flipped: tuple[dict[str, Any], ...] = ()  # reconcile conditions whose status changed
    report: pass_data.PassResult | None = None
    ready_replicas: int | None = None


def latest_status(observed: Observed, memory: ReconcileMemory) -> dict[str, Any]:
    """The status as last written when the watch has not delivered that write yet (the object
    is still at the version the write was based on), else as observed."""
    rv = str(observed.body["metadata"].get("resourceVersion"))
    if memory.status_written is not None and memory.status_written[0] == rv:
        return memory.status_written[1]
    return dict(without_empty(observed.body.get("status") or {}))


def plan_iteration(
    inputs: Inputs,
    memory: ReconcileMemory,
    now: float,
    repaired: Sequence[pass_data.RepairOutcome] | None = None,
) -> IterationPlan:
    """The one planning function of an iteration (no I/O, no clock: `now` is monotonic
    time, the adaptive pass's wall time is in its input). `repaired`: plan again from what the
    repairs did, when that was not what the first plan expected."""
    latest = latest_status(inputs.observed, memory)
    live = [p for p in inputs.observed.pods if pods_.is_live(p)]
    views = [pods_.view(p) for p in live]
    fleet = plan_fleet(inputs.spec, latest, inputs.samples, inputs.activity, views,
                       inputs.scalers, inputs.now)
    sized = sized_spec(inputs.spec, fleet)
    if inputs.modes is not None and inputs.modes.spec is not sized:
        inputs = replace(inputs, modes=replace(inputs.modes, spec=sized))
    modes = None
    if inputs.modes is not None and inputs.observation is not None:
        modes = plan_modes(inputs.modes, inputs.observation, repaired)
    standby = plan_standby(
        sized, inputs.activity, latest.get("standby"), pod_states(live, pods_.is_ready),
        inputs.now, inputs.scalers,
    )  # fmt: skip
    target = memory.batching_target  # no pass now: what the last one decided
    if modes is not None:  # the pass decides it (None under InPlace)
        target = modes.rolling.batching_target if modes.rolling is not None else None
    # The standby state changes with the clock alone (an idle window passing): it is part of
    # what the pass saw, so a change of it is a pass.
    fingerprint = (inputs.observed.fingerprint(), target, standby.replicas,
                   (standby.status or {}).get("state"), fleet.replicas)
    reconcile = now >= memory.retry_at and (
        fingerprint != memory.fingerprint
        or has_pending(memory.written, now)
        or gateway_due(memory, now)
    )
    children = None
    if reconcile and inputs.problem is None:
        children = plan_pass(
            inputs.owner, running(sized, standby), inputs.observed,
            _with_target(memory, target), now,
        )  # fmt: skip
    expected = [
        pass_data.FlipOutcome(s.flip.pod, s.flip.from_mode, s.flip.to_mode, True)
        for s in (modes.switches if modes is not None else ())
    ]
    partial = IterationPlan(
        inputs, modes, children, reconcile, fingerprint, target, Settled({}), standby, fleet,
        fleet_victims(fleet, standby.replicas, views, inputs.inflight),
    )
    return replace(partial, status=settle(partial, memory, expected, inputs.problem))


def _idle_message(standby: StandbyPlan) -> str | None:
    status = standby.status or {}
    if status.get("state") != "Idle":
        return None
    return f"{status.get('message')} The router holds the next request while replicas start."


def sized_spec(spec: AutoGLMDeploymentSpec, fleet: FleetPlan) -> AutoGLMDeploymentSpec:
    """The spec as the rest of the plan reads it: with autoscaling on, the replicas the fleet
    is sized to and scaleToZero as it applies (spec.standby())."""
    if fleet.status is None:
        return spec
    return spec.model_copy(update={"replicas": fleet.replicas,
                                   "scale_to_zero": spec.standby()})


def running(spec: AutoGLMDeploymentSpec, standby: StandbyPlan) -> AutoGLMDeploymentSpec:
    """The spec as the children are built now: with the replicas scaleToZero runs."""
    if standby.replicas == spec.replicas:
        return spec
    return spec.model_copy(update={"replicas": standby.replicas})


def _with_target(memory: ReconcileMemory, target: int | None) -> ReconcileMemory:
    """The reconcile memory as the pass plan reads it: with this iteration's Rolling share."""
    if target == memory.batching_target:
        return memory
    return replace(memory, batching_target=target)


def settle(
    the_plan: IterationPlan,
    memory: ReconcileMemory,
    flips: Sequence[pass_data.FlipOutcome],
    problem: status_.Problem | None,
) -> Settled:
    """The status the iteration leaves: the planned one with what the executor reported
    folded in (how each flip went, an API error the children hit). Pure."""
    inputs = the_plan.inputs
    report = None
    current = latest_status(inputs.observed, memory)
    if the_plan.modes is not None and inputs.modes is not None:
        report = report_.report(inputs.modes, the_plan.modes, flips)
        part = report_.status_part(inputs.modes, report)
        current = status_.overlay(current, part or {})
    current = status_.overlay(current, {"standby": the_plan.standby.status,
                                        "autoscaling": the_plan.fleet.status})
    if not the_plan.reconcile and problem is None:
        return Settled(current, (), report)
    meta = inputs.observed.body["metadata"]
    router_deployment = inputs.observed.children.get(
        ("Deployment", router.router_name(meta["name"]))
    )
    update = status_.compute(
        name=meta["name"],
        namespace=meta["namespace"],
        generation=inputs.generation,
        spec=running(sized_spec(inputs.spec, the_plan.fleet), the_plan.standby),
        deployment=inputs.observed.deployment,
        pods=inputs.observed.pods,
        router_pods=inputs.observed.router_pods,
        current=current,
        now=pol.iso_time(inputs.now),
        problem=problem,
        router=router_deployment,
        gateway_children=gateway_observed(meta["name"], inputs.observed),
        gateway_problem=memory.gateway_problem if inputs.spec.gateway.enabled else None,
        idle=_idle_message(the_plan.standby),
    )
    full = status_.overlay(current, update.status)
    return Settled(full, tuple(update.flipped), report, int(update.status["readyReplicas"]))
