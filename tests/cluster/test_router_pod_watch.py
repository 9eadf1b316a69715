"""The router's pod watch against the local control plane, as a ServiceAccount that may only
get, list and watch pods in its own namespace.

Pods are created directly (kwok runs them and gives each a loopback IP). The watch must show
each pod with its mode label, see a label flip within 2 s, drop a deleted pod at once, and go on
after the apiserver ends its watches and after the apiserver itself restarts.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autoglm_api.profiles import Mode
from autoglm_router.kube import ApiAccess, KubernetesDiscovery, in_cluster_access
from testkit.localcluster import LocalCluster, free_port
from testkit.operator_kit import KUBECTL_FAILED
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(240)

INSTANCE = "app.kubernetes.io/instance"
SELECTOR = f"{INSTANCE}=demo"
ACCOUNT = "autoglm-router"
FLIP_SECONDS = 2.0
ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
    "metadata": {"name": ACCOUNT},
    "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
}
BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
    "metadata": {"name": ACCOUNT},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
    "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT}],
}


def serving_pod(name: str, mode: str, instance: str = "demo") -> dict[str, Any]:
    """A pod shaped like the operator's serving pods, as far as the router reads them."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {
            INSTANCE: instance, "app.kubernetes.io/component": "server",
            "autoglm.io/mode": mode}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "runtime", "image": "autoglm-runtime:test",
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def service_account_folder(cluster: LocalCluster, namespace: str, folder: Path) -> Path:
    """What the kubelet mounts for a pod of the router's ServiceAccount: a token from the
    TokenRequest API, the cluster CA and the namespace."""
    cluster.kubectl("create", "serviceaccount", ACCOUNT, "-n", namespace)
    cluster.apply(ROLE, namespace=namespace)
    cluster.apply(BINDING, namespace=namespace)
    token = cluster.kubectl("create", "token", ACCOUNT, "-n", namespace,
                            "--duration=1h").stdout.strip()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text(token)
    (folder / "ca.crt").write_text(Path(cluster.ca_file).read_text())
    (folder / "namespace").write_text(namespace)
    return folder


def in_pod_env(cluster: LocalCluster) -> dict[str, str]:
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(cluster.api_port)}


@pytest.fixture
def account(cluster: LocalCluster, namespace: str, tmp_path: Path) -> ApiAccess:
    folder = service_account_folder(cluster, namespace, tmp_path / "serviceaccount")
    return in_cluster_access(in_pod_env(cluster), folder)


@pytest.fixture
async def watch(account: ApiAccess) -> AsyncIterator[KubernetesDiscovery]:
    assert account.namespace is not None
    # The apiserver ends each watch after 2 s, so the test sees the watch go on across many.
    discovery = KubernetesDiscovery(account, account.namespace, SELECTOR, "http",
                                    watch_seconds=2, backoff_max=1.0)
    await discovery.start()
    yield discovery
    await discovery.stop()


async def kubectl(cluster: LocalCluster, *args: str, input: str | None = None) -> None:
    """kubectl off the event loop, so the watch keeps reading while it runs."""
    await asyncio.to_thread(cluster.kubectl, *args, input=input)


async def seconds_until(check: Callable[[], bool], timeout: float,
                        started: float | None = None) -> float:
    """Seconds from `started` (default now) until check() holds; fails after `timeout`."""
    started = time.monotonic() if started is None else started
    while not check():
        assert time.monotonic() - started < timeout, f"not seen within {timeout} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def modes(watch: KubernetesDiscovery) -> dict[str, Mode | None]:
    """Each ready replica's mode, by pod name."""
    urls = {e.name: e for e in watch.endpoints() if e.ready}
    return {p.pod: urls[p.url].mode for p in watch.table.pods.values() if p.url in urls}


async def create_pods(cluster: LocalCluster, namespace: str, *pods: dict[str, Any]) -> None:
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(pods)})
    await kubectl(cluster, "create", "-n", namespace, "-f", "-", input=listed)


