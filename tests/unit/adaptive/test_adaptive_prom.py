"""prom.py against canned Prometheus answers: query building, scoping, failure classification."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import requests
from requests.adapters import BaseAdapter

from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive.signals import Availability
from autoglm_operator.io import prom
from autoglm_operator.io.prom import PrometheusReader
from autoglm_operator.resource.spec import PrometheusSource, QueryOverrides

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prometheus"
URL = "http://prometheus.test:9090"
NAME = "phone-9b"
PODS = ["phone-9b-7d9f8c6b5-abcde", "phone-9b-7d9f8c6b5-fghij"]

# Which canned answer a query gets, by fragments of its PromQL (first match of all wins).
ROUTES: tuple[tuple[str, str | tuple[str, ...]], ...] = (
    ("coverage", "timestamp("),
    ("coverage", "count(vllm:num_requests_waiting"),
    ("streaming_own_share", ("requests_received", 'mode="streaming"')),
    ("batching_own_share", ("requests_received", 'mode="batching"')),
    ("chat_rate", 'traffic_class="streamed_chat"'),
    ("other_rate", 'traffic_class="other"'),
    ("streaming_completions", ("request_success", 'mode="streaming"', "sum(sum by")),
    ("batching_completions", ("request_success", 'mode="batching"')),
    ("streaming_busy", ("requests_inflight", 'mode="streaming"')),
    ("batching_busy", ("requests_inflight", 'mode="batching"')),
    ("qps", "request_success"),
    ("gpu_memory_percent", "gpu_memory"),
    ("gpu_memory_percent", "DCGM"),
    ("queue_depth", "num_requests_waiting"),
    ("kv_cache_percent", "kv_cache"),
    ("ttft_p95_seconds", "time_to_first_token"),
)
Answer = tuple[int, str] | Exception


def fixture(name: str, status: int = 200) -> tuple[int, str]:
    return status, (FIXTURES / name).read_text()


def vector(value: float) -> tuple[int, str]:
    """A one-series instant vector."""
    body = {"metric": {}, "value": [1700000000.0, str(value)]}
    return 200, json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": [body]}}
    )


def _matches(fragments: str | tuple[str, ...], query: str) -> bool:
    wanted = (fragments,) if isinstance(fragments, str) else fragments
    return all(f in query for f in wanted)


class FakePrometheus(BaseAdapter):
    """A requests transport answering /api/v1/query* from fixtures; records every query."""

    def __init__(self, answers: dict[str, Answer]) -> None:
        super().__init__()
        self.answers = answers
        self.queries: list[str] = []
        self.params: list[dict[str, list[str]]] = []

    def send(
        self, request: requests.PreparedRequest, *args: object, **kwargs: object
    ) -> requests.Response:
        params = parse_qs(urlparse(request.url or "").query)
        query = params["query"][0]
        self.queries.append(query)
        self.params.append(params)
        name = next(n for n, fragments in ROUTES if _matches(fragments, query))
        answer = self.answers[name]
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        response = requests.Response()
        response.status_code = status
        response._content = body.encode()
        response.url = request.url or ""
        response.request = request
        return response

    def close(self) -> None:
        pass


HEALTHY: dict[str, Answer] = {
    "coverage": fixture("coverage_two_pods.json"),
    "qps": fixture("vector_qps.json"),
    "gpu_memory_percent": fixture("vector_gpu_memory.json"),
    "queue_depth": fixture("vector_queue.json"),
    "kv_cache_percent": fixture("vector_kv_cache.json"),
    "ttft_p95_seconds": fixture("vector_ttft_nan.json"),
    "chat_rate": vector(3.5),
    "other_rate": vector(9.0),
    "streaming_completions": vector(3.0),
    "batching_completions": vector(9.5),
    "streaming_busy": vector(7.0),
    "batching_busy": vector(60.0),
    "streaming_own_share": vector(0.5),
    "batching_own_share": vector(1.0),
}


def reader_for(
    answers: dict[str, Answer], queries: QueryOverrides | None = None
) -> tuple[PrometheusReader, FakePrometheus, list[tuple[str, float, Availability | None]]]:
    fake = FakePrometheus(answers)
    session = requests.Session()
    session.mount(URL + "/api", fake)  # longer than PrometheusConnect's own mount: ours wins
    observed: list[tuple[str, float, Availability | None]] = []
    source = PrometheusSource(url=URL, timeout_seconds=3, queries=queries or QueryOverrides())
    reader = PrometheusReader(source, session=session, observer=lambda *args: observed.append(args))
    return reader, fake, observed


def with_answers(**changes: Answer) -> dict[str, Answer]:
    return {**HEALTHY, **changes}


# -- query building and scoping --------------------------------------------------------------


def test_selector_is_exact_sorted_and_escaped() -> None:
    selector = prom.pod_selector("prod", ["b-1", "a.x-0", "b-1"])
    assert selector == 'namespace="prod",pod=~"a\\\\.x-0|b-1"'
    exported = prom.pod_selector("prod", ["a"], prefix="exported_")
    assert exported == 'exported_namespace="prod",exported_pod=~"a"'
    assert prom.pod_selector('we"ird', ["a"]).startswith('namespace="we\\"ird"')
    with pytest.raises(ValueError):
        prom.pod_selector("prod", [])


def test_two_deployments_never_match_each_others_pods() -> None:
    # PromQL anchors =~ at both ends; the same regex, fully matched, is what Prometheus tests.
    ours = ["chat-5d8f9-aaaaa", "chat-5d8f9-bbbbb"]
    theirs = ["chat-batch-77c4f-ccccc", "chat-5d8f9-aaaaa0", "xchat-5d8f9-bbbbb"]
    selector = prom.pod_selector("prod", ours)
    regex = re.search(r'pod=~"(.*)"', selector)
    assert regex is not None
    pattern = regex.group(1).replace("\\\\", "\\")
    assert all(re.fullmatch(pattern, pod) for pod in ours)
    assert not any(re.fullmatch(pattern, pod) for pod in theirs)


def test_every_default_query_is_scoped_and_overrides_replace_defaults() -> None:
    for name, template in prom.DEFAULT_QUERIES.items():
        rendered = prom.render(template, "prod", PODS, "phone-9b")
        assert "$" not in rendered, name
        assert rendered.count('namespace="prod"') == template.count("selector"), name
    chosen = prom.queries_for(QueryOverrides(qps="sum(my_rps{$selector})"))
    assert chosen["qps"] == "sum(my_rps{$selector})"
    assert chosen["queue_depth"] == prom.DEFAULT_QUERIES["queue_depth"]
    assert "DCGM_FI_DEV_FB_USED" in prom.DEFAULT_QUERIES["gpu_memory_percent"]
    gpu = prom.render(prom.DEFAULT_QUERIES["gpu_memory_percent"], "ns", ["p"], "d")
    assert "exported_pod" in gpu


def test_every_signal_is_a_samples_field_an_override_and_a_default_query() -> None:
    # One list of signals: a new one needs its Samples field, its override and its default.
    samples = {f.name for f in fields(pol.Samples)}
    assert set(prom.SIGNALS) <= samples
    assert set(prom.SIGNALS) == set(QueryOverrides.model_fields)
    assert set(prom.SIGNALS) == set(prom.DEFAULT_QUERIES)


def _pattern(rendered: str, label: str = "pod") -> str:
    regex = re.search(label + r'=~"([^"]*)"', rendered)
    assert regex is not None
    return regex.group(1).replace("\\\\", "\\")


def test_demand_is_the_routers_count_with_the_serving_pods_count_as_fallback() -> None:
    chat = prom.render(prom.DEFAULT_QUERIES["chat_rate"], "prod", PODS, NAME)
    router, fallback = chat.split(" or ")
    # Every request the routers took (any outcome, any mode: shed and refused ones too).
    assert router.startswith("sum(rate(autoglm_router_requests_total{")
    assert 'traffic_class="streamed_chat"' in router
    assert "outcome" not in router and "mode" not in router
    assert fallback == (
        'sum(rate(autoglm_requests_received_total{namespace="prod",'
        'pod=~"phone-9b-7d9f8c6b5-abcde|phone-9b-7d9f8c6b5-fghij",'
        'traffic_class="streamed_chat"}[1m]))'
    )
    assert 'traffic_class="other"' in prom.DEFAULT_QUERIES["other_rate"].split(" or ")[0]
    # The router pods of this deployment, not its serving pods nor a neighbour's routers.
    assert 'namespace="prod"' in router
    pattern = _pattern(router)
    assert re.fullmatch(pattern, "phone-9b-router-5c8b7d9f4-klmno")
    for other in [
        *PODS,
        "phone-9b-batch-router-5c8b7d9f4-klmno",
        "xphone-9b-router-5c8b-klmno",
        "phone-9b-router-5c8b7d9f4-klmno-x",
        "phone-9b-router-router-5c8b-klmno",
    ]:
        assert not re.fullmatch(pattern, other), other
    assert prom.demand_query("other", "15s").count("[15s]") == 2


@pytest.mark.parametrize("length", [8, 36, 40, 44, 45, 50, 53])
def test_router_pods_of_long_names_match_as_kubernetes_cuts_them(length: int) -> None:
    """The apiserver cuts `<rs name>-` to 58 characters before the 5 random ones."""
    name = ("phone-" * 10)[: length - 1] + "x"
    pattern = prom.router_pod_regex(name)
    for pod_template_hash in ("7", "5c8b7d9f4", "5c8b7d9f4z"):
        pod = f"{name}-router-{pod_template_hash}-"[:58] + "klmno"
        assert re.fullmatch(pattern, pod), (pod, pattern)
    # A neighbour whose name starts with this one: its routers and serving pods do not match.
    for other in (f"{name}-b-router-5c8b-klmno"[:58 + 5], f"{name}-b-0", f"{name}-b-5c8b-klmno"):
        assert not re.fullmatch(pattern, other), (other, pattern)


def test_own_class_shares_divide_each_modes_received_requests() -> None:
    share = prom.DEFAULT_QUERIES["streaming_own_share"]
    own, everything = share.split(" / ")
    assert 'traffic_class="streamed_chat"' in own and 'mode="streaming"' in own
    assert "traffic_class" not in everything and 'mode="streaming"' in everything
    batching = prom.DEFAULT_QUERIES["batching_own_share"]
    assert 'traffic_class="other"' in batching and 'mode="batching"' in batching


def test_a_router_selector_needs_the_deployment() -> None:
    with pytest.raises(ValueError, match="deployment"):
        prom.render(prom.DEFAULT_QUERIES["chat_rate"], "prod", PODS, "")


# -- reading ---------------------------------------------------------------------------------


def test_a_healthy_round_returns_samples_and_measures_each_query() -> None:
    reader, fake, observed = reader_for(HEALTHY)
    reading = reader.read("prod", PODS, deployment=NAME)

    assert reading.availability is Availability.OK and reading.available
    assert reading.samples == pol.Samples(
        qps=12.5,
        gpu_memory_percent=88.25,
        queue_depth=6.0,
        kv_cache_percent=41.5,
        ttft_p95_seconds=None,
        reporting_replicas=2,
        chat_rate=3.5,
        other_rate=9.0,
        streaming_completions=3.0,
        batching_completions=9.5,
        streaming_busy=7.0,
        batching_busy=60.0,
        streaming_own_share=0.5,
        batching_own_share=1.0,
    )
    assert reading.message == "14 queries answered; no data for ttft_p95_seconds"
    assert len(fake.queries) == 14 and next(o[0] for o in observed) == "coverage"
    assert all(o[2] is None and o[1] >= 0 for o in observed)
    selector = prom.pod_selector("prod", PODS)
    assert all(selector in q for q in fake.queries)
    assert all(p["timeout"] == ["3s"] for p in fake.params), "Prometheus aborts slow queries"
    again = reader.read("prod", PODS, deployment=NAME)
    assert again.message == reading.message, "stable text: no status churn"


def test_per_series_answers_sum_totals_and_take_the_worst_percentage() -> None:
    answers = with_answers(
        qps=fixture("vector_qps_per_pod.json"), gpu_memory_percent=fixture("vector_per_gpu.json")
    )
    reader, _, _ = reader_for(answers)
    samples = reader.read("prod", PODS, deployment=NAME).samples
    assert samples is not None
    assert samples.qps == 7.75
    assert samples.gpu_memory_percent == 93.5, "NaN series ignored, the fullest GPU counts"


def test_per_series_own_class_shares_take_the_most_mixed() -> None:
    shares = zip(PODS, ("0.6", "1"), strict=True)
    series = [{"metric": {"pod": p}, "value": [1700000000.0, v]} for p, v in shares]
    body = {"status": "success", "data": {"resultType": "vector", "result": series}}
    reader, _, _ = reader_for(with_answers(streaming_own_share=(200, json.dumps(body))))
    samples = reader.read("prod", PODS, deployment=NAME).samples
    assert samples is not None and samples.streaming_own_share == 0.6


def test_a_scalar_answer_is_read_too() -> None:
    reader, _, _ = reader_for(with_answers(qps=fixture("scalar_time.json")))
    samples = reader.read("prod", PODS, deployment=NAME).samples
    assert samples is not None and samples.qps == 3.5


@pytest.mark.parametrize(
    ("error", "detail"),
    [
        (requests.ConnectionError("Connection refused"), "connection failed"),
        (requests.ReadTimeout("read timed out"), "timed out"),
    ],
)
def test_unreachable_prometheus_fails_fast_and_holds(error: Exception, detail: str) -> None:
    reader, fake, observed = reader_for(dict.fromkeys(HEALTHY, error))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.UNREACHABLE and not reading.available
    assert detail in reading.message and URL in reading.message
    assert len(fake.queries) == 1, "one timeout per round, not one per query"
    assert observed[0][2] is Availability.UNREACHABLE
    assert reading.samples is None
    decision = pol.decide(
        reading.samples,
        [pol.ReplicaState("a", None)],
        pol.HysteresisState(),
        pol.AdaptiveSettings(),
        pol.ModePolicy.ADAPTIVE,
        0,
    )
    assert decision.reason == pol.METRICS_UNAVAILABLE


def test_prometheus_going_away_mid_round_stops_the_round() -> None:
    reader, fake, _ = reader_for(with_answers(qps=requests.ConnectionError("reset")))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.UNREACHABLE
    assert len(fake.queries) == 2


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_and_unavailable_answers_count_as_unreachable(status: int) -> None:
    reader, _, _ = reader_for(dict.fromkeys(HEALTHY, fixture("error_unavailable.json", status)))
    assert reader.read("prod", PODS, deployment=NAME).availability is Availability.UNREACHABLE


def test_a_rejected_query_is_a_query_error_with_prometheus_reason() -> None:
    reader, _, observed = reader_for(with_answers(qps=fixture("error_bad_data.json", 400)))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.QUERY_ERROR
    assert "HTTP 400" in reading.message and "parse error" in reading.message
    assert ("qps", Availability.QUERY_ERROR) in [(o[0], o[2]) for o in observed]
    assert reading.samples is not None and reading.samples.qps is None


def test_an_answer_that_is_not_prometheus_is_a_query_error() -> None:
    reader, _, _ = reader_for(dict.fromkeys(HEALTHY, fixture("not_prometheus.html")))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.QUERY_ERROR
    assert "not a Prometheus API answer" in reading.message


@pytest.mark.parametrize("answer", ["vector_empty.json", "vector_ttft_nan.json"])
def test_empty_or_nan_required_signal_is_no_data(answer: str) -> None:
    reader, _, _ = reader_for(with_answers(queue_depth=fixture(answer)))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.NO_DATA
    assert reading.samples is not None and reading.samples.queue_depth is None
    assert reading.samples.qps is None, "required values withheld as a whole"


def test_stale_samples_hold_and_partially_stale_pods_shrink_the_divisor() -> None:
    reader, _, _ = reader_for(with_answers(coverage=fixture("coverage_stale.json")))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.STALE
    assert "the newest sample is over 3 min old (limit 90s)" in reading.message
    reader, _, _ = reader_for(with_answers(coverage=fixture("coverage_one_fresh_one_stale.json")))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.OK
    assert reading.samples is not None and reading.samples.reporting_replicas == 1


def test_optional_signal_failures_do_not_block() -> None:
    reader, _, _ = reader_for(
        with_answers(gpu_memory_percent=fixture("error_bad_data.json", 422)),
        QueryOverrides(gpu_memory_percent="100 * max(my_gpu_memory{$selector}"),
    )
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.PARTIAL and reading.available
    assert "gpu_memory_percent" in reading.message
    assert reading.samples is not None and reading.samples.qps == 12.5
    reader, _, _ = reader_for(with_answers(gpu_memory_percent=fixture("vector_empty.json")))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.availability is Availability.OK
    assert reading.samples is not None and reading.samples.gpu_memory_percent is None


def test_no_coverage_series_falls_back_to_ready_pods() -> None:
    reader, _, _ = reader_for(with_answers(coverage=fixture("vector_empty.json")))
    reading = reader.read("prod", PODS, deployment=NAME)
    assert reading.available
    assert reading.samples is not None and reading.samples.reporting_replicas is None


def test_no_pods_queries_nothing() -> None:
    reader, fake, _ = reader_for(HEALTHY)
    reading = reader.read("prod", [], deployment=NAME)
    assert reading.availability is Availability.NO_PODS and fake.queries == []


def test_classify_rejects_what_it_does_not_know() -> None:
    with pytest.raises(ZeroDivisionError):
        prom.classify(ZeroDivisionError())


def test_reader_needs_a_url() -> None:
    with pytest.raises(ValueError, match=r"prometheus\.url"):
        PrometheusReader(PrometheusSource())


# -- range reads for replay ------------------------------------------------------------------


def test_read_range_aligns_signals_by_timestamp() -> None:
    answers: dict[str, Answer] = {
        "coverage": fixture("matrix_coverage.json"),
        "qps": fixture("matrix_qps.json"),
        "queue_depth": fixture("matrix_queue.json"),
        "gpu_memory_percent": fixture("matrix_empty.json"),
        "kv_cache_percent": fixture("matrix_empty.json"),
        "ttft_p95_seconds": fixture("matrix_empty.json"),
        **{name: fixture("matrix_empty.json") for name in prom.SIGNALS[5:]},
    }
    reader, fake, _ = reader_for(answers)
    start = datetime.fromtimestamp(1_700_000_000, tz=UTC)
    end = datetime.fromtimestamp(1_700_000_060, tz=UTC)
    rows = reader.read_range(
        "prod", None, start, end, 30, deployment=NAME, pod_regex="phone-9b-[a-z0-9]+-[a-z0-9]{5}"
    )
    assert [t for t, _ in rows] == [1_700_000_000, 1_700_000_030, 1_700_000_060]
    assert [s.qps for _, s in rows] == [2.0, None, 14.0]
    assert [s.queue_depth for _, s in rows] == [0.0, 1.0, 9.0]
    assert all(s.reporting_replicas == 2 for _, s in rows)
    assert all('pod=~"phone-9b-[a-z0-9]+-[a-z0-9]{5}"' in q for q in fake.queries)
    assert all(p["step"] == ["30s"] for p in fake.params)


def test_connection_errors_are_summarised_without_the_query_url() -> None:
    error = requests.ConnectionError(
        "HTTPConnectionPool(host='127.0.0.1', port=9090): Max retries exceeded with url: "
        '/api/v1/query?query=sum%28rate... (Caused by NewConnectionError("HTTPConnection('
        "host='127.0.0.1', port=9090): Failed to establish a new connection: "
        '[Errno 111] Connection refused"))'
    )
    assert prom.classify(error) == (
        Availability.UNREACHABLE,
        "connection failed: [Errno 111] Connection refused",
    )
    timeout = requests.ReadTimeout("HTTPConnectionPool(host='p', port=1): Read timed out. (x=5)")
    assert prom.classify(timeout) == (Availability.UNREACHABLE, "timed out: Read timed out")
