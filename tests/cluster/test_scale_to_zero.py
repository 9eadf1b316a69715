"""Scale to zero on the local control plane: the operator scales an idle deployment to zero, the
routers stay ready and hold what arrives, tell the operator, and serve it once a replica is up;
with sleep on, idle replicas sleep first and one stays as a standby that a request wakes.

Serving pods are sims that take `LOAD_SECONDS` to load their model (run by testkit.podrunner),
so a request at zero waits through scheduling, the start and the routers' release; routers are
`autoglm-router` processes under their ServiceAccount's token, patching the demand annotation
as that account.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from testkit.localcluster import LocalCluster
from testkit.operator_kit import (
    KUBECTL_FAILED,
    NAME,
    Operator,
    agd_object,
    deploy,
    events,
    get,
    status,
)
from testkit.podrunner import PodRunner
from testkit.servicelb import ServiceProxy
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(420)

IDLE_SECONDS = 10
HOLD_SECONDS = 60
LOAD_SECONDS = 2.0  # the sims' model load: /health is 503 until it passes
MODEL = "autoglm-phone-9b"
BURST = 100
HELD_HEADER = "x-autoglm-held-seconds"
SERVING = f"app.kubernetes.io/name=autoglm,app.kubernetes.io/instance={NAME}"
SLEEPING = "autoglm.io/sleeping"  # the operator's mark on a pod it put to sleep


@pytest.fixture
def pod_runner(cluster: LocalCluster, tmp_path: Path) -> Iterator[PodRunner]:
    sim_args = ["--model-load-seconds", str(LOAD_SECONDS)]
    with PodRunner(cluster, tmp_path / "pods", sim_args=sim_args) as runner:
        yield runner


def standby(cluster: LocalCluster, ns: str) -> dict[str, Any]:
    return dict(status(cluster, ns).get("standby") or {})


def serving_pods(cluster: LocalCluster, ns: str) -> list[str]:
    """Serving pods, terminating ones too."""
    items = get(cluster, ns, "pods", "-l", f"{SERVING}")["items"]
    return [p["metadata"]["name"] for p in items]


def at_zero(cluster: LocalCluster, ns: str, runner: PodRunner) -> None:
    """Idle, the Deployment at 0, no serving pod left, and the routers still ready."""
    eventually(lambda: standby(cluster, ns).get("state") == "Idle", IDLE_SECONDS + 60,
               every=0.5, what="status.standby Idle", ignoring=KUBECTL_FAILED)
    assert get(cluster, ns, "deployment", NAME)["spec"]["replicas"] == 0
    # Gone, processes too: kwok hands a deleted pod's address to a new pod at once, where a
    # node would not while the old one drains.
    eventually(lambda: not serving_pods(cluster, ns) and not runner.serving_processes(ns), 60,
               every=0.5, what="no serving pod", ignoring=KUBECTL_FAILED)
    ready = {"enabled": True, "replicas": 2, "readyReplicas": 2}
    assert status(cluster, ns).get("router") == ready


def streamed_chat(client: openai.OpenAI, text: str) -> tuple[str, float, float]:
    """One streamed chat through the official client: its answer, the seconds the router held
    it (its header), and the seconds until the answer was complete."""
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, stream=True, max_tokens=8,
        messages=[{"role": "user", "content": text}],
    )  # fmt: skip
    held = float(raw.headers.get(HELD_HEADER) or 0.0)
    answer = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return answer, held, time.monotonic() - started


def test_idle_goes_to_zero_and_the_first_requests_are_held_and_served(
    cluster: LocalCluster, namespace: str, operator: Operator, pod_runner: PodRunner
) -> None:
    ns = namespace
    obj = agd_object(
        replicas=2, adaptive={"paused": True},
        scaleToZero={"enabled": True, "idleSeconds": IDLE_SECONDS},
        router={"hold": {"waitSeconds": HOLD_SECONDS}},
    )  # fmt: skip
    deploy(cluster, ns, obj, "2/2")
    account = f"system:serviceaccount:{ns}:{NAME}-router"
    can = cluster.kubectl("auth", "can-i", "patch", f"autoglmdeployments.autoglm.io/{NAME}",
                          "-n", ns, "--as", account, check=False).stdout.strip()
    other = cluster.kubectl("auth", "can-i", "patch", "autoglmdeployments.autoglm.io/other",
                            "-n", ns, "--as", account, check=False).stdout.strip()
    assert (can, other) == ("yes", "no")

    # Nobody sends anything: after the idle window the serving pods go, the routers stay.
    at_zero(cluster, ns, pod_runner)
    went = standby(cluster, ns)
    assert went["reason"] == "ScaledToZero"
    assert "scaled from 2 to 0" in went["message"]
    reasons = {e.get("reason") for e in events(cluster, ns)}
    assert "ScaledToZero" in reasons

    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready router endpoints at zero", ignoring=KUBECTL_FAILED)
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="EMPTY", max_retries=0,
                               timeout=HOLD_SECONDS + 30)

        # The first request: held through the cold start, then served, its wait reported.
        answer, held, took = streamed_chat(client, "Open the settings app.")
        assert answer
        assert LOAD_SECONDS <= held <= took < HOLD_SECONDS
        print(f"first request at zero: held {held:.2f}s, answered after {took:.2f}s")
        eventually(lambda: standby(cluster, ns).get("state") == "Serving", 30, every=0.5,
                   what="status.standby Serving", ignoring=KUBECTL_FAILED)
        # The routers report their queue empty, with the wait of the request they released.
        eventually(lambda: standby(cluster, ns).get("heldRequests") == 0
                   and standby(cluster, ns).get("lastHeldWaitMillis", 0) >= held * 1000 - 1,
                   30, every=0.5, what="the held wait in status", ignoring=KUBECTL_FAILED)
        woke = standby(cluster, ns)
        print(f"status.standby after the wake: {woke}")
        # kwok reports a pod Ready when it is scheduled (no kubelet probes it), so the
        # operator's wake time here ends before the sim has loaded; the router's wait is real.
        assert woke["lastWakeMillis"] > 0
        assert woke["lastHeldWaitMillis"] >= LOAD_SECONDS * 1000
        reasons = {e.get("reason") for e in events(cluster, ns)}
        assert {"Waking", "Woke"} <= reasons

        # Idle again, then a burst arrives at zero: none lost, none past the hold bound.
        at_zero(cluster, ns, pod_runner)
        with ThreadPoolExecutor(max_workers=BURST) as pool:
            results = list(pool.map(lambda i: streamed_chat(client, f"Task {i}: open mail."),
                                    range(BURST)))
        assert all(answer for answer, _, _ in results)
        waits = sorted(held for _, held, _ in results)
        print(f"{BURST} requests at zero: held min {waits[0]:.2f}s, "
              f"median {waits[BURST // 2]:.2f}s, max {waits[-1]:.2f}s")
        assert waits[-1] < HOLD_SECONDS
        assert max(took for _, _, took in results) < HOLD_SECONDS


def runtime_sleeping(url: str) -> bool:
    """The runtime's own word (autoglm_sleeping on its /metrics), not the operator's mark."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return any(line.startswith("autoglm_sleeping ") and float(line.split()[1]) == 1.0
               for line in text.splitlines())


