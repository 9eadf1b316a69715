"""The adaptive pass's report, pure: from what the pass saw, decided and did to the status
fields and conditions it owns (lastDecision, decisionHistory, adaptiveState; MetricsAvailable,
ModeTransitioning) and its Events, and the status written before a flip touches a pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive.pass_data import (
    Event,
    FlipOutcome,
    ModePlan,
    PassInput,
    PassResult,
    RepairOutcome,
    Rolling,
    Seen,
)
from autoglm_operator.adaptive.signals import Availability, Reading
from autoglm_operator.resource.conditions import merge_conditions, without_empty
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec, ModePolicy
from autoglm_operator.resource.status import Condition, Decision

METRICS_AVAILABLE = "MetricsAvailable"
MODE_TRANSITIONING = "ModeTransitioning"
OWNED_CONDITIONS = (METRICS_AVAILABLE, MODE_TRANSITIONING)
HISTORY_LIMIT = 10
PAUSED = "Paused"
NOT_QUERIED = "NotQueried"


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


def announcement(inp: PassInput, decision: pol.PolicyDecision) -> dict[str, Any]:
    """The hysteresis state goes out before any pod is touched: an operator killed after a runtime
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


def last_decision(status: Mapping[str, Any]) -> Mapping[str, Any]:
    last = status.get("lastDecision")
    return last if isinstance(last, Mapping) else {}


def rolling_result(
    inp: PassInput,
    seen: Seen,
    decision: pol.PolicyDecision,
    phase: Rolling,
    target: int,
    kept_state: pol.HysteresisState,
) -> PassResult:
    """switchStrategy Rolling: record the batching share decided, report the replacement until
    done (`phase`, `target`, `kept_state`: planning's reading of where the replacement stands).

    The reconcile plan steps the two mode Deployments make-before-break toward the target
    (Adaptive) or the pinned policy. A decision is recorded with applied=false when the
    replacement starts and again with applied=true once every pod runs the decided mode and no
    surplus (old) pod is left; no new flip is decided meanwhile.
    """
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
    last = last_decision(inp.status)
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
    last = last_decision(inp.status)
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


def repair_event(repair: RepairOutcome) -> Event:
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
