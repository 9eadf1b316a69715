"""The adaptive mode policy: a pure function from metrics, modes and its hysteresis state to a
decision.

No I/O here (an import-linter contract forbids kopf, kubernetes and HTTP clients): the operator's
loop, the `replay` command and the benchmarks all run this same code.

How it decides, per pass, with per-class demand (`chat_rate` and `other_rate`: requests/s of
streamed chats and of everything else, from the router's autoglm_router_requests_total, or the
runtime's autoglm_requests_received_total without a router):
- It estimates what one replica of each mode serves within the SLOs (`Capacity`): the CRD's
  seeds (`adaptive.capacity`) until it has measured anything, then what saturated replicas
  were seen to complete while they served their own class (capacity.learn),
  kept in status so a restart keeps it.
- It scores every split that `minStreamingReplicas` allows by expected goodput for that
  demand (demand.best_split: the router's routing, spill, and its shedding of what no replica
  has room for) and picks the best; a move must gain 2% of the demand (hysteresis).
- The chosen split must stay wanted for the window of its direction
  (`toBatchingStabilizationSeconds` or `toStreamingStabilizationSeconds`), shortened by the
  gain: the full window for a small one, none for a split that serves twice the current.
  A step flips up to `maxFlipsPerStep` replicas toward it, oldest flip first, never one
  within `cooldownSeconds`, and restarts the window.
- Reasons: DemandNeedsBatching, DemandNeedsStreaming, SplitFitsDemand, Stabilizing, Cooldown.

Without per-class demand (a runtime that does not count it, a replay of an older trace) the
threshold rules decide:
- Load is *high* when any signal is at or above its high threshold (QPS per replica, GPU memory
  percent, queue depth per replica) and *low* when every available signal is at or below its low
  threshold; in between is the hysteresis band, where nothing moves and pending windows reset.
- High load must persist before a step moves replicas to batching: the whole
  `toBatchingStabilizationSeconds` just above the threshold, less the further above it is, none
  at twice it (the window filters noise around the threshold; load at twice it is not noise, and
  waiting there turns requests away). A step moves one replica with the queue just above its
  threshold and every replica there is room for at twice it, in proportion between; one when
  only QPS or GPU memory is high. Low load must persist for the
  whole `toStreamingStabilizationSeconds` before a step returns one replica. Each step restarts
  its window, so a long peak moves replicas step by step.
- High QPS alone moves only the first replica: once one replica batches, batch work has a home
  and the streaming replicas keep up unless requests queue in front of them (the queue signal
  counts the requests waiting for streaming replicas: batching queues by design) or GPU memory
  runs short. Further steps need that evidence.
- A step toward batching flips at most `maxFlipsPerStep` replicas; a return flips one (quick to
  relieve, slow to give back).

Either way: no step flips a replica that flipped within `cooldownSeconds`, the ones that
flipped longest ago first, and never leaves fewer than `minStreamingReplicas` ready replicas
streaming. Missing, NaN or infinite QPS or queue data (threshold rules) holds every replica where
it is and resets the windows: a gap breaks the "stayed high/low for N seconds" evidence.

Where each part lives: decide (here) learns capacity (capacity.learned), then, past the
minStreamingReplicas floor, sizes the split by demand (demand.size) or, without per-class demand,
steps by the threshold rules (threshold.step); decision.py holds what those steps share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autoglm_api.profiles import Mode, ModeProfiles
from autoglm_operator.adaptive import demand as dm
from autoglm_operator.adaptive import threshold
from autoglm_operator.adaptive.capacity import Capacity, learned
from autoglm_operator.adaptive.decision import (
    ALL_STREAMING,
    COOLDOWN,
    DEMAND_NEEDS_BATCHING,
    DEMAND_NEEDS_STREAMING,
    GPU_MEMORY_ABOVE_HIGH,
    KEEPING_UP,
    LOAD_BELOW_LOW,
    MAX_BATCHING_REACHED,
    MAX_FLIP_RECORDS,
    METRICS_UNAVAILABLE,
    MIN_STREAMING_REPLICAS,
    NO_READY_REPLICAS,
    PINNED_BATCHING,
    PINNED_STREAMING,
    QPS_ABOVE_HIGH,
    QUEUE_ABOVE_HIGH,
    SPLIT_FITS_DEMAND,
    STABILIZING,
    WITHIN_BAND,
    Fleet,
    Flip,
    HysteresisState,
    Kept,
    Outcome,
    ReplicaState,
    divisor,
    finite,
    iso_time,
    oldest_first,
    outcome,
    parse_iso,
    reset,
)
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.resource.spec import AdaptiveSettings, ModePolicy
from autoglm_operator.resource.status import MetricSample

# The policy's public names: decide, what it reads and returns, and the reasons it gives (the
# steps that produce them live in capacity, demand, threshold and decision).
__all__ = [
    "ALL_STREAMING",
    "COOLDOWN",
    "DEMAND_NEEDS_BATCHING",
    "DEMAND_NEEDS_STREAMING",
    "GPU_MEMORY_ABOVE_HIGH",
    "KEEPING_UP",
    "LOAD_BELOW_LOW",
    "MAX_BATCHING_REACHED",
    "METRICS_UNAVAILABLE",
    "MIN_STREAMING_REPLICAS",
    "NO_READY_REPLICAS",
    "PINNED_BATCHING",
    "PINNED_STREAMING",
    "QPS_ABOVE_HIGH",
    "QUEUE_ABOVE_HIGH",
    "SPLIT_FITS_DEMAND",
    "STABILIZING",
    "WITHIN_BAND",
    "Capacity",
    "Flip",
    "HysteresisState",
    "PolicyDecision",
    "ReplicaState",
    "Samples",
    "decide",
    "iso_time",
    "metric_sample",
    "parse_iso",
]


@dataclass(frozen=True)
class PolicyDecision:
    reason: str
    message: str
    from_batching: int
    to_batching: int
    flips: tuple[Flip, ...]
    state: HysteresisState
    metrics: MetricSample

    @property
    def changes(self) -> bool:
        return bool(self.flips)


def decide(
    samples: Samples | None,
    replicas: Sequence[ReplicaState],
    history: HysteresisState,
    config: AdaptiveSettings,
    policy: ModePolicy,
    now: float,
    profiles: ModeProfiles | None = None,
) -> PolicyDecision:
    """Decide which replicas flip now, and why. Pure: same inputs, same decision.

    `profiles`: the modes' admission profiles (spec.profiles), whose concurrency caps say when
    a mode is saturated; the defaults when not given.
    """
    from_batching = sum(1 for r in replicas if r.effective_mode is Mode.BATCHING)
    kept = _prune(history, replicas)
    caps = {m: (profiles or ModeProfiles()).for_mode(m).max_concurrency for m in Mode}
    capacity = history.capacity
    if policy is not ModePolicy.ADAPTIVE:
        outcome = _pinned(replicas, policy, kept)
    else:
        ready = {m: sum(1 for r in replicas if r.ready and r.effective_mode is m) for m in Mode}
        capacity = learned(samples, ready, history.capacity, history.last_flips, config, caps, now)
        sizing = dm.Sizing(capacity or Capacity.seeded(config), capacity is not None, caps)
        outcome = _adaptive(samples, replicas, history, kept, config, now, sizing)
    state = replace(outcome.state, capacity=capacity)
    if outcome.flips:
        records = dict(state.last_flips)
        for flip in outcome.flips:
            records[flip.pod] = (now, flip.to_mode)
        state = replace(state, last_flips=records)
    delta = sum(1 if f.to_mode is Mode.BATCHING else -1 for f in outcome.flips)
    return PolicyDecision(
        reason=outcome.reason,
        message=outcome.message,
        from_batching=from_batching,
        to_batching=from_batching + delta,
        flips=outcome.flips,
        state=state,
        metrics=metric_sample(samples, divisor(samples, replicas)),
    )


def _pinned(replicas: Sequence[ReplicaState], policy: ModePolicy, kept: Kept) -> Outcome:
    target = Mode.STREAMING if policy is ModePolicy.STREAMING else Mode.BATCHING
    reason = PINNED_STREAMING if target is Mode.STREAMING else PINNED_BATCHING
    flips = [
        Flip(r.name, r.effective_mode, target)
        for r in replicas
        if r.ready and r.effective_mode is not target
    ]
    message = f"modePolicy {policy.value} pins every replica to {target.value}"
    return outcome(reason, message, flips, HysteresisState(last_flips=kept))


def _adaptive(
    samples: Samples | None,
    replicas: Sequence[ReplicaState],
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
    sizing: dm.Sizing,
) -> Outcome:
    fleet = Fleet.of(replicas, config)
    if not fleet.ready:
        return outcome(NO_READY_REPLICAS, "no ready replica to decide for", [], reset(kept))
    # A hard floor, whatever the load: interactive chat always has a streaming replica.
    if len(fleet.streaming) < fleet.min_streaming:
        wanted = min(fleet.min_streaming - len(fleet.streaming), config.max_flips_per_step)
        chosen = oldest_first(fleet.batching, kept)[:wanted]
        flips = [Flip(r.name, Mode.BATCHING, Mode.STREAMING) for r in chosen]
        message = (
            f"{len(fleet.streaming)} ready replicas streaming, "
            f"minStreamingReplicas is {config.min_streaming_replicas}"
        )
        return outcome(MIN_STREAMING_REPLICAS, message, flips, reset(kept))
    demand = dm.demand_of(samples)
    if demand is not None:
        return dm.size(demand, fleet, history, kept, config, now, sizing)
    return threshold.step(samples, divisor(samples, replicas), fleet, history, kept, config, now)


def _prune(
    history: HysteresisState, replicas: Sequence[ReplicaState]
) -> dict[str, tuple[float, Mode]]:
    present = {r.name for r in replicas}
    kept = {pod: rec for pod, rec in history.last_flips.items() if pod in present}
    if len(kept) > MAX_FLIP_RECORDS:
        newest = sorted(kept.items(), key=lambda item: item[1][0])[-MAX_FLIP_RECORDS:]
        kept = dict(newest)
    return kept


def _fmt(value: float | None, digits: int = 3) -> str | None:
    if not finite(value):
        return None
    assert value is not None
    return f"{value:.{digits}f}"


def metric_sample(samples: Samples | None, divisor: int) -> MetricSample:
    """The values behind a decision, as the strings status carries (the CRD has no floats)."""
    if samples is None:
        return MetricSample()
    qps = samples.qps
    per_replica = qps / divisor if qps is not None and math.isfinite(qps) and divisor > 0 else None
    return MetricSample(
        qps=_fmt(samples.qps),
        qps_per_replica=_fmt(per_replica),
        gpu_memory_percent=_fmt(samples.gpu_memory_percent, 1),
        queue_depth=_fmt(samples.queue_depth, 1),
        kv_cache_percent=_fmt(samples.kv_cache_percent, 1),
        ttft_p95_seconds=_fmt(samples.ttft_p95_seconds),
    )