def sleeping_marks(cluster: LocalCluster, ns: str) -> dict[str, str | None]:
    items = get(cluster, ns, "pods", "-l", SERVING)["items"]
    return {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(SLEEPING)
            for p in items if not p["metadata"].get("deletionTimestamp")}


def test_idle_replicas_sleep_then_one_stays_as_a_warm_standby_that_a_request_wakes(
    cluster: LocalCluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    """Sleep mode against the sims (vLLM refuses it on the CPU): the operator puts idle
    replicas to sleep through their admin API, keeps one asleep at the floor, and the first
    request wakes it in about a second (no cold start), then both run again."""
    ns = namespace
    sim_args = ["--enable-sleep-mode", "--model-load-seconds", str(LOAD_SECONDS)]
    with PodRunner(cluster, tmp_path / "pods", sim_args=sim_args) as runner:
        obj = agd_object(
            replicas=2, adaptive={"paused": True},
            scaleToZero={"enabled": True, "idleSeconds": 2 * IDLE_SECONDS, "floor": 1,
                         "sleep": {"enabled": True, "idleSeconds": IDLE_SECONDS}},
        )  # fmt: skip
        deploy(cluster, ns, obj, "2/2")
        args = get(cluster, ns, "deployment", NAME)["spec"]["template"]["spec"]["containers"][0]
        assert "--enable-sleep-mode" in args["args"]
        eventually(lambda: standby(cluster, ns).get("state") == "Asleep", IDLE_SECONDS + 60,
                   every=0.5, what="status.standby Asleep", ignoring=KUBECTL_FAILED)
        eventually(lambda: set(sleeping_marks(cluster, ns).values()) == {"1"}, 30, every=0.5,
                   what="both pods marked asleep", ignoring=KUBECTL_FAILED)
        assert all(runtime_sleeping(url) for url in runner.runtime_urls(ns).values())
        eventually(lambda: standby(cluster, ns).get("state") == "Idle", IDLE_SECONDS + 60,
                   every=0.5, what="status.standby Idle at the floor", ignoring=KUBECTL_FAILED)
        assert get(cluster, ns, "deployment", NAME)["spec"]["replicas"] == 1
        eventually(lambda: len(sleeping_marks(cluster, ns)) == 1
                   and runner.serving_processes(ns) == 1, 60, every=0.5,
                   what="one sleeping standby left", ignoring=KUBECTL_FAILED)
        (standby_url,) = runner.runtime_urls(ns).values()
        assert runtime_sleeping(standby_url)

        with ServiceProxy(cluster, ns, NAME, kubelet=runner) as proxy:
            eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                       what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="EMPTY", max_retries=0,
                                   timeout=HOLD_SECONDS)
            answer, held, took = streamed_chat(client, "Open the calendar.")
        assert answer
        print(f"first request on a sleeping standby: held {held:.2f}s, answered after "
              f"{took:.2f}s")
        assert held == 0.0  # a sleeping replica takes it at once: it wakes, nothing is held
        assert took < LOAD_SECONDS  # a wake (0.85 s in the sim), not a cold start
        assert not runtime_sleeping(standby_url)
        eventually(lambda: standby(cluster, ns).get("state") == "Serving", 30, every=0.5,
                   what="status.standby Serving", ignoring=KUBECTL_FAILED)
        eventually(lambda: get(cluster, ns, "deployment", NAME)["spec"]["replicas"] == 2, 30,
                   every=0.5, what="back to 2 replicas", ignoring=KUBECTL_FAILED)
        eventually(lambda: set(sleeping_marks(cluster, ns).values()) == {None}, 30, every=0.5,
                   what="no pod marked asleep", ignoring=KUBECTL_FAILED)
        reasons = {e.get("reason") for e in events(cluster, ns)}
        assert {"Slept", "ScaledToFloor", "Woke"} <= reasons
