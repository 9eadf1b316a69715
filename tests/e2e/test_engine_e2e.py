"""One serving pod runs a real vLLM engine (the pod runner starts the pod's own command in the
engine environment, with the CPU's changes only): the operator deploys it, flips it to batching
and back through its admin API, and the router pods route the `openai` client's chats to it.
With spec.autoscaling on, load makes the operator start a second serving pod, whose real engine
starts and serves, then drains and goes when the load stops.

It needs the engine tier's environment and tiny model (hack/vllm-cpu-env.sh,
hack/tiny_glm4v.py), built on first use and cached.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from autoglm_operator.io.prom import demand_query
from testkit.engine import OPENAI_TIMEOUT, answer_of, engine_python, scraped_total, tiny_model
from testkit.history import History
from testkit.loadgen import LoadReport, run_load
from testkit.localcluster import LocalCluster
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import (
    KUBECTL_FAILED,
    NAME,
    Operator,
    admin_token,
    agd_events,
    agd_object,
    deploy,
    deployment_replicas,
    live_pods,
    patch_agd,
    pod_modes,
    runtime_state,
    status,
)
from testkit.podrunner import Engines, PodRunner
from testkit.servicelb import ServiceProxy
from testkit.waiting import TIME_SCALE, eventually, eventually_async

pytestmark = pytest.mark.timeout(900)
ENGINE_START_SECONDS = 600  # model load and kernel warm-up on 2 cores shared with the cluster
# The router holds a request at zero this long: the engine's start, on this machine.
HOLD_SECONDS = round(ENGINE_START_SECONDS * TIME_SCALE)
# A prompt of the shape the tiny model was trained on, so its answer is the trained turn.
MESSAGES = [{"role": "user", "content": "Step 1: tap the search box."}]
# Autoscaling: streamed chats/s through the routers (a light load for 2 cores), and requests the
# second engine must serve before the load stops.
AUTOSCALE_QPS = 0.3
SECOND_SERVES = 3


@pytest.fixture(scope="module")
def engines() -> Engines:
    """Two: the autoscaling test starts a second serving pod, and it too runs vLLM."""
    python = engine_python()
    return Engines(python, tiny_model(python), count=2)


@pytest.fixture(scope="module")
def pod_runner(cluster: LocalCluster, prometheus: LocalPrometheus, engines: Engines,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRunner]:
    runner = PodRunner(cluster, tmp_path_factory.mktemp("pods"),
                       targets_file=prometheus.targets_file, engines=engines).start()
    yield runner
    runner.stop()


def answers_health(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def test_the_operator_flips_a_real_engine_and_the_router_routes_to_it(
    cluster: LocalCluster, namespace: str, pod_runner: PodRunner, operator: Operator,
    engines: Engines,
) -> None:
    ns = namespace
    action = answer_of(engines.model_dir)["answer"].split("</think>", 1)[1]
    deploy(cluster, ns, agd_object(replicas=1, modePolicy="Streaming"), "1/1")
    eventually(lambda: len(pod_runner.runtime_urls(ns)) == 1, 60, every=0.5,
               what="a runtime for the serving pod", ignoring=KUBECTL_FAILED)
    (pod, url), = pod_runner.runtime_urls(ns).items()
    assert pod_runner.running(pod).engine  # type: ignore[union-attr]
    eventually(lambda: answers_health(url), ENGINE_START_SECONDS, every=0.5,
               what="the engine to answer /health", ignoring=KUBECTL_FAILED)
    token, admin_url = admin_token(cluster, ns, pod), pod_runner.admin_url(pod)
    assert admin_url is not None
    assert runtime_state(admin_url, token)["mode"] == "streaming"
    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) >= 1, 60, every=0.5,
                   what="a ready router endpoint", ignoring=KUBECTL_FAILED)
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="EMPTY", max_retries=0,
                               timeout=OPENAI_TIMEOUT)

        def streamed() -> tuple[str, str | None]:
            text, finish = "", None
            for part in client.chat.completions.create(
                model="autoglm-phone-9b", stream=True, max_tokens=128, temperature=0,
                messages=MESSAGES,
            ):
                for choice in part.choices:
                    text += choice.delta.content or ""
                    finish = choice.finish_reason or finish
            return text, finish

        assert streamed() == (action, "stop")
        for mode, policy in (("batching", "Batching"), ("streaming", "Streaming")):
            patch_agd(cluster, ns, {"spec": {"modePolicy": policy}})
            eventually(lambda m=mode: pod_modes(cluster, ns) == {pod: m}, 60, every=0.5,
                       what=f"the pod labelled {mode}", ignoring=KUBECTL_FAILED)
            # The engine's own middleware says so: the flip reached the pod, not only its label
            # (the operator labels first, then sets the runtime's mode).
            eventually(lambda m=mode: runtime_state(admin_url, token)["mode"] == m, 15, every=0.5,
                       what=f"the runtime in {mode}", ignoring=KUBECTL_FAILED)
            # One replica, in `mode`: the router still finds it for either class.
            done = client.chat.completions.create(
                model="autoglm-phone-9b", max_tokens=128, temperature=0, messages=MESSAGES)
            assert (done.choices[0].message.content, done.choices[0].finish_reason) == \
                (action, "stop")
            assert streamed() == (action, "stop")
        assert runtime_state(admin_url, token)["switches"] == 2


def test_a_request_at_zero_waits_out_a_real_engine_cold_start_and_is_served(
    cluster: LocalCluster, namespace: str, pod_runner: PodRunner, operator: Operator,
    engines: Engines,
) -> None:
    """Scale to zero with the real engine as the serving pod: idle, the Deployment goes to 0;
    a streamed chat through Service <name> is held by the router while the operator scales
    back up and vLLM loads the model, then answered; the wait is in its header and the status."""
    ns = namespace
    action = answer_of(engines.model_dir)["answer"].split("</think>", 1)[1]
    obj = agd_object(
        replicas=1, modePolicy="Streaming",
        scaleToZero={"enabled": True, "idleSeconds": 10},
        router={"hold": {"waitSeconds": HOLD_SECONDS}},
    )  # fmt: skip
    cluster.apply(obj, namespace=ns)
    eventually(lambda: (status(cluster, ns).get("standby") or {}).get("state") == "Idle", 120,
               every=0.5, what="scaled to zero", ignoring=KUBECTL_FAILED)
    eventually(lambda: not live_pods(cluster, ns) and not pod_runner.runtime_urls(ns), 120,
               every=0.5, what="no serving pod", ignoring=KUBECTL_FAILED)
    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) >= 1, 60, every=0.5,
                   what="a ready router endpoint at zero", ignoring=KUBECTL_FAILED)
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="EMPTY", max_retries=0,
                               timeout=openai.Timeout(HOLD_SECONDS + 60, connect=60))
        started = time.monotonic()
        raw = client.chat.completions.with_raw_response.create(
            model="autoglm-phone-9b", stream=True, max_tokens=128, temperature=0,
            messages=MESSAGES,
        )  # fmt: skip
        held = float(raw.headers["x-autoglm-held-seconds"])
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        took = time.monotonic() - started
    assert text == action
    (pod,) = [p["metadata"]["name"] for p in live_pods(cluster, ns)]
    assert pod_runner.running(pod).engine  # type: ignore[union-attr]
    eventually(lambda: "lastWakeMillis" in (status(cluster, ns).get("standby") or {}), 30,
               every=0.5, what="the wake in status", ignoring=KUBECTL_FAILED)
    # A held stream's head goes out at its first heartbeat (router.hold.heartbeatSeconds), its
    # header carrying the wait until then; the whole wait is in the status, as the router
    # reported it.
    eventually(lambda: (status(cluster, ns).get("standby") or {}).get("lastHeldWaitMillis", 0)
               >= held * 1000 - 1, 30, every=0.5, what="the whole wait in status",
               ignoring=KUBECTL_FAILED)
    woke = status(cluster, ns)["standby"]
    waited = woke["lastHeldWaitMillis"] / 1000
    print(f"cold start of the real CPU engine from zero: request held {waited:.1f}s (its head "
          f"after {held:.1f}s), answered after {took:.1f}s; status.standby.lastWakeMillis "
          f"{woke['lastWakeMillis']}")
    assert 0 < held <= waited <= took < HOLD_SECONDS
    assert woke["lastWakeMillis"] > 0


def test_under_load_a_second_real_engine_starts_and_serves_then_drains_and_goes(
    cluster: LocalCluster, namespace: str, prometheus: LocalPrometheus, pod_runner: PodRunner,
    operator: Operator,
) -> None:
    """spec.autoscaling on the real CPU engine: streamed chats from the `openai` client through
    Service <name> make the operator scale to a second serving pod; its vLLM engine starts,
    answers /health and serves requests the routers send it. The load stops: after the
    scale-down window one engine pod drains and goes. No request fails."""
    ns = namespace
    obj = agd_object(
        replicas=1, modePolicy="Streaming",
        adaptive={
            "intervalSeconds": 5,
            "prometheus": {
                "url": prometheus.url, "timeoutSeconds": 2,
                "queries": {"chatRate": demand_query("streamed_chat", "20s"),
                            "otherRate": demand_query("other", "20s")},
            },
            # By the model one replica serves 0.1 chats/s: the test's AUTOSCALE_QPS needs two.
            "capacity": {"streamingPerReplicaMilli": 100},
        },
        autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 2,
                     "scaleDown": {"stabilizationSeconds": 20, "periodSeconds": 5}},
    )  # fmt: skip
    cluster.apply(obj, namespace=ns)
    eventually(lambda: len(pod_runner.runtime_urls(ns)) == 1, 60, every=0.5,
               what="a runtime for the serving pod", ignoring=KUBECTL_FAILED)
    ((first, first_url),) = pod_runner.runtime_urls(ns).items()
    eventually(lambda: answers_health(first_url), ENGINE_START_SECONDS, every=0.5,
               what="the first engine to answer /health", ignoring=KUBECTL_FAILED)
    report = LoadReport()
    timings: dict[str, float] = {}

    def second_serving() -> str | None:
        """The other serving pod, once its engine is up and has served requests."""
        for pod, url in pod_runner.runtime_urls(ns).items():
            if pod != first and answers_health(url) \
                    and scraped_total(url, "vllm:request_success_total") >= SECOND_SERVES:
                return pod
        return None

    with History(cluster, ns, "deployment", NAME) as deployment, \
            ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 60, every=0.5,
                   what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
        stop = asyncio.Event()

        async def scenario() -> str:
            started = time.monotonic()
            load = asyncio.create_task(run_load(
                [proxy.url + "/v1"], lambda _: AUTOSCALE_QPS, 2 * HOLD_SECONDS, max_tokens=128,
                report=report, stop=stop))  # fmt: skip
            await eventually_async(
                lambda: asyncio.to_thread(lambda: deployment_replicas(cluster, ns) == 2), 90,
                every=1, what="the Deployment scaled to 2", ignoring=KUBECTL_FAILED)
            timings["scaled_up"] = time.monotonic() - started
            second = await eventually_async(
                lambda: asyncio.to_thread(second_serving), ENGINE_START_SECONDS, every=2,
                what=f"the second engine up and {SECOND_SERVES} requests served by it",
                ignoring=(*KUBECTL_FAILED, OSError))
            timings["second_serving"] = time.monotonic() - started
            stop.set()
            await load
            return second

        second = asyncio.run(scenario())
        assert pod_runner.running(second).engine  # type: ignore[union-attr]
        served = {pod: scraped_total(url, "vllm:request_success_total")
                  for pod, url in pod_runner.runtime_urls(ns).items()}
        stopped = time.monotonic()
        eventually(lambda: deployment_replicas(cluster, ns) == 1, 120, every=0.5,
                   what="back to 1 replica", ignoring=KUBECTL_FAILED)
        timings["scaled_down"] = time.monotonic() - stopped
        # The pod that goes drains (preStop, then the launcher stops vLLM) and its engine exits.
        eventually(lambda: pod_runner.serving_processes(ns) == 1, 180, every=0.5,
                   what="one engine left", ignoring=KUBECTL_FAILED)
        timings["gone"] = time.monotonic() - stopped
        counts = deployment.values(lambda o: o["spec"]["replicas"])
    (kept,) = [p["metadata"]["name"] for p in live_pods(cluster, ns)]
    assert kept in (first, second)
    assert pod_runner.running(kept).engine  # type: ignore[union-attr]
    assert counts == [1, 2, 1], counts
    assert {e["message"].split("; ")[-1] for e in agd_events(cluster, ns, "ScaledUp")} \
        == {"scaling up from 1 to 2"}
    assert {e["message"].split("; ")[-1] for e in agd_events(cluster, ns, "ScaledDown")} \
        == {"scaling down from 2 to 1"}
    failures = [r.error for r in report.failures]
    assert report.results, "no load was sent"
    assert not failures, f"{len(failures)} of {len(report.results)} requests failed: {failures}"
    gone = first if kept == second else second
    print(f"\nautoscaling on the real CPU engine: {AUTOSCALE_QPS} chats/s -> Deployment at 2 "
          f"after {timings['scaled_up']:.1f}s; the second engine up and serving after "
          f"{timings['second_serving']:.1f}s; requests served per engine {served}; load "
          f"stopped -> back to 1 after {timings['scaled_down']:.1f}s, {gone} drained and gone "
          f"after {timings['gone']:.1f}s; requests {len(report.results)}, failed "
          f"{len(report.failures)}")
