"""The adaptive pass's planning, pure: from the spec, the pods and what the pass read (each
pod's runtime mode, the metrics) to what it sees (repairs), what it decides (the policy) and a
plan of what to do to pods. report.py turns what the executor did into the status patch and
Events; pass_data.py holds the types both pass around.

A plan (ModePlan): make each pod's label and runtime agree (repairs, finishing or reverting a
flip an operator restart interrupted); then, under switchStrategy InPlace, the hysteresis state
to write before any pod is touched and the flips (label first, so the mode Services route right,
then the runtime's admin API, then a GET that confirms); under Rolling, the batching share the
children plan steps toward. iteration.plan_modes puts the steps together (with the one Rolling
target rule, rolling.rolling_batching_target) inside the iteration's one plan; io/executor.py
carries the entries out; report.report turns the outcomes into the status part and Events.

Invariant: after a pass, each ready pod's label and runtime mode agree, or status says which
do not (ModeTransitioning=True, ModeMismatch) and that pod is never flipped until they do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive import report
from autoglm_operator.adaptive.pass_data import (
    ModePlan,
    Observation,
    PassInput,
    Repair,
    RepairOutcome,
    Rolling,
    Seen,
    Switch,
    TargetRule,
)
from autoglm_operator.resource.pods import PodView
from autoglm_operator.resource.spec import ModePolicy, SwitchStrategy

logger = logging.getLogger(__name__)


# -- one pass --------------------------------------------------------------------------------


def plan_repairs(pods: Sequence[PodView], observation: Observation) -> tuple[Repair, ...]:
    """Every ready pod whose label and runtime mode disagree."""
    modes = observation.runtime_modes
    return tuple(
        Repair(p.name, p.ip, p.mode, modes[p.name])
        for p in pods
        if p.ready and p.ip and p.name in modes and p.mode is not modes[p.name]
    )


def mode_plan(
    inp: PassInput,
    repairs: tuple[Repair, ...],
    seen: Seen,
    decision: pol.PolicyDecision,
    target: TargetRule,
) -> ModePlan:
    """The plan of one pass once decided: flips in place, or under Rolling the share."""
    rolling = inp.spec.switch_strategy is SwitchStrategy.ROLLING
    if inp.spec.adaptive.dry_run or not (decision.flips or rolling):
        return ModePlan(repairs, seen, decision)
    if rolling:
        # A flip replaces pods (the reconcile plan does it); this pass only sets how many
        # replicas run batching and reports the replacement until it is done.
        return ModePlan(
            repairs,
            seen,
            decision,
            rolling=report.rolling_result(
                inp, seen, decision, *_rolling_phase(inp, seen, decision, target)
            ),
        )
    switches = tuple(Switch(f, _ip(inp, f.pod)) for f in decision.flips)
    return ModePlan(repairs, seen, decision, report.announcement(inp, decision), switches)


def _ip(inp: PassInput, pod: str) -> str | None:
    return next((p.ip for p in inp.pods if p.name == pod), None)


def seen(inp: PassInput, observation: Observation, repairs: Sequence[RepairOutcome]) -> Seen:
    """The pods as the repairs leave them: label and runtime must agree before deciding."""
    state = pol.HysteresisState.from_status(_safe_state(inp.status.get("adaptiveState")))
    labels = {p.name: p.mode for p in inp.pods}
    for repair in repairs:
        if repair.action == "Finished":
            # A flip that was under way: count it now so the cooldown holds across the restart.
            records = dict(state.last_flips)
            records[repair.pod] = (inp.now, repair.label or Mode.STREAMING)
            state = replace(state, last_flips=records)
        if repair.action in ("Adopted", "Reverted"):
            labels[repair.pod] = repair.runtime
    return Seen(
        state=state,
        repairs=list(repairs),
        runtime_modes=dict(observation.runtime_modes),
        unreachable=dict(observation.unreachable),
        mismatched={r.pod for r in repairs if r.action == "Failed"},
        labels=labels,
        events=[report.repair_event(r) for r in repairs],
        reading=observation.reading,
    )


def pass_decision(inp: PassInput, seen: Seen) -> pol.PolicyDecision:
    """The pass's decision: the policy (policy.decide) over the pods that can flip (runtime
    answered, agrees with label), or a hold while adaptive.paused."""
    replicas = [
        pol.ReplicaState(
            name=p.name,
            mode=seen.labels[p.name],
            ready=p.ready and p.name in seen.runtime_modes and p.name not in seen.mismatched,
        )
        for p in inp.pods
    ]
    spec = inp.spec
    if spec.mode_policy is ModePolicy.ADAPTIVE and spec.adaptive.paused:
        batching = sum(1 for r in replicas if r.effective_mode is Mode.BATCHING)
        return pol.PolicyDecision(
            reason=report.PAUSED,
            message="adaptive.paused is true: holding every replica in its mode",
            from_batching=batching,
            to_batching=batching,
            flips=(),
            state=pol.HysteresisState(
                last_flips=seen.state.last_flips, capacity=seen.state.capacity
            ),
            metrics=pol.metric_sample(None, 0),
        )
    samples = seen.reading.samples if seen.reading is not None else None
    return pol.decide(
        samples, replicas, seen.state, spec.adaptive, spec.mode_policy, inp.now, spec.profiles
    )


# -- switchStrategy Rolling: the pass decides the share, the plan replaces the pods -----------


def _rolling_phase(
    inp: PassInput, seen: Seen, decision: pol.PolicyDecision, target_rule: TargetRule
) -> tuple[Rolling, int, pol.HysteresisState]:
    """The phase, the batching target (target_rule: rolling.rolling_batching_target, the one
    rule) and the hysteresis state to keep."""
    spec = inp.spec
    batching = sum(1 for p in inp.pods if p.mode is Mode.BATCHING)
    stored = (inp.status.get("adaptiveState") or {}).get("batchingTarget")
    target = target_rule(None if stored is None else int(stored))
    in_flight = batching != target or len(inp.pods) > spec.replicas
    last = report.last_decision(inp.status)
    # While pods are replaced the adaptive pass holds its windows where they were; a pass that
    # flips nothing keeps the policy's (when load turned high or low), or no window would ever
    # fill.
    kept = seen.state if in_flight or decision.flips else decision.state
    done = not in_flight and last.get("applied") is False and last.get("toBatching") == target
    if done:
        return Rolling.DONE, target, kept
    if spec.mode_policy is ModePolicy.ADAPTIVE and decision.flips and not in_flight:
        target = target_rule(decision.to_batching)
        in_flight, kept = True, decision.state
    if not in_flight:
        return Rolling.STEADY, target, kept
    recorded = last.get("applied") is False and last.get("toBatching") == target
    return (Rolling.REPLACING if recorded else Rolling.STARTING), target, kept


def _safe_state(raw: Any) -> Mapping[str, Any] | None:
    if not isinstance(raw, Mapping):
        return None
    try:
        pol.HysteresisState.from_status(raw)
    except ValueError:
        logger.warning("Ignored an unreadable status.adaptiveState: %r", raw)
        return None
    return raw
