"""The changing-mix benchmark's trace and bounds: fast checks of bench/adaptive_mix.py."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest

from autoglm_operator.adaptive.policy import Capacity
from autoglm_operator.resource import spec
from autoglm_runtime.metrics import TRAFFIC_CLASSES
from testkit.loadgen import RequestResult
from testkit.paths import load_script

adaptive_mix = load_script("bench/adaptive_mix.py")
BATCH_SLO = adaptive_mix.BATCH_SLO
CHAT_TPOT_SLO = adaptive_mix.CHAT_TPOT_SLO
CHAT_TTFT_SLO = adaptive_mix.CHAT_TTFT_SLO
PHASES = adaptive_mix.PHASES
adaptive_spec = adaptive_mix.adaptive_spec
bound_seconds = adaptive_mix.bound_seconds
chosen_split = adaptive_mix.chosen_split
fixed_split = adaptive_mix.fixed_split
met_slo = adaptive_mix.met_slo
side_by_side = adaptive_mix.side_by_side


def settings() -> spec.AdaptiveSettings:
    return spec.AdaptiveSettings.model_validate(adaptive_spec("http://127.0.0.1:9090"))


def test_every_phase_moves_the_split_the_demand_sizing_chooses_from_the_seeds() -> None:
    config = settings()
    splits = [0]
    for phase in PHASES:
        splits.append(chosen_split(phase, splits[-1], Capacity.seeded(config), config))
    # quiet and chat hours keep all streaming (3.6 req/s fit 4 streaming replicas' 4.1, and at
    # 20% more the router sheds the excess: one batching replica does not pay), batch hours want
    # three (the most minStreamingReplicas 1 allows of 4), and back.
    assert splits == [0, 0, 0, 3, 0]


def test_the_bound_counts_steps_of_max_flips_and_the_directions_window() -> None:
    assert bound_seconds(1, 1) == 10  # the demand window only
    assert bound_seconds(1, 3) == 10 + 5 + 2 * 5  # one step of two, the 5 s window up
    assert bound_seconds(3, 1) == 10 + 10 + 2 * 5  # one step of two, the 10 s window back
    assert bound_seconds(0, 3) == 10 + 2 * (5 + 2 * 5)


def test_the_demand_queries_read_what_the_runtime_exports() -> None:
    queries = settings().prometheus.queries
    for query, traffic_class in ((queries.chat_rate, "streamed_chat"),
                                 (queries.other_rate, "other")):  # fmt: skip
        assert query is not None
        assert "autoglm_requests_received_total{$selector," in query
        assert re.search(r'traffic_class="(\w+)"', query).group(1) == traffic_class  # type: ignore[union-attr]
        assert traffic_class in TRAFFIC_CLASSES


def chat(ttft: float, per_token: float, tokens: int | None = 64) -> RequestResult:
    later = (tokens or 64) - 1
    return RequestResult(0.0, ttft, ttft + per_token * later, output_tokens=tokens)


def test_a_chat_counts_only_when_it_meets_both_scaled_slos() -> None:
    # The spec's defaults (0.5 s, 0.1 s per token) at time factor 4: 2 s and 0.4 s.
    assert (CHAT_TTFT_SLO, CHAT_TPOT_SLO) == (2.0, 0.4)
    assert met_slo(chat(1.9, 0.39), streamed=True)
    assert not met_slo(chat(2.1, 0.1), streamed=True)  # first token late
    assert not met_slo(chat(0.5, 0.41), streamed=True)  # later tokens too slow
    # The server's own count decides the time per token: 5 s over 10 tokens is 0.56 s each.
    assert not met_slo(RequestResult(0.0, 0.5, 5.5, output_tokens=10), streamed=True)
    assert met_slo(RequestResult(0.0, 0.5, 5.5, output_tokens=64), streamed=True)


def test_a_batch_job_counts_when_it_completes_in_time_and_a_failure_never() -> None:
    assert BATCH_SLO == 120
    assert met_slo(RequestResult(0.0, None, 119.0), streamed=False)
    assert not met_slo(RequestResult(0.0, None, 121.0), streamed=False)
    assert not met_slo(RequestResult(0.0, None, None, error="APIStatusError: 429"), streamed=False)
    assert not met_slo(RequestResult(0.0, 0.1, 0.2, error="unfinished"), streamed=True)


def run(policy: str, met: list[int]) -> dict[str, Any]:
    phases = [{"name": p.name, "seconds": 75.0, "chats_met": m, "jobs_met": 0, "sent": 100}
              for p, m in zip(PHASES, met, strict=True)]  # fmt: skip
    return {"policy": policy, "phases": phases}


def test_side_by_side_names_the_higher_goodput_and_prints_equal_ones_as_ties() -> None:
    rows = side_by_side([run("adaptive", [30, 80, 90, 70]), run("fixed 2", [30, 85, 60, 70])])
    assert [r["higher"] for r in rows] == ["tie", "fixed 2", "adaptive", "tie", "adaptive"]
    assert rows[-1]["phase"] == "total"
    assert rows[-1]["met"] == {"adaptive": 270, "fixed 2": 245}
    assert rows[-1]["goodput"]["adaptive"] == 270 / 300


def test_a_pinned_split_pauses_the_loop_within_what_min_streaming_allows() -> None:
    assert adaptive_spec("http://p", fixed=2)["paused"] is True
    assert adaptive_spec("http://p")["paused"] is False
    assert fixed_split("3") == 3
    for bad in ("4", "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="between 0 and 3"):
            fixed_split(bad)
