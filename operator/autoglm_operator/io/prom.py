"""The one module that talks to Prometheus: it reads one deployment's pods into signals.Reading.

Every query is scoped by `$selector`, which expands to `namespace="<ns>",pod=~"<pod1>|<pod2>"`
built from the operator's own list of pods, so two deployments never read each other's metrics.
(`$exported_selector` is the same on `exported_namespace`/`exported_pod`, the labels
dcgm-exporter's pod mapping ends up under when Prometheus keeps the exporter's own target labels.)
`$router_selector` is `namespace="<ns>",pod=~"<name>-router-<hash>-<id>"`: the pods of the
deployment's router (Deployment `<name>-router`), which the chart's router PodMonitor and its
plain `autoglm-router` scrape job label with the same `namespace` and `pod` as serving pods.

A read says what it could not get, and why, so MetricsAvailable can carry a precise reason:
PrometheusUnreachable (connection refused, timeout, 502/503/504), QueryError (Prometheus
rejected the PromQL or answered something that is not its API), NoData (empty or NaN result),
StaleData (the newest sample of every pod is too old). QPS and queue depth are required; GPU
memory, KV cache and TTFT are reported when present and never block a decision.
"""

from __future__ import annotations

import ast
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from autoglm_operator.adaptive.signals import Availability, QueryOutcome, Reading, Samples
from autoglm_operator.resource.names import router_name
from autoglm_operator.resource.spec import PrometheusSource, QueryOverrides

QPS = "qps"
GPU_MEMORY_PERCENT = "gpu_memory_percent"
QUEUE_DEPTH = "queue_depth"
KV_CACHE_PERCENT = "kv_cache_percent"
TTFT_P95_SECONDS = "ttft_p95_seconds"
CHAT_RATE = "chat_rate"
OTHER_RATE = "other_rate"
STREAMING_COMPLETIONS = "streaming_completions"
BATCHING_COMPLETIONS = "batching_completions"
STREAMING_BUSY = "streaming_busy"
BATCHING_BUSY = "batching_busy"
STREAMING_OWN_SHARE = "streaming_own_share"
BATCHING_OWN_SHARE = "batching_own_share"
# Every signal (each one a policy.Samples field and a QueryOverrides field) and how the series
# an override may return combine: totals add up; percentages and latency take the worst (the
# highest); a mode's own-class share takes the lowest (the most mixed, which learns nothing).
_COMBINE: Mapping[str, Callable[[Sequence[float]], float]] = {
    QPS: sum,
    GPU_MEMORY_PERCENT: max,
    QUEUE_DEPTH: sum,
    KV_CACHE_PERCENT: max,
    TTFT_P95_SECONDS: max,
    CHAT_RATE: sum,
    OTHER_RATE: sum,
    STREAMING_COMPLETIONS: sum,
    BATCHING_COMPLETIONS: sum,
    STREAMING_BUSY: sum,
    BATCHING_BUSY: sum,
    STREAMING_OWN_SHARE: min,
    BATCHING_OWN_SHARE: min,
}
SIGNALS = tuple(_COMBINE)
REQUIRED = (QPS, QUEUE_DEPTH)
# Not a signal: which pods Prometheus has fresh samples from, and how fresh (for staleness).
COVERAGE = "coverage"

