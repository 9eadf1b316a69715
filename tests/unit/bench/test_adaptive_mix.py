"""The changing-mix benchmark's trace and bounds: fast checks of bench/adaptive_mix.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from adaptive_mix import PHASES, adaptive_spec, bound_seconds, chosen_split

from autoglm_operator import spec as crd
from autoglm_operator.policy import Capacity
from autoglm_runtime.metrics import TRAFFIC_CLASSES


def settings() -> crd.AdaptiveSettings:
    return crd.AdaptiveSettings.model_validate(adaptive_spec("http://127.0.0.1:9090"))


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
