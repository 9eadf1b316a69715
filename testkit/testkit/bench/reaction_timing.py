"""The pure half of bench/adaptive_reaction.py: matching load steps, the operator's decisions and
the runtimes' confirmations into one timing per flip, their percentiles, and the targets.

Every time is a Unix timestamp in seconds (the operator, the runtimes and the bench share one
clock: they run on one machine).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from testkit.stats import percentile

BATCHING, STREAMING = "batching", "streaming"


@dataclass(frozen=True)
class Step:
    """The load generator switched rate; `to_mode` is where that should move one replica."""

    t: float
    to_mode: str


@dataclass(frozen=True)
class Decision:
    """One record of status.decisionHistory (its time has millisecond precision)."""

    t: float
    from_batching: int
    to_batching: int
    applied: bool
    reason: str = ""

    @property
    def to_mode(self) -> str | None:
        if self.to_batching == self.from_batching:
            return None
        return BATCHING if self.to_batching > self.from_batching else STREAMING

    @classmethod
    def from_status(cls, record: Mapping[str, Any]) -> Decision:
        when = datetime.fromisoformat(str(record["time"]).replace("Z", "+00:00"))
        return cls(
            t=when.timestamp(),
            from_batching=int(record.get("fromBatching") or 0),
            to_batching=int(record.get("toBatching") or 0),
            applied=bool(record.get("applied", True)),
            reason=str(record.get("reason") or ""),
        )


@dataclass(frozen=True)
class Confirmation:
    """A runtime running `mode` from time t: `switched` is the runtime's own switch time
    (InPlace), `serving` when a pod's /health first answered 200 (a Rolling replacement)."""

    pod: str
    t: float
    mode: str
    how: str


@dataclass(frozen=True)
class FlipTiming:
    to_mode: str
    step: float
    decision: float | None = None
    confirmed: float | None = None
    pod: str | None = None

    @property
    def step_to_decision(self) -> float | None:
        return None if self.decision is None else self.decision - self.step

    @property
    def step_to_flip(self) -> float | None:
        return None if self.confirmed is None else self.confirmed - self.step

    @property
    def decision_to_confirmation(self) -> float | None:
        if self.decision is None or self.confirmed is None:
            return None
        return self.confirmed - self.decision


def flip_decisions(records: Sequence[Decision], rolling: bool) -> list[Decision]:
    """The records that start a flip, oldest first. Under Rolling the start is recorded with
    applied=false and the completion again with applied=true: only the start counts."""
    return sorted(
        (d for d in set(records) if d.to_mode and not (rolling and d.applied)), key=lambda d: d.t
    )


def match_flips(
    steps: Sequence[Step], decisions: Sequence[Decision], confirmations: Sequence[Confirmation]
) -> tuple[list[FlipTiming], list[Decision]]:
    """Per step, the first flip decided its way before the next step, and the first runtime
    confirming that mode at or after the decision (before the next step). A pass that started
    before a step decided on older metrics, so a decision must not precede its step. Returns
    the timings and the flip decisions no step explains (flapping)."""
    ordered_steps = sorted(steps, key=lambda s: s.t)
    ends = [s.t for s in ordered_steps[1:]] + [math.inf]
    by_time = sorted(decisions, key=lambda d: d.t)
    confirmed_by_time = sorted(confirmations, key=lambda c: c.t)
    used: set[Decision] = set()
    used_confirmations: set[Confirmation] = set()
    timings: list[FlipTiming] = []
    for step, end in zip(ordered_steps, ends, strict=True):
        decision = next(
            (d for d in by_time if step.t <= d.t < end and d.to_mode == step.to_mode), None
        )
        if decision is None:
            timings.append(FlipTiming(step.to_mode, step.t))
            continue
        used.add(decision)
        confirmation = next(
            (
                c
                for c in confirmed_by_time
                if decision.t <= c.t < end
                and c.mode == step.to_mode
                and c not in used_confirmations
            ),
            None,
        )
        if confirmation is None:
            timings.append(FlipTiming(step.to_mode, step.t, decision.t))
            continue
        used_confirmations.add(confirmation)
        timings.append(
            FlipTiming(step.to_mode, step.t, decision.t, confirmation.t, confirmation.pod)
        )
    extra = [d for d in by_time if d not in used]
    return timings, extra


def spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """How many values were measured, and their p50, p95 and max (nearest rank)."""
    measured = [v for v in values if v is not None]
    return {
        "n": len(measured),
        "p50": percentile(measured, 0.50),
        "p95": percentile(measured, 0.95),
        "max": max(measured) if measured else None,
    }


def summarize(timings: Sequence[FlipTiming]) -> dict[str, dict[str, float | int | None]]:
    return {
        "step_to_decision": spread([t.step_to_decision for t in timings]),
        "step_to_flip": spread([t.step_to_flip for t in timings]),
        "decision_to_confirmation": spread([t.decision_to_confirmation for t in timings]),
    }


@dataclass(frozen=True)
class Settings:
    """The adaptive settings the bench ran with: the targets follow from them."""

    interval: float
    to_batching_window: float
    to_streaming_window: float
    confirmation_target: float = 1.0

    def step_to_flip_target(self, to_mode: str) -> float:
        """Two passes (one may start just before metrics cross, one to act) plus the window."""
        window = self.to_batching_window if to_mode == BATCHING else self.to_streaming_window
        return 2 * self.interval + window


def verdicts(
    timings: Sequence[FlipTiming],
    extra: Sequence[Decision],
    flips_wanted: int,
    failed_requests: int,
    settings: Settings,
) -> list[dict[str, Any]]:
    """PASS/FAIL of each InPlace target, with the figures behind it."""
    out: list[dict[str, Any]] = []

    def verdict(target: str, ok: bool, detail: str) -> None:
        out.append({"target": target, "pass": ok, "detail": detail})

    complete = [t for t in timings if t.decision_to_confirmation is not None]
    verdict(
        f"all {flips_wanted} flips decided and confirmed, none extra",
        len(complete) == flips_wanted and not extra,
        f"{len(complete)} of {flips_wanted} confirmed, {len(timings) - len(complete)} missed, "
        f"{len(extra)} extra flip decisions",
    )
    p95 = spread([t.decision_to_confirmation for t in timings])["p95"]
    limit = settings.confirmation_target
    verdict(
        f"decision to runtime confirmation p95 < {limit:g} s",
        p95 is not None and p95 < limit,
        "no flip measured" if p95 is None else f"p95 {1000 * p95:.0f} ms",
    )
    for to_mode in (BATCHING, STREAMING):
        limit = settings.step_to_flip_target(to_mode)
        p95 = spread([t.step_to_flip for t in timings if t.to_mode == to_mode])["p95"]
        window = (
            settings.to_batching_window if to_mode == BATCHING else settings.to_streaming_window
        )
        verdict(
            f"step to flip applied, to {to_mode}, p95 < {limit:g} s "
            f"(2 x interval {settings.interval:g} s + window {window:g} s)",
            p95 is not None and p95 < limit,
            "no flip measured" if p95 is None else f"p95 {p95:.1f} s",
        )
    verdict(
        "no request failed across the InPlace flips",
        failed_requests == 0,
        f"{failed_requests} failed",
    )
    return out