_DCGM_PERCENT = (
    "100 * max(DCGM_FI_DEV_FB_USED{{{sel}}} "
    "/ (DCGM_FI_DEV_FB_USED{{{sel}}} + DCGM_FI_DEV_FB_FREE{{{sel}}}))"
)
_BASE_QUERIES: Mapping[str, str] = {
    QPS: "sum(rate(vllm:request_success_total{$selector}[1m]))",
    # The runtime's NVML gauges first; dcgm-exporter (MiB used and free) when the runtime has none.
    # max: the fullest GPU of the deployment is the one that runs out first.
    GPU_MEMORY_PERCENT: (
        "100 * max(autoglm_gpu_memory_used_bytes{$selector}"
        " / autoglm_gpu_memory_total_bytes{$selector})"
        " or "
        + _DCGM_PERCENT.format(sel="$selector")
        + " or "
        + _DCGM_PERCENT.format(sel="$exported_selector")
    ),
    # Requests waiting in front of streaming replicas: vLLM's own queue plus the runtime
    # middleware's admission queue (streaming caps concurrency below vLLM's max-num-seqs, so the
    # wait happens in front of vLLM). Batching replicas queue by design to fill their batches:
    # autoglm_mode{mode="streaming"} is 0 there and zeroes them out.
    QUEUE_DEPTH: (
        "sum("
        "(sum by (pod) (vllm:num_requests_waiting{$selector})"
        " + (sum by (pod) (autoglm_requests_queued{$selector})"
        " or 0 * sum by (pod) (vllm:num_requests_waiting{$selector})))"
        ' * on (pod) sum by (pod) (autoglm_mode{$selector,mode="streaming"}))'
    ),
    KV_CACHE_PERCENT: "100 * avg(vllm:kv_cache_usage_perc{$selector})",
    TTFT_P95_SECONDS: (
        "histogram_quantile(0.95, "
        "sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{$selector}[1m])))"
    ),
}


def demand_query(traffic_class: str, window: str = "1m") -> str:
    """Requests/s of one traffic class arriving at the deployment.

    The routers' count when they have one: every request a router took, whatever became of it
    (served, shed with 429, refused), once however many replicas it tried; each router counts
    its own requests, so the sum over routers is the demand. A client that retries after a 429
    is counted again, as it is demand again. Without router series (router disabled, a router
    older than the counter) what the serving pods' middleware received; that misses what a
    router shed, and counts a request a router retried on a second replica twice.
    """
    return (
        f"sum(rate(autoglm_router_requests_total"
        f'{{$router_selector,traffic_class="{traffic_class}"}}[{window}]))'
        " or sum(rate(autoglm_requests_received_total"
        f'{{$selector,traffic_class="{traffic_class}"}}[{window}]))'
    )


def _per_mode(expression: str, mode: str) -> str:
    # Each pod's figure under the mode it runs now (autoglm_mode is 1 for that mode only).
    return (
        f"sum(sum by (pod) ({expression})"
        f' * on (pod) sum by (pod) (autoglm_mode{{$selector,mode="{mode}"}}))'
    )


def _own_share(mode: str, own_class: str) -> str:
    # Of what this mode's replicas received, the share that was their own class (NaN, hence no
    # data, while they received nothing).
    received = "rate(autoglm_requests_received_total{$selector%s}[1m])"
    own = received % f',traffic_class="{own_class}"'
    return f"{_per_mode(own, mode)} / {_per_mode(received % '', mode)}"


_COMPLETIONS = "rate(vllm:request_success_total{$selector}[1m])"
_BUSY = "autoglm_requests_inflight{$selector} + autoglm_requests_queued{$selector}"
# Demand by traffic class, and per mode what its replicas complete and hold (in flight plus
# queued in front of them) and how much of what they received was their own class: the
# demand-sized policy's inputs (policy.Samples).
DEFAULT_QUERIES: Mapping[str, str] = {
    **_BASE_QUERIES,
    CHAT_RATE: demand_query("streamed_chat"),
    OTHER_RATE: demand_query("other"),
    STREAMING_COMPLETIONS: _per_mode(_COMPLETIONS, "streaming"),
    BATCHING_COMPLETIONS: _per_mode(_COMPLETIONS, "batching"),
    STREAMING_BUSY: _per_mode(_BUSY, "streaming"),
    BATCHING_BUSY: _per_mode(_BUSY, "batching"),
    STREAMING_OWN_SHARE: _own_share("streaming", "streamed_chat"),
    BATCHING_OWN_SHARE: _own_share("batching", "other"),
}
COVERAGE_QUERY = "max by (pod) (timestamp(vllm:num_requests_waiting{$selector}))"
COVERAGE_RANGE_QUERY = "count(vllm:num_requests_waiting{$selector})"


