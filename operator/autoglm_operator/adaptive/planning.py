"""The adaptive pass's planning, pure: from the spec, the pods and what the pass read (each
pod's runtime mode, the metrics) to what it sees (repairs), what it decides (the policy) and a
plan of what to do to pods; and from what the executor did, the status patch and Events.

A plan (ModePlan): make each pod's label and runtime agree (repairs, finishing or reverting a
flip an operator restart interrupted); then, under switchStrategy InPlace, the loop state to
write before any pod is touched and the flips (label first, so the mode Services route right,
then the runtime's admin API, then a GET that confirms); under Rolling, the batching share the
children plan steps toward. plan.plan_modes puts the steps together (with the one Rolling
target rule, plan.rolling_batching_target) inside the iteration's one plan; executor.py carries
the entries out; report turns the outcomes into the status part and Events.

Invariant: after a pass, each ready pod's label and runtime mode agree, or status says which
do not (ModeTransitioning=True, ModeMismatch) and that pod is never flipped until they do.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive.signals import Availability, Reading
from autoglm_operator.resource.conditions import merge_conditions, without_empty
from autoglm_operator.resource.pods import PodView
from autoglm_operator.resource.spec import (
    AutoGLMDeploymentSpec,
    Condition,
    Decision,
    ModePolicy,
    SwitchStrategy,
)
from autoglm_runtime.profiles import Mode

logger = logging.getLogger(__name__)

METRICS_AVAILABLE = "MetricsAvailable"
MODE_TRANSITIONING = "ModeTransitioning"
OWNED_CONDITIONS = (METRICS_AVAILABLE, MODE_TRANSITIONING)
HISTORY_LIMIT = 10
PAUSED = "Paused"
NOT_QUERIED = "NotQueried"


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class FlipOutcome:
    pod: str
    from_mode: Mode
    to_mode: Mode
    applied: bool
    detail: str = ""
    seconds: float = 0.0  # decision to runtime confirmation
    attempts: int = 0
    mismatch: bool = False  # label and runtime left disagreeing (the next pass repairs it)


@dataclass(frozen=True)
class RepairOutcome:
    pod: str
    label: Mode | None
    runtime: Mode
    action: str  # Adopted | Finished | Reverted | Failed
    detail: str = ""


@dataclass
class PassResult:
    status_patch: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    decision: pol.PolicyDecision | None = None
    reading: Reading | None = None
    flips: list[FlipOutcome] = field(default_factory=list)
    repairs: list[RepairOutcome] = field(default_factory=list)
    # switchStrategy Rolling: how many replicas should run batching pods (the plan steps there)
    batching_target: int | None = None


# -- conditions ------------------------------------------------------------------------------


def _metrics_condition(
    reading: Reading | None, spec: AutoGLMDeploymentSpec, generation: int | None
) -> Condition:
    if spec.mode_policy is not ModePolicy.ADAPTIVE:
        return Condition(
            type=METRICS_AVAILABLE,
            status="Unknown",
            reason=NOT_QUERIED,
            message=f"modePolicy {spec.mode_policy.value} reads no metrics",
            observed_generation=generation,
        )
    if spec.adaptive.paused or reading is None:
        return Condition(
            type=METRICS_AVAILABLE,
            status="Unknown",
            reason=PAUSED,
            message="adaptive.paused is true: Prometheus is not queried",
            observed_generation=generation,
        )
    if reading.availability is Availability.NO_PODS:
        status = "Unknown"  # nothing to measure yet (a new or scaled-to-zero deployment)
    else:
        status = "True" if reading.available else "False"
    return Condition(
        type=METRICS_AVAILABLE,
        status=status,
        reason=reading.availability.value,
        message=reading.message[:1000],
        observed_generation=generation,
    )


# -- one pass --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassInput:
    namespace: str
    name: str
    generation: int | None
    spec: AutoGLMDeploymentSpec
    status: Mapping[str, Any]  # the object's current status, as read
    pods: Sequence[PodView]
    now: float
    # switchStrategy Rolling: the replicas each mode's Deployment has now (None: none yet).
    deployment_split: Mapping[Mode, int] | None = None


@dataclass
class Seen:
    """What a pass found before deciding: label and runtime made to agree, and what could not."""

    state: pol.LoopState  # the loop state from status, with finished flips counted
    repairs: list[RepairOutcome]
    runtime_modes: dict[str, Mode]
    unreachable: dict[str, str]  # pod -> why its admin API could not be read
    mismatched: set[str]  # label and runtime still disagree: never flipped
    labels: dict[str, Mode | None]  # each pod's label after the repairs
    events: list[Event]  # the repairs' Events; a pass appends its own
    reading: Reading | None = None

    @property
    def after_repairs(self) -> int:
        return len(self.repairs)


@dataclass(frozen=True)
class Observation:
    """What a pass read before planning: each ready pod's runtime mode, why the admin API of
    the others failed, and the metrics (None when not queried)."""

    runtime_modes: Mapping[str, Mode]
    unreachable: Mapping[str, str]
    reading: Reading | None = None


@dataclass(frozen=True)
class Repair:
    """Plan entry: make one pod's label and runtime agree. An unlabelled pod gets its runtime's
    mode as label (Adopted); a label ahead of the runtime is a flip in flight (the label is
    written first): push it to the runtime (Finished), or put the label back (Reverted)."""

    pod: str
    ip: str
    label: Mode | None
    runtime: Mode

    @property
    def expected(self) -> RepairOutcome:
        action = "Adopted" if self.label is None else "Finished"
        return RepairOutcome(self.pod, self.label, self.runtime, action)


@dataclass(frozen=True)
class Switch:
    """Plan entry: flip one pod in place: label, runtime PUT and GET, revert on failure."""

    flip: pol.Flip
    ip: str | None


@dataclass(frozen=True)
class ModePlan:
    """What one pass does to pods, in the order the executor does it, and what it decided."""

    repairs: tuple[Repair, ...]  # first; empty when planned from repairs already done
    seen: Seen
    decision: pol.PolicyDecision
    announce: dict[str, Any] | None = None  # status written before any flip touches a pod
    switches: tuple[Switch, ...] = ()
    rolling: PassResult | None = None  # switchStrategy Rolling: the result; nothing flips live


def plan_repairs(pods: Sequence[PodView], observation: Observation) -> tuple[Repair, ...]:
    """Every ready pod whose label and runtime mode disagree."""
    modes = observation.runtime_modes
    return tuple(
        Repair(p.name, p.ip, p.mode, modes[p.name])
        for p in pods
        if p.ready and p.ip and p.name in modes and p.mode is not modes[p.name]
    )


# The Rolling target rule (plan.rolling_batching_target) bound to one pass's spec and split:
# from the batching share decided (None: nothing decided) to the share to step toward.
TargetRule = Callable[[int | None], int]


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
        return ModePlan(repairs, seen, decision, rolling=_rolling_pass(inp, seen, decision, target))
    switches = tuple(Switch(f, _ip(inp, f.pod)) for f in decision.flips)
    return ModePlan(repairs, seen, decision, _announcement(inp, decision), switches)


def report(inp: PassInput, the_plan: ModePlan, outcomes: Sequence[FlipOutcome]) -> PassResult:
    """What the pass did, as status patch and Events (`outcomes`: the executor's flips)."""
    if the_plan.rolling is not None:
        return the_plan.rolling
    return _in_place_result(inp, the_plan.seen, the_plan.decision, outcomes)


# The status fields the adaptive pass decides (its two conditions besides); the rest is the
# reconcile pass's. The iteration's one status write puts them over the latest status.
OWNED_STATUS_FIELDS = ("lastDecision", "decisionHistory", "adaptiveState")


def owned_status(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Every status field the pass decides, as `patch` leaves them: written over the latest
    status, it replaces what an earlier write (the announce before a flip) said of them."""
    merged = {**current, **patch}
    owned: dict[str, Any] = {
        "conditions": [
            c for c in merged.get("conditions") or [] if c.get("type") in OWNED_CONDITIONS
        ]
    }
    for key in OWNED_STATUS_FIELDS:
        if merged.get(key) is not None:
            owned[key] = merged[key]
    return dict(without_empty(owned))


def status_part(inp: PassInput, result: PassResult) -> dict[str, Any] | None:
    """The pass's fields for the iteration's status write; None when it has nothing to say.
    After an announce the part goes out even when it says what status said before."""
    if not (result.status_patch or result.flips):
        return None
    return owned_status(inp.status, result.status_patch)


def _ip(inp: PassInput, pod: str) -> str | None:
    return next((p.ip for p in inp.pods if p.name == pod), None)


def seen(inp: PassInput, observation: Observation, repairs: Sequence[RepairOutcome]) -> Seen:
    """The pods as the repairs leave them: label and runtime must agree before deciding."""
    state = pol.LoopState.from_status(_safe_state(inp.status.get("adaptiveState")))
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
        events=[_repair_event(r) for r in repairs],
        reading=observation.reading,
    )


def decide(inp: PassInput, seen: Seen) -> pol.PolicyDecision:
    """Decide: the pure policy over the pods that can flip (runtime answered, agrees with label)."""
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
            reason=PAUSED,
            message="adaptive.paused is true: holding every replica in its mode",
            from_batching=batching,
            to_batching=batching,
            flips=(),
            state=pol.LoopState(last_flips=seen.state.last_flips, capacity=seen.state.capacity),
            metrics=pol.metric_sample(None, 0),
        )
    samples = seen.reading.samples if seen.reading is not None else None
    return pol.decide(
        samples, replicas, seen.state, spec.adaptive, spec.mode_policy, inp.now, spec.profiles
    )


def _announcement(inp: PassInput, decision: pol.PolicyDecision) -> dict[str, Any]:
    """The loop state goes out before any pod is touched: an operator killed after a runtime
    switched but before the final status still finds each flip's cooldown (and the restarted
    stabilization window) when it starts again."""
    moves = ", ".join(f"{f.pod} to {f.to_mode.value}" for f in decision.flips)
    flipping = Condition(
        type=MODE_TRANSITIONING,
        status="True",
        reason="Flipping",
        message=f"{decision.reason}: flipping {moves}",
        observed_generation=inp.generation,
    )
    now_iso = pol.iso_time(inp.now)
    return {
        "adaptiveState": decision.state.to_status().model_dump(by_alias=True, exclude_none=True),
        "conditions": merge_conditions(inp.status.get("conditions") or [], [flipping], now_iso),
    }


DRY_RUN = "adaptive.dryRun is true"


def _flip_events(
    decision: pol.PolicyDecision, outcomes: Sequence[FlipOutcome], dry_run: bool
) -> list[Event]:
    events = []
    for outcome in outcomes:
        if outcome.applied:
            events.append(
                Event(
                    "Normal",
                    "ModeFlipped",
                    f"Flipped pod {outcome.pod} from {outcome.from_mode.value} to "
                    f"{outcome.to_mode.value} ({decision.reason}); runtime confirmed in "
                    f"{outcome.seconds * 1000:.0f} ms",
                )
            )
        else:
            events.append(
                Event(
                    "Warning",
                    "ModeFlipFailed",
                    f"Flip of pod {outcome.pod} to {outcome.to_mode.value} failed: "
                    f"{outcome.detail}",
                )
            )
    for flip in decision.flips if dry_run else ():
        events.append(
            Event(
                "Normal",
                "DryRunFlip",
                f"Would flip pod {flip.pod} from {flip.from_mode.value} to "
                f"{flip.to_mode.value} ({decision.reason}); {DRY_RUN}",
            )
        )
    return events


def _in_place_result(
    inp: PassInput,
    seen: Seen,
    decision: pol.PolicyDecision,
    outcomes: Sequence[FlipOutcome],
) -> PassResult:
    """switchStrategy InPlace (and dry run): what the flips did, as status and Events."""
    dry_run = inp.spec.adaptive.dry_run
    labels, mismatched = dict(seen.labels), set(seen.mismatched)
    for outcome in outcomes:
        if outcome.applied:
            labels[outcome.pod] = outcome.to_mode
        elif outcome.mismatch:
            mismatched.add(outcome.pod)
        else:
            labels[outcome.pod] = outcome.from_mode
    events = seen.events + _flip_events(decision, outcomes, dry_run)
    failed = [o for o in outcomes if not o.applied]
    to_batching = sum(1 for m in labels.values() if (m or Mode.STREAMING) is Mode.BATCHING)
    message = decision.message
    if seen.unreachable:
        message += f"; {len(seen.unreachable)} pods not flippable, admin API failed: " + "; ".join(
            seen.unreachable[pod] for pod in sorted(seen.unreachable)
        )
    if failed:
        message += "; failed: " + "; ".join(f"{o.pod}: {o.detail}" for o in failed)
    if dry_run and decision.flips:
        message += f" (nothing applied: {DRY_RUN})"
        to_batching = decision.to_batching
    record = Decision(
        time=pol.iso_time(inp.now),
        from_batching=decision.from_batching,
        to_batching=to_batching,
        reason=decision.reason,
        message=message[:1000],
        applied=not dry_run and not failed,
        metrics=decision.metrics,
    )
    transitioning = _transitioning_condition(mismatched, seen.unreachable, inp.generation)
    patch = _conditions_patch(inp, seen, transitioning, events)
    if decision.flips or failed or _differs(inp.status.get("lastDecision"), record):
        patch.update(_recorded(inp.status, record))
    stored_state = decision.state.to_status().model_dump(by_alias=True, exclude_none=True)
    if stored_state != (inp.status.get("adaptiveState") or {}):
        patch["adaptiveState"] = stored_state
    return PassResult(
        status_patch=patch,
        events=events,
        decision=decision,
        reading=seen.reading,
        flips=list(outcomes),
        repairs=seen.repairs,
    )


# -- switchStrategy Rolling: the pass decides the share, the plan replaces the pods -----------


class Rolling(enum.Enum):
    """Where a Rolling replacement stands in this pass."""

    STEADY = "steady"  # every pod runs the wanted mode: decisions are recorded as held
    STARTING = "starting"  # a replacement starts now: recorded with applied=false
    REPLACING = "replacing"  # pods are being replaced, recorded already: nothing new decided
    DONE = "done"  # the pending replacement finished: recorded again with applied=true


def _rolling_phase(
    inp: PassInput, seen: Seen, decision: pol.PolicyDecision, target_rule: TargetRule
) -> tuple[Rolling, int, pol.LoopState]:
    """The phase, the batching target (target_rule: plan.rolling_batching_target, the one
    rule) and the loop state to keep."""
    spec = inp.spec
    batching = sum(1 for p in inp.pods if p.mode is Mode.BATCHING)
    stored = (inp.status.get("adaptiveState") or {}).get("batchingTarget")
    target = target_rule(None if stored is None else int(stored))
    in_flight = batching != target or len(inp.pods) > spec.replicas
    last = _last(inp.status)
    # While pods are replaced the loop holds its windows where they were; a pass that flips
    # nothing keeps the policy's (when load turned high or low), or no window would ever fill.
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


def _last(status: Mapping[str, Any]) -> Mapping[str, Any]:
    last = status.get("lastDecision")
    return last if isinstance(last, Mapping) else {}


def _rolling_pass(
    inp: PassInput, seen: Seen, decision: pol.PolicyDecision, target_rule: TargetRule
) -> PassResult:
    """switchStrategy Rolling: decide the batching share, report the replacement until done.

    The reconcile plan steps the two mode Deployments make-before-break toward the target
    (Adaptive) or the pinned policy. A decision is recorded with applied=false when the
    replacement starts and again with applied=true once every pod runs the decided mode and no
    surplus (old) pod is left; no new flip is decided meanwhile.
    """
    phase, target, kept_state = _rolling_phase(inp, seen, decision, target_rule)
    record, event = _rolling_record(inp, decision, phase, target)
    events = seen.events + ([event] if event else [])
    if phase in (Rolling.STARTING, Rolling.REPLACING):
        transitioning = _replacing_condition(inp, target)
    else:
        transitioning = _transitioning_condition(seen.mismatched, seen.unreachable, inp.generation)
    patch = _conditions_patch(inp, seen, transitioning, events)
    if record is not None:
        patch.update(_recorded(inp.status, record))
    stored_state = kept_state.to_status().model_copy(update={"batching_target": target})
    dumped = stored_state.model_dump(by_alias=True, exclude_none=True)
    if dumped != (inp.status.get("adaptiveState") or {}):
        patch["adaptiveState"] = dumped
    return PassResult(
        status_patch=patch,
        events=events,
        decision=decision,
        reading=seen.reading,
        repairs=seen.repairs,
        batching_target=target,
    )


def _rolling_record(
    inp: PassInput, decision: pol.PolicyDecision, phase: Rolling, target: int
) -> tuple[Decision | None, Event | None]:
    """The decision to record in this phase, and its Event."""
    if phase is Rolling.STARTING:
        return _started(inp, decision, target)
    if phase is Rolling.DONE:
        return _replaced(inp, decision)
    if phase is Rolling.REPLACING:
        return None, None
    batching = sum(1 for p in inp.pods if p.mode is Mode.BATCHING)
    record = Decision(
        time=pol.iso_time(inp.now),
        from_batching=batching,
        to_batching=batching,
        reason=decision.reason,
        message=decision.message[:1000],
        applied=True,
        metrics=decision.metrics,
    )
    # The completion record's fromBatching is the count before the replacement: compare
    # with the count now, so the pass after a completion writes nothing.
    last = _last(inp.status)
    if last and not _differs({**last, "fromBatching": batching}, record):
        return None, None
    return record, None


def _started(inp: PassInput, decision: pol.PolicyDecision, target: int) -> tuple[Decision, Event]:
    replicas = inp.spec.replicas
    batching = sum(1 for p in inp.pods if p.mode is Mode.BATCHING)
    verb = "batching" if target > batching else "streaming"
    return Decision(
        time=pol.iso_time(inp.now),
        from_batching=batching,
        to_batching=target,
        reason=decision.reason,
        message=(
            f"{decision.message}; switchStrategy Rolling: replacing pods make-before-break, "
            f"{batching} of {replicas} replicas batching now, {target} wanted"
        )[:1000],
        applied=False,
        metrics=decision.metrics,
    ), Event(
        "Normal",
        "ModeReplacing",
        f"Replacing {abs(target - batching)} replica(s) with {verb} pods "
        f"({decision.reason}): each new pod is ready before an old one is removed",
    )


def _replaced(inp: PassInput, decision: pol.PolicyDecision) -> tuple[Decision, Event]:
    replicas = inp.spec.replicas
    batching = sum(1 for p in inp.pods if p.mode is Mode.BATCHING)
    last = _last(inp.status)
    took = inp.now - (pol.parse_iso(str(last.get("time"))) or inp.now)
    reason = str(last.get("reason") or decision.reason)
    return Decision(
        time=pol.iso_time(inp.now),
        from_batching=int(last.get("fromBatching") or 0),
        to_batching=batching,
        reason=reason,
        message=(
            f"switchStrategy Rolling: replacement done in {took:.0f}s, {batching} of "
            f"{replicas} replicas batching; {decision.message}"
        )[:1000],
        applied=True,
        metrics=decision.metrics,
    ), Event(
        "Normal",
        "ModeReplaced",
        f"{batching} of {replicas} replicas run batching pods, as decided "
        f"({reason}); make-before-break replacement took {took:.0f}s",
    )


def _replacing_condition(inp: PassInput, target: int) -> Condition:
    batching = sum(1 for p in inp.pods if p.mode is Mode.BATCHING)
    return Condition(
        type=MODE_TRANSITIONING,
        status="True",
        reason="Replacing",
        message=(
            f"switchStrategy Rolling: {len(inp.pods)} pods, {batching} batching; "
            f"replacing pods make-before-break toward {target} of {inp.spec.replicas} batching"
        ),
        observed_generation=inp.generation,
    )


def _recorded(status: Mapping[str, Any], record: Decision) -> dict[str, Any]:
    """lastDecision and the bounded decisionHistory with the record appended."""
    recorded = record.model_dump(by_alias=True, exclude_none=True)
    history = list(status.get("decisionHistory") or [])
    return {"lastDecision": recorded, "decisionHistory": [*history, recorded][-HISTORY_LIMIT:]}


def _conditions_patch(
    inp: PassInput, seen: Seen, transitioning: Condition, events: list[Event]
) -> dict[str, Any]:
    """Merge the pass's conditions into status; a patch holding them when they changed. Their
    Events go in before the flips': metrics news comes before the flips it enabled or held."""
    owned = [_metrics_condition(seen.reading, inp.spec, inp.generation), transitioning]
    current = list(inp.status.get("conditions") or [])
    conditions = merge_conditions(current, owned, pol.iso_time(inp.now))
    events[seen.after_repairs : seen.after_repairs] = _availability_events(current, conditions)
    return {"conditions": conditions} if conditions != current else {}


def _safe_state(raw: Any) -> Mapping[str, Any] | None:
    if not isinstance(raw, Mapping):
        return None
    try:
        pol.LoopState.from_status(raw)
    except ValueError:
        logger.warning("Ignored an unreadable status.adaptiveState: %r", raw)
        return None
    return raw


# Holds that differ only in wording: moving between them is not a new decision worth a write.
_QUIET = {pol.WITHIN_BAND, pol.ALL_STREAMING}


def _differs(last: Any, record: Decision) -> bool:
    """A new lastDecision only when the decision changed, so a quiet loop writes nothing."""
    if not isinstance(last, Mapping):
        return True
    reason = last.get("reason")
    return (
        (reason != record.reason and not {reason, record.reason} <= _QUIET)
        or last.get("fromBatching") != record.from_batching
        or last.get("toBatching") != record.to_batching
        or last.get("applied", True) != record.applied
    )


def _transitioning_condition(
    mismatched: set[str], unreachable: Mapping[str, str], generation: int | None
) -> Condition:
    if mismatched:
        return Condition(
            type=MODE_TRANSITIONING,
            status="True",
            reason="ModeMismatch",
            message=(
                "label and runtime mode disagree on pods "
                + ", ".join(sorted(mismatched))
                + "; retrying each pass, these pods are not flipped meanwhile"
            ),
            observed_generation=generation,
        )
    if unreachable:
        # Not transitioning, but not able to: say which pods and why (401, refused, timeout).
        return Condition(
            type=MODE_TRANSITIONING,
            status="False",
            reason="AdminApiUnavailable",
            message=(
                "cannot read or set the mode of "
                + "; ".join(f"{pod}: {unreachable[pod]}" for pod in sorted(unreachable))
            )[:1000],
            observed_generation=generation,
        )
    return Condition(
        type=MODE_TRANSITIONING,
        status="False",
        reason="Stable",
        message="every ready pod's label matches its runtime mode",
        observed_generation=generation,
    )


def _availability_events(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[Event]:
    """An Event when metrics or the admin API stop working (once per cause) and on recovery."""

    def find(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
        return next((c for c in conditions if c.get("type") == kind), {})

    events = []
    old, new = find(before, METRICS_AVAILABLE), find(after, METRICS_AVAILABLE)
    if new.get("status") == "False" and old.get("reason") != new.get("reason"):
        events.append(
            Event(
                "Warning",
                str(new.get("reason")),
                f"Holding modes: {new.get('message', '')}"[:1000],
            )
        )
    if new.get("status") == "True" and old.get("status") == "False":
        events.append(
            Event("Normal", "MetricsRecovered", "Prometheus answered again; loop resumed")
        )
    old, new = find(before, MODE_TRANSITIONING), find(after, MODE_TRANSITIONING)
    if new.get("reason") == "AdminApiUnavailable" and old.get("reason") != new.get("reason"):
        events.append(Event("Warning", "AdminApiUnavailable", str(new.get("message"))[:1000]))
    return events


def _repair_event(repair: RepairOutcome) -> Event:
    label = repair.label.value if repair.label else "none"
    if repair.action == "Adopted":
        return Event(
            "Normal",
            "ModeLabelSet",
            f"Labelled pod {repair.pod} {repair.runtime.value}, the mode its runtime reports",
        )
    if repair.action == "Finished":
        return Event(
            "Normal",
            "ModeFlipFinished",
            f"Finished an interrupted flip: pod {repair.pod} runtime moved from "
            f"{repair.runtime.value} to {label}, as its label says",
        )
    if repair.action == "Reverted":
        return Event(
            "Warning",
            "ModeFlipReverted",
            f"Reverted pod {repair.pod} label from {label} to {repair.runtime.value}: "
            f"{repair.detail}",
        )
    return Event(
        "Warning",
        "ModeMismatch",
        f"Pod {repair.pod} label says {label} but its runtime runs {repair.runtime.value}, "
        f"and neither could be changed: {repair.detail}",
    )
