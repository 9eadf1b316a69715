"""The adaptive mode policy: a pure function from metrics, modes and its hysteresis state to a
decision.

No I/O here (an import-linter contract forbids kopf, kubernetes and HTTP clients): the operator's
loop, the `replay` command and the benchmarks all run this same code.

How it decides, per pass, with per-class demand (`chat_rate` and `other_rate`: requests/s of
streamed chats and of everything else, from the router's autoglm_router_requests_total, or the
runtime's autoglm_requests_received_total without a router):
- It estimates what one replica of each mode serves within the SLOs (`Capacity`): the CRD's
  seeds (`adaptive.capacity`) until it has measured anything, then what saturated replicas
  were seen to complete while they served their own class (autoglm_operator.adaptive.demand.learn),
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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from autoglm_operator.adaptive import demand as dm
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.resource.spec import (
    AdaptiveLoopState,
    AdaptiveSettings,
    LearnedCapacity,
    MetricSample,
    ModePolicy,
    ReplicaFlip,
)
from autoglm_runtime.profiles import Mode, ModeProfiles

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

# A learned capacity is stored only when it moves by this share in some mode: smaller moves are
# measurement noise, and storing them would write status every pass of a saturated loop.
MIN_CAPACITY_CHANGE = 0.02
# The window of the default rate queries ([1m]): a replica that flipped within it has its
# completions counted under a mode it no longer runs, so nothing is learned meanwhile.
RATE_WINDOW_SECONDS = 60.0

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
class Capacity:
    """Requests per second one replica of each mode serves within the SLOs."""

    streaming: float
    batching: float

    @classmethod
    def seeded(cls, config: AdaptiveSettings) -> Capacity:
        seeds = config.capacity
        return cls(
            seeds.streaming_per_replica_milli / 1000, seeds.batching_per_replica_milli / 1000
        )

    def of(self, mode: Mode) -> float:
        return self.streaming if mode is Mode.STREAMING else self.batching

    def to_status(self) -> LearnedCapacity:
        return LearnedCapacity(
            streaming_milli=max(1, round(self.streaming * 1000)),
            batching_milli=max(1, round(self.batching * 1000)),
        )

    @classmethod
    def from_status(cls, stored: LearnedCapacity | None) -> Capacity | None:
        if stored is None:
            return None
        return cls(stored.streaming_milli / 1000, stored.batching_milli / 1000)


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

    def to_status(self) -> AdaptiveLoopState:
        return AdaptiveLoopState(
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
        cls, stored: AdaptiveLoopState | Mapping[str, object] | None
    ) -> HysteresisState:
        if stored is None:
            return cls()
        if not isinstance(stored, AdaptiveLoopState):
            stored = AdaptiveLoopState.model_validate(stored)
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
        capacity = _learned(samples, replicas, history, config, caps, now)
        sizing = _Sizing(capacity or Capacity.seeded(config), capacity is not None, caps)
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
        metrics=metric_sample(samples, _divisor(samples, replicas)),
    )


@dataclass(frozen=True)
class _Outcome:
    """A decision before the bookkeeping: why, which flips, the windows to keep."""

    reason: str
    message: str
    flips: tuple[Flip, ...]
    state: HysteresisState


def _outcome(reason: str, message: str, flips: Sequence[Flip], state: HysteresisState) -> _Outcome:
    return _Outcome(reason, _with_flips(message, flips), tuple(flips), state)


Kept = Mapping[str, tuple[float, Mode]]


def _pinned(replicas: Sequence[ReplicaState], policy: ModePolicy, kept: Kept) -> _Outcome:
    target = Mode.STREAMING if policy is ModePolicy.STREAMING else Mode.BATCHING
    reason = PINNED_STREAMING if target is Mode.STREAMING else PINNED_BATCHING
    flips = [
        Flip(r.name, r.effective_mode, target)
        for r in replicas
        if r.ready and r.effective_mode is not target
    ]
    message = f"modePolicy {policy.value} pins every replica to {target.value}"
    return _outcome(reason, message, flips, HysteresisState(last_flips=kept))


@dataclass(frozen=True)
class _Fleet:
    """The ready replicas by mode, and how many must stay streaming."""

    ready: list[ReplicaState]
    streaming: list[ReplicaState]
    batching: list[ReplicaState]
    min_streaming: int

    @classmethod
    def of(cls, replicas: Sequence[ReplicaState], config: AdaptiveSettings) -> _Fleet:
        ready = [r for r in replicas if r.ready]
        return cls(
            ready=ready,
            streaming=[r for r in ready if r.effective_mode is Mode.STREAMING],
            batching=[r for r in ready if r.effective_mode is Mode.BATCHING],
            min_streaming=min(config.min_streaming_replicas, len(ready)),
        )


@dataclass(frozen=True)
class _Sizing:
    """What sizing by demand needs beside the metrics: capacities and the modes' caps."""

    capacity: Capacity
    learned: bool  # False: still the CRD's seeds
    caps: Mapping[Mode, int]