# Worst first: when several queries fail differently, the condition shows the most basic cause.
_SEVERITY = [
    Availability.UNREACHABLE,
    Availability.QUERY_ERROR,
    Availability.NO_PODS,
    Availability.NO_DATA,
    Availability.STALE,
]

Observer = Callable[[str, float, Availability | None], None]


def _ignore(_name: str, _seconds: float, _failure: Availability | None) -> None:
    return None


def _regex_literal(name: str) -> str:
    # Pod names are DNS subdomains ([a-z0-9.-]); escape anything else for RE2 all the same.
    return "".join(ch if ch.isalnum() or ch == "-" else "\\" + ch for ch in name)


def _promql_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def pod_selector(namespace: str, pods: Iterable[str], *, prefix: str = "") -> str:
    """Label matchers for exactly these pods: `namespace="ns",pod=~"a|b"` (anchored by PromQL)."""
    names = sorted(set(pods))
    if not names:
        raise ValueError("a selector needs at least one pod")
    alternatives = "|".join(_regex_literal(n) for n in names)
    return (
        f'{prefix}namespace="{_promql_string(namespace)}",'
        f'{prefix}pod=~"{_promql_string(alternatives)}"'
    )


# Kubernetes names a pod from its ReplicaSet's name plus "-", cut to 63 - 5 characters, then
# 5 random ones (apiserver's SimpleNameGenerator); the pod-template-hash has 1-10 characters.
_GENERATED_BASE_MAX = 58


def router_pod_regex(deployment: str) -> str:
    """The pods of Deployment `<deployment>-router`: `<deployment>-router-<hash>-<5 chars>`,
    or that name cut short where it passes 58 characters before the random part (names from
    about 40 characters on). Another AutoGLMDeployment's router or serving pods never match
    (the parts after the name have no dash), and serving pods do not export the router's
    metrics."""
    prefix = router_name(deployment) + "-"
    if len(prefix) >= _GENERATED_BASE_MAX:
        return f"{_regex_literal(prefix[:_GENERATED_BASE_MAX])}[a-z0-9]{{5}}"
    # Room left for the hash and its dash before the cut: a cut hash may lose the dash.
    room = _GENERATED_BASE_MAX - len(prefix)
    full = "[a-z0-9]{1,10}-"
    if room >= 11:
        return f"{_regex_literal(prefix)}{full}[a-z0-9]{{5}}"
    return f"{_regex_literal(prefix)}({full}|[a-z0-9]{{{room}}})[a-z0-9]{{5}}"


def router_selector(namespace: str, deployment: str) -> str:
    """Label matchers for the router pods of one deployment."""
    if not deployment:
        raise ValueError("a router selector needs the deployment's name")
    return (
        f'namespace="{_promql_string(namespace)}",'
        f'pod=~"{_promql_string(router_pod_regex(deployment))}"'
    )


def render(template: str, namespace: str, pods: Iterable[str], deployment: str) -> str:
    names = list(pods)
    return (
        template.replace("$exported_selector", pod_selector(namespace, names, prefix="exported_"))
        .replace("$router_selector", router_selector(namespace, deployment))
        .replace("$selector", pod_selector(namespace, names))
    )


def queries_for(overrides: QueryOverrides | None) -> dict[str, str]:
    chosen = dict(DEFAULT_QUERIES)
    if overrides is not None:
        for name in SIGNALS:
            override = getattr(overrides, name)
            if override:
                chosen[name] = override
    return chosen


def _status_code(error: PrometheusApiClientException) -> int | None:
    match = re.search(r"HTTP Status Code (\d+)", str(error))
    return int(match.group(1)) if match else None


