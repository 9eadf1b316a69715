"""What a replica's /metrics says of it: how many requests it holds (other routers' share of its
load) and whether its engine sleeps."""

from __future__ import annotations

from autoglm_router.others import OtherRouters, parse_gauges

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
    assert parse_gauges(RUNTIME).held == 7.0


def test_plain_vllm_counts_running_and_waiting_over_engines() -> None:
    text = ('vllm:num_requests_running{engine="0"} 3.0\nvllm:num_requests_running{engine="1"} '
            '1.0\nvllm:num_requests_waiting{engine="0"} 2.0\n')
    assert parse_gauges(text).held == 6.0


def test_a_replica_without_either_gauge_says_nothing() -> None:
    assert parse_gauges("autoglm_mode{mode=\"batching\"} 1.0\n").held is None
    assert parse_gauges("autoglm_requests_inflight oops\n").held is None


def test_a_sleeping_engine_says_so_and_an_awake_one_or_a_plain_vllm_does_not() -> None:
    assert parse_gauges(RUNTIME + "# TYPE autoglm_sleeping gauge\nautoglm_sleeping 1.0\n").asleep
    assert not parse_gauges(RUNTIME + "autoglm_sleeping 0.0\n").asleep
    assert not parse_gauges(RUNTIME).asleep


def test_sleep_is_read_from_each_scrape_and_forgotten_with_the_replica() -> None:
    others = OtherRouters(lambda: ["http://a"], lambda name: 0)
    others.read("http://a", "autoglm_sleeping 1\n")
    assert others.asleep("http://a") and not others.asleep("http://b")
    others.read("http://a", "")  # no answer: nothing known, so it counts as awake
    assert not others.asleep("http://a")
