"""Capacity learning, in one place, pure: what one replica of each mode serves within the SLOs
(Capacity), seeded from the CRD (`adaptive.capacity`) until anything is measured, then learned
from what saturated replicas were seen to complete while they served their own class (learn: one
measurement; learned: one pass, with when nothing is learned and when a change is worth storing),
kept in status.adaptiveState so a restart keeps it. Demand sizing (demand.py) reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.resource.spec import AdaptiveSettings
from autoglm_operator.resource.status import LearnedCapacity

# A mode is saturated (its completions are its capacity) when requests in flight and queued
# reach this share of its replicas' concurrency caps.
SATURATED = 0.9

# A mode's completions are its capacity only while its replicas serve their own class (streaming
# replicas: streamed chats; batching: the rest), which is what the model sizes. Batch jobs spilled
# onto streaming replicas are short and complete fast: counted as streaming capacity, they
# inflate it and the policy chooses the wrong split. With at least 90% own class the other class
# moves the completion rate by at most a tenth of the gap between the two classes' rates, within
# what LEARNING_RATE averages out.
OWN_CLASS_SHARE = 0.9

# How far one saturated measurement moves the learned capacity (an exponential average over
# about 1 / LEARNING_RATE passes: a minute at the default 15 s interval).
LEARNING_RATE = 0.25

# Learned capacity stays within this factor of the seed either way: a replica that served
# nothing for a minute (stuck, draining) must not teach the adaptive pass that a mode serves
# nothing.
CAPACITY_RANGE = 4.0

# A learned capacity is stored only when it moves by this share in some mode: smaller moves are
# measurement noise, and storing them would write status every pass of a saturated loop.
MIN_CAPACITY_CHANGE = 0.02

# The window of the default rate queries ([1m]): a replica that flipped within it has its
# completions counted under a mode it no longer runs, so nothing is learned meanwhile.
RATE_WINDOW_SECONDS = 60.0


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
    corrected while all of them stream batch load, and the adaptive pass would never move; a too-low
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


def learned(
    samples: Samples | None,
    ready: Mapping[Mode, int],
    stored: Capacity | None,
    last_flips: Mapping[str, tuple[float, Mode]],
    config: AdaptiveSettings,
    caps: Mapping[Mode, int],
    now: float,
) -> Capacity | None:
    """The capacities after this pass's measurements (learn), from what status stored
    (`stored`) and the ready replicas per mode; None while nothing was learned (the seeds
    apply). Nothing is learned while a replica's recent flip (`last_flips`) blurs which mode
    its completions belong to."""
    seeds = Capacity.seeded(config)
    current = stored or seeds
    recent = any(now - t < RATE_WINDOW_SECONDS for t, _ in last_flips.values())
    if samples is None or recent:
        return stored
    learned = learn(
        capacity={m: current.of(m) for m in Mode},
        seeds={m: seeds.of(m) for m in Mode},
        completions=_by_mode(samples.streaming_completions, samples.batching_completions),
        busy=_by_mode(samples.streaming_busy, samples.batching_busy),
        replicas=ready,
        caps=caps,
        own_share=_by_mode(samples.streaming_own_share, samples.batching_own_share),
    )
    updated = Capacity(learned[Mode.STREAMING], learned[Mode.BATCHING])
    if all(abs(updated.of(m) - current.of(m)) < MIN_CAPACITY_CHANGE * current.of(m) for m in Mode):
        return stored  # noise, and a status write every pass: keep what is stored
    return updated


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _by_mode(streaming: float | None, batching: float | None) -> dict[Mode, float | None]:
    return {Mode.STREAMING: _finite_or_none(streaming), Mode.BATCHING: _finite_or_none(batching)}