def _api_error(error: PrometheusApiClientException) -> str:
    # The client formats the body as a bytes repr; Prometheus puts its reason in "error".
    match = re.search(r"HTTP Status Code \d+ \((b(['\"]).*\2)\)\s*$", str(error), re.DOTALL)
    if match:
        try:
            body = json.loads(ast.literal_eval(match.group(1)))
            return str(body.get("error") or body)[:300]
        except (ValueError, SyntaxError, TypeError, AttributeError):
            pass
    return str(error)[:300]


def _root_cause(error: BaseException) -> str:
    # urllib3 nests the reason in a long message that repeats the whole query URL.
    text = str(error)
    match = re.search(r"(\[Errno -?\d+\][^\"')]*|Read timed out|timed out)", text)
    return match.group(1).strip(" .") if match else text[:200]


def classify(error: BaseException) -> tuple[Availability, str]:
    """Map a failed query to the MetricsAvailable reason it stands for."""
    if isinstance(error, requests.Timeout):
        return Availability.UNREACHABLE, f"timed out: {_root_cause(error)}"
    if isinstance(error, requests.ConnectionError | requests.exceptions.RetryError):
        return Availability.UNREACHABLE, f"connection failed: {_root_cause(error)}"
    if isinstance(error, PrometheusApiClientException):
        code = _status_code(error)
        if code in (502, 503, 504):
            return Availability.UNREACHABLE, f"HTTP {code} from Prometheus"
        return Availability.QUERY_ERROR, f"HTTP {code}: {_api_error(error)}"
    if isinstance(error, ValueError | KeyError | TypeError):
        # A 200 that is not Prometheus' JSON: a proxy page, a wrong URL path.
        return Availability.QUERY_ERROR, f"not a Prometheus API answer: {error!r}"
    if isinstance(error, requests.RequestException):
        return Availability.UNREACHABLE, str(error)
    raise error


def _as_float(text: Any) -> float:
    return float(text)  # Prometheus encodes values as strings: "1.5", "NaN", "+Inf"


def _vector_values(result: Any) -> list[tuple[dict[str, str], float, float]]:
    """(labels, evaluation timestamp, value) per series of an instant query result."""
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        return [({}, float(result[0]), _as_float(result[1]))]  # a scalar result
    series = []
    for item in result:
        timestamp, value = item["value"]
        series.append((dict(item.get("metric", {})), float(timestamp), _as_float(value)))
    return series


def _combine(name: str, values: Sequence[float]) -> float:
    return _COMBINE[name](values)