def _adaptive(
    samples: Samples | None,
    replicas: Sequence[ReplicaState],
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
    sizing: _Sizing,
) -> _Outcome:
    fleet = _Fleet.of(replicas, config)
    if not fleet.ready:
        return _outcome(NO_READY_REPLICAS, "no ready replica to decide for", [], _reset(kept))
    # A hard floor, whatever the load: interactive chat always has a streaming replica.
    if len(fleet.streaming) < fleet.min_streaming:
        wanted = min(fleet.min_streaming - len(fleet.streaming), config.max_flips_per_step)
        chosen = _oldest_first(fleet.batching, kept)[:wanted]
        flips = [Flip(r.name, Mode.BATCHING, Mode.STREAMING) for r in chosen]
        message = (
            f"{len(fleet.streaming)} ready replicas streaming, "
            f"minStreamingReplicas is {config.min_streaming_replicas}"
        )
        return _outcome(MIN_STREAMING_REPLICAS, message, flips, _reset(kept))
    demand = _demand(samples)
    if demand is not None:
        return _sized(demand, fleet, history, kept, config, now, sizing)
    load = _classify(samples, _divisor(samples, replicas), config)
    if load.unavailable:
        message = f"holding modes: {load.unavailable}"
        return _outcome(METRICS_UNAVAILABLE, message, [], _reset(kept))
    if load.high:
        return _toward_batching(load, fleet, history, kept, config, now)
    if load.low:
        return _toward_streaming(load, fleet, history, kept, config, now)
    message = f"{load.summary}; inside the hysteresis band"
    return _outcome(WITHIN_BAND, message, [], _reset(kept))


def _toward_batching(
    load: _Load,
    fleet: _Fleet,
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
) -> _Outcome:
    high_since = history.high_since if history.high_since is not None else now
    state = HysteresisState(high_since=high_since, low_since=None, last_flips=kept)
    ready, batching = fleet.ready, fleet.batching
    room = len(ready) - fleet.min_streaming - len(batching)
    if load.high == (QPS_ABOVE_HIGH,) and batching and room > 0:
        message = (
            f"{load.summary}; {len(batching)} of {len(ready)} ready replicas batching "
            "and no queue in front of the streaming ones: they keep up"
        )
        # The evidence a further step needs is a queue, not QPS: its window starts then.
        return _outcome(KEEPING_UP, message, [], _reset(kept))
    if room <= 0:
        message = (
            f"{load.summary}; {len(batching)} of {len(ready)} ready replicas batching, "
            f"minStreamingReplicas {config.min_streaming_replicas} keeps the rest streaming"
        )
        return _outcome(MAX_BATCHING_REACHED, message, [], state)
    waited = now - high_since
    window = _evidence_window(config.to_batching_stabilization_seconds, load.severity)
    if waited < window:
        message = f"{load.summary}; high for {waited:.0f}s of {window:.0f}s before a flip"
        return _outcome(STABILIZING, message, [], state)
    eligible = [r for r in fleet.streaming if _cooled(r.name, kept, now, config)]
    if not eligible:
        message = _cooldown_message(load.summary, fleet.streaming, kept, now, config)
        return _outcome(COOLDOWN, message, [], state)
    step = min(config.max_flips_per_step, room, _step_size(room, load.shortage))
    chosen = _oldest_first(eligible, kept)[:step]
    flips = [Flip(r.name, Mode.STREAMING, Mode.BATCHING) for r in chosen]
    # Restart the window: the next step needs fresh evidence that load stays high.
    return _outcome(load.high[0], load.summary, flips, replace(state, high_since=now))


