"""Through the operator's router under load: Service `<name>` (the router pods, run by the pod
runner as `autoglm-router` processes) while the operator flips every replica to batching and
back. No request may fail, with client retries off."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from testkit.loadgen import LoadReport, RequestResult, run_load
from testkit.localcluster import LocalCluster
from testkit.operator_kit import (
    KUBECTL_FAILED,
    NAME,
    Operator,
    agd_object,
    deploy,
    patch_agd,
    pod_modes,
)
from testkit.podrunner import PodRunner
from testkit.servicelb import ServiceProxy
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(420)

STREAMED_QPS = 4.0
OTHER_QPS = 2.0
DURATION = 45.0


async def _non_streamed(base_url: str, qps: float, duration: float, report: LoadReport) -> None:
    """Non-streamed chats (the router's `other` class) at a steady rate, retries off."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=120)

    async def one() -> None:
        started = time.monotonic()
        try:
            await client.chat.completions.create(
                model="autoglm-phone-9b", max_tokens=16,
                messages=[{"role": "user", "content": "Summarise my unread messages."}],
            )  # fmt: skip
            done = time.monotonic()
            report.results.append(RequestResult(started, done - started, done - started))
        except Exception as exc:  # a failed request is data
            error = f"{type(exc).__name__}: {exc}"
            report.results.append(RequestResult(started, None, None, error))

    tasks = []
    start = time.monotonic()
    while time.monotonic() - start < duration:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(1 / qps)
    await asyncio.gather(*tasks)
    await client.close()


def test_flips_under_load_through_the_router_fail_no_request(
    cluster: LocalCluster, namespace: str, pod_runner: PodRunner, operator: Operator
) -> None:
    ns = namespace
    deploy(cluster, ns, agd_object(replicas=2, modePolicy="Streaming"), "2/2")
    eventually(lambda: len(pod_runner.runtime_urls(ns)) == 2, 60, every=0.5,
               what="a sim per serving pod", ignoring=KUBECTL_FAILED)
    eventually(lambda: len(pod_runner.router_urls(ns)) == 2, 60, every=0.5,
               what="a router per router pod", ignoring=KUBECTL_FAILED)
    streamed, other = LoadReport(), LoadReport()
    flips: list[tuple[str, float]] = []

    def all_in(mode: str) -> bool:
        modes = pod_modes(cluster, ns)
        return len(modes) == 2 and set(modes.values()) == {mode}

    async def flip_twice() -> None:
        for mode, policy in (("batching", "Batching"), ("streaming", "Streaming")):
            await asyncio.sleep(10)
            await asyncio.to_thread(patch_agd, cluster, ns, {"spec": {"modePolicy": policy}})
            await asyncio.to_thread(eventually, lambda m=mode: all_in(m), 30, every=0.5,
                                    what=f"both replicas {mode}", ignoring=KUBECTL_FAILED)
            flips.append((mode, time.monotonic()))

    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
        assert {e.pod for e in proxy.endpoints()} == set(pod_runner.router_urls(ns))
        base = proxy.url + "/v1"

        async def scenario() -> None:
            await asyncio.gather(
                run_load([base], lambda _: STREAMED_QPS, DURATION, report=streamed),
                _non_streamed(base, OTHER_QPS, DURATION, other),
                flip_twice(),
            )

        asyncio.run(scenario())
        assert set(proxy.stats.connections) <= set(pod_runner.router_urls(ns))

    counts = pod_runner.router_requests_once(ns, len(streamed.results) + len(other.results))
    print(f"{len(streamed.results)} streamed, {len(other.results)} other; flips {flips}; "
          f"router counts {counts}")  # fmt: skip
    assert [m for m, _ in flips] == ["batching", "streaming"]
    assert streamed.results and other.results
    assert not streamed.failures, streamed.failures[:3]
    assert not other.failures, other.failures[:3]
    # Every request went through a router and came back ok; streamed chats met both modes
    # (streaming replicas before and after, batching ones while every replica was batching).
    assert {outcome for _, _, outcome in counts} == {"ok"}
    assert sum(counts.values()) == len(streamed.results) + len(other.results)
    assert counts.get(("streamed_chat", "streaming", "ok"), 0) > 0
    assert counts.get(("streamed_chat", "batching", "ok"), 0) > 0