class PrometheusReader:
    """Reads one deployment's signals. Synchronous (requests): call it from a worker thread."""

    def __init__(
        self,
        source: PrometheusSource,
        *,
        session: requests.Session | None = None,
        observer: Observer = _ignore,
        max_sample_age_seconds: float = 90.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not source.url:
            raise ValueError("adaptive.prometheus.url is not set")
        self.source = source
        self.queries = queries_for(source.queries)
        self.observer = observer
        self.max_sample_age_seconds = max_sample_age_seconds
        self.clock = clock
        # No retries in the HTTP layer: the next adaptive pass tries again, and a dead Prometheus
        # must cost one timeout per round, not (1 + retries) x timeout per query.
        self.client = PrometheusConnect(
            url=source.url.rstrip("/"),
            retry=Retry(total=0, raise_on_status=False),
            session=session,
            timeout=source.timeout_seconds,
        )

    def close(self) -> None:
        self.client.close()

    def _query(self, name: str, promql: str) -> tuple[Any, QueryOutcome]:
        started = self.clock()
        try:
            result = self.client.custom_query(
                promql, params={"timeout": f"{self.source.timeout_seconds}s"}
            )
            values = _vector_values(result)
        except Exception as error:  # classify() re-raises anything it does not recognise
            failure, detail = classify(error)
            seconds = self.clock() - started
            self.observer(name, seconds, failure)
            return None, QueryOutcome(name, promql, None, failure, detail, seconds)
        seconds = self.clock() - started
        self.observer(name, seconds, None)
        return values, QueryOutcome(name, promql, None, None, "", seconds)

    def read(self, namespace: str, pods: Sequence[str], *, deployment: str) -> Reading:
        """One round for the serving `pods` (and the router pods) of `deployment`: coverage
        first (it fails fast when Prometheus is down), then each signal."""
        started = self.clock()
        if not pods:
            return Reading(None, Availability.NO_PODS, "the deployment has no pods to read")
        outcomes: dict[str, QueryOutcome] = {}

        coverage = render(COVERAGE_QUERY, namespace, pods, deployment)
        coverage_series, outcome = self._query(COVERAGE, coverage)
        outcomes[COVERAGE] = outcome
        if outcome.failure is Availability.UNREACHABLE:
            return Reading(
                None,
                Availability.UNREACHABLE,
                f"Prometheus at {self.source.url} is unreachable: {outcome.detail}",
                outcomes,
                self.clock() - started,
            )
        reporting, stale_problem = self._coverage(coverage_series, outcome, outcomes)

        values: dict[str, float | None] = {}
        for name in SIGNALS:
            values[name], outcomes[name] = self._signal(name, namespace, pods, deployment)
            if outcomes[name].failure is Availability.UNREACHABLE:
                break  # Prometheus went away mid-round: the rest would only time out too.

        availability, message = self._judge(outcomes, stale_problem)
        samples = _samples(values, reporting, availability, message)
        return Reading(samples, availability, message, outcomes, self.clock() - started)

    def _signal(
        self, name: str, namespace: str, pods: Sequence[str], deployment: str
    ) -> tuple[float | None, QueryOutcome]:
        """One signal's value (its series combined), or why there is none."""
        promql = render(self.queries[name], namespace, pods, deployment)
        series, outcome = self._query(name, promql)
        if series is None:
            return None, outcome
        finite = [v for _, _, v in series if math.isfinite(v)]
        if finite:
            value = _combine(name, finite)
            return value, QueryOutcome(name, outcome.query, value, None, "", outcome.seconds)
        detail = "returned NaN" if series else "returned no series"
        return None, QueryOutcome(
            name, outcome.query, None, Availability.NO_DATA, detail, outcome.seconds
        )

    def _coverage(
        self, series: Any, outcome: QueryOutcome, outcomes: dict[str, QueryOutcome]
    ) -> tuple[int | None, str]:
        if series is None:
            return None, ""
        if not series:
            outcomes[COVERAGE] = QueryOutcome(
                COVERAGE,
                outcome.query,
                None,
                Availability.NO_DATA,
                "no pod of this deployment has vllm:num_requests_waiting samples",
                outcome.seconds,
            )
            # Not blocking by itself (queries may be overridden for another engine): per-replica
            # figures then divide by the ready pods, and missing QPS or queue still holds.
            return None, ""
        fresh = 0
        newest_age = float("inf")
        for _labels, evaluated_at, last_sample in series:
            age = evaluated_at - last_sample
            newest_age = min(newest_age, age)
            if age <= self.max_sample_age_seconds:
                fresh += 1
        if fresh == 0:
            # Whole minutes only: the message lands in status, which must not change every pass.
            problem = (
                f"the newest sample is over {int(newest_age // 60)} min old "
                f"(limit {self.max_sample_age_seconds:.0f}s)"
                if newest_age >= 60
                else f"the newest sample is older than {self.max_sample_age_seconds:.0f}s"
            )
            outcomes[COVERAGE] = QueryOutcome(
                COVERAGE, outcome.query, 0.0, Availability.STALE, problem, outcome.seconds
            )
            return 0, problem
        outcomes[COVERAGE] = QueryOutcome(
            COVERAGE, outcome.query, float(fresh), None, "", outcome.seconds
        )
        return fresh, ""

    def _judge(
        self, outcomes: Mapping[str, QueryOutcome], stale_problem: str
    ) -> tuple[Availability, str]:
        blocking = [
            o
            for name, o in outcomes.items()
            if o.failure is not None
            and (name in REQUIRED or (name == COVERAGE and o.failure is not Availability.NO_DATA))
        ]
        if any(o.failure is Availability.UNREACHABLE for o in outcomes.values()):
            blocking = [o for o in outcomes.values() if o.failure is Availability.UNREACHABLE]
        if blocking:
            worst = min(blocking, key=lambda o: _SEVERITY.index(o.failure))  # type: ignore[arg-type]
            assert worst.failure is not None
            details = "; ".join(f"{o.name}: {o.detail}" for o in blocking)
            if worst.failure is Availability.STALE:
                details = stale_problem or details
            return worst.failure, details
        optional_errors = [o for o in outcomes.values() if o.failure is Availability.QUERY_ERROR]
        if optional_errors:
            details = "; ".join(f"{o.name}: {o.detail}" for o in optional_errors)
            return Availability.PARTIAL, f"optional queries failed: {details}"
        missing = sorted(n for n, o in outcomes.items() if o.failure is Availability.NO_DATA)
        note = f"; no data for {', '.join(missing)}" if missing else ""
        # No latency here: the message lands in status, which is written only when it changes
        # (latency goes to autoglm_operator_prometheus_query_seconds instead).
        return Availability.OK, f"{len(outcomes)} queries answered{note}"

    def read_range(
        self,
        namespace: str,
        pods: Sequence[str] | None,
        start: datetime,
        end: datetime,
        step_seconds: int,
        *,
        deployment: str,
        pod_regex: str | None = None,
    ) -> list[tuple[float, Samples]]:
        """Samples at every step of a past window, for `replay`. Failures raise: it is a CLI."""

        def scoped(template: str) -> str:
            if pods:
                return render(template, namespace, pods, deployment)
            assert pod_regex is not None, "pods or pod_regex"
            regex = f'namespace="{_promql_string(namespace)}",pod=~"{_promql_string(pod_regex)}"'
            exported = (
                f'exported_namespace="{_promql_string(namespace)}",'
                f'exported_pod=~"{_promql_string(pod_regex)}"'
            )
            return (
                template.replace("$exported_selector", exported)
                .replace("$router_selector", router_selector(namespace, deployment))
                .replace("$selector", regex)
            )

        columns: dict[str, dict[float, float]] = {}
        for name, template in [*self.queries.items(), (COVERAGE, COVERAGE_RANGE_QUERY)]:
            result = self.client.custom_query_range(
                scoped(template), start_time=start, end_time=end, step=f"{step_seconds}s"
            )
            points: dict[float, list[float]] = {}
            for series in result:
                for timestamp, text in series["values"]:
                    value = _as_float(text)
                    if math.isfinite(value):
                        points.setdefault(float(timestamp), []).append(value)
            combine = sum if name == COVERAGE else (lambda v, n=name: _combine(n, v))
            columns[name] = {t: combine(v) for t, v in points.items()}
        stamps = sorted(set().union(*(c.keys() for c in columns.values())))
        rows = []
        for t in stamps:
            coverage = columns[COVERAGE].get(t)
            signals: dict[str, Any] = {name: columns[name].get(t) for name in SIGNALS}
            reporting = int(coverage) if coverage is not None else None
            rows.append((t, Samples(**signals, reporting_replicas=reporting)))
        return rows


def _samples(
    values: Mapping[str, float | None],
    reporting: int | None,
    availability: Availability,
    message: str,
) -> Samples:
    usable = availability in (Availability.OK, Availability.PARTIAL)
    if not usable:
        # Never hand the policy half a picture: required values are withheld as a whole.
        return Samples(
            kv_cache_percent=values.get(KV_CACHE_PERCENT),
            gpu_memory_percent=values.get(GPU_MEMORY_PERCENT),
            ttft_p95_seconds=values.get(TTFT_P95_SECONDS),
            reporting_replicas=reporting,
            problem=f"{availability.value}: {message}",
        )
    signals: dict[str, Any] = {name: values.get(name) for name in SIGNALS}  # Samples' fields
    return Samples(**signals, reporting_replicas=reporting, problem=None)
