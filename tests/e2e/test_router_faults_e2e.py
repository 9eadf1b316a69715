"""Faults through the operator's router under load, client retries off (`max_retries=0`).

The client reaches Service `<name>` through testkit.servicelb, which forwards as kube-proxy does:
each new connection to the next ready router pod, a kept-alive connection stays with its pod.
The `openai` client keeps its connections alive between requests, so both faults meet
connections opened before them.

- A serving pod deleted (preStop sleep, SIGTERM, drain): the routers stop sending it requests
  and retry a draining refusal elsewhere, so no request fails.
- A router pod deleted: the proxy drops it at once (deletionTimestamp), the router keeps
  answering on the connections it has during the preStop sleep, then on SIGTERM finishes what
  it has in flight and answers each kept-alive connection's next request with `Connection:
  close` (closing idle ones at once failed a request the client was sending on one); the
  client's next connection goes to another router. No request fails.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from testkit.loadgen import LoadReport, run_load
from testkit.localcluster import LocalCluster
from testkit.operator_kit import (
    KUBECTL_FAILED,
    NAME,
    Operator,
    agd_object,
    deploy,
    live_pods,
    ready_as,
)
from testkit.podrunner import PodRunner
from testkit.servicelb import ServiceProxy
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(240)

QPS = 4.0
LOAD_SECONDS = 30.0
DELETE_AT = 8.0  # seconds into the load
ANSWER = {"min_tokens": 100}  # ~2 s streams: some are in flight when SIGTERM comes


def _ready(cluster: LocalCluster, ns: str, pod_runner: PodRunner) -> None:
    deploy(cluster, ns, agd_object(replicas=2, modePolicy="Streaming"), "2/2")
    eventually(lambda: len(pod_runner.runtime_urls(ns)) == 2, 60, every=0.5,
               what="a sim per serving pod", ignoring=KUBECTL_FAILED)
    eventually(lambda: len(pod_runner.router_urls(ns)) == 2, 60, every=0.5,
               what="a router per router pod", ignoring=KUBECTL_FAILED)


def _load_with_deletion(
    cluster: LocalCluster, ns: str, proxy: ServiceProxy, pod: str
) -> tuple[LoadReport, float]:
    """Load through the Service for LOAD_SECONDS; `pod` deleted DELETE_AT seconds in."""
    report = LoadReport()
    deleted_at = 0.0

    async def delete_later() -> None:
        nonlocal deleted_at
        await asyncio.sleep(DELETE_AT)
        deleted_at = time.time()
        await asyncio.to_thread(cluster.kubectl, "delete", "pod", pod, "-n", ns, "--wait=false")

    async def scenario() -> None:
        await asyncio.gather(
            run_load([proxy.url + "/v1"], lambda _: QPS, LOAD_SECONDS, report=report,
                     extra_body=ANSWER, max_retries=0),
            delete_later(),
        )  # fmt: skip

    asyncio.run(scenario())
    return report, deleted_at


def test_serving_pod_deleted_under_load_through_the_router_fails_no_request(
    cluster: LocalCluster, namespace: str, pod_runner: PodRunner, operator: Operator
) -> None:
    ns = namespace
    _ready(cluster, ns, pod_runner)
    victim = sorted(pod_runner.runtime_urls(ns))[0]
    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
        report, _ = _load_with_deletion(cluster, ns, proxy, victim)
        counts = pod_runner.router_requests_once(ns, len(report.results))
    print(f"serving pod {victim} deleted: {len(report.results)} requests, "
          f"{len(report.failures)} failed; router counts {counts}")  # fmt: skip
    assert len(report.results) >= QPS * LOAD_SECONDS * 0.8
    assert not report.failures, report.failures[:3]
    assert {outcome for _, _, outcome in counts} == {"ok"}
    assert sum(counts.values()) == len(report.results)
    # The replacement joins: two serving pods again, the deleted one not among them.
    eventually(ready_as(cluster, ns, "2/2"), 60, every=0.5, what="2/2 again",
               ignoring=KUBECTL_FAILED)
    assert victim not in {p["metadata"]["name"] for p in live_pods(cluster, ns)}


def test_router_pod_deleted_under_load_fails_no_request(
    cluster: LocalCluster, namespace: str, pod_runner: PodRunner, operator: Operator
) -> None:
    ns = namespace
    _ready(cluster, ns, pod_runner)
    routers = sorted(pod_runner.router_urls(ns))
    victim, survivor = routers
    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
        report, deleted_at = _load_with_deletion(cluster, ns, proxy, victim)
        stats = proxy.stats
    removed_at = stats.removed_at.get(victim)
    after = [pod for when, pod in stats.connection_times if removed_at and when >= removed_at]
    before = [pod for when, pod in stats.connection_times if when < deleted_at]
    print(f"router pod {victim} deleted: {len(report.results)} requests, "
          f"{len(report.failures)} failed; connections before the deletion {before}, "
          f"after the endpoint's removal {after} "
          f"(removed {removed_at and removed_at - deleted_at:.2f} s after the delete)")  # fmt: skip
    assert len(report.results) >= QPS * LOAD_SECONDS * 0.8
    assert not report.failures, report.failures[:3]
    # Both routers served before the deletion; no new connection went to the deleted one once
    # it left the endpoints (the survivor and the replacement router pod took them).
    assert {victim, survivor} <= set(before)
    assert len(stats.connection_times) < len(report.results) / 4  # kept alive, reused
    assert removed_at is not None and removed_at - deleted_at < 2.0
    assert after and victim not in after