def _toward_streaming(
    load: _Load,
    fleet: _Fleet,
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
) -> _Outcome:
    low_since = history.low_since if history.low_since is not None else now
    state = HysteresisState(high_since=None, low_since=low_since, last_flips=kept)
    if not fleet.batching:
        return _outcome(ALL_STREAMING, f"{load.summary}; every ready replica streaming", [], state)
    waited = now - low_since
    window = config.to_streaming_stabilization_seconds
    if waited < window:
        message = f"{load.summary}; low for {waited:.0f}s of {window}s before a return"
        return _outcome(STABILIZING, message, [], state)
    eligible = [r for r in fleet.batching if _cooled(r.name, kept, now, config)]
    if not eligible:
        message = _cooldown_message(load.summary, fleet.batching, kept, now, config)
        return _outcome(COOLDOWN, message, [], state)
    chosen = _oldest_first(eligible, kept)[:1]
    flips = [Flip(r.name, Mode.BATCHING, Mode.STREAMING) for r in chosen]
    return _outcome(LOAD_BELOW_LOW, load.summary, flips, replace(state, low_since=now))


def _demand(samples: Samples | None) -> dm.Demand | None:
    """Each class's demand, when both rates are known (else the threshold rules decide)."""
    if samples is None or not (_finite(samples.chat_rate) and _finite(samples.other_rate)):
        return None
    assert samples.chat_rate is not None and samples.other_rate is not None
    return dm.Demand(max(0.0, samples.chat_rate), max(0.0, samples.other_rate))


def _learned(
    samples: Samples | None,
    replicas: Sequence[ReplicaState],
    history: HysteresisState,
    config: AdaptiveSettings,
    caps: Mapping[Mode, int],
    now: float,
) -> Capacity | None:
    """The capacities after this pass's measurements (demand.learn); None while nothing was
    learned (the seeds apply). Nothing is learned while a replica's recent flip blurs which
    mode its completions belong to."""
    seeds = Capacity.seeded(config)
    current = history.capacity or seeds
    recent = any(now - t < RATE_WINDOW_SECONDS for t, _ in history.last_flips.values())
    if samples is None or recent:
        return history.capacity
    ready = [r for r in replicas if r.ready]
    learned = dm.learn(
        capacity={m: current.of(m) for m in Mode},
        seeds={m: seeds.of(m) for m in Mode},
        completions=_by_mode(samples.streaming_completions, samples.batching_completions),
        busy=_by_mode(samples.streaming_busy, samples.batching_busy),
        replicas={m: sum(1 for r in ready if r.effective_mode is m) for m in Mode},
        caps=caps,
        own_share=_by_mode(samples.streaming_own_share, samples.batching_own_share),
    )
    updated = Capacity(learned[Mode.STREAMING], learned[Mode.BATCHING])
    if all(abs(updated.of(m) - current.of(m)) < MIN_CAPACITY_CHANGE * current.of(m) for m in Mode):
        return history.capacity  # noise, and a status write every pass: keep what is stored
    return updated


_THRESHOLDS = {
    "qps_per_replica_milli": "qpsPerReplicaMilli",
    "gpu_memory_percent": "gpuMemoryPercent",
    "queue_depth_per_replica": "queueDepthPerReplica",
}


