"""The sessions benchmark's verdicts (bench/router_sessions.py): what counts as meeting the TTFT
target when the gains are a few %."""

from __future__ import annotations

import dataclasses
import json

import pytest

from testkit.paths import load_script

bench = load_script("bench/router_sessions.py")


def figures(router: float, oracle: float, random: float = 0.320) -> dict[str, dict[str, float]]:
    def one(p50: float, hits: float) -> dict[str, float]:
        return {"later_ttft_p50_s": p50, "hit_ratio": hits, "in_flight_max_over_mean": 1.1,
                "errors": 0.0}  # fmt: skip

    return {"autoglm-router": one(router, 0.52), "oracle": one(oracle, 0.55),
            "random": one(random, 0.43)}  # fmt: skip


def ttft_verdict(router: float, oracle: float) -> str:
    rows = {target: status for target, _, _, status in
            bench.check(figures(router, oracle), "autoglm-router")}  # fmt: skip
    return rows["TTFT gain / oracle's"]


@pytest.mark.parametrize(("router", "oracle", "verdict"), [
    (0.300, 0.304, "met"),  # a resolved gain, more than the oracle's
    (0.305, 0.300, "met"),  # 15 of the oracle's 20 ms would miss 80%, but it is within 2%
    (0.300, 0.340, "met"),  # the oracle slower than random: the router's own gain counts
    (0.316, 0.318, "tie"),  # neither gain beyond 2% of random's p50: not resolved
    (0.316, 0.280, "MISSED"),  # the oracle gains 40 ms, the router 4
])  # fmt: skip
def test_the_ttft_target_needs_a_resolved_gain(router: float, oracle: float,
                                               verdict: str) -> None:  # fmt: skip
    assert ttft_verdict(router, oracle) == verdict


def test_hit_ratio_and_balance_are_judged_against_their_targets() -> None:
    rows = {target: status for target, _, _, status in
            bench.check(figures(0.3, 0.3), "autoglm-router")}  # fmt: skip
    assert rows["hit ratio / oracle's"] == "met"  # 0.52 / 0.55 = 95%
    assert rows["in-flight max/mean"] == "met"


def test_the_hit_gain_is_judged_over_random_not_the_plain_ratio() -> None:
    """The shared system prompt is cached on every replica, so random's plain ratio is high:
    0.52 against the oracle's 0.55 is 95%, but only 75% of the oracle's gain over random."""
    rows = {target: (measured, status) for target, measured, _, status in
            bench.check(figures(0.3, 0.3), "autoglm-router")}  # fmt: skip
    measured, status = rows["hit gain / oracle's"]
    assert measured == pytest.approx((0.52 - 0.43) / (0.55 - 0.43))
    assert status == "MISSED"


def test_the_peer_rows_result_comes_back_from_its_namespace_whole() -> None:
    """The gie-epp row runs in a process of its own and hands its RunResult back as JSON."""
    result = bench.RunResult(turns=[bench.TurnResult(3, 1, 0.31, 620)], errors=1,
                             wall_seconds=66.5, replicas=[{"hits": 10.0, "queries": 16.0}],
                             placements={"turns_hit": 2.0})  # fmt: skip
    assert bench.loaded(json.loads(json.dumps(dataclasses.asdict(result)))) == result


def test_every_peer_is_a_row_of_its_own_with_its_own_colour() -> None:
    assert set(bench.PEERS) <= set(bench.ROUTERS) and "autoglm-router" not in bench.PEERS
    assert len(bench.COLORS) == len(bench.ROUTERS)
