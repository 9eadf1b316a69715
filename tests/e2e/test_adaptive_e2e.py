"""The adaptive pass end to end, with every real piece.

The local control plane with kwok GPU nodes, the operator as a subprocess, Debian's Prometheus
scraping a `sim` runtime per pod (the pod runner binds each pod's loopback IP), and a bounded
load from the official `openai` client. Batch demand (non-streamed requests) rises past what one
batching replica serves: replicas flip to batching one step at a time up to the streaming floor,
and status, pod labels, the runtimes and `autoglm_mode` in Prometheus all agree. Load falls to
a trickle of chats: batching no longer pays and they return. No request fails. Prometheus
dies: modes hold and the condition says why; it returns: the loop resumes.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from autoglm_operator.io.prom import demand_query
from testkit.loadgen import LoadReport, run_load
from testkit.localcluster import LocalCluster
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import Operator, admin_token, pod_modes, runtime_state
from testkit.podrunner import PodRunner
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(600)

NAME = "phone-9b"
REPLICAS = 3
INTERVAL = 5
HIGH_QPS_PER_REPLICA = 1.5
# Batch jobs one batching replica serves, as the demand sizing's seed: the test's 9 jobs/s need
# three, so the split steps up to the floor (2 of 3 batching).
BATCHING_PER_REPLICA = 3.0


def resource(prometheus_url: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoglm.io/v1alpha1",
        "kind": "AutoGLMDeployment",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": REPLICAS,
            "adaptive": {
                "intervalSeconds": INTERVAL,
                "prometheus": {
                    "url": prometheus_url,
                    "timeoutSeconds": 2,
                    # Short rate windows: the test runs in minutes, not hours.
                    "queries": {
                        "qps": "sum(rate(vllm:request_success_total{$selector}[10s]))",
                        "chatRate": demand_query("streamed_chat", "10s"),
                        "otherRate": demand_query("other", "10s"),
                    },
                },
                "capacity": {"batchingPerReplicaMilli": int(BATCHING_PER_REPLICA * 1000)},
                "qpsPerReplicaMilli": {"high": int(HIGH_QPS_PER_REPLICA * 1000), "low": 600},
                "queueDepthPerReplica": {"high": 2, "low": 1},
                "toBatchingStabilizationSeconds": 5,
                "toStreamingStabilizationSeconds": 10,
                "cooldownSeconds": 10,
                "minStreamingReplicas": 1,
                "maxFlipsPerStep": 1,
            },
            # A small streaming concurrency cap (~1.9 req/s of 64-token streams per replica): the
            # test's load queues in front of streaming replicas, the evidence the policy needs for
            # a second step; a long queue timeout keeps those waiting requests from failing.
            "profiles": {"streaming": {"maxConcurrency": 3, "queueTimeoutSeconds": 120}},
        },
    }


def agd(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    return cluster.get_json("agd", NAME, "-n", namespace)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def batching_count(cluster: LocalCluster, namespace: str) -> int:
    return int(agd(cluster, namespace).get("status", {}).get("batchingReplicas", 0))


def modes_agree(
    cluster: LocalCluster, namespace: str, runner: PodRunner, prom: LocalPrometheus, token: str
) -> dict[str, str]:
    """Pod label, the runtime's own answer and autoglm_mode in Prometheus, per pod. The runtime
    must agree at once; Prometheus within a few scrapes."""
    labels = pod_modes(cluster, namespace)
    for pod, label in labels.items():
        url = runner.admin_url(pod)
        assert url is not None, f"no runtime for {pod}"
        mode = runtime_state(url, token)["mode"]
        assert mode == label, f"{pod}: label {label} but runtime runs {mode}"

    def scraped() -> dict[str, str]:
        query = f'autoglm_mode{{namespace="{namespace}"}} == 1'
        return {r["metric"]["pod"]: r["metric"]["mode"] for r in prom.query(query)}

    eventually(lambda: scraped() == labels, 10, every=0.5,
               what=f"autoglm_mode in Prometheus to show {labels}")
    return labels


def test_load_flips_replicas_step_by_step_and_back_and_an_outage_holds_them(
    cluster: LocalCluster,
    namespace: str,
    prometheus: LocalPrometheus,
    pod_runner: PodRunner,
    operator: Operator,
) -> None:
    cluster.apply(resource(prometheus.url), namespace)

    def ready() -> bool:
        return bool(agd(cluster, namespace).get("status", {}).get("readyReplicas") == REPLICAS)

    def runtimes_up() -> bool:
        pods = pod_modes(cluster, namespace)  # no pod yet is not "a runtime per pod"
        return len(pods) == REPLICAS and all(pod_runner.runtime_url(p) for p in pods)

    def all_streaming() -> bool:
        return set(pod_modes(cluster, namespace).values()) == {"streaming"}

    def metrics_available() -> bool:
        return condition(agd(cluster, namespace), "MetricsAvailable").get("status") == "True"

    eventually(ready, 90, every=0.5, what="3 ready replicas")
    eventually(runtimes_up, 60, every=0.5, what="a runtime per pod")
    # One pod template (no rollout here): its pods share its admin token.
    token = admin_token(cluster, namespace, next(iter(pod_modes(cluster, namespace))))
    eventually(all_streaming, 30, every=0.5, what="every pod streaming")
    eventually(metrics_available, 60, every=0.5, what="metrics in Prometheus")

    def targets() -> list[str]:
        return [
            u + "/v1" for p in pod_modes(cluster, namespace) if (u := pod_runner.runtime_url(p))
        ]

    report = LoadReport()
    timings: dict[str, float] = {}

    async def phase(
        qps: float, until: Callable[[], bool], timeout: float, label: str, stream: bool = True
    ) -> None:
        """Hold `qps` (streamed chats, or batch jobs) until `until()` (checked every second)
        or `timeout`."""
        started = time.monotonic()
        load = asyncio.create_task(
            run_load(targets, lambda _: qps, timeout, report=report, stream=stream)
        )
        while time.monotonic() - started < timeout:
            if await asyncio.to_thread(until):
                timings[label] = time.monotonic() - started
                break
            await asyncio.sleep(1)
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)

    async def scenario() -> None:
        # High: 9 batch jobs/s want three batching replicas; maxFlipsPerStep 1 moves one, then
        # the next, up to the floor of one streaming replica.
        def at_least_one() -> bool:
            return batching_count(cluster, namespace) >= 1

        def at_the_floor() -> bool:
            return batching_count(cluster, namespace) == REPLICAS - 1

        await phase(9.0, at_least_one, 90, "first_flip", stream=False)
        await phase(9.0, at_the_floor, 90, "peak", stream=False)
        await asyncio.to_thread(modes_agree, cluster, namespace, pod_runner, prometheus, token)
        # Low: 0.5 chats/s fit any split; batching replicas that no longer pay go back.
        await phase(0.5, lambda: batching_count(cluster, namespace) == 0, 150, "back")

    load_started = time.time()
    asyncio.run(scenario())
    last = agd(cluster, namespace).get("status", {}).get("decisionHistory", [])[-3:]
    assert "first_flip" in timings, f"no replica flipped to batching under load: {last}"
    assert "peak" in timings, f"replicas did not step to batching up to the floor: {last}"
    assert "back" in timings, f"replicas did not return to streaming when load fell: {last}"
    labels = modes_agree(cluster, namespace, pod_runner, prometheus, token)
    assert set(labels.values()) == {"streaming"}
    assert report.results, "no load was sent"
    failures = [r.error for r in report.failures]
    assert not failures, f"{len(failures)} of {len(report.results)} requests failed: {failures[:5]}"

    history = agd(cluster, namespace)["status"].get("decisionHistory", [])
    flips = [d for d in history if d["fromBatching"] != d["toBatching"]]
    assert any(d["toBatching"] > d["fromBatching"] for d in flips)
    assert any(d["toBatching"] < d["fromBatching"] for d in flips)
    events = cluster.get_json("events", "-n", namespace)["items"]
    assert any("batching" in (e.get("message") or "") for e in events), "no Event for a flip"
    crossing_to_flip = threshold_crossing_to_first_flip(prometheus, namespace, flips, load_started)
    flip_seconds = operator_histogram(operator.metrics_port, "autoglm_operator_mode_flip_seconds")

    # Prometheus goes away: modes hold and the condition says why; it returns: the loop resumes.
    before = pod_modes(cluster, namespace)
    prometheus.stop()
    try:

        def metrics_lost() -> dict[str, Any] | None:
            found = condition(agd(cluster, namespace), "MetricsAvailable")
            return found if found.get("status") == "False" else None

        down = eventually(metrics_lost, 4 * INTERVAL, every=0.5, what="MetricsAvailable=False")
        assert down["reason"] == "PrometheusUnreachable", down
        time.sleep(2 * INTERVAL)
        assert pod_modes(cluster, namespace) == before, "modes changed while metrics were down"
    finally:
        prometheus.start()
    eventually(metrics_available, 6 * INTERVAL, every=0.5, what="MetricsAvailable=True again")

    print(
        f"\nE2E: load step to first flip applied {timings['first_flip']:.1f}s; "
        f"threshold crossing (QPS as the loop reads it) to first flip {crossing_to_flip:.1f}s; "
        f"to {REPLICAS - 1} batching {timings['first_flip'] + timings['peak']:.1f}s; "
        f"back to all streaming after load fell {timings['back']:.1f}s; "
        f"decision to runtime confirmation mean {1000 * flip_seconds[0]:.0f} ms over "
        f"{flip_seconds[1]:.0f} flips; requests {len(report.results)}, "
        f"failed {len(report.failures)}; Prometheus down -> {down['reason']}"
    )


def threshold_crossing_to_first_flip(
    prom: LocalPrometheus, namespace: str, flips: list[dict[str, Any]], since: float
) -> float:
    """Seconds from QPS per replica (the query the loop runs) crossing the high threshold to
    the first flip's decision time."""
    first = min(
        datetime.fromisoformat(d["time"].replace("Z", "+00:00")).timestamp()
        for d in flips
        if d["toBatching"] > d["fromBatching"]
    )
    query = f'sum(rate(vllm:request_success_total{{namespace="{namespace}"}}[10s])) / {REPLICAS}'
    values = prom.query_range(query, since, first, step=0.5)
    crossed = next(t for t, v in values if v >= HIGH_QPS_PER_REPLICA)
    return first - crossed


def operator_histogram(port: int, name: str) -> tuple[float, float]:
    """(mean, count) of a histogram on the operator's own /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    sums = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")}  # fmt: skip
    count = sums.get(f"{name}_count", 0.0)
    assert count > 0, f"{name} recorded nothing"
    return sums[f"{name}_sum"] / count, count