def _unused_thresholds(config: AdaptiveSettings) -> str:
    """A warning, in the decision message, for thresholds set away from their defaults: they
    are accepted, but sizing by demand does not read them (the fallback rules do)."""
    default = AdaptiveSettings()
    changed = [
        camel
        for name, camel in _THRESHOLDS.items()
        if getattr(config, name) != getattr(default, name)
    ]
    if not changed:
        return ""
    return (
        f" ({', '.join(changed)} set, but read only without per-class demand: ignored while "
        "sizing by demand)"
    )


def _finite_or_none(value: float | None) -> float | None:
    return value if _finite(value) else None


def _by_mode(streaming: float | None, batching: float | None) -> dict[Mode, float | None]:
    return {Mode.STREAMING: _finite_or_none(streaming), Mode.BATCHING: _finite_or_none(batching)}


def _sized(
    demand: dm.Demand,
    fleet: _Fleet,
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
    sizing: _Sizing,
) -> _Outcome:
    """The split that serves the most demand within the SLOs, approached through the windows,
    the cooldown and maxFlipsPerStep (the module docstring)."""
    n, k = len(fleet.ready), len(fleet.batching)
    cap = sizing.capacity
    current, best = dm.best_split(
        k,
        n,
        n - fleet.min_streaming,
        demand,
        {Mode.STREAMING: cap.streaming, Mode.BATCHING: cap.batching},
        config.slo,
        sizing.caps[Mode.BATCHING],
    )
    summary = (
        f"demand {demand.chat:.2f} chats/s, {demand.other:.2f} other/s; per replica "
        f"streaming serves {cap.streaming:.2f}/s, batching {cap.batching:.2f}/s "
        f"({'learned' if sizing.learned else 'seeds'}); {k} of {n} batching: "
        f"{current.goodput:.2f}/s within SLO"
    )
    summary += _unused_thresholds(config)
    if best.batching == k:
        return _outcome(SPLIT_FITS_DEMAND, f"{summary}, the best split", [], _reset(kept))
    toward = best.batching > k
    summary += f", {best.batching} batching: {best.goodput:.2f}/s"
    started = (history.high_since if toward else history.low_since) or now
    state = HysteresisState(
        high_since=started if toward else None,
        low_since=None if toward else started,
        last_flips=kept,
    )
    gain = best.goodput / current.goodput if current.goodput > 0 else math.inf
    window = _evidence_window(
        config.to_batching_stabilization_seconds
        if toward
        else config.to_streaming_stabilization_seconds,
        gain,
    )
    waited = now - started
    if waited < window:
        message = f"{summary}; wanted for {waited:.0f}s of {window:.0f}s before a flip"
        return _outcome(STABILIZING, message, [], state)
    movable = fleet.streaming if toward else fleet.batching
    eligible = [r for r in movable if _cooled(r.name, kept, now, config)]
    if not eligible:
        return _outcome(COOLDOWN, _cooldown_message(summary, movable, kept, now, config), [], state)
    step = min(config.max_flips_per_step, abs(best.batching - k))
    to_mode = Mode.BATCHING if toward else Mode.STREAMING
    chosen = _oldest_first(eligible, kept)[:step]
    flips = [Flip(r.name, r.effective_mode, to_mode) for r in chosen]
    reason = DEMAND_NEEDS_BATCHING if toward else DEMAND_NEEDS_STREAMING
    restarted = replace(
        state, high_since=now if toward else None, low_since=None if toward else now
    )
    return _outcome(reason, summary, flips, restarted)


@dataclass(frozen=True)
class _Load:
    high: tuple[str, ...] = ()
    # How far above its high threshold the furthest signal is: 1.0 at the threshold, 2.0 at twice.
    severity: float = 0.0
    # The same for the signals that show capacity running short (queue, GPU memory); QPS alone
    # says the deployment is busy, not that it is short, and moves one replica at a time.
    shortage: float = 1.0
    low: bool = False
    unavailable: str = ""
    summary: str = ""


