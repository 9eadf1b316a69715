"""The pure policy over synthetic traces: ramps, falls, noise, gaps, cooldowns, pins, restarts."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.replay import Step, simulate, summarize
from autoglm_operator.resource.spec import AdaptiveSettings, ModePolicy
from autoglm_operator.resource.status import AdaptiveState

INTERVAL = 15.0


def config(**overrides: object) -> AdaptiveSettings:
    # Defaults: QPS/replica high 3.0 low 1.5, GPU 98/95, queue 4/1, to batching 30 s, to streaming
    # 300 s, cooldown 120 s, up to 4 flips per step, one replica always streaming.
    return AdaptiveSettings.model_validate(overrides)


def load(qps: float | None, *, gpu: float | None = 50.0, queue: float | None = 0.0) -> pol.Samples:
    return pol.Samples(qps=qps, gpu_memory_percent=gpu, queue_depth=queue)


def trace(
    values: Sequence[float | None], start: float = 1_000_000.0
) -> list[tuple[float, pol.Samples]]:
    return [(start + i * INTERVAL, load(v)) for i, v in enumerate(values)]


def flips(steps: list[Step]) -> list[tuple[float, str, Mode]]:
    return [(s.time, f.pod, f.to_mode) for s in steps for f in s.decision.flips]


# -- ramp and fall ---------------------------------------------------------------------------


def test_ramp_moves_to_batching_in_steps_and_keeps_min_streaming() -> None:
    # 4 replicas; total QPS climbs from 2 to 14 over 20 minutes (0.5 -> 3.5 per replica) while the
    # queue in front of the streaming replicas grows to 6 per replica, then both hold.
    def ramp(i: int) -> pol.Samples:
        x = min(i / 80, 1)
        return load(2 + 12 * x, queue=4 * 6 * x)

    samples = [(1_000_000.0 + i * INTERVAL, ramp(i)) for i in range(120)]
    steps = simulate(samples, 4, config())
    batching = [s.batching for s in steps]

    assert batching == sorted(batching), "a rising load never returns a replica"
    assert all(b - a <= 1 for a, b in itertools.pairwise(batching)), "just above: one at a time"
    assert max(batching) == 3, "minStreamingReplicas=1 keeps one of 4 streaming"
    assert all(s.streaming >= 1 for s in steps)
    first_high = next(s.time for s in steps if s.decision.state.high_since is not None)
    first_flip = flips(steps)[0][0]
    assert first_flip - first_high == 30, "just above the threshold the whole 30 s window holds"
    times = [t for t, _, _ in flips(steps)]
    assert all(b - a >= 15 for a, b in itertools.pairwise(times)), "one step per window"
    assert steps[-1].decision.reason == pol.MAX_BATCHING_REACHED


def test_high_qps_without_a_queue_moves_only_the_first_replica() -> None:
    # 5 req/s per replica, served without a queue: one replica takes the batch work, the rest keep
    # streaming; a queue building in front of them moves more.
    calm = [load(20.0, queue=0.0)] * 20
    queued = [load(20.0, queue=24.0)] * 10
    samples = [(1_000_000.0 + i * INTERVAL, s) for i, s in enumerate(calm + queued)]
    steps = simulate(samples, 4, config())

    assert [s.batching for s in steps[:20]][-1] == 1
    assert steps[19].decision.reason == pol.KEEPING_UP
    assert "keep up" in steps[19].decision.message
    assert steps[-1].batching == 3


def test_the_further_above_the_threshold_the_shorter_the_wait_and_the_bigger_the_step() -> None:
    replicas = [pol.ReplicaState(f"r{i}", Mode.STREAMING) for i in range(8)]
    cfg = config(maxFlipsPerStep=8)
    started = pol.HysteresisState(high_since=1000.0)

    def after(seconds: float, queue_per_replica: float) -> pol.PolicyDecision:
        samples = load(0.0, queue=8 * queue_per_replica)
        return pol.decide(samples, replicas, started, cfg, ModePolicy.ADAPTIVE, 1000.0 + seconds)

    # Queue high is 4 per replica: at 4 the whole 30 s window, at 6 (1.5x) half of it, at 8 none.
    assert after(29, 4.0).reason == pol.STABILIZING
    assert len(after(30, 4.0).flips) == 1
    assert after(14, 6.0).reason == pol.STABILIZING
    assert len(after(15, 6.0).flips) == math.ceil(7 * 0.5), "half of the room of 7"
    assert len(after(0, 8.0).flips) == 7, "twice the threshold: every replica there is room for"
    assert len(after(0, 40.0).flips) == 7
    capped = pol.decide(
        load(0.0, queue=64), replicas, started, config(maxFlipsPerStep=2), ModePolicy.ADAPTIVE, 1000
    )
    assert len(capped.flips) == 2, "maxFlipsPerStep caps the step"


def test_fall_returns_one_replica_per_slow_window() -> None:
    # A peak with a queue in front of the streaming replicas, then quiet (0.5 req/s per replica).
    peak = [load(20.0, queue=24.0)] * 20
    quiet = [load(2.0)] * 200
    samples = [(1_000_000.0 + i * INTERVAL, s) for i, s in enumerate(peak + quiet)]
    steps = simulate(samples, 4, config())
    peak_end = steps[20].time
    returns = [(t, pod) for t, pod, mode in flips(steps) if mode is Mode.STREAMING]

    assert [s.batching for s in steps][19] == 3
    assert len(returns) == 3 and steps[-1].batching == 0
    assert returns[0][0] - peak_end == 300, "the first return waits the whole 300 s window"
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(returns)]
    assert gaps == [300, 300], "each further return needs another full window"


def test_max_flips_per_step_moves_several_at_once() -> None:
    samples = [(1_000_000.0 + i * INTERVAL, load(40.0, queue=80.0)) for i in range(10)]
    steps = simulate(samples, 8, config(maxFlipsPerStep=3, minStreamingReplicas=2))
    per_step = [len(s.decision.flips) for s in steps if s.decision.flips]
    assert per_step == [3, 3], "3, 3, then the cap of 8 - 2 = 6 batching"
    assert steps[-1].batching == 6


# -- no flapping -----------------------------------------------------------------------------


def test_noise_around_the_high_threshold_never_flips_without_persistence() -> None:
    # QPS per replica alternates 3.05 / 2.95 around high=3.0: never high for 30 s in a row.
    values = [4 * (3.05 if i % 2 == 0 else 2.95) for i in range(400)]
    steps = simulate(trace(values), 4, config())
    assert flips(steps) == []


def test_noise_inside_the_band_never_flips() -> None:
    rng = random.Random(7)
    values = [4 * (2.25 + rng.uniform(-0.7, 0.7)) for _ in range(2000)]  # 1.55 .. 2.95 per replica
    steps = simulate(trace(values), 4, config())
    assert flips(steps) == []
    assert {s.decision.reason for s in steps} == {pol.WITHIN_BAND}


def test_noise_spanning_both_thresholds_respects_cooldown_per_replica() -> None:
    rng = random.Random(11)
    values = [4 * rng.choice([0.5, 3.5]) * rng.uniform(0.9, 1.1) for _ in range(3000)]
    cfg = config(toBatchingStabilizationSeconds=0, toStreamingStabilizationSeconds=0)
    steps = simulate(trace(values), 4, cfg)
    summary = summarize(steps, cfg)
    assert summary.flips > 0
    assert summary.cooldown_violations == 0
    last: dict[str, float] = {}
    for t, pod, _ in flips(steps):
        assert pod not in last or t - last[pod] >= 120
        last[pod] = t


# -- missing data ----------------------------------------------------------------------------


@pytest.mark.parametrize("gap", [None, math.nan, math.inf])
def test_missing_data_holds_and_restarts_the_window(gap: float | None) -> None:
    # 3.25 req/s per replica: just above the threshold, so the whole 30 s window applies.
    values: list[float | None] = [13.0, 13.0] + [gap] * 10 + [13.0] * 4
    steps = simulate(trace(values), 4, config())
    held = steps[2:12]
    assert all(s.decision.reason == pol.METRICS_UNAVAILABLE and not s.decision.flips for s in held)
    assert all(s.decision.state.high_since is None for s in held)
    # Back at index 12: high again from there, so the first flip is 30 s later, at index 14.
    assert [i for i, s in enumerate(steps) if s.decision.flips] == [14]


def test_missing_queue_holds_but_missing_gpu_memory_does_not() -> None:
    replicas = [pol.ReplicaState(f"r{i}", Mode.STREAMING) for i in range(2)]
    cfg = config(toBatchingStabilizationSeconds=0)
    no_queue = pol.decide(
        load(20, queue=None), replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0
    )
    assert no_queue.reason == pol.METRICS_UNAVAILABLE and not no_queue.flips
    no_gpu = pol.decide(
        load(20, gpu=None), replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0
    )
    assert no_gpu.reason == pol.QPS_ABOVE_HIGH and len(no_gpu.flips) == 1
    assert "gpu memory n/a" in no_gpu.message


def test_samples_none_holds() -> None:
    replicas = [pol.ReplicaState("r0", Mode.BATCHING), pol.ReplicaState("r1", Mode.STREAMING)]
    decision = pol.decide(None, replicas, pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, 0)
    assert decision.reason == pol.METRICS_UNAVAILABLE
    assert decision.flips == () and decision.from_batching == decision.to_batching == 1


# -- signals, reasons, messages ---------------------------------------------------------------


def test_each_signal_has_its_reason_and_the_message_carries_values() -> None:
    replicas = [pol.ReplicaState(f"r{i}", Mode.STREAMING) for i in range(2)]
    cfg = config(toBatchingStabilizationSeconds=0)
    cases = {
        pol.QPS_ABOVE_HIGH: load(6.2),
        pol.GPU_MEMORY_ABOVE_HIGH: load(1.0, gpu=99.0),
        pol.QUEUE_ABOVE_HIGH: load(1.0, queue=9.0),
    }
    for reason, samples in cases.items():
        decision = pol.decide(samples, replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0)
        assert decision.reason == reason
        assert decision.flips == (pol.Flip("r0", Mode.STREAMING, Mode.BATCHING),)
    decision = pol.decide(load(6.2), replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0)
    assert "qps 6.20 (3.10/replica over 2, high 3, low 1.5)" in decision.message
    assert decision.metrics.qps == "6.200" and decision.metrics.qps_per_replica == "3.100"
    assert "flipping r0 to batching" in decision.message


def test_low_needs_every_signal_low() -> None:
    replicas = [pol.ReplicaState("r0", Mode.STREAMING), pol.ReplicaState("r1", Mode.BATCHING)]
    cfg = config(toStreamingStabilizationSeconds=0, minStreamingReplicas=0)
    busy_gpu = pol.decide(
        load(0.5, gpu=96.5), replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0
    )
    assert busy_gpu.reason == pol.WITHIN_BAND
    quiet = pol.decide(
        load(0.5, gpu=60), replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0
    )
    assert quiet.reason == pol.LOAD_BELOW_LOW
    assert quiet.flips == (pol.Flip("r1", Mode.BATCHING, Mode.STREAMING),)


def test_per_replica_figures_divide_by_reporting_pods() -> None:
    replicas = [pol.ReplicaState(f"r{i}", Mode.STREAMING) for i in range(4)]
    cfg = config(toBatchingStabilizationSeconds=0)
    # 8 req/s over 4 ready pods is 2/replica (band), but only 2 pods report: 4/replica (high).
    samples = pol.Samples(qps=8.0, queue_depth=0.0, reporting_replicas=2)
    decision = pol.decide(samples, replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0)
    assert decision.reason == pol.QPS_ABOVE_HIGH
    unscoped = pol.decide(load(8.0), replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0)
    assert unscoped.reason == pol.WITHIN_BAND


def test_not_ready_replicas_are_never_flipped() -> None:
    replicas = [
        pol.ReplicaState("a", Mode.STREAMING, ready=False),
        pol.ReplicaState("b", Mode.STREAMING),
        pol.ReplicaState("c", Mode.STREAMING),
    ]
    cfg = config(toBatchingStabilizationSeconds=0, maxFlipsPerStep=5)
    decision = pol.decide(load(30), replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0)
    assert [f.pod for f in decision.flips] == ["b"], "2 ready, 1 kept streaming"
    nobody = [pol.ReplicaState("a", Mode.STREAMING, ready=False)]
    assert (
        pol.decide(load(30), nobody, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0).reason
        == pol.NO_READY_REPLICAS
    )


# -- cooldown and ordering -------------------------------------------------------------------


def test_cooldown_blocks_a_return_until_it_expires() -> None:
    cfg = config(
        toBatchingStabilizationSeconds=0, toStreamingStabilizationSeconds=0, minStreamingReplicas=0
    )
    values = [10.0] + [0.5] * 12  # high once, then low at once
    steps = simulate(trace(values), 1, cfg)
    assert steps[0].decision.flips and steps[0].batching == 1
    cooling = [s.decision.reason for s in steps[1:8]]
    assert cooling == [pol.COOLDOWN] * 7, "0 < 15 s .. 105 s < 120 s"
    assert "next one free in 105s" in steps[1].decision.message
    assert steps[8].decision.flips and steps[8].time - steps[0].time == 120


def test_oldest_flip_goes_first() -> None:
    history = pol.HysteresisState(
        last_flips={"a": (100.0, Mode.STREAMING), "b": (50.0, Mode.STREAMING)}
    )
    replicas = [pol.ReplicaState(n, Mode.STREAMING) for n in ("a", "b", "c", "d")]
    cfg = config(toBatchingStabilizationSeconds=0, maxFlipsPerStep=2, cooldownSeconds=10)
    overloaded = load(40, queue=40)  # twice the queue threshold: a step of maxFlipsPerStep
    decision = pol.decide(overloaded, replicas, history, cfg, ModePolicy.ADAPTIVE, 1000)
    assert [f.pod for f in decision.flips] == ["c", "d"], "never flipped first"
    history = pol.HysteresisState(
        last_flips={
            n: (t, Mode.STREAMING) for n, t in (("a", 100.0), ("b", 50.0), ("c", 70.0), ("d", 90.0))
        }
    )
    decision = pol.decide(overloaded, replicas, history, cfg, ModePolicy.ADAPTIVE, 1000)
    assert [f.pod for f in decision.flips] == ["b", "c"]
    assert decision.state.last_flips["b"] == (1000, Mode.BATCHING)


# -- floors and pins -------------------------------------------------------------------------


def test_min_streaming_floor_is_restored_whatever_the_load() -> None:
    replicas = [pol.ReplicaState(f"r{i}", Mode.BATCHING) for i in range(3)]
    cfg = config(minStreamingReplicas=1)
    decision = pol.decide(load(60), replicas, pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, 0)
    assert decision.reason == pol.MIN_STREAMING_REPLICAS
    assert decision.flips == (pol.Flip("r0", Mode.BATCHING, Mode.STREAMING),)
    assert decision.to_batching == 2


@pytest.mark.parametrize(
    ("mode_policy", "target", "reason"),
    [
        (ModePolicy.STREAMING, Mode.STREAMING, pol.PINNED_STREAMING),
        (ModePolicy.BATCHING, Mode.BATCHING, pol.PINNED_BATCHING),
    ],
)
def test_pinned_policies_move_every_ready_replica_whatever_the_metrics(
    mode_policy: ModePolicy, target: Mode, reason: str
) -> None:
    replicas = [
        pol.ReplicaState("a", Mode.STREAMING),
        pol.ReplicaState("b", Mode.BATCHING),
        pol.ReplicaState("c", None),
        pol.ReplicaState("d", Mode.STREAMING, ready=False),
    ]
    history = pol.HysteresisState(
        last_flips={"a": (999.0, Mode.STREAMING), "b": (999.0, Mode.BATCHING)}
    )
    decision = pol.decide(None, replicas, history, config(), mode_policy, 1000)
    assert decision.reason == reason
    expected = {r.name for r in replicas if r.ready and r.effective_mode is not target}
    assert {f.pod for f in decision.flips} == expected, "cooldown does not hold a pin back"
    assert all(f.to_mode is target for f in decision.flips)
    again = simulate([(0.0, load(None)), (15.0, load(None))], ["a", "b"], config(), mode_policy)
    assert again[1].decision.flips == (), "a pinned fleet stays put"


# -- state survives restarts -----------------------------------------------------------------


def test_loop_state_round_trips_through_status_json() -> None:
    state = pol.HysteresisState(
        high_since=1_700_000_000.125,
        low_since=None,
        last_flips={
            "pod-a": (1_700_000_100.5, Mode.BATCHING),
            "pod-b": (1_699_999_000.0, Mode.STREAMING),
        },
    )
    stored = json.loads(json.dumps(state.to_status().model_dump(by_alias=True, exclude_none=True)))
    assert stored["highSince"] == "2023-11-14T22:13:20.125Z"
    assert stored["lastFlips"][0] == {
        "pod": "pod-a",
        "time": "2023-11-14T22:15:00.500Z",
        "mode": "batching",
    }
    assert pol.HysteresisState.from_status(stored) == state
    assert pol.HysteresisState.from_status(AdaptiveState.model_validate(stored)) == state
    assert pol.HysteresisState.from_status(None) == pol.HysteresisState()


def test_a_restart_mid_window_and_mid_cooldown_changes_nothing() -> None:
    cfg = config()
    values = [20.0] * 40 + [1.0] * 60
    straight = simulate(trace(values), 4, cfg)
    rows = trace(values)
    restarted: list[Step] = []
    # Cut the run every 7 passes; each piece starts from modes and state as status persisted them.
    modes = ["replica-0", "replica-1", "replica-2", "replica-3"]
    state = pol.HysteresisState()
    current = dict.fromkeys(modes, Mode.STREAMING)
    for start in range(0, len(rows), 7):
        stored = json.loads(json.dumps(state.to_status().model_dump(by_alias=True)))
        state = pol.HysteresisState.from_status(stored)
        for t, samples in rows[start : start + 7]:
            replicas = [pol.ReplicaState(n, current[n]) for n in modes]
            decision = pol.decide(samples, replicas, state, cfg, ModePolicy.ADAPTIVE, t)
            for f in decision.flips:
                current[f.pod] = f.to_mode
            state = decision.state
            batching = sum(1 for m in current.values() if m is Mode.BATCHING)
            restarted.append(Step(t, samples, decision, 4 - batching, batching))
    assert flips(restarted) == flips(straight)


def test_unreadable_stored_state_is_rejected_field_by_field() -> None:
    stored = {
        "highSince": "not a time",
        "lastFlips": [{"pod": "a", "time": "x", "mode": "batching"}],
    }
    assert pol.HysteresisState.from_status(stored) == pol.HysteresisState()


# -- invariants over arbitrary traces --------------------------------------------------------

samples_strategy = st.builds(
    pol.Samples,
    qps=st.one_of(st.none(), st.just(math.nan), st.floats(0, 80)),
    gpu_memory_percent=st.one_of(st.none(), st.floats(0, 100)),
    queue_depth=st.one_of(st.none(), st.floats(0, 200)),
)


@settings(max_examples=150, deadline=None)
@given(
    series=st.lists(samples_strategy, min_size=1, max_size=60),
    replicas=st.integers(1, 6),
    min_streaming=st.integers(0, 3),
    max_flips=st.integers(1, 3),
    cooldown=st.sampled_from([0, 30, 120]),
)
def test_invariants_hold_on_any_trace(
    series: list[pol.Samples], replicas: int, min_streaming: int, max_flips: int, cooldown: int
) -> None:
    cfg = config(
        minStreamingReplicas=min(min_streaming, replicas),
        maxFlipsPerStep=max_flips,
        cooldownSeconds=cooldown,
        toBatchingStabilizationSeconds=15,
        toStreamingStabilizationSeconds=30,
    )
    steps = simulate([(i * INTERVAL, s) for i, s in enumerate(series)], replicas, cfg)
    last: dict[str, float] = {}
    for step in steps:
        decision = step.decision
        assert len(decision.flips) <= max_flips
        assert step.streaming >= cfg.min_streaming_replicas
        assert decision.to_batching == step.batching
        if step.samples.qps is None or not math.isfinite(step.samples.qps):
            assert not decision.flips
        if step.samples.queue_depth is None:
            assert not decision.flips
        for f in decision.flips:
            assert f.pod not in last or step.time - last[f.pod] >= cooldown
            last[f.pod] = step.time
