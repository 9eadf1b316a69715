"""The policy benchmark's simulator keeps honest books: fast checks of testkit.bench.policy_sim."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import numpy as np
import pytest

from testkit.bench import policy_sim
from testkit.bench import policy_traces as traces
from testkit.bench.policy_sim import BATCH, CHAT, Pool, Workload
from testkit.paths import load_script

bench = load_script("bench/policy_goodput.py")

from autoglm_api.profiles import Mode  # noqa: E402
from autoglm_router import routing  # noqa: E402


def _poisson(
    rate: float, seconds: float, kind_of: Callable[[int], int] = lambda i: CHAT, seed: int = 3
) -> list[tuple[float, int]]:
    rng = random.Random(seed)
    t, i = 0.0, 0
    out: list[tuple[float, int]] = []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append((t, kind_of(i)))
        i += 1


def _run(modes, arrivals, seconds, **kwargs):
    pool = Pool(modes, arrivals, **kwargs)
    pool.run_until(seconds)
    pool.drain(120)
    outcomes = pool.outcomes + [
        bench.Outcome(r.kind, r.arrival, -1.0, -1.0, False) for r in pool.pending()
    ]
    return pool, bench.summarize(outcomes, seconds, len(arrivals))


def test_light_load_streaming_pool_meets_every_slo() -> None:
    arrivals = _poisson(4.0, 120, kind_of=lambda i: CHAT if i % 2 else BATCH)
    _, r = _run([Mode.STREAMING] * 4, arrivals, 120)
    assert r["slo_attainment"] == 1.0
    assert r["rejected"] == 0
    assert r["goodput"] == pytest.approx(len(arrivals) / 120)
    # Calibration: the published streaming TTFT is ~0.32 s.
    assert 0.2 <= r["ttft_p50"] <= 0.36


def _capacity(modes, rate: float, **kwargs) -> float:
    """Requests per second a pool completes within a minute of open-loop arrivals at `rate`."""
    pool, _ = _run(modes, _poisson(rate, 60), 60, **kwargs)
    return len([o for o in pool.outcomes if o.e2e >= 0 and o.arrival + o.e2e <= 60]) / 60


def test_overloaded_streaming_pool_misses_and_sheds() -> None:
    # Far past what 4 streaming replicas serve of chats (one alone: ~9.5 req/s, streamed chats
    # running up to the engine's 64 sequences): the router sheds, most chats miss.
    arrivals = _poisson(80.0, 60)
    pool, r = _run([Mode.STREAMING] * 4, arrivals, 60)
    assert r["slo_attainment"] < 0.5
    assert r["rejected"] > 0
    # Never more than the replicas can serve, each measured alone.
    pool_done = [o for o in pool.outcomes if o.e2e >= 0 and o.arrival + o.e2e <= 60]
    assert len(pool_done) / 60 <= 4 * 1.1 * _capacity([Mode.STREAMING], 20.0)


def test_streaming_replica_capacity_matches_the_calibration() -> None:
    # One replica, chats only, open loop well above capacity, on an engine of 8 sequences (the
    # streaming cap, as a Rolling switch starts it): the published ~4.1 req/s, and every
    # arrival is accounted for exactly once.
    arrivals = _poisson(8.0, 60)
    env = policy_sim.EngineEnvelope(max_num_seqs=8)
    pool, r = _run([Mode.STREAMING], arrivals, 60, env=env)
    assert r["requests"] == len(arrivals)
    done_in_trace = [o for o in pool.outcomes if o.e2e >= 0 and o.arrival + o.e2e <= 60]
    assert 3.6 <= len(done_in_trace) / 60 <= 4.6
    # With the envelope's 64 sequences, streams first: chats run past the cap of 8.
    assert _capacity([Mode.STREAMING], 20.0) > 1.5 * len(done_in_trace) / 60


def test_batching_mode_trades_ttft_for_throughput() -> None:
    arrivals = _poisson(2.0, 120)
    _, stream = _run([Mode.STREAMING], arrivals, 120)
    _, batch = _run([Mode.BATCHING], arrivals, 120)
    assert batch["ttft_p50"] > stream["ttft_p50"]  # SSE coalescing, no stream priority
    heavy = _poisson(9.0, 60, kind_of=lambda i: BATCH)
    _, s = _run([Mode.STREAMING], heavy, 60)
    _, b = _run([Mode.BATCHING], heavy, 60)
    assert b["batch_attainment"] > s["batch_attainment"]


def test_adaptive_runs_the_operator_policy_and_flips_under_overload() -> None:
    r = bench.simulate("steady-overload", "adaptive", hours=0.1)
    assert r["flips"] >= 1
    # The bench feeds the policy each class's demand: it sizes the split, not thresholds.
    assert r["reasons"].get("DemandNeedsBatching", 0) >= 1
    assert r["max_flips_per_replica_per_cooldown"] <= 1
    low = bench.simulate("steady-low", "adaptive", hours=0.1)
    assert low["flips"] == 0 and low["slo_attainment"] > 0.99


def test_demand_meter_reads_what_the_default_promql_would() -> None:
    # rate(autoglm_requests_received_total{traffic_class}[1m]): arrivals per class in the last
    # minute; completions per mode over the same window, in flight plus queued per mode now.
    arrivals = [traces.Arrival(float(t), CHAT if t % 3 else BATCH) for t in range(120)]
    pool = Pool([Mode.STREAMING, Mode.BATCHING], arrivals, workload=bench.WORKLOAD)
    meter = bench.DemandMeter(arrivals)
    meter.read(pool, 60.0)
    pool.run_until(119.5)
    read = meter.read(pool, 119.5)
    in_window = [a for a in arrivals if 59.5 < a[0] <= 119.5]
    assert read["chat_rate"] == pytest.approx(sum(a[1] == CHAT for a in in_window) / 60)
    assert read["other_rate"] == pytest.approx(sum(a[1] == BATCH for a in in_window) / 60)
    done = pool.replicas[0].completed + pool.replicas[1].completed
    assert 0 < (read["streaming_completions"] + read["batching_completions"]) * 59.5 <= done
    busy = pool.replicas[1].inflight + pool.replicas[1].queued
    assert read["batching_busy"] == busy
    # Each class reached its own mode: every mode received only its own class.
    assert read["streaming_own_share"] == read["batching_own_share"] == 1.0


def test_demand_meter_shares_show_a_mode_serving_the_other_class() -> None:
    # No batching replica: batch jobs go to the streaming replicas, whose received requests
    # are then a third batch jobs; the batching mode received nothing (NaN in Prometheus).
    arrivals = [traces.Arrival(float(t), CHAT if t % 3 else BATCH) for t in range(120)]
    pool = Pool([Mode.STREAMING, Mode.STREAMING], arrivals, workload=bench.WORKLOAD)
    meter = bench.DemandMeter(arrivals)
    meter.read(pool, 60.0)
    pool.run_until(119.5)
    read = meter.read(pool, 119.5)
    # The first read saw the pool before it ran: the window holds every arrival up to 119.5.
    received = [a for a in arrivals if a[0] <= 119.5]
    chats = sum(a[1] == CHAT for a in received)
    assert read["streaming_own_share"] == pytest.approx(chats / len(received))
    assert read["batching_own_share"] is None


def test_traces_are_deterministic() -> None:
    trace = traces.TRACES["flash-crowd"]
    assert traces.arrivals(trace, 4, seed=5) == traces.arrivals(trace, 4, seed=5)


def test_routing_is_the_routers_own_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    decided: list[str] = []
    real_decide = routing.decide

    def spy(features, replicas, config, exclude=(), placed=None):
        route = real_decide(features, replicas, config, exclude, placed)
        decided.append(route.replica)
        return route

    monkeypatch.setattr(policy_sim.routing, "decide", spy)
    modes = [Mode.STREAMING, Mode.STREAMING, Mode.BATCHING, Mode.BATCHING]
    arrivals = _poisson(6.0, 60, kind_of=lambda i: CHAT if i % 2 else BATCH)
    placed: list[int] = []
    real_offer = Pool._offer

    def offer(self, replica, req, t):
        placed.append(replica.index)
        return real_offer(self, replica, req, t)

    monkeypatch.setattr(Pool, "_offer", offer)
    _run(modes, arrivals, 60)
    assert len(decided) == len(arrivals)
    assert [f"replica-{i}" for i in placed] == decided
    # The router's rule 1 at light load: chats on streaming replicas, batch jobs on batching.
    kinds = [k for _, k in arrivals]
    assert {placed[i] for i, k in enumerate(kinds) if k == CHAT} <= {0, 1}
    assert {placed[i] for i, k in enumerate(kinds) if k == BATCH} <= {2, 3}


def test_random_routing_ignores_modes_and_spreads_evenly(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("random routing must not use the router")

    monkeypatch.setattr(policy_sim.routing, "decide", fail)
    placed: list[int] = []
    real_offer = Pool._offer

    def offer(self, replica, req, t):
        placed.append(replica.index)
        return real_offer(self, replica, req, t)

    monkeypatch.setattr(Pool, "_offer", offer)
    arrivals = _poisson(8.0, 120)  # chats only: the router would keep them off batching
    _run([Mode.STREAMING, Mode.BATCHING] * 2, arrivals, 120, routing="random")
    assert len(placed) == len(arrivals)
    shares = [placed.count(i) / len(placed) for i in range(4)]
    assert all(0.2 <= share <= 0.3 for share in shares), shares
    with pytest.raises(ValueError, match="routing must be one of"):
        Pool([Mode.STREAMING], arrivals, routing="gateway")


def test_a_chat_that_streams_too_slowly_misses() -> None:
    arrivals = _poisson(1.0, 60)
    _, fine = _run([Mode.STREAMING], arrivals, 60)
    _, slow = _run([Mode.STREAMING], arrivals, 60, workload=Workload(chat_tpot_slo=0.005))
    assert fine["chat_attainment"] == 1.0
    assert slow["chat_attainment"] == 0.0  # first tokens in time, later ones too slow


def test_oracle_is_at_least_every_baseline_on_a_tiny_trace() -> None:
    results = [bench.simulate(*job) for job in bench.jobs_for(["flash-crowd"], [1], hours=0.2)]
    assert {r["policy"] for r in results} == set(bench.POLICIES)
    assert {r["routing"] for r in results if r["policy"] != "greedy"} == {"router", "random"}
    table = bench.aggregate(results, ["flash-crowd"])
    (cell,) = table["cells"]
    for p in (*bench.FIXED, "naive", "greedy"):
        assert cell["oracle"] >= cell["router"][p]
    assert table["allowed_fixed"] == ["fixed-0", "fixed-1", "fixed-2", "fixed-3"]
    assert cell["best_fixed"] in table["allowed_fixed"]
    verdicts = bench.check(table, ["flash-crowd"])
    oracle_check = verdicts[-1]
    assert oracle_check["target"].startswith("the oracle")
    assert (oracle_check["verdict"], oracle_check["met"]) == ("PASS", True)


def _cell(seed: int, router: dict[str, float], random: dict[str, float]) -> dict:
    allowed = ["fixed-0", "fixed-1", "fixed-2", "fixed-3"]
    best = max(allowed, key=lambda p: router[p])
    oracle = max(router[p] for p in (*bench.FIXED, "naive", "greedy"))
    return {
        "trace": "t",
        "seed": seed,
        "router": router,
        "random": random,
        "best_fixed": best,
        "best_fixed_goodput": router[best],
        "oracle": oracle,
        "oracle_from": best,
    }


def test_ties_are_printed_as_ties_and_never_pass_a_beats_target(capsys) -> None:
    # Adaptive's worst ratio is 1.0; fixed-3 sits exactly 10 points below (0.9): a tie.
    router = {
        "fixed-0": 10.0,
        "fixed-1": 5.0,
        "fixed-2": 4.0,
        "fixed-3": 9.0,
        "fixed-4": 1.0,
        "naive": 10.0,
        "adaptive": 10.0,
        "greedy": 10.0,
    }
    random = dict(router)
    table = {"cells": [_cell(1, router, random)], "allowed_fixed": bench.allowed_fixed()}
    verdicts = {v["target"]: v for v in bench.check(table, ["t"])}
    tie = verdicts["no static answer: adaptive's worst case beats fixed-3's by >= 10 points"]
    assert (tie["verdict"], tie["met"]) == ("TIE", False)
    naive = verdicts["no static answer: adaptive's worst case beats naive's by >= 10 points"]
    assert (naive["verdict"], naive["met"]) == ("FAIL", False)
    on_off = verdicts["t: router on >= off for adaptive"]
    assert (on_off["verdict"], on_off["met"]) == ("TIE", True)  # ">=": a tie meets it
    assert "TIE: no static answer: adaptive's worst case beats fixed-3's" in capsys.readouterr().out


def test_new_traces_change_mix_and_shapes() -> None:
    dump = traces.shaped_arrivals(traces.TRACES["batch-dump"], 4, seed=1)
    long_jobs = [a.time for a in dump if a.shape == traces.LONG]
    assert len(long_jobs) == traces.DUMP_JOBS and all(600 <= t < 610 for t in long_jobs)
    mixed = traces.shaped_arrivals(traces.TRACES["text-vs-screenshot"], 4, seed=1)
    first = {a.shape for a in mixed if a.kind == CHAT and a.time < 600}
    second = {a.shape for a in mixed if a.kind == CHAT and 600 <= a.time < 1200}
    assert (first, second) == ({traces.TEXT}, {traces.AGENT})
    day_night = traces.shaped_arrivals(traces.TRACES["day-night"], 4, seed=1)

    def chat_share(lo: float, hi: float) -> float:
        kinds = [a.kind for a in day_night if lo <= a.time < hi]
        return kinds.count(CHAT) / len(kinds)

    assert chat_share(1800, 5400) > 0.7 > 0.3 > chat_share(9000, 12600)


def test_agent_steps_fit_the_default_context() -> None:
    # The phone agent at maxModelLen 2048: six steps' history, screenshot and answer fit.
    agent = traces.AgentPrompt()
    assert agent.steps_that_fit(2048) == 6
    assert agent.prompt(5) + agent.answer <= 2048 < agent.prompt(6) + agent.answer
    # A later step sends again what came before the previous step's screenshot, never more.
    for step in range(1, 6):
        assert agent.shared_with_later_steps(step - 1) < agent.prompt(step) - agent.image


def test_chat_arrivals_become_agent_conversations_in_place() -> None:
    # Numbering moves no arrival and changes no class or shape: each trace's demand stays its own.
    raw = [traces.Arrival(t / 4, BATCH if t % 3 == 0 else CHAT,
                          traces.SCREENSHOT if t % 3 == 0 else traces.AGENT) for t in range(400)]
    numbered = traces.agent_steps(raw, np.random.default_rng(5))
    assert [a._replace(conversation=-1, step=0) for a in numbered] == raw
    assert {a.conversation for a in numbered if a.kind == BATCH} == {-1}
    shaped = traces.shaped_arrivals(traces.TRACES["noise"], 4, seed=5)
    steps: dict[int, list[traces.Arrival]] = {}
    for a in shaped:
        if a.shape == traces.AGENT:
            steps.setdefault(a.conversation, []).append(a)
    assert len(steps) > 100
    longest = traces.AgentPrompt().steps_that_fit(traces.DEFAULT_MAX_MODEL_LEN)
    for conversation in steps.values():
        assert [a.step for a in conversation] == list(range(len(conversation)))
        assert len(conversation) <= longest
        gaps = [b.time - a.time for a, b in itertools.pairwise(conversation)]
        assert all(gap >= traces.STEP_CYCLE_SECONDS for gap in gaps)
    # Conversations run their course (2-6 steps) but the trace's last ones are cut short.
    assert sum(len(c) >= 2 for c in steps.values()) > 0.9 * len(steps)


def _agent_conversation(conversation: int, start: float, steps: int) -> list[traces.Arrival]:
    return [traces.Arrival(start + 5.0 * k, CHAT, traces.AGENT, conversation, k)
            for k in range(steps)]


def test_a_later_step_prefills_only_what_its_replica_lacks() -> None:
    agent = traces.AgentPrompt()
    arrivals = sorted(_agent_conversation(0, 0.0, 3) + _agent_conversation(1, 2.0, 1))
    pool, r = _run([Mode.STREAMING], arrivals, 20, workload=bench.WORKLOAD)
    assert r["slo_attainment"] == 1.0
    replica = pool.replicas[0]

    def blocks(tokens: int) -> int:
        return tokens // 16 * 16

    # Conversation 0: nothing cached, then the system prompt, then the first step's text and
    # answer; conversation 1's first step finds only the system prompt.
    cached = [0, blocks(agent.system), blocks(agent.system),
              blocks(agent.shared_with_later_steps(1))]
    assert replica.cached_tokens == sum(cached)
    assert replica.prompt_tokens == sum(a.prompt(k) for a, k in ((agent, 0), (agent, 0),
                                                                  (agent, 1), (agent, 2)))


def _hit_ratios(session_ids: bool) -> dict[str, float]:
    """Prefix-cache hit ratios on 4 streaming replicas at light load: the router's, random
    routing's, and what only the system prompt or every later step at home would give."""
    chats = [traces.Arrival(t, CHAT, traces.AGENT) for t, _ in _poisson(3.0, 240, seed=8)]
    arrivals = traces.agent_steps(chats, np.random.default_rng(8))
    agent = traces.AgentPrompt()

    def share(cached: Callable[[int], int]) -> float:
        prompts = sum(agent.prompt(a.step) for a in arrivals)
        return sum(cached(a.step) // 16 * 16 for a in arrivals) / prompts

    out = {
        "system only": share(lambda step: agent.system),
        "at home": share(lambda step: agent.shared_with_later_steps(step - 1) if step
                         else agent.system),
    }
    for routing_name in policy_sim.ROUTINGS:
        pool, r = _run([Mode.STREAMING] * 4, arrivals, 240, workload=bench.WORKLOAD,
                       routing=routing_name, session_ids=session_ids)
        assert r["rejected"] == 0
        ratio = pool.prefix_cache_hit_ratio()
        assert ratio is not None
        out[routing_name] = ratio
    return out


@pytest.mark.parametrize("session_ids", [False, True], ids=["no-session-id", "session-id"])
def test_the_router_keeps_an_agent_task_where_its_history_is_cached(session_ids: bool) -> None:
    # Every replica caches the shared system prompt; only the replica a task's earlier steps
    # ran on holds its text. Random routing finds it there one time in four (and
    # part of it where an earlier step of the same task went).
    ratios = _hit_ratios(session_ids)
    floor, ceiling = ratios["system only"], ratios["at home"]

    def gained(ratio: float) -> float:
        return (ratio - floor) / (ceiling - floor)

    assert gained(ratios["random"]) < 0.5, ratios
    assert gained(ratios["router"]) > 0.8, ratios  # the sessions benchmark's target
