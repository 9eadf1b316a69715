"""The adaptive pass's data, pure: its input (PassInput), what it read (Observation) and saw
(Seen), its plan and the plan's entries (ModePlan, Repair, Switch, and Rolling's phase), and what
came of it (FlipOutcome, RepairOutcome, Event, PassResult).

planning.py makes the plan, io/executor.py carries its entries out, report.py reports them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive.signals import Reading
from autoglm_operator.resource.pods import PodView
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec


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

    state: pol.HysteresisState  # from status.adaptiveState, with finished flips counted
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
    inflight: Mapping[str, int] = field(default_factory=dict)  # requests each pod serves now


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


# The Rolling target rule (rolling.rolling_batching_target) bound to one pass's spec and split:
# from the batching share decided (None: nothing decided) to the share to step toward.
TargetRule = Callable[[int | None], int]


class Rolling(enum.Enum):
    """Where a Rolling replacement stands in this pass."""

    STEADY = "steady"  # every pod runs the wanted mode: decisions are recorded as held
    STARTING = "starting"  # a replacement starts now: recorded with applied=false
    REPLACING = "replacing"  # pods are being replaced, recorded already: nothing new decided
    DONE = "done"  # the pending replacement finished: recorded again with applied=true
