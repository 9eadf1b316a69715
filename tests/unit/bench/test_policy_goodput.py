"""The policy benchmark's simulator keeps honest books: fast checks of bench/policy_sim.py."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "traces")]

import policy_goodput as bench  # noqa: E402
import policy_traces as traces  # noqa: E402
from policy_sim import BATCH, CHAT, Pool  # noqa: E402

from autoglm_runtime.profiles import Mode  # noqa: E402


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


def _run(modes, arrivals, seconds):
    pool = Pool(modes, arrivals)
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


def test_overloaded_streaming_pool_misses_and_sheds() -> None:
    # 40 req/s against 4 streaming replicas (~4.1 req/s each): the queue overflows.
    arrivals = _poisson(40.0, 60)
    pool, r = _run([Mode.STREAMING] * 4, arrivals, 60)
    assert r["slo_attainment"] < 0.5
    assert r["rejected"] > 0
    # Never more than the replicas can serve: ~4.1 req/s each by the calibration.
    pool_done = [o for o in pool.outcomes if o.e2e >= 0 and o.arrival + o.e2e <= 60]
    assert len(pool_done) / 60 < 4 * 4.6


def test_streaming_replica_capacity_matches_the_calibration() -> None:
    # One replica, chats only, open loop well above capacity: the 8-sequence cap serves
    # ~4.1 req/s (published), and every arrival is accounted for exactly once.
    arrivals = _poisson(8.0, 60)
    pool, r = _run([Mode.STREAMING], arrivals, 60)
    assert r["requests"] == len(arrivals)
    done_in_trace = [o for o in pool.outcomes if o.e2e >= 0 and o.arrival + o.e2e <= 60]
    assert 3.6 <= len(done_in_trace) / 60 <= 4.6


def test_batching_mode_trades_ttft_for_throughput() -> None:
    arrivals = _poisson(2.0, 120)
    _, stream = _run([Mode.STREAMING], arrivals, 120)
    _, batch = _run([Mode.BATCHING], arrivals, 120)
    assert batch["ttft_p50"] > stream["ttft_p50"]  # window + coalescing
    heavy = _poisson(9.0, 60, kind_of=lambda i: BATCH)
    _, s = _run([Mode.STREAMING], heavy, 60)
    _, b = _run([Mode.BATCHING], heavy, 60)
    assert b["batch_attainment"] > s["batch_attainment"]


def test_adaptive_runs_the_operator_policy_and_flips_under_overload() -> None:
    r = bench.simulate("steady-overload", "adaptive", hours=0.1)
    assert r["flips"] >= 1
    assert r["reasons"].get("QpsAboveHigh", 0) + r["reasons"].get("QueueAboveHigh", 0) >= 1
    assert r["max_flips_per_replica_per_cooldown"] <= 1
    low = bench.simulate("steady-low", "adaptive", hours=0.1)
    assert low["flips"] == 0 and low["slo_attainment"] > 0.99


def test_traces_are_deterministic() -> None:
    trace = traces.TRACES["flash-crowd"]
    assert traces.arrivals(trace, 4, seed=5) == traces.arrivals(trace, 4, seed=5)
