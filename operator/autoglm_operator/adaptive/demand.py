"""Demand sizing, pure: which split of replicas between the modes serves the most requests
within their SLOs, for the demand each traffic class brings (best_split), and the policy's step
toward it (size). What each mode's replicas serve comes from capacity.py.

The model (expected goodput, requests/s meeting their SLO) follows the router's routing
(`autoglm_router.routing`): streamed chats go to streaming replicas and everything else to
batching replicas; a class whose own replicas are full spills to the other mode's free room;
a class with no replica in its mode uses them all. With `n` ready replicas, `k` of them batching,
chat demand `c`, other demand `b` and per-replica capacities `Cs`, `Cb`:

- streaming serves `S = (n - k) * Cs`, batching `B = k * Cb`.
- A chat counts when a streaming replica serves it; a chat spilled to a batching replica
  misses its time to first token (micro-batch window, coalesced events: ~1.8 s at load).
- A batch job counts wherever it is served, unless the batching replicas run at their
  concurrency cap for longer than the batch completion SLO (cap / Cb seconds per request).
- Demand beyond what its own mode and the other's free room serve does not queue: the router
  sheds it (its rule 1c: a streamed chat is answered 429 at the cap, other work once its pool's
  queue reaches twice the cap). So under overload each mode serves its capacity, in time, and
  refuses the rest: a class gets at most its replicas' capacity, never less than that because
  of the excess. (Before the router shed, an unbounded queue made every request of an
  overloaded class late, and this model had a cliff there: it then picked 3 batching replicas
  of 4 on steady overload where 2 serve 6% more, bench/policy_goodput.py seed 1.)
- With no batching replica (k = 0), the streaming replicas serve both classes up to their
  capacity: which class gets it under overload does not change the count (batch jobs queue
  where chats are shed, so they take more of it); with no streaming replica, chats miss and
  batch jobs share the batching replicas with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive.capacity import Capacity
from autoglm_operator.adaptive.decision import (
    COOLDOWN,
    DEMAND_NEEDS_BATCHING,
    DEMAND_NEEDS_STREAMING,
    SPLIT_FITS_DEMAND,
    STABILIZING,
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
from autoglm_operator.resource.spec import AdaptiveSettings, ServiceLevelObjectives

# The demand is a minute's count of random arrivals (batch jobs come in groups), so the split is
# scored on the measured demand and on each class 20% above and below it, every combination
# weighted alike: a split that serves the measured demand only at the edge of a cliff scores
# below one with room to spare.
DEMAND_SPREAD = (0.8, 1.0, 1.2)

# A move must gain this share of the demand (expected goodput, requests/s): the hysteresis that
# keeps a split from flapping between two that serve nearly the same.
MIN_GAIN = 0.02

# Batching only where it pays: once a split with fewer batching replicas serves within this share
# of the demand of the best one (off-peak, every split serves everything), replicas go back to
# streaming, which gives every chat its lowest time to first token. Below MIN_GAIN, so a split
# that just paid for a move does not flip back at once.
RELEASE_TOLERANCE = 0.005


@dataclass(frozen=True)
class Demand:
    """Requests per second arriving, by traffic class."""

    chat: float
    other: float

    @property
    def total(self) -> float:
        return self.chat + self.other


@dataclass(frozen=True)
class Split:
    """One candidate: `batching` replicas batching, its expected goodput, requests/s."""

    batching: int
    goodput: float


def expected_goodput(
    batching: int,
    replicas: int,
    demand: Demand,
    streaming_capacity: float,
    batching_capacity: float,
    batch_ok_at_cap: bool,
) -> float:
    """Requests/s that meet their SLO with `batching` of `replicas` batching (module docstring)."""
    c, b = demand.chat, demand.other
    s = (replicas - batching) * streaming_capacity
    bb = batching * batching_capacity
    if batching == 0:
        return min(c + b, s)
    if batching == replicas:
        return min(b, bb) if b + c <= bb or batch_ok_at_cap else 0.0
    chats = min(c, s)  # the rest spill to batching room (and miss) or are shed
    free_s, free_b = s - c, bb - b
    if free_b >= 0:
        # Batch jobs fit their own replicas; chats spilled there may fill them to the cap.
        spilled = min(max(-free_s, 0.0), free_b)
        return chats + (b if free_b - spilled > 0 or batch_ok_at_cap else 0.0)
    # Jobs past the batching replicas take free streaming room; the rest queue on the
    # batching replicas up to the router's limit and are shed beyond it.
    return chats + (bb if batch_ok_at_cap else 0.0) + min(-free_b, max(free_s, 0.0))


def best_split(
    current: int,
    replicas: int,
    most_batching: int,
    demand: Demand,
    capacity: Mapping[Mode, float],
    slo: ServiceLevelObjectives,
    batching_cap: int,
) -> tuple[Split, Split]:
    """The current split and the best one: the most expected goodput, by MIN_GAIN of the
    demand more than the current split's to be worth a move (ties: the nearest to current);
    batching replicas that do not pay (RELEASE_TOLERANCE) go back to streaming."""
    cs, cb = capacity[Mode.STREAMING], capacity[Mode.BATCHING]
    ok_at_cap = cb > 0 and batching_cap / cb <= slo.batch_completion_seconds
    spread = [
        Demand(demand.chat * x, demand.other * y) for x in DEMAND_SPREAD for y in DEMAND_SPREAD
    ]

    def expected(k: int) -> Split:
        total = sum(expected_goodput(k, replicas, d, cs, cb, ok_at_cap) for d in spread)
        return Split(k, total / len(spread))

    now = expected(current)
    splits = [expected(k) for k in range(most_batching + 1)]
    top = max(s.goodput for s in splits)
    paying = [s for s in splits if s.goodput >= top - RELEASE_TOLERANCE * demand.total - 1e-9]
    fewest = min(paying, key=lambda s: s.batching)
    if fewest.batching < current:
        return now, fewest
    if top - now.goodput <= MIN_GAIN * demand.total:
        return now, now
    near = [s for s in splits if s.goodput >= top - 1e-9 * max(1.0, top)]
    return now, min(near, key=lambda s: abs(s.batching - current))


@dataclass(frozen=True)
class Sizing:
    """What sizing by demand needs beside the metrics: capacities and the modes' caps."""

    capacity: Capacity
    learned: bool  # False: still the CRD's seeds
    caps: Mapping[Mode, int]


