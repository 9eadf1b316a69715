"""Scale to zero on the local control plane: the operator scales an idle deployment to zero, the
routers stay ready and hold what arrives, the operator reads what they hold from their ops port
and wakes one replica, then more as demand fills it; with sleep on, idle replicas sleep first
and one stays as a standby that a request wakes. What must not wake GPUs (a model list, a
client that leaves at once), keep them awake (a router that died holding) or be cut (a stream
longer than the idle window, a held stream behind a proxy that cuts idle connections) is
checked here on the real control plane.

Serving pods are sims that take `LOAD_SECONDS` to load their model (run by testkit.podrunner),
so a request at zero waits through scheduling, the start and the routers' release; routers are
`autoglm-router` processes under their ServiceAccount's token, which may only list and watch
pods (tests/abuse/test_router_identity.py proves each refusal with that token).
"""

from __future__ import annotations

import json
import socket
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
from testkit.waiting import TIME_SCALE, eventually

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
    idle(cluster, ns)
    # Gone, processes too: kwok hands a deleted pod's address to a new pod at once, where a
    # node would not while the old one drains.
    eventually(lambda: not serving_pods(cluster, ns) and not runner.serving_processes(ns), 60,
               every=0.5, what="no serving pod", ignoring=KUBECTL_FAILED)
    ready = {"enabled": True, "replicas": 2, "readyReplicas": 2}
    assert status(cluster, ns).get("router") == ready


def idle(cluster: LocalCluster, ns: str) -> None:
    """status.standby Idle and the Deployment at 0 (its old pods may still drain)."""
    eventually(lambda: standby(cluster, ns).get("state") == "Idle", IDLE_SECONDS + 60,
               every=0.5, what="status.standby Idle", ignoring=KUBECTL_FAILED)
    assert get(cluster, ns, "deployment", NAME)["spec"]["replicas"] == 0


def deployment_replicas(cluster: LocalCluster, ns: str) -> int:
    return int(get(cluster, ns, "deployment", NAME)["spec"]["replicas"])


def stays_at_zero(cluster: LocalCluster, ns: str, seconds: float) -> None:
    """Nothing wakes for `seconds`: several operator passes (one a second) and router reads."""
    deadline = time.monotonic() + seconds * TIME_SCALE
    while time.monotonic() < deadline:
        assert deployment_replicas(cluster, ns) == 0
        assert standby(cluster, ns).get("state") == "Idle"
        time.sleep(0.5)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:  # refused, or an HTTPError (503 while the model loads)
        return False


