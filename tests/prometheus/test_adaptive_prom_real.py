"""prom.py against a real Prometheus (Debian's) scraping fake pods on loopback.

Tiny exporters stand in for pods: two of deployment `chat` and one of `chat-batch` (a
neighbour whose pod names share a prefix), each serving vLLM and runtime metric names, one of
`solo` (no router), and router pods (two of `chat`, one of `chat-batch`) serving the router's
request counter, all with the `namespace` and `pod` target labels a PodMonitor or `role: pod`
relabeling gives them. The test checks the default PromQL end to end: values, scoping, demand
from the routers or, without them, from the pods, staleness when a pod stops, a rejected
override, and Prometheus going away. About 15 s; everything on ephemeral loopback ports.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

import pytest
import requests
import yaml

from autoglm_operator.io import prom
from autoglm_operator.io.prom import Availability, PrometheusReader
from autoglm_operator.resource.spec import PrometheusSource, QueryOverrides
from testkit.localcluster import free_port
from testkit.localprom import LocalPrometheus, serve_exposition
from testkit.waiting import TIME_SCALE

GIB = 1024**3


@dataclass
class FakePod:
    name: str
    qps: float
    waiting: int
    queued: int
    kv: float
    gpu_used: tuple[float, float]  # GiB used on each of 2 GPUs of 48 GiB
    ttft_fast_share: float  # share of requests under 0.25 s
    mode: str = "streaming"
    received: tuple[float, float] = (0.0, 0.0)  # req/s arriving: streamed chats, the rest
    started: float = field(default_factory=time.time)

    def exposition(self) -> str:
        elapsed = time.time() - self.started
        served = self.qps * elapsed
        fast = served * self.ttft_fast_share
        chats, others = (rate * elapsed for rate in self.received)
        lines = [
            "# TYPE autoglm_requests_received_total counter",
            f'autoglm_requests_received_total{{traffic_class="streamed_chat"}} {chats:.3f}',
            f'autoglm_requests_received_total{{traffic_class="other"}} {others:.3f}',
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{model_name="autoglm-phone-9b",engine="0",'
            f'finished_reason="stop"}} {served:.3f}',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{model_name="autoglm-phone-9b",engine="0"}} {self.waiting}',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{model_name="autoglm-phone-9b",engine="0"}} {self.kv}',
            "# TYPE autoglm_requests_queued gauge",
            f"autoglm_requests_queued {self.queued}",
            "# TYPE autoglm_mode gauge",
            f'autoglm_mode{{mode="streaming"}} {int(self.mode == "streaming")}',
            f'autoglm_mode{{mode="batching"}} {int(self.mode == "batching")}',
            "# TYPE autoglm_gpu_memory_used_bytes gauge",
            "# TYPE autoglm_gpu_memory_total_bytes gauge",
            "# TYPE vllm:time_to_first_token_seconds histogram",
        ]
        for gpu, used in enumerate(self.gpu_used):
            lines.append(f'autoglm_gpu_memory_used_bytes{{gpu="{gpu}"}} {used * GIB:.0f}')
            lines.append(f'autoglm_gpu_memory_total_bytes{{gpu="{gpu}"}} {48 * GIB}')
        for le, count in (("0.25", fast), ("1.0", served), ("+Inf", served)):
            lines.append(
                f'vllm:time_to_first_token_seconds_bucket{{model_name="autoglm-phone-9b",'
                f'engine="0",le="{le}"}} {count:.3f}'
            )
        lines.append(f"vllm:time_to_first_token_seconds_count {served:.3f}")
        return "\n".join(lines) + "\n"


@dataclass
class FakeRouter:
    """A router pod: autoglm_router_requests_total, req/s by (traffic_class, mode, outcome)."""

    name: str
    rates: dict[tuple[str, str, str], float]
    started: float = field(default_factory=time.time)

    def exposition(self) -> str:
        elapsed = time.time() - self.started
        lines = ["# TYPE autoglm_router_requests_total counter"]
        for (traffic_class, mode, outcome), rate in self.rates.items():
            lines.append(
                f'autoglm_router_requests_total{{traffic_class="{traffic_class}",mode="{mode}",'
                f'outcome="{outcome}"}} {rate * elapsed:.3f}'
            )
        return "\n".join(lines) + "\n"


def serve(pod: FakePod | FakeRouter) -> ThreadingHTTPServer:
    return serve_exposition(lambda: pod.exposition().encode())


OURS = [
    FakePod("chat-5d8f9c7b4-aaaaa", 2.0, 1, 2, 0.30, (30.0, 36.0), 0.9, received=(1.5, 0.5)),
    FakePod("chat-5d8f9c7b4-bbbbb", 3.0, 4, 3, 0.50, (20.0, 24.0), 0.5, "batching", (0.0, 3.0)),
]
NEIGHBOUR = FakePod("chat-batch-6c4d8f7b9-ccccc", 50.0, 40, 40, 0.99, (47.0, 47.0), 0.0)
# A deployment without a router (or with one older than its counter): demand falls back to
# what its serving pods received.
SOLO = FakePod("solo-7b6c5d4f3-ddddd", 1.0, 0, 0, 0.10, (10.0, 10.0), 1.0, received=(0.5, 0.25))
# Two routers of `chat`, each counting its own requests; the first shed 1 chat/s (429, rule
# 1c: mode none). The routers count 4 chats/s and 3 others/s where the pods received 1.5 and 3.5.
ROUTERS = [
    FakeRouter(
        "chat-router-6f7d8c9b5-rrrrr",
        {
            ("streamed_chat", "streaming", "ok"): 2.0,
            ("streamed_chat", "none", "refused"): 1.0,
            ("other", "batching", "ok"): 1.0,
        },
    ),
    FakeRouter(
        "chat-router-6f7d8c9b5-sssss",
        {("streamed_chat", "streaming", "ok"): 1.0, ("other", "batching", "client_error"): 2.0},
    ),
]
NEIGHBOUR_ROUTER = FakeRouter(
    "chat-batch-router-5b6c7d8f9-ttttt", {("streamed_chat", "streaming", "ok"): 50.0}
)
TARGETS: list[FakePod | FakeRouter] = [*OURS, NEIGHBOUR, SOLO, *ROUTERS, NEIGHBOUR_ROUTER]


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, ThreadingHTTPServer]]]:
    workdir = tmp_path_factory.mktemp("prometheus")
    servers = {pod.name: serve(pod) for pod in TARGETS}
    jobs = []
    for name, server in servers.items():
        jobs.append(
            f"  - job_name: {name}\n"
            f"    static_configs:\n"
            f"      - targets: ['127.0.0.1:{server.server_address[1]}']\n"
            f"        labels: {{namespace: prod, pod: {name}}}\n"
        )
    config = yaml.safe_load(
        "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\n"
        "scrape_configs:\n" + "".join(jobs)
    )
    prom = LocalPrometheus(workdir, custom_config=config).start()
    url = prom.url
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                query = "count(rate(up[1m]))"
                answer = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=2)
                result = answer.json()["data"]["result"]
                if result and float(result[0]["value"][1]) == len(TARGETS):
                    break  # every target scraped at least twice: rate() has data
            except (requests.RequestException, KeyError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("Prometheus did not scrape the fake pods within 60 s")
            time.sleep(0.5)
        yield url, servers
    finally:
        prom.stop()
        for server in servers.values():
            server.shutdown()
            server.server_close()


def reader(url: str, **queries: str) -> PrometheusReader:
    return PrometheusReader(
        PrometheusSource(url=url, timeout_seconds=5, queries=QueryOverrides(**queries)),
        max_sample_age_seconds=30,
    )


def test_default_queries_read_only_this_deployment(prometheus: tuple[str, dict]) -> None:
    url, _ = prometheus
    pods = [p.name for p in OURS]
    reading = reader(url).read("prod", pods, deployment="chat")
    assert reading.availability is Availability.OK, reading.message
    samples = reading.samples
    assert samples is not None
    # rate()[1m] divides by the whole minute, so a series younger than that reads low: the
    # default QPS undershoots for a new pod's first minute (conservative: it delays batching).
    assert samples.qps is not None and 0 < samples.qps < 5.0
    short = reader(url, qps="sum(rate(vllm:request_success_total{$selector}[4s]))")
    deadline = time.monotonic() + 15
    while True:  # a 4 s window is full once the series is 4 s old
        qps = short.read("prod", pods, deployment="chat").samples.qps  # type: ignore[union-attr]
        if qps == pytest.approx(5.0, rel=0.1) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert qps == pytest.approx(5.0, rel=0.1), "2 + 3 req/s, not the neighbour's 50"
    assert samples.queue_depth == 3, "the streaming pod's vLLM waiting 1 + middleware queued 2"
    assert samples.gpu_memory_percent == pytest.approx(75.0), "the fullest GPU: 36 of 48 GiB"
    assert samples.kv_cache_percent == pytest.approx(40.0)
    assert samples.ttft_p95_seconds is not None and 0.25 < samples.ttft_p95_seconds <= 1.0
    assert samples.reporting_replicas == 2
    assert reading.outcomes and all(o.seconds < 2 * TIME_SCALE for o in reading.outcomes.values())


def _demand_within(
    url: str, pods: list[str], deployment: str, want: tuple[float, float]
) -> tuple[float | None, float | None]:
    """chat_rate and other_rate with the default demand queries over a 4 s window (full once
    the series are 4 s old, where [1m] would read low for their first minute)."""
    short = reader(
        url,
        chat_rate=prom.demand_query("streamed_chat", "4s"),
        other_rate=prom.demand_query("other", "4s"),
    )
    deadline = time.monotonic() + 15
    while True:
        samples = short.read("prod", pods, deployment=deployment).samples
        assert samples is not None
        got = (samples.chat_rate, samples.other_rate)
        if got == pytest.approx(want, rel=0.1) or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_demand_is_every_request_the_routers_took_else_what_the_pods_received(
    prometheus: tuple[str, dict],
) -> None:
    url, _ = prometheus
    # Both routers of `chat` summed, the chat one shed included; not the neighbour's router,
    # and not the pods' own count (which misses what was shed).
    assert _demand_within(url, [p.name for p in OURS], "chat", (4.0, 3.0)) == pytest.approx(
        (4.0, 3.0), rel=0.1
    )
    # No router series for `solo`: its serving pod's count.
    assert _demand_within(url, [SOLO.name], "solo", (0.5, 0.25)) == pytest.approx(
        (0.5, 0.25), rel=0.1
    )


def test_own_class_shares_per_mode(prometheus: tuple[str, dict]) -> None:
    url, _ = prometheus
    samples = reader(url).read("prod", [p.name for p in OURS], deployment="chat").samples
    assert samples is not None
    # The streaming pod received 1.5 chats and 0.5 others per second, the batching pod only
    # others (a ratio of two rates over the same series' age: exact before [1m] fills).
    assert samples.streaming_own_share == pytest.approx(0.75, rel=0.05)
    assert samples.batching_own_share == pytest.approx(1.0)


def test_a_rejected_override_is_a_query_error(prometheus: tuple[str, dict]) -> None:
    url, _ = prometheus
    reading = reader(url, qps="sum(rate(vllm:request_success_total{$selector}[1m])").read(
        "prod", [p.name for p in OURS], deployment="chat"
    )
    assert reading.availability is Availability.QUERY_ERROR
    assert "HTTP 400" in reading.message and "parse error" in reading.message


def test_a_pod_nobody_scrapes_is_no_data(prometheus: tuple[str, dict]) -> None:
    url, _ = prometheus
    reading = reader(url).read("prod", ["chat-5d8f9c7b4-zzzzz"], deployment="chat")
    assert reading.availability is Availability.NO_DATA
    assert reading.samples is not None and reading.samples.qps is None


def test_a_stopped_pod_drops_out_and_a_stopped_prometheus_is_unreachable(
    prometheus: tuple[str, dict],
) -> None:
    url, servers = prometheus
    servers[OURS[1].name].shutdown()
    servers[OURS[1].name].server_close()
    deadline = time.monotonic() + 20
    while True:  # the next failed scrape writes stale markers for the pod's series
        reading = reader(url).read("prod", [p.name for p in OURS], deployment="chat")
        if reading.samples is not None and reading.samples.reporting_replicas == 1:
            break
        assert time.monotonic() < deadline, reading
        time.sleep(0.5)
    assert reading.available
    assert reading.samples.queue_depth == 3, "only the live pod's queue is left"
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    down = reader(dead).read("prod", [p.name for p in OURS], deployment="chat")
    assert down.availability is Availability.UNREACHABLE
    assert time.monotonic() - started < 2, "a refused connection fails the round at once"
