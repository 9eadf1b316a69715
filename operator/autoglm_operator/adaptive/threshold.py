"""The threshold rules, pure: the mode policy's fallback without per-class demand (a runtime
that does not count it, a replay of an older trace). The rules are in policy.py's docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive.decision import (
    ALL_STREAMING,
    COOLDOWN,
    GPU_MEMORY_ABOVE_HIGH,
    KEEPING_UP,
    LOAD_BELOW_LOW,
    MAX_BATCHING_REACHED,
    METRICS_UNAVAILABLE,
    QPS_ABOVE_HIGH,
    QUEUE_ABOVE_HIGH,
    STABILIZING,
    WITHIN_BAND,
    Fleet,
    Flip,
    HysteresisState,
    Kept,
    Outcome,
    cooldown_message,
    cooled,
    evidence_window,
    finite,
    oldest_first,
    outcome,
    reset,
)
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.resource.spec import AdaptiveSettings


def step(
    samples: Samples | None,
    divisor: int,
    fleet: Fleet,
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
) -> Outcome:
    """A step of the threshold rules: toward batching while load is high, back to streaming
    while it is low, nothing in the hysteresis band or without QPS and queue data."""
    load = classify(samples, divisor, config)
    if load.unavailable:
        message = f"holding modes: {load.unavailable}"
        return outcome(METRICS_UNAVAILABLE, message, [], reset(kept))
    if load.high:
        return toward_batching(load, fleet, history, kept, config, now)
    if load.low:
        return toward_streaming(load, fleet, history, kept, config, now)
    message = f"{load.summary}; inside the hysteresis band"
    return outcome(WITHIN_BAND, message, [], reset(kept))


def toward_batching(
    load: Load,
    fleet: Fleet,
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
) -> Outcome:
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
        return outcome(KEEPING_UP, message, [], reset(kept))
    if room <= 0:
        message = (
            f"{load.summary}; {len(batching)} of {len(ready)} ready replicas batching, "
            f"minStreamingReplicas {config.min_streaming_replicas} keeps the rest streaming"
        )
        return outcome(MAX_BATCHING_REACHED, message, [], state)
    waited = now - high_since
    window = evidence_window(config.to_batching_stabilization_seconds, load.severity)
    if waited < window:
        message = f"{load.summary}; high for {waited:.0f}s of {window:.0f}s before a flip"
        return outcome(STABILIZING, message, [], state)
    eligible = [r for r in fleet.streaming if cooled(r.name, kept, now, config)]
    if not eligible:
        message = cooldown_message(load.summary, fleet.streaming, kept, now, config)
        return outcome(COOLDOWN, message, [], state)
    step = min(config.max_flips_per_step, room, step_size(room, load.shortage))
    chosen = oldest_first(eligible, kept)[:step]
    flips = [Flip(r.name, Mode.STREAMING, Mode.BATCHING) for r in chosen]
    # Restart the window: the next step needs fresh evidence that load stays high.
    return outcome(load.high[0], load.summary, flips, replace(state, high_since=now))


def toward_streaming(
    load: Load,
    fleet: Fleet,
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
) -> Outcome:
    low_since = history.low_since if history.low_since is not None else now
    state = HysteresisState(high_since=None, low_since=low_since, last_flips=kept)
    if not fleet.batching:
        return outcome(ALL_STREAMING, f"{load.summary}; every ready replica streaming", [], state)
    waited = now - low_since
    window = config.to_streaming_stabilization_seconds
    if waited < window:
        message = f"{load.summary}; low for {waited:.0f}s of {window}s before a return"
        return outcome(STABILIZING, message, [], state)
    eligible = [r for r in fleet.batching if cooled(r.name, kept, now, config)]
    if not eligible:
        message = cooldown_message(load.summary, fleet.batching, kept, now, config)
        return outcome(COOLDOWN, message, [], state)
    chosen = oldest_first(eligible, kept)[:1]
    flips = [Flip(r.name, Mode.BATCHING, Mode.STREAMING) for r in chosen]
    return outcome(LOAD_BELOW_LOW, load.summary, flips, replace(state, low_since=now))


@dataclass(frozen=True)
class Load:
    high: tuple[str, ...] = ()
    # How far above its high threshold the furthest signal is: 1.0 at the threshold, 2.0 at twice.
    severity: float = 0.0
    # The same for the signals that show capacity running short (queue, GPU memory); QPS alone
    # says the deployment is busy, not that it is short, and moves one replica at a time.
    shortage: float = 1.0
    low: bool = False
    unavailable: str = ""
    summary: str = ""


def step_size(room: int, shortage: float) -> int:
    """Replicas one step moves toward batching: one just above the threshold, every replica
    there is room for at twice it, in proportion between."""
    return max(1, math.ceil(room * (shortage - 1.0) - 1e-9))


def classify(samples: Samples | None, divisor: int, config: AdaptiveSettings) -> Load:
    if samples is None:
        return Load(unavailable="no metrics were read")
    missing = [
        name
        for name, value in (("qps", samples.qps), ("queue depth", samples.queue_depth))
        if not finite(value)
    ]
    if missing:
        why = f" ({samples.problem})" if samples.problem else ""
        return Load(unavailable=f"{' and '.join(missing)} unavailable{why}")
    if divisor <= 0:
        return Load(unavailable="no pod of this deployment reports metrics")
    assert samples.qps is not None and samples.queue_depth is not None
    qps_milli = samples.qps / divisor * 1000
    queue = samples.queue_depth / divisor
    q, g, c = (
        config.qps_per_replica_milli,
        config.gpu_memory_percent,
        config.queue_depth_per_replica,
    )
    gpu = samples.gpu_memory_percent if finite(samples.gpu_memory_percent) else None

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
    if finite(samples.ttft_p95_seconds):
        parts.append(f"ttft p95 {samples.ttft_p95_seconds:.3f}s")
    summary = ", ".join(parts)
    return Load(high=tuple(high), severity=severity, shortage=shortage, low=low, summary=summary)
