"""What survives a fault while traffic flows.

The operator SIGKILLed in the middle of a mode flip, at the two points where the flip is half
done: after the pod label changed but before the runtime was told, and after the runtime
switched but before status recorded it (a failpoint in the operator's HTTP layer kills it the
moment that request is answered, so the window is hit every time, not by luck). Restarted, the
operator must finish the flip once: label, runtime and status agree, nothing else changed, and
the replica does not flip back before its cooldown is over, though load has gone.

A runtime pod deleted under load: the pod runner takes it down the kubelet's way (preStop hook,
SIGTERM, SIGKILL after the grace period) and a kube-proxy-like Service proxy (testkit.servicelb)
stops sending it new connections, while the official `openai` client keeps sending through the
Service. Every request the runtime admitted must finish, no request may fail, and the
replacement pod must join the Service.

Like kube-proxy, the proxy leaves established connections alone, so the client's kept-alive
connections to the deleted pod still reach it while it drains; the drain answers those 503
(connection closed, Retry-After) and the client's retry (the `openai` default, 2) goes through
the Service to a ready pod. The test counts those refusals; a client without retries sees each
one as a failure.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import pytest

from autoglm_operator.adaptive.policy import parse_iso
from autoglm_operator.io.prom import demand_query
from testkit.loadgen import LoadReport, run_load
from testkit.localcluster import LocalCluster
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import (
    INSTANCE,
    KUBECTL_FAILED,
    NAME,
    Operator,
    admin_token,
    agd_object,
    condition,
    deploy,
    events,
    get,
    live_pods,
    pod_modes,
    ready_as,
    runtime_state,
    status,
)
from testkit.podrunner import PodRunner
from testkit.servicelb import ServiceProxy
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(300)

# Long answers (~20 s each at ~20 ms per decode step): those the pod admitted before its
# deletion are still streaming when SIGTERM comes, after the preStop hook's 5 s.
LONG_ANSWER = {"min_tokens": 900}
KILL_QPS = 0.8  # ~16 in flight over 3 replicas, ~8 over 2: within the streaming cap of 8
KILL_AT = 10.0  # seconds into the load
LOAD_SECONDS = 30.0
CLIENT_RETRIES = 2  # the `openai` client's default

ADMITTED = "autoglm_requests_admitted_total"
IN_FLIGHT = "autoglm_requests_inflight"
QUEUED = "autoglm_requests_queued"
REFUSED_DRAINING = 'autoglm_requests_rejected_total{reason="draining"}'


@dataclass
class Sample:
    t: float
    series: dict[str, float]

    def __getitem__(self, name: str) -> float:
        """A series by its full name, or a metric summed over its label sets."""
        if name in self.series:
            return self.series[name]
        return sum(v for k, v in self.series.items() if k.split("{")[0] == name)


@dataclass
class RuntimeSampler:
    """Reads one runtime's /metrics every 0.1 s until it stops answering: the runtime's own
    count of what it admitted, has in flight, finished and refused."""

    url: str
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> RuntimeSampler:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                with urllib.request.urlopen(f"{self.url}/metrics", timeout=2) as response:
                    text = response.read().decode()
            except OSError:
                if self.samples:
                    return  # gone: the process exited
                continue
            series = {
                line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line and not line.startswith("#")
            }
            self.samples.append(Sample(time.time(), series))

    def last_before(self, when: float) -> Sample:
        return [s for s in self.samples if s.t < when][-1]


def test_a_runtime_pod_killed_under_load_finishes_what_it_admitted(
    cluster: LocalCluster, namespace: str, pod_runner: PodRunner, operator: Operator
) -> None:
    # Pinned to streaming: no mode flip moves traffic, only the pod's deletion does.
    # Router off: Service <name> selects the runtime pods, as kube-proxy spreads connections.
    obj = agd_object(replicas=3, modePolicy="Streaming", router={"enabled": False})
    deploy(cluster, namespace, obj, "3/3")
    pods = [p["metadata"]["name"] for p in live_pods(cluster, namespace)]
    assert len(pods) == 3, pods  # the wait below holds for no pod at all
    eventually(lambda: all(pod_runner.running(p) for p in pods), 60, every=0.5,
               what="a runtime per pod", ignoring=KUBECTL_FAILED)
    with ServiceProxy(cluster, namespace, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 3, 30, every=0.5, what="3 ready endpoints",
                   ignoring=KUBECTL_FAILED)
        victim = pod_runner.running(pods[0])
        assert victim is not None
        sampler = RuntimeSampler(f"http://{victim.ip}:8000").start()
        report = LoadReport()
        deleted_at = deleted_mono = 0.0

        async def scenario() -> None:
            nonlocal deleted_at, deleted_mono
            load = asyncio.create_task(
                run_load([proxy.url + "/v1"], lambda _: KILL_QPS, LOAD_SECONDS, max_tokens=1024,
                         report=report, extra_body=LONG_ANSWER, max_retries=CLIENT_RETRIES)
            )  # fmt: skip
            await asyncio.sleep(KILL_AT)
            deleted_at, deleted_mono = time.time(), time.monotonic()
            await asyncio.to_thread(
                cluster.kubectl, "delete", "pod", victim.name, "-n", namespace, "--wait=false"
            )
            await load

        asyncio.run(scenario())
        victim.process.wait(timeout=60)
        sampler.stop()

        def replacement() -> str | None:
            return next((e.pod for e in proxy.endpoints() if e.pod not in pods), None)

        joined = eventually(replacement, 30, every=0.5, what="the replacement in the Service",
                            ignoring=KUBECTL_FAILED)
        during_load = proxy.stats.connections[joined]
        # The running client keeps its connections; a new client's connections are balanced
        # over every ready endpoint, the replacement included.
        asyncio.run(run_load([proxy.url + "/v1"], lambda _: 3.0, 2.0, report=report))
        stats = proxy.stats
    eventually(ready_as(cluster, namespace, "3/3"), 60, every=0.5, what="3/3 Ready again",
               ignoring=KUBECTL_FAILED)

    assert victim.sigterm_at is not None, "the pod runner never sent SIGTERM"
    at_sigterm = sampler.last_before(victim.sigterm_at)
    final = sampler.samples[-1]
    removed = stats.removed_at[victim.name]
    late = [t for t, pod in stats.connection_times if pod == victim.name and t >= removed]
    failures = [r.error for r in report.failures]
    in_flight_at_sigterm = at_sigterm[IN_FLIGHT] + at_sigterm[QUEUED]
    log = (victim.folder / "runtime.log").read_text(errors="replace")
    drain_began = re.search(r"Started draining: (\d+) in flight, (\d+) queued", log)
    assert drain_began is not None, log[-2000:]
    print(
        f"\nFAULTS pod killed under load: {len(report.results)} requests "
        f"({len(report.window(deleted_mono, float('inf')))} sent after the delete), "
        f"{len(failures)} failed; {victim.name} left the Service {removed - deleted_at:.2f}s "
        f"after the delete, got SIGTERM {victim.sigterm_at - deleted_at:.1f}s after it with "
        f"{in_flight_at_sigterm:.0f} requests in flight, answered its last "
        f"{final.t - victim.sigterm_at:.1f}s after SIGTERM; it admitted {final[ADMITTED]:.0f} "
        f"in all, {int(drain_began[1]) + int(drain_began[2])} in flight when the preStop hook "
        f"began its drain, and refused {final[REFUSED_DRAINING]:.0f} attempts on kept-alive "
        f"connections while draining (retried by the client); connections per pod "
        f"{dict(stats.connections)}; replacement {joined}: {during_load} connections during the "
        f"load, {stats.connections[joined]} with a new client's"
    )

    # The Service: the deleted pod got no new connection once it left; the replacement joined.
    assert not late, f"{len(late)} connections went to {victim.name} after it left the Service"
    assert stats.connections[joined] > 0, f"the replacement {joined} got no connection"
    # The runtime: requests were in flight at SIGTERM, and it finished every one it admitted.
    assert in_flight_at_sigterm > 0, "no request was in flight at SIGTERM: the test proves nothing"
    # Drained: its own wait for idle returned with nothing in flight or queued, then it exited.
    assert "Drained (all done)" in log and victim.process.returncode == 0, log[-2000:]
    # The clients: nothing failed.
    assert report.results, "no load was sent"
    assert not failures, f"{len(failures)} of {len(report.results)} requests failed: {failures[:5]}"


# -- the operator killed mid-flip -------------------------------------------------------------

COOLDOWN = 40
# Batch jobs a second: more than the streaming replicas serve (the seeds below say 1/s each), so
# the demand sizing wants one batching replica (6/s) at once; none once the load goes.
FLIP_QPS = 5.0


def adaptive_object(prometheus_url: str) -> dict[str, Any]:
    """Two replicas that flip at once under load and return at once when it goes, but for the
    cooldown: a forgotten cooldown shows as a return well before it is over."""
    return agd_object(
        replicas=2,
        router={"enabled": False},  # Service <name> selects the runtime pods
        adaptive={
            "intervalSeconds": 5,
            "prometheus": {
                "url": prometheus_url,
                "timeoutSeconds": 2,
                "queries": {
                    "qps": "sum(rate(vllm:request_success_total{$selector}[10s]))",
                    "chatRate": demand_query("streamed_chat", "10s"),
                    "otherRate": demand_query("other", "10s"),
                },
            },
            "capacity": {"streamingPerReplicaMilli": 1000, "batchingPerReplicaMilli": 6000},
            "qpsPerReplicaMilli": {"high": 1500, "low": 600},
            "toBatchingStabilizationSeconds": 0,
            "toStreamingStabilizationSeconds": 0,
            "cooldownSeconds": COOLDOWN,
            "minStreamingReplicas": 1,
            "maxFlipsPerStep": 1,
        },
    )


def state_of(runner: PodRunner, pod: str, token: str) -> dict[str, Any]:
    url = runner.admin_url(pod)
    assert url is not None, f"no runtime for {pod}"
    return runtime_state(url, token)


@pytest.mark.parametrize(
    "die_after",
    ["PATCH /pods/ batching", "PUT /autoglm/v1/mode batching"],
    ids=["label-set-runtime-not-told", "runtime-told-status-not-written"],
)
def test_operator_killed_mid_flip_finishes_it_once_and_keeps_the_cooldown(
    cluster: LocalCluster,
    namespace: str,
    prometheus: LocalPrometheus,
    pod_runner: PodRunner,
    operator: Operator,
    die_after: str,
) -> None:
    operator.stop(signal.SIGKILL)  # nothing to clean up yet: start again with the failpoint
    operator.start(die_after=die_after)
    deploy(cluster, namespace, adaptive_object(prometheus.url), "2/2")
    pods = sorted(pod_modes(cluster, namespace))
    assert len(pods) == 2, pods  # the wait below holds for no pod at all
    eventually(lambda: all(pod_runner.running(p) for p in pods), 60, every=0.5,
               what="a runtime per pod", ignoring=KUBECTL_FAILED)
    token = admin_token(cluster, namespace, pods[0])  # one pod template: one token
    eventually(
        lambda: condition(status(cluster, namespace), "MetricsAvailable").get("status") == "True",
        60, every=0.5, what="metrics in Prometheus", ignoring=KUBECTL_FAILED,
    )
    assert operator.proc is not None

    with ServiceProxy(cluster, namespace, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5, what="2 ready endpoints",
                   ignoring=KUBECTL_FAILED)
        report = LoadReport()

        async def load_until_the_operator_dies() -> float:
            load = asyncio.create_task(
                run_load(
                    [proxy.url + "/v1"], lambda _: FLIP_QPS, 120, report=report, stream=False
                )
            )
            try:
                while operator.proc is not None and operator.proc.poll() is None:
                    assert not load.done(), "load ended and no flip was tried"
                    await asyncio.sleep(0.05)
                return time.time()
            finally:
                load.cancel()  # load goes away with the operator: the loop would flip back
                await asyncio.gather(load, return_exceptions=True)

        killed_at = asyncio.run(load_until_the_operator_dies())

    # The failpoint hit the window it names.
    assert operator.proc.returncode == -signal.SIGKILL, operator.logs()[-3000:]
    at_kill = pod_modes(cluster, namespace)
    flipped = [p for p, mode in at_kill.items() if mode == "batching"]
    assert len(flipped) == 1, at_kill
    (pod,) = flipped
    other = next(p for p in pods if p != pod)
    told = state_of(pod_runner, pod, token)["mode"]
    assert told == ("streaming" if die_after.startswith("PATCH") else "batching"), told
    assert status(cluster, namespace).get("batchingReplicas", 0) == 0, "status saw the flip"

    operator.start()
    restarted_at = time.time()

    def converged() -> dict[str, Any] | None:
        st = status(cluster, namespace)
        modes = pod_modes(cluster, namespace)
        agree = all(state_of(pod_runner, p, token)["mode"] == m for p, m in modes.items())
        settled = (
            agree
            and modes == {pod: "batching", other: "streaming"}
            and (st.get("batchingReplicas"), st.get("streamingReplicas")) == (1, 1)
            and st.get("readyReplicas") == 2
            and condition(st, "ModeTransitioning").get("status") == "False"
        )
        return st if settled else None

    st = eventually(converged, 60, every=0.5, what="label, runtime and status to agree",
                    ignoring=KUBECTL_FAILED)
    converged_in = time.time() - restarted_at
    flips = {f["pod"]: f for f in st["adaptiveState"].get("lastFlips", [])}
    assert flips.get(pod, {}).get("mode") == "batching", st["adaptiveState"]
    switches = {p: state_of(pod_runner, p, token)["switches"] for p in pods}
    assert switches == {pod: 1, other: 0}, f"a runtime was switched more than once: {switches}"
    assert sorted(pod_modes(cluster, namespace)) == pods, "pods were replaced"
    assert len(get(cluster, namespace, "deployments", "-l", INSTANCE)["items"]) == 1

    # Load is gone, so the loop wants the replica back, but only once its cooldown is over.
    # A flip is label, then the runtime's PUT, then the status write that records it: wait
    # for the record, so the runtime has taken the mode too.
    def returned() -> dict[str, Any] | None:
        st = status(cluster, namespace)
        history = st.get("decisionHistory", [])
        back = [d for d in history if d["fromBatching"] == 1 and d["toBatching"] == 0]
        done = condition(st, "ModeTransitioning").get("status") == "False"
        return back[-1] if back and done else None

    back = eventually(returned, COOLDOWN + 45, every=0.5, what="the replica's return to streaming",
                      ignoring=KUBECTL_FAILED)
    assert pod_modes(cluster, namespace)[pod] == "streaming"
    history = status(cluster, namespace).get("decisionHistory", [])
    back_at = parse_iso(back["time"])
    assert back_at is not None, back
    held = [d["reason"] for d in history if (parse_iso(d["time"]) or back_at) < back_at]
    reasons = [e["reason"] for e in events(cluster, namespace)]
    switches = {p: state_of(pod_runner, p, token)["switches"] for p in pods}
    print(
        f"\nFAULTS operator killed after {die_after!r}: {pod} label batching, runtime {told}; "
        f"restarted, converged in {converged_in:.1f}s (events {sorted(set(reasons))}); "
        f"returned to streaming {back_at - killed_at:.1f}s after the kill (cooldown "
        f"{COOLDOWN}s; decisions before it {held}); runtime switches {switches}; "
        f"requests {len(report.results)}, failed {len(report.failures)}"
    )
    assert back_at - killed_at >= COOLDOWN - 1, f"flipped back within the cooldown: {history}"
    assert "Cooldown" in held, "the loop never held the replica for its cooldown"
    assert switches == {pod: 2, other: 0}, switches
    assert not report.failures, [r.error for r in report.failures][:5]
