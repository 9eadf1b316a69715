"""How many requests a replica holds, from its /metrics: other routers' share of its load."""

from __future__ import annotations

from autoglm_router.others import parse_held_requests

RUNTIME = """\
# HELP autoglm_requests_inflight Requests admitted and not finished.
# TYPE autoglm_requests_inflight gauge
autoglm_requests_inflight 5.0
autoglm_requests_queued 2.0
vllm:num_requests_running{engine="0",model_name="autoglm-phone-9b"} 4.0
vllm:num_requests_waiting{engine="0",model_name="autoglm-phone-9b"} 0.0
"""


def test_the_mode_middleware_counts_admitted_and_queued() -> None:
    # Queued requests are held back before vLLM sees them: vLLM's own gauges would miss them.
    assert parse_held_requests(RUNTIME) == 7.0


def test_plain_vllm_counts_running_and_waiting_over_engines() -> None:
    text = ('vllm:num_requests_running{engine="0"} 3.0\nvllm:num_requests_running{engine="1"} '
            '1.0\nvllm:num_requests_waiting{engine="0"} 2.0\n')
    assert parse_held_requests(text) == 6.0


def test_a_replica_without_either_gauge_says_nothing() -> None:
    assert parse_held_requests("autoglm_mode{mode=\"batching\"} 1.0\n") is None
    assert parse_held_requests("autoglm_requests_inflight oops\n") is None