async def test_pods_appear_flip_and_leave_through_the_watch(
    cluster: LocalCluster, namespace: str, watch: KubernetesDiscovery
) -> None:
    await create_pods(cluster, namespace, serving_pod("a", "streaming"),
                      serving_pod("b", "batching"), serving_pod("other", "streaming", "else"))
    await seconds_until(lambda: len(modes(watch)) == 2, timeout=30)
    assert modes(watch) == {"a": Mode.STREAMING, "b": Mode.BATCHING}  # not the other instance
    assert all(e.name.startswith("http://127.") and e.name.endswith(":8000")
               for e in watch.endpoints())

    figures: dict[str, float] = {}
    # Each figure counts from the start of the kubectl command that makes the change.
    for mode in (Mode.BATCHING, Mode.STREAMING):  # flip a, then back
        started = time.monotonic()
        await kubectl(cluster, "label", "pod", "a", "-n", namespace, "--overwrite",
                      f"autoglm.io/mode={mode.value}")
        figures[f"flip to {mode.value}"] = await seconds_until(
            lambda mode=mode: modes(watch).get("a") is mode, FLIP_SECONDS, started)

    # Several apiserver-ended watches later (2 s each), a flip still arrives in time, and no
    # new list was needed: each watch went on from the last resourceVersion.
    await seconds_until(lambda: watch.watches >= 4, timeout=20)
    started = time.monotonic()
    await kubectl(cluster, "label", "pod", "b", "-n", namespace, "--overwrite",
                  "autoglm.io/mode=streaming")
    figures["flip after watch ends"] = await seconds_until(
        lambda: modes(watch).get("b") is Mode.STREAMING, FLIP_SECONDS, started)
    assert watch.lists == 1

    # The readiness probe fails (the kubelet's status write): a is out, then back.
    for ready in ("False", "True"):
        started = time.monotonic()
        await kubectl(cluster, "patch", "pod", "a", "-n", namespace, "--subresource=status",
                      "-p", json.dumps({"status": {"conditions": [
                          {"type": "Ready", "status": ready}]}}))
        figures[f"ready {ready}"] = await seconds_until(
            lambda ready=ready: ("a" in modes(watch)) == (ready == "True"), FLIP_SECONDS,
            started)

    b_url = next(p.url for p in watch.table.pods.values() if p.pod == "b")
    started = time.monotonic()
    await kubectl(cluster, "delete", "pod", "b", "-n", namespace, "--wait=false")
    figures["deleted pod gone"] = await seconds_until(
        lambda: b_url not in {e.name for e in watch.endpoints()}, FLIP_SECONDS, started)
    print(" ".join(f"{k}: {v:.2f}s" for k, v in figures.items()))
    # The apiserver's audit log: the router's account listed and watched pods, nothing else.
    used = {(e["verb"], e["objectRef"]["resource"], e["objectRef"]["namespace"])
            for e in cluster.audit_events(f"system:serviceaccount:{namespace}:{ACCOUNT}")}
    assert used == {("list", "pods", namespace), ("watch", "pods", namespace)}


async def test_the_watch_goes_on_after_the_apiserver_restarts(
    cluster: LocalCluster, namespace: str, watch: KubernetesDiscovery
) -> None:
    await create_pods(cluster, namespace, serving_pod("a", "streaming"))
    await seconds_until(lambda: modes(watch) == {"a": Mode.STREAMING}, timeout=30)
    down = await asyncio.to_thread(cluster.restart, "kube-apiserver")
    assert modes(watch) == {"a": Mode.STREAMING}  # the last pods seen stay while it is down
    started = time.monotonic()
    await kubectl(cluster, "label", "pod", "a", "-n", namespace, "--overwrite",
                  "autoglm.io/mode=batching")
    # Reconnect backoff is at most 1 s here (30 s by default).
    seen = await seconds_until(lambda: modes(watch).get("a") is Mode.BATCHING, 10, started)
    print(f"apiserver down/up {down:.1f}s; flip after restart seen in {seen:.2f}s")


def test_the_service_account_may_only_read_pods_of_its_namespace(
    cluster: LocalCluster, namespace: str, account: ApiAccess
) -> None:
    who = f"--as=system:serviceaccount:{namespace}:{ACCOUNT}"

    def can(*what: str) -> str:
        return cluster.kubectl("auth", "can-i", *what, who, check=False).stdout.strip()

    assert [can(verb, "pods", "-n", namespace) for verb in ("get", "list", "watch")] == [
        "yes"] * 3
    assert can("list", "pods", "-n", "default") == "no"
    assert can("patch", "pods", "-n", namespace) == "no"
    assert can("list", "services", "-n", namespace) == "no"


# -- real requests through the router, to sims at the pods' addresses -------------------------


def start_sim(ip: str, port: int, mode: str, folder: Path) -> subprocess.Popen[bytes]:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"initialMode": mode}))
    env = {**os.environ, "AUTOGLM_CONFIG_FILE": str(folder / "config.json"),
           "AUTOGLM_LABELS_FILE": str(folder / "labels"), "AUTOGLM_ADMIN_TOKEN": "t"}
    return subprocess.Popen(
        [sys.executable, "-m", "testkit.sim", "--host", ip, "--port", str(port),
         "--time-factor", "0.05"],
        env=env, stdout=(folder / "sim.log").open("wb"), stderr=subprocess.STDOUT)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def admitted(base_url: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("autoglm_requests_admitted_total"))