def demand_of(samples: Samples | None) -> Demand | None:
    """Each class's demand, when both rates are known (else the threshold rules decide)."""
    if samples is None or not (finite(samples.chat_rate) and finite(samples.other_rate)):
        return None
    assert samples.chat_rate is not None and samples.other_rate is not None
    return Demand(max(0.0, samples.chat_rate), max(0.0, samples.other_rate))


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


def size(
    demand: Demand,
    fleet: Fleet,
    history: HysteresisState,
    kept: Kept,
    config: AdaptiveSettings,
    now: float,
    sizing: Sizing,
) -> Outcome:
    """The split that serves the most demand within the SLOs, approached through the windows,
    the cooldown and maxFlipsPerStep (the module docstring)."""
    n, k = len(fleet.ready), len(fleet.batching)
    cap = sizing.capacity
    current, best = best_split(
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
        return outcome(SPLIT_FITS_DEMAND, f"{summary}, the best split", [], reset(kept))
    toward = best.batching > k
    summary += f", {best.batching} batching: {best.goodput:.2f}/s"
    started = (history.high_since if toward else history.low_since) or now
    state = HysteresisState(
        high_since=started if toward else None,
        low_since=None if toward else started,
        last_flips=kept,
    )
    gain = best.goodput / current.goodput if current.goodput > 0 else math.inf
    window = evidence_window(
        config.to_batching_stabilization_seconds
        if toward
        else config.to_streaming_stabilization_seconds,
        gain,
    )
    waited = now - started
    if waited < window:
        message = f"{summary}; wanted for {waited:.0f}s of {window:.0f}s before a flip"
        return outcome(STABILIZING, message, [], state)
    movable = fleet.streaming if toward else fleet.batching
    eligible = [r for r in movable if cooled(r.name, kept, now, config)]
    if not eligible:
        return outcome(COOLDOWN, cooldown_message(summary, movable, kept, now, config), [], state)
    step = min(config.max_flips_per_step, abs(best.batching - k))
    to_mode = Mode.BATCHING if toward else Mode.STREAMING
    chosen = oldest_first(eligible, kept)[:step]
    flips = [Flip(r.name, r.effective_mode, to_mode) for r in chosen]
    reason = DEMAND_NEEDS_BATCHING if toward else DEMAND_NEEDS_STREAMING
    restarted = replace(
        state, high_since=now if toward else None, low_since=None if toward else now
    )
    return outcome(reason, summary, flips, restarted)
