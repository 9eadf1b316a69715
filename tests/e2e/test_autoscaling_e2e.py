"""spec.autoscaling end to end, with every real piece: the fleet follows the demand.

The local control plane with kwok GPU nodes, the operator as a subprocess, a `sim` runtime per
serving pod and an `autoglm-router` per router pod (the pod runner), Debian's Prometheus
scraping them, and the official `openai` client sending through Service `<name>` (the routers,
behind testkit's kube-proxy stand-in). The capacity seeds are small (one replica serves 1
request/s by the model), so a bounded load needs three replicas:

- a ramp of streamed chats and batch jobs takes the Deployment from 1 to 2 to 3 replicas
  (status.autoscaling.reason ScaledUp, an Event each step) and every replica takes traffic;
- the load stops: after scaleDown.stabilizationSeconds it steps back to 1, one replica at a
  time, periodSeconds apart; long streams in flight on the replicas that go are not cut (their
  pods drain: every token arrives); no request fails;
- `kubectl scale` while autoscaling is on changes nothing but posts a Warning (ReplicasIgnored);
- an HPA (autoscaling/v2) on the AutoGLMDeployment takes the count (AutoscalerConflict, a
  Warning, spec.replicas as the HPA writes it runs); deleted, the fleet is sized again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import openai
import pytest

from autoglm_operator.io.prom import demand_query
from testkit.engine import scraped_total
from testkit.history import History
from testkit.loadgen import LoadReport, RequestResult, one_request, run_load
from testkit.localcluster import LocalCluster
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import (
    KUBECTL_FAILED,
    NAME,
    Operator,
    agd_events,
    agd_object,
    condition,
    deployment_replicas,
    get,
    live_pods,
    status,
)
from testkit.podrunner import PodRunner
from testkit.servicelb import ServiceProxy
from testkit.waiting import TIME_SCALE, eventually, eventually_async

pytestmark = pytest.mark.timeout(420)

MODEL = "autoglm-phone-9b"
INTERVAL = 5  # adaptive.intervalSeconds: how often the demand is read
STABILIZATION = 20  # autoscaling.scaleDown.stabilizationSeconds
PERIOD = 5  # autoscaling.scaleDown.periodSeconds
MAX_REPLICAS = 3
# The ramp: (streamed chats/s, batch jobs/s, the replicas it needs). With the seeds below (a
# streaming replica serves 1/s, a batching one 0.1/s, so batching never pays) and 20% headroom:
# 1.0/s needs 2 (1.2/s), 2.2/s needs 3 (2.64/s). Batch jobs are a fifth of each step: a
# streaming replica then serves under 90% its own class, so its capacity is not learned up
# from what the sims serve (adaptive/capacity.py), and the seeds stay what sizes the fleet.
RAMP = ((0.8, 0.2, 2), (1.8, 0.4, 3))
# Long streams started when the fleet starts to wait out its scale-down window: ~18 ms a token
# in the sim, so they outlast both steps down, and the replicas that go drain them.
LONG_STREAMS = 6
LONG_TOKENS = 2400


def resource(prometheus_url: str) -> dict[str, Any]:
    return agd_object(
        replicas=1,
        maxModelLen=4096,  # room for the long streams
        engine={"shutdownTimeoutSeconds": 60},  # their drain: what is left of them, and margin
        adaptive={
            "intervalSeconds": INTERVAL,
            "cooldownSeconds": 10,
            "prometheus": {
                "url": prometheus_url,
                "timeoutSeconds": 2,
                # Short rate windows: the test runs in minutes, not hours.
                "queries": {"chatRate": demand_query("streamed_chat", "10s"),
                            "otherRate": demand_query("other", "10s")},
            },
            "capacity": {"streamingPerReplicaMilli": 1000, "batchingPerReplicaMilli": 100},
        },
        autoscaling={
            "enabled": True, "minReplicas": 1, "maxReplicas": MAX_REPLICAS,
            "scaleDown": {"stabilizationSeconds": STABILIZATION, "periodSeconds": PERIOD},
        },
    )  # fmt: skip


def autoscaling(cluster: LocalCluster, ns: str) -> dict[str, Any]:
    return dict(status(cluster, ns).get("autoscaling") or {})


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def received(url: str) -> float:
    """Requests a runtime's middleware received, every traffic class."""
    return scraped_total(url, "autoglm_requests_received_total")


