"""The pure parts of adaptive, adaptive_handlers, pods and operator_metrics: what is written,
what is counted, how a pod is seen."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive import report
from autoglm_operator.adaptive.pass_data import FlipOutcome, PassResult, RepairOutcome
from autoglm_operator.adaptive.planning import PodView
from autoglm_operator.adaptive.signals import Availability, QueryOutcome, Reading
from autoglm_operator.handlers import adaptive_pass as ah
from autoglm_operator.io.metrics import OperatorMetrics
from autoglm_operator.resource import pods


def test_owned_status_carries_every_owned_field_and_no_empty_object() -> None:
    current = {
        "replicas": 2,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllReplicasReady"},
            {"type": "MetricsAvailable", "status": "True", "reason": "QueriesSucceeded"},
        ],
        "decisionHistory": [{"time": "t0", "reason": "QpsAboveHigh", "metrics": {}}],
        "adaptiveState": {"lastFlips": []},
    }
    patch = {
        "lastDecision": {"time": "t1", "reason": "MetricsUnavailable", "metrics": {}},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllReplicasReady"},
            {"type": "MetricsAvailable", "status": "False", "reason": "PrometheusUnreachable"},
        ],
    }
    owned = report.owned_status(current, patch)
    assert set(owned) == {"conditions", "lastDecision", "decisionHistory", "adaptiveState"}
    assert [c["type"] for c in owned["conditions"]] == ["MetricsAvailable"], "Ready is not ours"
    assert owned["conditions"][0]["status"] == "False"
    assert owned["lastDecision"] == {"time": "t1", "reason": "MetricsUnavailable"}
    assert owned["decisionHistory"] == [{"time": "t0", "reason": "QpsAboveHigh"}]
    assert owned["adaptiveState"] == {"lastFlips": []}, "an empty list is a value, kept"


def test_pod_view_reads_ip_label_and_readiness() -> None:
    pod = {
        "metadata": {"name": "p", "labels": {"autoglm.io/mode": "batching"}},
        "status": {"podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert pods.view(pod) == PodView("p", "10.0.0.7", Mode.BATCHING, True)
    odd = {"metadata": {"name": "q", "labels": {"autoglm.io/mode": "turbo"}}, "status": {}}
    assert pods.view(odd) == PodView("q", None, None, False)


def test_record_counts_decisions_flips_repairs_and_query_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    monkeypatch.setattr(ah, "METRICS", metrics)
    decision = pol.PolicyDecision(
        reason=pol.QPS_ABOVE_HIGH,
        message="",
        from_batching=0,
        to_batching=1,
        flips=(pol.Flip("a", Mode.STREAMING, Mode.BATCHING),),
        state=pol.HysteresisState(),
        metrics=pol.metric_sample(None, 0),
    )
    reading = Reading(
        pol.Samples(qps=1.0, queue_depth=0.0),
        Availability.OK,
        "ok",
        {"ttft_p95_seconds": QueryOutcome("ttft_p95_seconds", "q", None, Availability.NO_DATA)},
    )
    result = PassResult(
        status_patch={},
        decision=decision,
        reading=reading,
        flips=[FlipOutcome("a", Mode.STREAMING, Mode.BATCHING, True, seconds=0.02)],
        repairs=[RepairOutcome("b", Mode.BATCHING, Mode.STREAMING, "Finished")],
    )
    ah.record("ns", "chat", result, dry_run=False)
    value = metrics.registry.get_sample_value
    assert (
        value(
            "autoglm_operator_adaptive_decisions_total",
            {"namespace": "ns", "name": "chat", "reason": "QpsAboveHigh"},
        )
        == 1
    )
    assert (
        value(
            "autoglm_operator_mode_flips_total",
            {"namespace": "ns", "name": "chat", "to": "batching", "result": "applied"},
        )
        == 1
    )
    assert value("autoglm_operator_mode_flip_seconds_count") == 1
    assert (
        value(
            "autoglm_operator_mode_repairs_total",
            {"namespace": "ns", "name": "chat", "action": "Finished"},
        )
        == 1
    )
    assert value("autoglm_operator_metrics_available", {"namespace": "ns", "name": "chat"}) == 1
    assert (
        value(
            "autoglm_operator_prometheus_query_errors_total",
            {"query": "ttft_p95_seconds", "reason": "NoData"},
        )
        == 1
    )
    metrics.observe_query("qps", 0.5, Availability.UNREACHABLE)
    assert value("autoglm_operator_prometheus_query_seconds_count", {"query": "qps"}) == 1
    assert (
        value(
            "autoglm_operator_prometheus_query_errors_total",
            {"query": "qps", "reason": "PrometheusUnreachable"},
        )
        == 1
    )
    metrics.forget("ns", "chat")
    assert value("autoglm_operator_metrics_available", {"namespace": "ns", "name": "chat"}) is None
    assert (
        value(
            "autoglm_operator_mode_flips_total",
            {"namespace": "ns", "name": "chat", "to": "batching", "result": "applied"},
        )
        is None
    )


def test_a_pass_is_due_every_interval_and_at_once_after_a_spec_change() -> None:
    loop = ah.AdaptivePass(None, "ns", "x")  # type: ignore[arg-type]  # no I/O in due()
    body = {"metadata": {"generation": 3}}
    assert loop.due(body)  # the first pass runs at once
    loop.generation, loop.due_at = 3, float("inf")  # as a pass of generation 3 leaves it
    assert not loop.due(body)
    # A new modePolicy, pause or threshold is acted on (and reported) in this iteration.
    assert loop.due({"metadata": {"generation": 4}})


class TokenSecret:
    """The executor's read of the admin Secret: its tokens by template, counted."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = tokens
        self.reads = 0

    def read_admin_tokens(self, namespace: str, name: str) -> dict[str, str]:
        self.reads += 1
        return dict(self.tokens)


async def test_each_pod_is_called_with_its_templates_token_and_a_new_template_rereads() -> None:
    secret = TokenSecret({"old": "t-old", "new": "t-new"})
    loop = ah.AdaptivePass(secret, "ns", "x")  # type: ignore[arg-type]
    try:
        pods_ = [PodView("a", "10.0.0.1", Mode.STREAMING, True, template="old"),
                 PodView("b", "10.0.0.2", Mode.STREAMING, True, template="new"),
                 PodView("c", None, None, False, template="new")]
        clients = await loop.clients(pods_)
        assert {ip: c._headers["Authorization"] for ip, c in clients.items()} == {
            "10.0.0.1": "Bearer t-old", "10.0.0.2": "Bearer t-new"}
        await loop.clients(pods_)
        assert secret.reads == 1  # known templates: no read per pass
        # A rollout's first pod: its template's token is read, once it is there.
        secret.tokens = {"new": "t-new", "next": "t-next"}
        rolled = [*pods_[1:2], PodView("d", "10.0.0.4", Mode.STREAMING, True, template="next")]
        clients = await loop.clients(rolled)
        assert secret.reads == 2
        assert clients["10.0.0.4"]._headers["Authorization"] == "Bearer t-next"
        # A pod whose template has no token (yet) is not called, and says why.
        io = ah.KubeIO(secret, "ns", "x", await loop.clients(  # type: ignore[arg-type]
            [PodView("e", "10.0.0.5", Mode.STREAMING, True, template="unknown")]),
            None, None)  # type: ignore[arg-type]
        with pytest.raises(ah.RuntimeUnauthorized, match=r"10\.0\.0\.5"):
            await io.runtime_state("10.0.0.5")
        assert io.unauthorized
    finally:
        await loop.close()
