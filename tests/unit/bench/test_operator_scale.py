"""The scale benchmark's arithmetic: fast checks of testkit.bench.scale_stats."""

from __future__ import annotations

import json
import math

import pytest

from autoglm_operator.io import prom
from testkit.bench import scale_stats as stats
from testkit.stats import percentile


def test_percentile_is_nearest_rank() -> None:
    # The one rule (testkit.stats), which the scale benchmark's summary uses too.
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([7.0], 0.99) == 7
    assert percentile([], 0.5) is None
    # Order of the input does not matter.
    assert percentile(list(reversed(values)), 0.9) == 90


def test_summary_keeps_a_latency_that_never_caught_up_visible() -> None:
    row = stats.summary([0.2, 0.1, math.inf, 0.3])
    assert row["n"] == 4
    assert row["p50"] == 0.2
    assert row["p99"] == math.inf
    assert row["max"] == math.inf
    assert stats.summary([]) == {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}


def test_per_interval_counts_each_time_in_its_own_minute_and_drops_the_rest() -> None:
    start = 1000.0
    times = [999.9, 1000.0, 1059.9, 1060.0, 1130.0, 1179.9, 1180.0, 1240.0]
    assert stats.per_interval(times, start, 60, 3) == [2, 1, 2]


@pytest.mark.parametrize(
    ("counts", "is_flat"),
    [
        ([0, 0, 0, 0], True),
        ([12, 12, 12, 12], True),
        ([30, 12, 12, 12], True),  # settling down is not growth
        ([100, 103, 101, 104], True),  # within 5% of the mean per minute
        ([0, 0, 0, 10], False),
        ([12, 24, 36, 48], False),
        ([100, 110, 120, 130], False),
        ([], False),
    ],
)
def test_flat_means_no_upward_trend(counts: list[int], is_flat: bool) -> None:
    assert stats.flat(counts) is is_flat


def test_slope_is_the_least_squares_growth_per_step() -> None:
    assert stats.slope([1, 3, 5, 7]) == pytest.approx(2.0)
    assert stats.slope([5, 5]) == 0.0
    assert stats.slope([9]) == 0.0


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        (
            "https://127.0.0.1:6443/api/v1/namespaces/ns/pods/p-1?{'watch': 'true', "
            "'resourceVersion': '12'}",
            "WATCH pods",
        ),
        (
            "https://127.0.0.1:6443/apis/autoglm.io/v1alpha1/namespaces/ns/autoglmdeployments/a/"
            "status?fieldManager=autoglm-adaptive&force=true",
            "PATCH autoglmdeployments/status",
        ),
        ("https://127.0.0.1:6443/apis/apps/v1/namespaces/ns/deployments/a", "PATCH deployments"),
        (
            "https://127.0.0.1:6443/apis/coordination.k8s.io/v1/namespaces/ns/leases/autoglm",
            "PATCH leases",
        ),
        ("https://127.0.0.1:6443/api/v1/pods?watch=true&labelSelector=x", "WATCH pods"),
        ("https://127.0.0.1:6443/api/v1/namespaces", "PATCH namespaces"),
    ],
)
def test_request_kind_names_verb_and_resource(url: str, kind: str) -> None:
    assert stats.request_kind({"method": "patch", "url": url}) == kind


def _log_line(promql: str) -> str:
    return json.dumps({"params": {"query": promql, "start": "x", "step": 0}, "ts": "t"})


def test_query_log_attributes_every_default_query_to_its_deployment() -> None:
    pods = ["agd-007-5d8f9c7b4-abcde", "agd-007-5d8f9c7b4-fghij", "agd-007-5d8f9c7b4-klmno"]
    templates = [prom.COVERAGE_QUERY, *prom.DEFAULT_QUERIES.values()]
    lines = [_log_line(prom.render(t, "scale-3", pods, "agd-007")) for t in templates] + [""]
    logged = stats.parse_query_log(lines)
    assert len(logged) == len(templates)
    assert {q.owner for q in logged} == {("scale-3", "agd-007")}
    assert all(q.pods == tuple(sorted(pods)) for q in logged)


def test_a_query_without_one_deployments_pods_has_no_owner() -> None:
    logged = stats.parse_query_log(
        [
            _log_line("up"),
            _log_line('sum(x{namespace="a",pod=~"one-5d8f9c7b4-aaaaa|two-5d8f9c7b4-bbbbb"})'),
        ]
    )
    assert [q.owner for q in logged] == [None, None]


def test_queries_per_round_by_replica_count() -> None:
    def round_of(ns: str, owner: str, replicas: int) -> list[stats.LoggedQuery]:
        pods = tuple(f"{owner}-5d8f9c7b4-p{i}" for i in range(replicas))
        return [stats.LoggedQuery(ns, pods)] * 6

    replicas = {("a", "small"): 2, ("a", "big"): 4, ("b", "big"): 4}
    # small: 3 rounds of 6 queries; each big: 2 rounds, but one of them asked per pod (4 rounds).
    queries = (
        round_of("a", "small", 2) * 3
        + round_of("a", "big", 4) * 2
        + round_of("b", "big", 4) * 4
        + [stats.LoggedQuery(None, ())]  # not ours: ignored
    )
    rounds = {("a", "small"): 3.0, ("a", "big"): 2.0, ("b", "big"): 2.0}
    result = stats.queries_per_round(queries, rounds, replicas)
    assert result[2] == {
        "deployments": 1, "rounds": 3.0, "queries": 18, "queries_per_round": 6.0,
        "pods_per_query": 2.0,
    }  # fmt: skip
    assert result[4]["queries_per_round"] == pytest.approx((12 + 24) / 4)
    assert result[4]["pods_per_query"] == 4.0