def router_report(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/autoglm/v1/demand", timeout=5) as response:
        return dict(json.loads(response.read()))


def router_sample(url: str, name: str) -> float | None:
    """A router's own sample of `name` (no labels), or None when it exports none."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def plain_chat(client: openai.OpenAI, text: str) -> str | openai.APIError:
    """One non-streamed chat: its answer, or the error that ended it."""
    try:
        reply = client.chat.completions.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": text}])
    except openai.APIError as error:
        return error
    return reply.choices[0].message.content or ""


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
        # Every client reaches the routers from the service proxy's one address: one client.
        router={"hold": {"waitSeconds": HOLD_SECONDS, "perClient": 256}},
    )  # fmt: skip
    deploy(cluster, ns, obj, "2/2")
    account = f"system:serviceaccount:{ns}:{NAME}-router"
    can = cluster.kubectl("auth", "can-i", "patch", f"autoglmdeployments.autoglm.io/{NAME}",
                          "-n", ns, "--as", account, check=False).stdout.strip()
    assert can == "no"  # the router writes nothing; the operator reads its ops port

    # Nobody sends anything: after the idle window the Deployment goes to zero, the routers
    # stay. A chat sent at once, while the old pods still drain, is held and served (their
    # addresses go to the new pod: the draining one's refusal must not hold the new one out).
    idle(cluster, ns)
    went = standby(cluster, ns)
    assert went["reason"] == "ScaledToZero"
    assert "scaled from 2 to 0" in went["message"]
    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready router endpoints at zero", ignoring=KUBECTL_FAILED)
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="EMPTY", max_retries=0,
                               timeout=HOLD_SECONDS + 30)
        answer, held, took = streamed_chat(client, "Open the settings app.")
        assert answer
        assert LOAD_SECONDS <= held <= took < HOLD_SECONDS
        print(f"first request at zero, old pods draining: held {held:.2f}s, answered after "
              f"{took:.2f}s")
        # One replica woke for it, not both.
        eventually(lambda: standby(cluster, ns).get("state") == "Serving", 30, every=0.5,
                   what="status.standby Serving", ignoring=KUBECTL_FAILED)
        assert deployment_replicas(cluster, ns) == 1
        assert standby(cluster, ns).get("wokenReplicas") == 1
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
        assert {"ScaledToZero", "Waking", "Woke"} <= reasons

        # At zero, a model list and a client that leaves at once wake nothing.
        at_zero(cluster, ns, pod_runner)
        models = client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        leaving = socket.create_connection(("127.0.0.1", proxy.port))
        body = json.dumps({"model": MODEL, "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        leaving.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.3)
        leaving.close()
        stays_at_zero(cluster, ns, 6)
        print("at zero: GET /v1/models answered by the routers and a client that left after "
              "0.3 s woke nothing for 6 s")

        # A burst at zero, through both routers: none lost, none past the hold bound, and the
        # one replica that woke first is joined by the second once it is full.
        with ThreadPoolExecutor(max_workers=BURST) as pool:
            results = list(pool.map(lambda i: streamed_chat(client, f"Task {i}: open mail."),
                                    range(BURST)))
        assert all(answer for answer, _, _ in results)
        waits = sorted(held for _, held, _ in results)
        print(f"{BURST} requests at zero: held min {waits[0]:.2f}s, "
              f"median {waits[BURST // 2]:.2f}s, max {waits[-1]:.2f}s")
        assert waits[-1] < HOLD_SECONDS
        assert max(took for _, _, took in results) < HOLD_SECONDS
        held_by = {pod: router_sample(url, "autoglm_router_hold_seconds_count")
                   for pod, url in pod_runner.router_ops_urls(ns).items()}
        print(f"held by each router: {held_by}")
        assert len(held_by) == 2 and all(count for count in held_by.values())
        eventually(lambda: deployment_replicas(cluster, ns) == 2, 30, every=0.5,
                   what="the second replica started for the burst", ignoring=KUBECTL_FAILED)
        assert "ScaledUp" in {e.get("reason") for e in events(cluster, ns)}


def test_a_stream_longer_than_the_idle_window_is_not_cut(
    cluster: LocalCluster, namespace: str, operator: Operator, pod_runner: PodRunner
) -> None:
    ns = namespace
    obj = agd_object(replicas=1, adaptive={"paused": True},
                     scaleToZero={"enabled": True, "idleSeconds": IDLE_SECONDS})
    deploy(cluster, ns, obj, "1/1")
    # kwok reports the pod Ready before its sim has loaded (no kubelet probes it): wait for the
    # engine itself, as a readiness probe would.
    eventually(lambda: any(healthy(url) for url in pod_runner.runtime_urls(ns).values()), 60,
               every=0.5, what="the replica's engine loaded")
    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="EMPTY", max_retries=0,
                               timeout=300)
        started = time.monotonic()
        stream = client.chat.completions.create(
            model=MODEL, stream=True, max_tokens=1500, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": "Describe every app on the phone."}])
        chunks = sum(1 for c in stream if c.choices and c.choices[0].delta.content)
        took = time.monotonic() - started
    print(f"one stream of {chunks} chunks took {took:.1f}s against idleSeconds {IDLE_SECONDS}")
    assert took > 1.5 * IDLE_SECONDS  # a positive control: it did outlast the window
    assert chunks >= 1500
    # The window starts at its end: the deployment idles only after that.
    idle(cluster, ns)
    went_idle = standby(cluster, ns)
    assert float(went_idle["message"].split("No request for ")[1].split("s")[0]) >= IDLE_SECONDS


def test_a_router_that_dies_holding_does_not_keep_the_deployment_awake(
    cluster: LocalCluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    """A wake for a request held by a router that then dies: once the report it can no longer
    give is older than the hold's bound, it counts no more and the deployment goes back (kwok
    reports the new pod Ready at once, so the wake ends as Woke and the idle window follows;
    with a real kubelet's probe the wake is abandoned instead)."""
    ns = namespace
    wait_seconds = 10
    # The replica's start outlasts everything here, so only the dead router's demand could
    # keep the wake going.
    with PodRunner(cluster, tmp_path / "pods", sim_args=["--model-load-seconds", "600"]) as runner:
        obj = agd_object(replicas=2, adaptive={"paused": True},
                         scaleToZero={"enabled": True, "idleSeconds": IDLE_SECONDS},
                         router={"hold": {"waitSeconds": wait_seconds}})
        cluster.apply(obj, ns)
        eventually(lambda: standby(cluster, ns).get("state") == "Idle", IDLE_SECONDS + 90,
                   every=0.5, what="status.standby Idle", ignoring=KUBECTL_FAILED)
        routers = runner.router_ops_urls(ns)
        assert len(routers) == 2
        pod, ops = sorted(routers.items())[0]
        api = runner.router_urls(ns)[pod]
        held = socket.create_connection(tuple(api.removeprefix("http://").rsplit(":", 1)))
        body = json.dumps({"model": MODEL, "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        held.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        eventually(lambda: router_report(ops)["holding"] == 1, 10, every=0.2,
                   what="the router reports it holds the request")
        eventually(lambda: standby(cluster, ns).get("state") == "Waking", 15, every=0.2,
                   what="the wake", ignoring=KUBECTL_FAILED)
        running = runner.running(pod)
        assert running is not None
        running.process.kill()  # the router dies with the request held
        killed = time.monotonic()
        eventually(lambda: standby(cluster, ns).get("state") == "Idle", wait_seconds + 30,
                   every=0.5, what="back to Idle", ignoring=KUBECTL_FAILED)
        back = standby(cluster, ns)
        print(f"a router killed while holding: back to {back['state']} ({back['reason']}) "
              f"{time.monotonic() - killed:.1f}s later")
        assert back["reason"] in ("WakeAbandoned", "ScaledToZero")
        assert back["heldRequests"] == 0
        assert time.monotonic() - killed >= wait_seconds  # its last report aged out, no sooner
        assert deployment_replicas(cluster, ns) == 0
        held.close()


def test_a_held_stream_survives_a_proxy_that_cuts_idle_connections(
    cluster: LocalCluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    """A 90 s cold start behind a proxy that cuts connections idle for 60 s (an ingress's or a
    cloud load balancer's default): the router's heartbeats keep the held stream open."""
    ns = namespace
    start_seconds, proxy_idle = 90.0, 60.0
    sim_args = ["--model-load-seconds", str(start_seconds)]
    with PodRunner(cluster, tmp_path / "pods", sim_args=sim_args) as runner:
        obj = agd_object(replicas=1, adaptive={"paused": True},
                         scaleToZero={"enabled": True, "idleSeconds": IDLE_SECONDS},
                         router={"hold": {"waitSeconds": 180}})
        cluster.apply(obj, ns)
        eventually(lambda: standby(cluster, ns).get("state") == "Idle",
                   IDLE_SECONDS + start_seconds + 60, every=0.5, what="status.standby Idle",
                   ignoring=KUBECTL_FAILED)
        with ServiceProxy(cluster, ns, NAME, kubelet=runner, idle_timeout=proxy_idle) as proxy:
            eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                       what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="EMPTY",
                                   max_retries=0, timeout=300)
            with ThreadPoolExecutor(max_workers=1) as pool:
                # A positive control beside it: a non-streamed request hears nothing while it
                # is held, so this proxy cuts it.
                control = pool.submit(plain_chat, client, "Open the camera.")
                answer, _, took = streamed_chat(client, "Open the gallery.")
                cut = control.result()
            cuts = proxy.stats.idle_cuts
    print(f"behind a {proxy_idle:.0f}s-idle proxy: a stream held through a "
          f"{start_seconds:.0f}s start, answered after {took:.1f}s; {cuts} idle connection(s) "
          "cut (the non-streamed control)")
    assert answer
    assert took >= start_seconds
    assert isinstance(cut, openai.APIConnectionError)  # the control was cut
    assert cuts == 1  # the control's, and not the held stream's


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
        urls = runner.runtime_urls(ns)
        assert len(urls) == 2, urls  # all() of no runtime would pass
        assert all(runtime_sleeping(url) for url in urls.values())
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
        assert took < LOAD_SECONDS * TIME_SCALE  # a wake (0.85 s in the sim), not a cold start
        assert not runtime_sleeping(standby_url)
        eventually(lambda: standby(cluster, ns).get("state") == "Serving", 30, every=0.5,
                   what="status.standby Serving", ignoring=KUBECTL_FAILED)
        # The standby serves alone until demand fills it: one chat starts no second replica.
        assert standby(cluster, ns).get("wokenReplicas") == 1
        assert get(cluster, ns, "deployment", NAME)["spec"]["replicas"] == 1
        eventually(lambda: set(sleeping_marks(cluster, ns).values()) == {None}, 30, every=0.5,
                   what="no pod marked asleep", ignoring=KUBECTL_FAILED)
        reasons = {e.get("reason") for e in events(cluster, ns)}
        assert {"Slept", "ScaledToFloor", "Woke"} <= reasons
