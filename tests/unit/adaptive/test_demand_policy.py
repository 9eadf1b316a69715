"""The demand-sized policy: the split each demand wants, learned capacity, cold start, and the
windows, cooldown and maxFlipsPerStep it keeps (policy.decide with per-class demand)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import capacity
from autoglm_operator.adaptive import demand as dm
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.replay import read_trace, simulate
from autoglm_operator.resource.spec import AdaptiveSettings, ModePolicy, ServiceLevelObjectives

T0 = 1_000_000.0
SEEDS = {Mode.STREAMING: 4.1, Mode.BATCHING: 11.5}  # the CRD's capacity seeds


def config(**overrides: object) -> AdaptiveSettings:
    return AdaptiveSettings.model_validate(overrides)


def demand(chat: float, other: float, **measured: float) -> pol.Samples:
    return pol.Samples(
        qps=chat + other, queue_depth=0.0, chat_rate=chat, other_rate=other, **measured
    )


def fleet(batching: int, replicas: int = 4) -> list[pol.ReplicaState]:
    return [
        pol.ReplicaState(f"pod-{i}", Mode.BATCHING if i < batching else Mode.STREAMING)
        for i in range(replicas)
    ]


def best(chat: float, other: float, current: int, slo: ServiceLevelObjectives | None = None) -> int:
    _, split = dm.best_split(
        current, 4, 3, dm.Demand(chat, other), SEEDS, slo or ServiceLevelObjectives(), 64
    )
    return split.batching


# -- demand -> split ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chat", "other", "current", "wanted", "why"),
    [
        (2.0, 2.0, 0, 0, "light load fits any split: stay"),
        (2.0, 2.0, 2, 0, "light load fits any split: batching that does not pay goes back"),
        (0.0, 0.0, 1, 0, "no traffic: every replica streaming, ready for the first chat"),
        (10.0, 10.0, 1, 1, "a mixed peak: the batching replica pays, it stays"),
        (17.0, 17.0, 0, 2, "overload of both: two and two, each mode sheds what it cannot serve"),
        (12.0, 12.0, 0, 1, "a flash crowd of both: chats fill three streaming replicas"),
        (1.0, 30.0, 0, 3, "batch-heavy: every replica but the floor batching"),
        (14.0, 0.5, 2, 0, "a chat crowd on a batch pool: give every replica back to chats"),
        (10.0, 10.0, 3, 1, "chats beyond one streaming replica: return two"),
        (6.0, 6.0, 0, 0, "both fit the streaming replicas with room: no batching needed"),
    ],
)
def test_the_split_each_demand_wants(
    chat: float, other: float, current: int, wanted: int, why: str
) -> None:
    assert best(chat, other, current) == wanted, why


def test_min_streaming_replicas_bounds_the_search() -> None:
    _, split = dm.best_split(0, 4, 2, dm.Demand(1.0, 30.0), SEEDS, ServiceLevelObjectives(), 64)
    assert split.batching == 2  # minStreamingReplicas 2 of 4


def test_a_batch_deadline_shorter_than_a_full_batching_replica_counts_its_jobs_lost() -> None:
    # 2 of 4 batching; 14.2 chats/s overflow the streaming replicas (8.2/s) by 6, which fill
    # the batching replicas' free room (23 - 17) to their cap: 64 requests at 11.5/s, ~5.6 s
    # each. Within a 30 s deadline the batch jobs are served; within 5 s they are not.
    crowd = dm.Demand(14.2, 17.0)
    assert dm.expected_goodput(2, 4, crowd, 4.1, 11.5, batch_ok_at_cap=True) == pytest.approx(25.2)
    assert dm.expected_goodput(2, 4, crowd, 4.1, 11.5, batch_ok_at_cap=False) == pytest.approx(8.2)
    loose = ServiceLevelObjectives()
    tight = ServiceLevelObjectives(batch_completion_seconds=5)
    now_loose, _ = dm.best_split(2, 4, 3, crowd, SEEDS, loose, 64)
    now_tight, _ = dm.best_split(2, 4, 3, crowd, SEEDS, tight, 64)
    assert now_tight.goodput < now_loose.goodput  # the SLO decides what the split is worth


def test_overload_is_shed_not_queued_so_each_mode_serves_its_capacity() -> None:
    # Steady overload (17 + 17 req/s): the router answers chats past the streaming replicas'
    # caps with 429 and sheds batch jobs past twice the batching caps, so no queue makes a
    # whole class late: each mode serves what its replicas can, in time.
    overload = dm.Demand(17.0, 17.0)
    assert dm.expected_goodput(1, 4, overload, 4.1, 11.5, True) == pytest.approx(12.3 + 11.5)
    assert dm.expected_goodput(2, 4, overload, 4.1, 11.5, True) == pytest.approx(8.2 + 17.0)
    assert dm.expected_goodput(3, 4, overload, 4.1, 11.5, True) == pytest.approx(4.1 + 17.0)
    assert dm.expected_goodput(0, 4, overload, 4.1, 11.5, True) == pytest.approx(16.4)
    # Batch jobs past the batching replicas take free streaming room first.
    jobs_heavy = dm.Demand(2.0, 20.0)
    assert dm.expected_goodput(1, 4, jobs_heavy, 4.1, 11.5, True) == pytest.approx(2.0 + 20.0)
    assert dm.expected_goodput(1, 4, dm.Demand(2.0, 30.0), 4.1, 11.5, True) == pytest.approx(
        2.0 + 11.5 + 10.3
    )
    assert best(17.0, 17.0, 3) == 2  # measured best fixed split on steady overload: 2 batching


# -- decide: cold start, windows, cooldown, flips per step -----------------------------------


def test_cold_start_uses_the_seeds_and_says_so() -> None:
    decision = pol.decide(
        demand(17.0, 17.0), fleet(0), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0
    )
    assert "(seeds)" in decision.message
    assert "streaming serves 4.10/s, batching 11.50/s" in decision.message
    assert decision.state.capacity is None  # nothing measured: status keeps no capacity


def test_overload_flips_at_once_up_to_max_flips_per_step() -> None:
    # From all streaming, 4 chats/s and 40 jobs/s: the best split (3 batching) serves over
    # twice the current one, so no window applies; maxFlipsPerStep 2 moves two now, the third
    # once the (shorter: a smaller gain) window has passed.
    cfg = config(maxFlipsPerStep=2)
    first = pol.decide(
        demand(4.0, 40.0), fleet(0), pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, T0
    )
    assert first.reason == pol.DEMAND_NEEDS_BATCHING
    assert [f.to_mode for f in first.flips] == [Mode.BATCHING] * 2
    steps = simulate([(T0 + 15 * i, demand(4.0, 40.0)) for i in range(4)], 4, cfg)
    assert [s.batching for s in steps] == [2, 2, 3, 3]


def test_a_small_gain_waits_the_full_window_and_cooldown_holds() -> None:
    # 12 + 12 req/s on 1 batching replica: 2 batching serves more, but not twice as much:
    # the to-batching window (30 s) runs most of its length before the flip.
    cfg = config(toBatchingStabilizationSeconds=60)
    rows = [(T0 + 15 * i, demand(12.0, 12.0)) for i in range(8)]
    steps = simulate(rows, ["pod-0", "pod-1", "pod-2", "pod-3"], cfg)
    reasons = [s.decision.reason for s in steps]
    assert reasons[0] == pol.STABILIZING
    first_flip = next(i for i, s in enumerate(steps) if s.decision.flips)
    assert first_flip >= 1
    assert all(s.decision.reason != pol.DEMAND_NEEDS_STREAMING for s in steps)


def test_returning_replicas_waits_the_to_streaming_window_then_flips_the_oldest() -> None:
    # 3 batching; the demand becomes chat-heavy (10 + 10): 1 batching serves 19.98/s, the
    # current split 14.10/s. A gain of 1.42x shortens the 300 s to-streaming window to
    # 300 x (2 - 1.42) = 175 s; then one step returns both replicas the best split frees,
    # the ones that flipped longest ago (never) first: not pod-0, which flipped a minute ago.
    state = pol.HysteresisState(last_flips={"pod-0": (T0 - 60, Mode.BATCHING)})
    waited = []
    for i in range(30):
        d = pol.decide(demand(10, 10), fleet(3), state, config(), ModePolicy.ADAPTIVE, T0 + 15 * i)
        state = d.state
        if d.flips:
            break
        assert d.reason == pol.STABILIZING and "of 175s before a flip" in d.message
        waited.append(15 * i)
    assert d.reason == pol.DEMAND_NEEDS_STREAMING
    assert max(waited) == 165  # the first pass past 175 s flips
    assert [(f.pod, f.to_mode) for f in d.flips] == [
        ("pod-1", Mode.STREAMING),
        ("pod-2", Mode.STREAMING),
    ]


def test_cooldown_holds_a_wanted_split() -> None:
    # The window has passed, but every batching replica flipped within cooldownSeconds (120).
    flipped = {f"pod-{i}": (T0 - 100, Mode.BATCHING) for i in range(3)}
    state = pol.HysteresisState(low_since=T0 - 400, last_flips=flipped)
    held = pol.decide(demand(10, 10), fleet(3), state, config(), ModePolicy.ADAPTIVE, T0)
    assert held.reason == pol.COOLDOWN and not held.flips
    assert "next one free in 20s" in held.message
    later = pol.decide(demand(10, 10), fleet(3), held.state, config(), ModePolicy.ADAPTIVE, T0 + 20)
    assert later.reason == pol.DEMAND_NEEDS_STREAMING and len(later.flips) == 2


def test_noise_around_a_boundary_does_not_flap() -> None:
    # Demand wandering 10% around 6 + 6 req/s (fits all streaming with room): never a flip.
    rows = [(T0 + 15 * i, demand(6.0 * (1 + 0.1 * (-1) ** i), 6.0)) for i in range(80)]
    steps = simulate(rows, 4, config())
    assert sum(len(s.decision.flips) for s in steps) == 0


def test_dry_run_and_pause_are_the_loops_not_the_policys() -> None:
    # The policy decides the same with dryRun (adaptive.py applies nothing): decide ignores it.
    a = pol.decide(
        demand(17, 17), fleet(0), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0
    )
    b = pol.decide(
        demand(17, 17),
        fleet(0),
        pol.HysteresisState(),
        config(dryRun=True),
        ModePolicy.ADAPTIVE,
        T0,
    )
    assert a.flips == b.flips


def test_without_class_demand_the_threshold_rules_decide() -> None:
    # A runtime without autoglm_requests_received_total (or an old replay trace): QPS alone.
    samples = pol.Samples(qps=40.0, queue_depth=0.0, gpu_memory_percent=50.0)
    d = pol.decide(samples, fleet(0), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0)
    assert d.reason == pol.QPS_ABOVE_HIGH


def test_old_and_new_replay_traces() -> None:
    import io

    old = "timestamp,qps,queue\n0,40,0\n15,40,0\n30,40,0\n"
    new = "timestamp,qps,queue,chat_rate,other_rate\n" + "".join(
        f"{t},34,0,17,17\n" for t in (0, 15, 30)
    )
    old_steps = simulate(read_trace(io.StringIO(old)), 4, config())
    new_steps = simulate(read_trace(io.StringIO(new)), 4, config())
    assert old_steps[0].decision.reason == pol.QPS_ABOVE_HIGH  # the threshold rules
    assert new_steps[0].decision.message.startswith("demand 17.00 chats/s")  # sized by demand
    assert new_steps[-1].decision.reason == pol.DEMAND_NEEDS_BATCHING
    assert new_steps[-1].batching == 2


# -- learned capacity --------------------------------------------------------------------------


def test_saturated_mode_teaches_its_capacity() -> None:
    # Three batching replicas hold 3 x 64 requests (saturated) and complete 27 req/s: 9 per
    # replica, below the 11.5 seed: the estimate moves a quarter of the way there.
    samples = demand(1.0, 30.0, batching_completions=27.0, batching_busy=192.0)
    d = pol.decide(samples, fleet(3), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0)
    assert d.state.capacity is not None
    assert d.state.capacity.batching == pytest.approx(11.5 + 0.25 * (9.0 - 11.5))
    assert d.state.capacity.streaming == pytest.approx(4.1)
    assert "(learned)" in d.message


def test_an_unsaturated_mode_that_delivers_more_raises_its_estimate() -> None:
    samples = demand(6.0, 0.0, streaming_completions=18.0, streaming_busy=10.0)
    d = pol.decide(samples, fleet(0), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0)
    assert d.state.capacity is not None
    assert d.state.capacity.streaming == pytest.approx(4.5)  # 18 / 4 replicas


def test_idle_modes_and_recent_flips_teach_nothing() -> None:
    idle = demand(1.0, 1.0, streaming_completions=1.0, streaming_busy=1.0)
    d = pol.decide(idle, fleet(0), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0)
    assert d.state.capacity is None
    saturated = demand(1.0, 30.0, batching_completions=27.0, batching_busy=192.0)
    recent = pol.HysteresisState(last_flips={"pod-0": (T0 - 30, Mode.BATCHING)})
    d = pol.decide(saturated, fleet(3), recent, config(), ModePolicy.ADAPTIVE, T0)
    assert d.state.capacity is None  # the [1m] rates still count pod-0 under its old mode


def _learn(**share: float | None) -> dict[Mode, float]:
    """Both modes saturated, each completing twice its seed per replica (2 of 4 batching)."""
    return capacity.learn(
        SEEDS,
        SEEDS,
        {Mode.STREAMING: 2 * 4.1 * 2, Mode.BATCHING: 2 * 11.5 * 2},
        {Mode.STREAMING: 2 * 8.0, Mode.BATCHING: 2 * 64.0},
        {Mode.STREAMING: 2, Mode.BATCHING: 2},
        {Mode.STREAMING: 8, Mode.BATCHING: 64},
        {Mode.STREAMING: share.get("streaming"), Mode.BATCHING: share.get("batching")},
    )


def test_a_mode_that_served_the_other_class_learns_nothing() -> None:
    # Streaming replicas whose completions are a third short batch jobs: twice the seed, but
    # not what they serve of chats. The batching replicas served their own class: they learn.
    mixed = _learn(streaming=2 / 3, batching=0.97)
    assert mixed[Mode.STREAMING] == pytest.approx(4.1)
    assert mixed[Mode.BATCHING] == pytest.approx(11.5 + 0.25 * 11.5)
    chats_spilled = _learn(streaming=1.0, batching=0.5)
    assert chats_spilled[Mode.BATCHING] == pytest.approx(11.5)
    assert chats_spilled[Mode.STREAMING] == pytest.approx(4.1 + 0.25 * 4.1)


def test_the_own_class_share_is_a_bound_and_unknown_learns_as_before() -> None:
    at_bound = _learn(streaming=capacity.OWN_CLASS_SHARE, batching=capacity.OWN_CLASS_SHARE - 0.001)
    assert at_bound[Mode.STREAMING] == pytest.approx(4.1 * 1.25)
    assert at_bound[Mode.BATCHING] == pytest.approx(11.5)
    unknown = _learn()  # a runtime without the counter, a trace without the columns
    assert unknown == {Mode.STREAMING: pytest.approx(4.1 * 1.25), Mode.BATCHING: 11.5 * 1.25}


def test_a_saturated_mode_with_every_replica_may_lower_its_estimate_from_a_mix() -> None:
    # Every replica streams and batch jobs fill them: the model sizes both classes with the
    # streaming capacity here, and a seed above what they deliver must come down, or a batch
    # overload would never move a replica. Never up: short jobs must not double it.
    def alone(delivered: float, share: float, busy: float = 4 * 8.0) -> float:
        return capacity.learn(
            SEEDS,
            SEEDS,
            {Mode.STREAMING: 4 * delivered, Mode.BATCHING: None},
            {Mode.STREAMING: busy, Mode.BATCHING: None},
            {Mode.STREAMING: 4, Mode.BATCHING: 0},
            {Mode.STREAMING: 8, Mode.BATCHING: 64},
            {Mode.STREAMING: share, Mode.BATCHING: None},
        )[Mode.STREAMING]

    assert alone(1.9, 0.0) == pytest.approx(4.1 + 0.25 * (1.9 - 4.1))
    assert alone(8.2, 0.0) == pytest.approx(4.1)
    assert alone(1.9, 0.0, busy=4 * 4.0) == pytest.approx(4.1), "not saturated: nothing"
    # With a batching replica beside them the mix is spill: nothing learned either way.
    mixed = _learn(streaming=0.0, batching=1.0)
    assert mixed[Mode.STREAMING] == pytest.approx(4.1)


def test_spilled_batch_jobs_do_not_raise_the_streaming_capacity() -> None:
    # The live run: 1 of 4 batching, batch jobs spilled onto the 3 streaming replicas, which
    # complete 2 x 4.1 per replica while full. Unchecked, the loop learned that streaming
    # serves twice its seed and sized the split for it.
    spilled = demand(
        12.0,
        30.0,
        streaming_completions=3 * 8.2,
        streaming_busy=3 * 8.0,
        streaming_own_share=0.45,
    )
    d = pol.decide(spilled, fleet(1), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0)
    assert d.state.capacity is None
    assert "(seeds)" in d.message
    own = replace(spilled, streaming_own_share=0.95)
    d = pol.decide(own, fleet(1), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0)
    assert d.state.capacity is not None
    assert d.state.capacity.streaming == pytest.approx(4.1 + 0.25 * (8.2 - 4.1))


def test_replay_reads_the_own_class_shares() -> None:
    import io

    header = "timestamp,qps,queue,chat_rate,other_rate,streaming_completions,streaming_busy"
    rows = "0,42,0,12,30,24.6,24"
    mixed = simulate(
        read_trace(io.StringIO(f"{header},streaming_own_share\n{rows},0.45\n")), 4, config()
    )
    assert mixed[0].samples.streaming_own_share == 0.45
    assert mixed[0].decision.state.capacity is None
    old = simulate(read_trace(io.StringIO(f"{header}\n{rows}\n")), 4, config())
    assert old[0].samples.streaming_own_share is None
    capacity = old[0].decision.state.capacity
    assert capacity is not None and capacity.streaming > 4.1  # unknown share: learned as before


def test_learned_capacity_survives_a_restart_through_status() -> None:
    samples = demand(1.0, 30.0, batching_completions=27.0, batching_busy=192.0)
    d = pol.decide(samples, fleet(3), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0)
    stored = d.state.to_status().model_dump(by_alias=True, exclude_none=True)
    assert stored["capacity"] == {"streamingMilli": 4100, "batchingMilli": 10875}
    restored = pol.HysteresisState.from_status(stored)
    assert restored.capacity == d.state.capacity
    again = pol.decide(demand(1.0, 30.0), fleet(3), restored, config(), ModePolicy.ADAPTIVE, T0)
    assert again.state.capacity == d.state.capacity
    assert "batching 10.88/s (learned)" in again.message


def test_learned_capacity_stays_within_a_factor_of_the_seed() -> None:
    stuck = demand(1.0, 30.0, batching_completions=0.0, batching_busy=192.0)
    state = pol.HysteresisState()
    for i in range(40):
        state = pol.decide(stuck, fleet(3), state, config(), ModePolicy.ADAPTIVE, T0 + 15 * i).state
    assert state.capacity is not None
    assert state.capacity.batching == pytest.approx(11.5 / capacity.CAPACITY_RANGE)


def test_pinned_policies_keep_the_learned_capacity() -> None:
    learned = pol.HysteresisState(capacity=pol.Capacity(4.0, 9.0))
    d = pol.decide(demand(1, 1), fleet(0), learned, config(), ModePolicy.STREAMING, T0)
    assert d.state.capacity == learned.capacity


def test_old_manifests_with_every_threshold_are_accepted() -> None:
    old = {
        "intervalSeconds": 15,
        "qpsPerReplicaMilli": {"high": 3000, "low": 1500},
        "gpuMemoryPercent": {"high": 98, "low": 95},
        "queueDepthPerReplica": {"high": 4, "low": 1},
        "toBatchingStabilizationSeconds": 30,
        "toStreamingStabilizationSeconds": 300,
        "cooldownSeconds": 120,
        "maxFlipsPerStep": 4,
        "minStreamingReplicas": 1,
    }
    settings = AdaptiveSettings.model_validate(old)
    assert settings.slo == ServiceLevelObjectives()  # defaults: 500 ms, 100 ms, 30 s
    assert settings.slo.chat_time_to_first_token_millis == 500


def test_a_change_under_two_percent_is_not_stored() -> None:
    # A saturated loop measures every pass; storing each wobble would write status each pass.
    stored = pol.HysteresisState(capacity=pol.Capacity(4.1, 9.0))
    near = demand(1.0, 30.0, batching_completions=3 * 9.2, batching_busy=192.0)
    d = pol.decide(near, fleet(3), stored, config(), ModePolicy.ADAPTIVE, T0)
    assert d.state.capacity == stored.capacity
    far = demand(1.0, 30.0, batching_completions=3 * 10.0, batching_busy=192.0)
    d = pol.decide(far, fleet(3), stored, config(), ModePolicy.ADAPTIVE, T0)
    assert d.state.capacity == pol.Capacity(4.1, 9.25)


def test_thresholds_set_away_from_defaults_are_accepted_with_a_warning() -> None:
    # An existing manifest with its own thresholds keeps working; while demand decides, the
    # decision message (status.lastDecision) says they are not read.
    cfg = config(qpsPerReplicaMilli={"high": 5000, "low": 2000})
    d = pol.decide(demand(2, 2), fleet(0), pol.HysteresisState(), cfg, ModePolicy.ADAPTIVE, T0)
    assert d.reason == pol.SPLIT_FITS_DEMAND
    assert "qpsPerReplicaMilli set, but read only without per-class demand" in d.message
    plain = pol.decide(
        demand(2, 2), fleet(0), pol.HysteresisState(), config(), ModePolicy.ADAPTIVE, T0
    )
    assert "without per-class demand" not in plain.message
