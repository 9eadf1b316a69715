"""What every step of the mode policy shares, pure: the replicas as the policy sees them
(ReplicaState), what it remembers between passes (HysteresisState, status.adaptiveState), the
flips a step makes and its outcome, the reasons it gives, and the rules every step keeps: the
cooldown, oldest flip first, the evidence window a stabilization shortens to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive.capacity import Capacity
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.resource.spec import AdaptiveSettings
from autoglm_operator.resource.status import AdaptiveState, ReplicaFlip

# Reasons (CamelCase, one word each), as they appear in status.lastDecision.reason.
QPS_ABOVE_HIGH = "QpsAboveHigh"
GPU_MEMORY_ABOVE_HIGH = "GpuMemoryAboveHigh"
QUEUE_ABOVE_HIGH = "QueueAboveHigh"
LOAD_BELOW_LOW = "LoadBelowLow"
WITHIN_BAND = "WithinBand"
STABILIZING = "Stabilizing"
COOLDOWN = "Cooldown"
MAX_BATCHING_REACHED = "MaxBatchingReached"
KEEPING_UP = "KeepingUp"
ALL_STREAMING = "AllStreaming"
MIN_STREAMING_REPLICAS = "MinStreamingReplicas"
METRICS_UNAVAILABLE = "MetricsUnavailable"
NO_READY_REPLICAS = "NoReadyReplicas"
PINNED_STREAMING = "PinnedStreaming"
PINNED_BATCHING = "PinnedBatching"
DEMAND_NEEDS_BATCHING = "DemandNeedsBatching"
DEMAND_NEEDS_STREAMING = "DemandNeedsStreaming"
SPLIT_FITS_DEMAND = "SplitFitsDemand"

# The most flip records the state keeps; one per pod, pods that vanished are dropped first.
MAX_FLIP_RECORDS = 256


@dataclass(frozen=True)
class ReplicaState:
    """One pod as the policy sees it. ready=False: it is counted but never flipped."""

    name: str
    mode: Mode | None
    ready: bool = True

    @property
    def effective_mode(self) -> Mode:
        # A pod without a mode label runs the runtime's default, streaming.
        return self.mode or Mode.STREAMING


@dataclass(frozen=True)
class HysteresisState:
    """What the policy remembers between passes (status.adaptiveState): since when load or
    demand has pointed one way, each pod's last flip, the learned capacity. to_status() and
    from_status() persist it, so a restart keeps windows and cooldowns."""

    high_since: float | None = None
    low_since: float | None = None
    last_flips: Mapping[str, tuple[float, Mode]] = field(default_factory=dict)
    capacity: Capacity | None = None  # learned; None: the CRD's seeds

    def last_flip_time(self, pod: str) -> float | None:
        record = self.last_flips.get(pod)
        return record[0] if record else None

    def to_status(self) -> AdaptiveState:
        return AdaptiveState(
            high_since=_iso(self.high_since),
            low_since=_iso(self.low_since),
            last_flips=[
                ReplicaFlip(pod=pod, time=_iso(t) or "", mode=mode.value)
                for pod, (t, mode) in sorted(self.last_flips.items())
            ],
            capacity=self.capacity.to_status() if self.capacity else None,
        )

    @classmethod
    def from_status(
        cls, stored: AdaptiveState | Mapping[str, object] | None
    ) -> HysteresisState:
        if stored is None:
            return cls()
        if not isinstance(stored, AdaptiveState):
            stored = AdaptiveState.model_validate(stored)
        flips: dict[str, tuple[float, Mode]] = {}
        for record in stored.last_flips:
            when = parse_iso(record.time)
            if when is not None and record.mode in {m.value for m in Mode}:
                flips[record.pod] = (when, Mode(record.mode))
        return cls(
            high_since=parse_iso(stored.high_since),
            low_since=parse_iso(stored.low_since),
            last_flips=flips,
            capacity=Capacity.from_status(stored.capacity),
        )


@dataclass(frozen=True)
class Flip:
    pod: str
    from_mode: Mode
    to_mode: Mode


@dataclass(frozen=True)
class Outcome:
    """A decision before the bookkeeping: why, which flips, the windows to keep."""

    reason: str
    message: str
    flips: tuple[Flip, ...]
    state: HysteresisState


def outcome(reason: str, message: str, flips: Sequence[Flip], state: HysteresisState) -> Outcome:
    return Outcome(reason, _with_flips(message, flips), tuple(flips), state)


Kept = Mapping[str, tuple[float, Mode]]


@dataclass(frozen=True)
class Fleet:
    """The ready replicas by mode, and how many must stay streaming."""

    ready: list[ReplicaState]
    streaming: list[ReplicaState]
    batching: list[ReplicaState]
    min_streaming: int

    @classmethod
    def of(cls, replicas: Sequence[ReplicaState], config: AdaptiveSettings) -> Fleet:
        ready = [r for r in replicas if r.ready]
        return cls(
            ready=ready,
            streaming=[r for r in ready if r.effective_mode is Mode.STREAMING],
            batching=[r for r in ready if r.effective_mode is Mode.BATCHING],
            min_streaming=min(config.min_streaming_replicas, len(ready)),
        )


def evidence_window(window: float, severity: float) -> float:
    """The stabilization a high load needs: the full window at the threshold, shrinking linearly
    to none at twice it. The window guards against noise around the threshold; load at twice the
    threshold is not noise, and every second spent waiting there is requests turned away."""
    return window * min(1.0, max(0.0, 2.0 - severity))


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def divisor(samples: Samples | None, replicas: Sequence[ReplicaState]) -> int:
    if samples is not None and samples.reporting_replicas is not None:
        return samples.reporting_replicas
    return sum(1 for r in replicas if r.ready)


def cooled(
    pod: str, flips: Mapping[str, tuple[float, Mode]], now: float, config: AdaptiveSettings
) -> bool:
    record = flips.get(pod)
    return record is None or now - record[0] >= config.cooldown_seconds


def oldest_first(
    replicas: Sequence[ReplicaState], flips: Mapping[str, tuple[float, Mode]]
) -> list[ReplicaState]:
    # Never-flipped pods first, then the longest-ago flip; the name breaks ties deterministically.
    return sorted(
        replicas,
        key=lambda r: (flips[r.name][0] if r.name in flips else -math.inf, r.name),
    )


def cooldown_message(
    summary: str,
    candidates: Sequence[ReplicaState],
    flips: Mapping[str, tuple[float, Mode]],
    now: float,
    config: AdaptiveSettings,
) -> str:
    waits = [
        config.cooldown_seconds - (now - flips[r.name][0]) for r in candidates if r.name in flips
    ]
    soonest = min(waits) if waits else 0.0
    return f"{summary}; every candidate flipped within cooldown, next one free in {soonest:.0f}s"


def _with_flips(message: str, flips: Sequence[Flip]) -> str:
    if not flips:
        return message
    moves = ", ".join(f"{f.pod} to {f.to_mode.value}" for f in flips)
    return f"{message}; flipping {moves}"


def reset(kept: Mapping[str, tuple[float, Mode]]) -> HysteresisState:
    return HysteresisState(high_since=None, low_since=None, last_flips=kept)


def _iso(when: float | None) -> str | None:
    if when is None:
        return None
    return (
        datetime.fromtimestamp(when, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def iso_time(when: float) -> str:
    """RFC 3339 with milliseconds, UTC: the time format status uses."""
    return _iso(when) or ""