def chat(router: str, stream: bool) -> None:
    body = json.dumps({"model": "autoglm-phone-9b", "stream": stream, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "open settings"}]}).encode()
    request = urllib.request.Request(router + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        response.read()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.terminate()
    for proc in started:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_requests_reach_sims_at_pod_addresses_by_their_mode_label(
    cluster: LocalCluster, namespace: str, tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    folder = service_account_folder(cluster, namespace, tmp_path / "serviceaccount")
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "List",
        "items": [serving_pod("s", "streaming"), serving_pod("b", "batching")]}))
    ips = eventually(lambda: pod_ips(cluster, namespace, 2), 30, every=0.5, what="both pods' IPs",
                     ignoring=KUBECTL_FAILED)
    port = free_port()
    sims = {name: f"http://{ip}:{port}" for name, ip in ips.items()}
    for name, ip in ips.items():
        processes.append(start_sim(ip, port, {"s": "streaming", "b": "batching"}[name],
                                   tmp_path / name))
    for url in sims.values():
        eventually(lambda url=url: answers(url + "/health"), 30, every=0.5, what=f"sim at {url}",
                   ignoring=KUBECTL_FAILED)

    router, ops = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    processes.append(subprocess.Popen(
        [sys.executable, "-m", "autoglm_router.cli", "--host", "127.0.0.1",
         "--port", router.rsplit(":", 1)[1], "--metrics-port", ops.rsplit(":", 1)[1],
         "--kubernetes", "--selector", SELECTOR,
         "--target-port", str(port), "--kubeconfig", str(service_account_kubeconfig(
             cluster, folder))],
        stdout=(tmp_path / "router.log").open("wb"), stderr=subprocess.STDOUT,
    ))
    eventually(lambda: answers(ops + "/health"), 30, every=0.5, what="router healthy",
               ignoring=KUBECTL_FAILED)
    before = {name: admitted(url) for name, url in sims.items()}
    for _ in range(3):
        chat(router, stream=True)
        chat(router, stream=False)
    served = {name: admitted(url) - before[name] for name, url in sims.items()}
    assert served == {"s": 3, "b": 3}, served

    # Flip b's label: streamed chats now have two streaming replicas to share.
    cluster.kubectl("label", "pod", "b", "-n", namespace, "--overwrite",
                    "autoglm.io/mode=streaming")
    eventually(lambda: replicas_by_mode(ops) == {
        "streaming": 2, "batching": 0, "unknown": 0}, 5, every=0.5,
        what="flip seen by the router", ignoring=KUBECTL_FAILED)
    cluster.kubectl("delete", "pod", "s", "-n", namespace, "--wait=false")
    eventually(lambda: replicas_by_mode(ops) == {
        "streaming": 1, "batching": 0, "unknown": 0}, 5, every=0.5,
        what="deleted pod gone from the router", ignoring=KUBECTL_FAILED)
    before = {name: admitted(url) for name, url in sims.items()}
    for _ in range(3):
        chat(router, stream=True)
    served = {name: admitted(url) - before[name] for name, url in sims.items()}
    assert served == {"s": 0, "b": 3}, served


def replicas_by_mode(ops: str) -> dict[str, int]:
    """The router's /health, on its metrics port."""
    with urllib.request.urlopen(ops + "/health", timeout=5) as response:
        return json.loads(response.read())["replicas"]  # type: ignore[no-any-return]


def pod_ips(cluster: LocalCluster, namespace: str, count: int) -> dict[str, str] | None:
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    ips = {p["metadata"]["name"]: p["status"].get("podIP") for p in pods}
    return ips if len(ips) == count and all(ips.values()) else None


def service_account_kubeconfig(cluster: LocalCluster, folder: Path) -> Path:
    """A kubeconfig with the ServiceAccount's token, as a router outside the cluster uses."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "router",
        "clusters": [{"name": "local", "cluster": {
            "server": cluster.server, "certificate-authority": "ca.crt"}}],
        "users": [{"name": ACCOUNT, "user": {"tokenFile": "token"}}],
        "contexts": [{"name": "router", "context": {
            "cluster": "local", "user": ACCOUNT,
            "namespace": (folder / "namespace").read_text()}}],
    }
    path = folder / "kubeconfig"
    path.write_text(json.dumps(config))
    return path