@contextlib.contextmanager
def serving_fleet(
    cluster: LocalCluster, ns: str, prometheus: LocalPrometheus, runner: PodRunner
) -> Iterator[ServiceProxy]:
    """The resource applied at one replica, its runtimes and routers up, metrics in, and
    Service <name> proxied."""
    cluster.apply(resource(prometheus.url), ns)
    eventually(lambda: len(runner.runtime_urls(ns)) == 1 and len(live_pods(cluster, ns)) == 1,
               60, every=0.5, what="one serving replica running", ignoring=KUBECTL_FAILED)
    eventually(lambda: len(runner.router_urls(ns)) == 2, 60, every=0.5,
               what="a router per router pod", ignoring=KUBECTL_FAILED)
    eventually(lambda: condition(status(cluster, ns), "MetricsAvailable").get("status") == "True",
               60, every=0.5, what="metrics in Prometheus", ignoring=KUBECTL_FAILED)
    with ServiceProxy(cluster, ns, NAME, kubelet=runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
        yield proxy


class InflightWatch:
    """Each serving pod's requests in flight (its runtime's autoglm_requests_inflight), read
    every quarter second, also after the pod is deleted while its process drains (until it
    stops answering); when each pod left the runner (its deletion)."""

    def __init__(self, runner: PodRunner, ns: str) -> None:
        self.runner, self.ns = runner, ns
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self.deleted: dict[str, float] = {}
        self._urls: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> InflightWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def at_deletion(self, pod: str) -> float | None:
        """In flight at the last read before the pod was deleted."""
        before = [v for t, v in self.samples.get(pod, []) if t <= self.deleted.get(pod, 0.0)]
        return before[-1] if before else None

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            running = self.runner.runtime_urls(self.ns)
            for pod in set(self._urls) - set(running) - set(self.deleted):
                self.deleted[pod] = time.time()
            for pod in running:  # back: it was moved to another address, not deleted
                self.deleted.pop(pod, None)
            self._urls.update(running)
            for pod, url in list(self._urls.items()):
                try:
                    value = scraped_total(url, "autoglm_requests_inflight", timeout=2)
                except OSError:  # gone: its process exited (and its address may be reused)
                    if pod in self.deleted:
                        del self._urls[pod]
                    continue
                self.samples.setdefault(pod, []).append((time.time(), value))


def test_load_scales_the_fleet_up_step_by_step_and_back_without_cutting_a_stream(
    cluster: LocalCluster, namespace: str, prometheus: LocalPrometheus, pod_runner: PodRunner,
    operator: Operator,
) -> None:
    ns = namespace
    report = LoadReport()
    long_results: list[RequestResult] = []
    timings: dict[str, float] = {}
    with serving_fleet(cluster, ns, prometheus, pod_runner) as proxy, \
            History(cluster, ns, "agd", NAME) as agd, \
            History(cluster, ns, "deployment", NAME) as deployment, \
            InflightWatch(pod_runner, ns) as watch:
        base = proxy.url + "/v1"
        rates = {"chats": 0.0, "jobs": 0.0}
        stop = asyncio.Event()

        def replicas_and_traffic(want: int) -> bool:
            """The Deployment at `want` and each of its replicas' runtimes took requests."""
            urls = pod_runner.runtime_urls(ns)
            return deployment_replicas(cluster, ns) == want and len(urls) == want \
                and all(received(u) > 0 for u in urls.values())

        async def ramp() -> None:
            started = time.monotonic()
            for chats, jobs, want in RAMP:
                rates.update(chats=chats, jobs=jobs)
                step = time.monotonic()
                await eventually_async(lambda w=want: asyncio.to_thread(replicas_and_traffic, w),
                                       90, every=1, what=f"{want} replicas, each taking traffic",
                                       ignoring=(*KUBECTL_FAILED, OSError))
                timings[f"to {want}"] = time.monotonic() - step
            timings["ramp"] = time.monotonic() - started
            stop.set()

        async def long_streams() -> None:
            client = openai.AsyncOpenAI(base_url=base, api_key="EMPTY", max_retries=0,
                                        timeout=openai.Timeout(300, connect=30))
            tasks = []
            for _ in range(LONG_STREAMS):  # apart, so each router sees the ones before
                tasks.append(asyncio.create_task(one_request(
                    client, MODEL, LONG_TOKENS, {"ignore_eos": True}, usage=True)))
                await asyncio.sleep(0.3)
            long_results.extend(await asyncio.gather(*tasks))
            await client.close()

        async def scenario() -> None:
            duration = 300 * TIME_SCALE  # a bound: `stop` ends the load
            await asyncio.gather(
                run_load([base], lambda _: rates["chats"], duration, report=report, stop=stop),
                run_load([base], lambda _: rates["jobs"], duration, report=report, stop=stop,
                         stream=False),
                ramp(),
            )
            timings["load_stopped"] = time.time()
            # The fleet wants fewer: its scale-down window starts (lowerSince). Streams start
            # now, to be in flight on the replicas when they go.
            await eventually_async(lambda: asyncio.to_thread(
                lambda: autoscaling(cluster, ns).get("lowerSince")), 60, every=0.5,
                what="a smaller fleet wanted (lowerSince)", ignoring=KUBECTL_FAILED)
            timings["lower_since"] = time.time()
            streams = asyncio.create_task(long_streams())
            await eventually_async(
                lambda: asyncio.to_thread(lambda: deployment_replicas(cluster, ns) == 1),
                STABILIZATION + 3 * PERIOD + 30, every=0.5, what="back to 1 replica",
                ignoring=KUBECTL_FAILED)
            timings["back_to_1"] = time.time()
            await streams

        asyncio.run(scenario())
        # The replicas that went have gone: their processes drained and exited.
        eventually(lambda: pod_runner.serving_processes(ns) == 1, 90, every=0.5,
                   what="one serving process left")
        reasons = agd.values(lambda o: o["status"]["autoscaling"]["reason"])
        counts = deployment.values(lambda o: o["spec"]["replicas"])
        scaled_down = [a for _, o in agd.versions()
                       if (a := (o.get("status") or {}).get("autoscaling") or {})
                       .get("reason") == "ScaledDown"]  # fmt: skip
        deleted = dict(watch.deleted)
        at_deletion = {pod: watch.at_deletion(pod) for pod in deleted}

    # Up: 1 -> 2 -> 3, each a ScaledUp decision and Event.
    assert counts[:3] == [1, 2, 3], f"the Deployment's replicas went {counts}"
    assert "ScaledUp" in reasons, reasons
    ups = [e["message"] for e in agd_events(cluster, ns, "ScaledUp")]
    assert any("scaling up from 1 to 2" in m for m in ups), ups
    assert any("scaling up from 2 to 3" in m for m in ups), ups
    # Down: one step at a time, periodSeconds apart, only after the window.
    assert counts[2:] == [3, 2, 1], f"the Deployment's replicas went {counts}"
    downs = [e["message"] for e in agd_events(cluster, ns, "ScaledDown")]
    assert any("scaling down from 3 to 2" in m for m in downs), downs
    assert any("scaling down from 2 to 1" in m for m in downs), downs
    assert "ScaleDownStabilizing" in reasons, reasons
    assert reasons[-1] in ("FleetFitsDemand", "ScaledDown"), reasons
    assert len(scaled_down) == 2, scaled_down
    first, second = scaled_down
    # Not before the window (status times are whole seconds), and periodSeconds apart.
    waited = seconds(first["lastScaleDownTime"]) - seconds(first["lowerSince"])
    assert waited >= STABILIZATION - 1, first
    apart = seconds(second["lastScaleDownTime"]) - seconds(first["lastScaleDownTime"])
    assert apart >= PERIOD - 1, scaled_down
    # No request failed, the long streams included, and every long stream has all its tokens.
    failures = [r.error for r in report.failures + [r for r in long_results if r.error]]
    assert report.results, "no load was sent"
    assert not failures, f"{len(failures)} requests failed: {failures[:5]}"
    assert len(long_results) == LONG_STREAMS
    assert [r.output_tokens for r in long_results] == [LONG_TOKENS] * LONG_STREAMS
    # The positive control: a replica that went had long streams in flight when it was deleted
    # (so they drained through it, not elsewhere).
    assert len(deleted) == 2, f"deleted pods: {deleted}"
    assert any((n or 0) >= 1 for n in at_deletion.values()), \
        f"no replica that went had a stream in flight: {at_deletion}"
    longest = max(r.latency or 0.0 for r in long_results)
    print(
        f"\nAUTOSCALING E2E: 1->2 replicas in {timings['to 2']:.1f}s of {sum(RAMP[0][:2]):.1f}/s, "
        f"2->3 in {timings['to 3']:.1f}s of {sum(RAMP[1][:2]):.1f}/s; replicas {counts}; "
        f"load stopped -> lowerSince {timings['lower_since'] - timings['load_stopped']:.1f}s, "
        f"-> back to 1 {timings['back_to_1'] - timings['load_stopped']:.1f}s; first step down "
        f"{waited:.0f}s after lowerSince, the second {apart:.0f}s later; in flight on the "
        f"deleted replicas at deletion {at_deletion}; {LONG_STREAMS} long streams of "
        f"{LONG_TOKENS} tokens, the longest {longest:.1f}s; requests {len(report.results)}, "
        f"failed {len(report.failures)}; reasons {reasons}"
    )


def test_kubectl_scale_is_ignored_and_an_hpa_takes_the_count_until_it_goes(
    cluster: LocalCluster, namespace: str, prometheus: LocalPrometheus, pod_runner: PodRunner,
    operator: Operator,
) -> None:
    ns = namespace
    with serving_fleet(cluster, ns, prometheus, pod_runner), \
            History(cluster, ns, "deployment", NAME) as deployment:
        eventually(lambda: autoscaling(cluster, ns).get("reason") == "FleetFitsDemand", 60,
                   every=0.5, what="the fleet sized at its floor", ignoring=KUBECTL_FAILED)

        # `kubectl scale` writes spec.replicas: not read while autoscaling is on.
        scaled = time.time()
        cluster.kubectl("scale", f"autoglmdeployment/{NAME}", "--replicas=3", "-n", ns)
        ignored = eventually(lambda: agd_events(cluster, ns, "ReplicasIgnored"), 30,
                             every=0.5, what="a ReplicasIgnored Event", ignoring=KUBECTL_FAILED)
        assert ignored[0]["type"] == "Warning"
        assert "spec.replicas changed to 3" in ignored[0]["message"]
        eventually(lambda: autoscaling(cluster, ns).get("ignoredReplicas") == 3, 30, every=0.5,
                   what="status.autoscaling.ignoredReplicas 3", ignoring=KUBECTL_FAILED)
        # Several iterations later (one a second), the Deployment is still the autoscaler's.
        deadline = time.monotonic() + 5 * TIME_SCALE
        while time.monotonic() < deadline:
            assert deployment_replicas(cluster, ns) == 1
            time.sleep(0.5)
        assert deployment.values(lambda o: o["spec"]["replicas"], since=scaled) in ([], [1])
        assert get(cluster, ns, "agd", NAME)["spec"]["replicas"] == 3
        assert len(agd_events(cluster, ns, "ReplicasIgnored")) == 1  # once per change

        # An HPA on the AutoGLMDeployment (the scale subresource): it owns the count.
        hpa = {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": f"{NAME}-hpa"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "autoglm.io/v1alpha1",
                                   "kind": "AutoGLMDeployment", "name": NAME},
                "minReplicas": 2, "maxReplicas": 2,
                "metrics": [{"type": "Resource", "resource": {
                    "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}],
            },
        }  # fmt: skip
        cluster.apply(hpa, ns)
        conflict = eventually(
            lambda: (a := autoscaling(cluster, ns)).get("reason") == "AutoscalerConflict" and a,
            45, every=0.5, what="status.autoscaling.reason AutoscalerConflict",
            ignoring=KUBECTL_FAILED)
        assert f"{NAME}-hpa" in conflict["message"]
        warned = agd_events(cluster, ns, "AutoscalerConflict")
        assert warned and warned[0]["type"] == "Warning", warned
        # The HPA writes spec.replicas (its bounds: 2), and that count runs.
        eventually(lambda: get(cluster, ns, "agd", NAME)["spec"]["replicas"] == 2, 60,
                   every=0.5, what="the HPA's count in spec.replicas", ignoring=KUBECTL_FAILED)
        eventually(lambda: deployment_replicas(cluster, ns) == 2
                   and autoscaling(cluster, ns).get("desiredReplicas") == 2, 30, every=0.5,
                   what="the Deployment at the HPA's 2", ignoring=KUBECTL_FAILED)
        assert len(agd_events(cluster, ns, "AutoscalerConflict")) == 1  # once

        # The HPA goes: the fleet is sized again, back down to its floor after the window.
        cluster.kubectl("delete", "hpa", f"{NAME}-hpa", "-n", ns)
        removed = time.monotonic()
        eventually(lambda: autoscaling(cluster, ns).get("reason")
                   not in (None, "AutoscalerConflict"), 45, every=0.5, what="sizing back",
                   ignoring=KUBECTL_FAILED)
        back = autoscaling(cluster, ns)
        eventually(lambda: deployment_replicas(cluster, ns) == 1, STABILIZATION + 60, every=0.5,
                   what="the Deployment back at the autoscaler's 1", ignoring=KUBECTL_FAILED)
        took = time.monotonic() - removed
        counts = deployment.values(lambda o: o["spec"]["replicas"])
    # The 3 `kubectl scale` left in spec.replicas never runs: when the operator sees the HPA
    # the sized count stays until the HPA writes its own 2.
    assert counts == [1, 2, 1], counts
    print(f"\nHPA deleted: sizing back as {back['reason']} ({back['message']}); Deployment "
          f"back to 1 after {took:.1f}s; Deployment replicas since kubectl scale {counts}")
