"""Reading a replica's mode and drain state from its public /metrics."""

from __future__ import annotations

from autoglm_api.profiles import Mode
from autoglm_router.discovery import parse_runtime_metrics

METRICS = """\
# HELP autoglm_mode 1 for the replica's active mode.
# TYPE autoglm_mode gauge
autoglm_mode{mode="streaming"} 0.0
autoglm_mode{mode="batching"} 1.0
# HELP autoglm_draining 1 while the replica drains.
# TYPE autoglm_draining gauge
autoglm_draining 0.0
vllm:num_requests_running{engine="0",model_name="autoglm-phone-9b"} 3.0
"""


def test_mode_and_draining_come_from_the_gauges() -> None:
    assert parse_runtime_metrics(METRICS) == (Mode.BATCHING, False)
    flipped = METRICS.replace('"streaming"} 0.0', '"streaming"} 1.0').replace(
        '"batching"} 1.0', '"batching"} 0.0').replace("autoglm_draining 0.0",
                                                      "autoglm_draining 1.0")
    assert parse_runtime_metrics(flipped) == (Mode.STREAMING, True)


def test_a_plain_vllm_replica_has_no_mode() -> None:
    assert parse_runtime_metrics("vllm:num_requests_running 0.0\n") == (None, False)
