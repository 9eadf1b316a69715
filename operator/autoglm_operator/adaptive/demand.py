"""Demand sizing, pure: which split of replicas between the modes serves the most requests
within their SLOs, for the demand each traffic class brings; and what each mode's replicas can
serve, learned from what they deliver.

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

from collections.abc import Mapping
from dataclasses import dataclass

from autoglm_operator.resource.spec import ServiceLevelObjectives
from autoglm_runtime.profiles import Mode

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
# A mode is saturated (its completions are its capacity) when requests in flight and queued
# reach this share of its replicas' concurrency caps.
SATURATED = 0.9
# A mode's completions are its capacity only while its replicas serve their own class (streaming
# replicas: streamed chats; batching: the rest), which is what the model sizes. Batch jobs spilled
# onto streaming replicas are short and complete fast: in a live run they drove the learned
# streaming capacity to twice its seed and the policy chose the wrong split. With at least 90%
# own class the other class moves the completion rate by at most a tenth of the gap between the
# two classes' rates, within what LEARNING_RATE averages out.
OWN_CLASS_SHARE = 0.9
# How far one saturated measurement moves the learned capacity (an exponential average over
# about 1 / LEARNING_RATE passes: a minute at the default 15 s interval).
LEARNING_RATE = 0.25
# Learned capacity stays within this factor of the seed either way: a replica that served
# nothing for a minute (stuck, draining) must not teach the loop that a mode serves nothing.
CAPACITY_RANGE = 4.0


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


def learn(
    capacity: Mapping[Mode, float],
    seeds: Mapping[Mode, float],
    completions: Mapping[Mode, float | None],
    busy: Mapping[Mode, float | None],
    replicas: Mapping[Mode, int],
    caps: Mapping[Mode, int],
    own_share: Mapping[Mode, float | None],
) -> dict[Mode, float]:
    """Each mode's capacity per replica after one pass's measurements.

    Saturated (in flight + queued at SATURATED of its caps): what its replicas completed per
    replica is what they can serve; the estimate moves LEARNING_RATE of the way there. Below
    saturation a mode that completed more than the estimate proves the estimate low: it rises
    to what was delivered. Otherwise (idle, unknown, no replica in that mode) nothing is learned.

    A mode whose replicas received less than OWN_CLASS_SHARE of their own class learns nothing,
    but for one case: it has every ready replica (the model then sizes both classes with its
    capacity) and is saturated; its estimate may then fall toward what it delivered, never
    rise. Without that, a seed above what the replicas serve of batch jobs would never be
    corrected while all of them stream batch load, and the loop would never move; a too-low
    estimate corrects itself once the mode serves its own class again. An unknown share (a
    runtime or trace without it) is taken as unmixed: such a mode learns as before.
    """
    learned = dict(capacity)
    for mode, estimate in capacity.items():
        done, inflight, n = completions.get(mode), busy.get(mode), replicas.get(mode, 0)
        if n <= 0 or done is None or inflight is None:
            continue
        share = own_share.get(mode)
        mixed = share is not None and share < OWN_CLASS_SHARE
        alone = all(replicas.get(m, 0) <= 0 for m in Mode if m is not mode)
        saturated = inflight >= SATURATED * caps[mode] * n
        delivered = done / n
        if mixed and not (alone and saturated):
            continue  # its completions are not its own class's capacity
        if saturated:
            target = min(delivered, estimate) if mixed else delivered
            estimate += LEARNING_RATE * (target - estimate)
        elif delivered > estimate:
            estimate = delivered
        seed = seeds[mode]
        learned[mode] = min(seed * CAPACITY_RANGE, max(seed / CAPACITY_RANGE, estimate))
    return learned