def _evidence_window(window: float, severity: float) -> float:
    """The stabilization a high load needs: the full window at the threshold, shrinking linearly
    to none at twice it. The window guards against noise around the threshold; load at twice the
    threshold is not noise, and every second spent waiting there is requests turned away."""
    return window * min(1.0, max(0.0, 2.0 - severity))


def _step_size(room: int, shortage: float) -> int:
    """Replicas one step moves toward batching: one just above the threshold, every replica
    there is room for at twice it, in proportion between."""
    return max(1, math.ceil(room * (shortage - 1.0) - 1e-9))


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _divisor(samples: Samples | None, replicas: Sequence[ReplicaState]) -> int:
    if samples is not None and samples.reporting_replicas is not None:
        return samples.reporting_replicas
    return sum(1 for r in replicas if r.ready)


def _classify(samples: Samples | None, divisor: int, config: AdaptiveSettings) -> _Load:
    if samples is None:
        return _Load(unavailable="no metrics were read")
    missing = [
        name
        for name, value in (("qps", samples.qps), ("queue depth", samples.queue_depth))
        if not _finite(value)
    ]
    if missing:
        why = f" ({samples.problem})" if samples.problem else ""
        return _Load(unavailable=f"{' and '.join(missing)} unavailable{why}")
    if divisor <= 0:
        return _Load(unavailable="no pod of this deployment reports metrics")
    assert samples.qps is not None and samples.queue_depth is not None
    qps_milli = samples.qps / divisor * 1000
    queue = samples.queue_depth / divisor
    q, g, c = (
        config.qps_per_replica_milli,
        config.gpu_memory_percent,
        config.queue_depth_per_replica,
    )
    gpu = samples.gpu_memory_percent if _finite(samples.gpu_memory_percent) else None

    high: list[str] = []
    shortage = 1.0  # a percent near 100 has no "twice the threshold": GPU memory counts as 1
    if gpu is not None and gpu >= g.high:
        high.append(GPU_MEMORY_ABOVE_HIGH)
    if queue >= c.high:
        high.append(QUEUE_ABOVE_HIGH)
        shortage = queue / c.high
    if qps_milli >= q.high:
        high.insert(0, QPS_ABOVE_HIGH)
    severity = max(shortage, qps_milli / q.high) if high else 0.0
    low = qps_milli <= q.low and queue <= c.low and (gpu is None or gpu <= g.low)

    parts = [
        f"qps {samples.qps:.2f} ({qps_milli / 1000:.2f}/replica over {divisor}, "
        f"high {q.high / 1000:g}, low {q.low / 1000:g})",
        (
            f"gpu memory {gpu:.0f}% (high {g.high}, low {g.low})"
            if gpu is not None
            else "gpu memory n/a"
        ),
        f"queue {samples.queue_depth:g} ({queue:.2f}/replica, high {c.high}, low {c.low})",
    ]
    if _finite(samples.ttft_p95_seconds):
        parts.append(f"ttft p95 {samples.ttft_p95_seconds:.3f}s")
    summary = ", ".join(parts)
    return _Load(high=tuple(high), severity=severity, shortage=shortage, low=low, summary=summary)


def _cooled(
    pod: str, flips: Mapping[str, tuple[float, Mode]], now: float, config: AdaptiveSettings
) -> bool:
    record = flips.get(pod)
    return record is None or now - record[0] >= config.cooldown_seconds


def _oldest_first(
    replicas: Sequence[ReplicaState], flips: Mapping[str, tuple[float, Mode]]
) -> list[ReplicaState]:
    # Never-flipped pods first, then the longest-ago flip; the name breaks ties deterministically.
    return sorted(
        replicas,
        key=lambda r: (flips[r.name][0] if r.name in flips else -math.inf, r.name),
    )


def _cooldown_message(
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


def _reset(kept: Mapping[str, tuple[float, Mode]]) -> HysteresisState:
    return HysteresisState(high_since=None, low_since=None, last_flips=kept)


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
    if not _finite(value):
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
