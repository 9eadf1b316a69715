"""The operator's router on the local control plane: `<name>-router` and its identity exist with
the fields users rely on, Service `<name>` reaches the router pods (run by testkit.podrunner as
`autoglm-router` processes under their ServiceAccount's token), requests through it reach a
replica of the right mode, and `router.enabled: false` takes it all away again.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from autoglm_api.profiles import MODE_PATH
from testkit.localcluster import LocalCluster
from testkit.operator_kit import (
    KUBECTL_FAILED,
    NAME,
    Operator,
    admin_token,
    agd_object,
    deploy,
    get,
    live_pods,
    patch_agd,
    status,
)
from testkit.podrunner import PodRunner
from testkit.servicelb import ServiceProxy
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(300)

ROUTER = f"{NAME}-router"
ROUTER_KINDS = ("deployment", "pdb", "serviceaccount", "role", "rolebinding")
ROUTING = {"app.kubernetes.io/name": "autoglm-router", "app.kubernetes.io/instance": NAME}
SERVING = {"app.kubernetes.io/name": "autoglm", "app.kubernetes.io/instance": NAME}
MODEL = "autoglm-phone-9b"
REQUESTS = 6  # of each class


@pytest.fixture
def pod_runner(cluster: LocalCluster, tmp_path: Path) -> Iterator[PodRunner]:
    with PodRunner(cluster, tmp_path / "pods") as runner:
        yield runner


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def _health(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]
    except OSError:
        return {}


def _can(cluster: LocalCluster, account: str, verb: str, what: str, namespace: str) -> bool:
    """A SubjectAccessReview through `kubectl auth can-i --as`."""
    result = cluster.kubectl("auth", "can-i", verb, what, "-n", namespace, "--as", account,
                             check=False)  # fmt: skip
    return result.stdout.strip() == "yes"


def _flip(cluster: LocalCluster, ns: str, pod: str, admin_url: str, mode: str) -> None:
    """A flip as the operator does it: the label first, then the runtime's admin port."""
    cluster.kubectl("label", "pod", pod, f"autoglm.io/mode={mode}", "--overwrite", "-n", ns)
    request = urllib.request.Request(
        f"{admin_url}{MODE_PATH}", data=json.dumps({"mode": mode}).encode(), method="PUT",
        headers={"Authorization": f"Bearer {admin_token(cluster, ns, pod)}",
                 "Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=5).close()


def _send(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Open the settings app."}]
    for i in range(REQUESTS):
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, max_tokens=8,  # type: ignore[arg-type]
            extra_headers={"X-Session-ID": f"chat-{i}"},
        )  # fmt: skip
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8,  # type: ignore[arg-type]
            extra_headers={"X-Session-ID": f"job-{i}"},
        )  # fmt: skip
        assert reply.choices[0].message.content


def _router_children(cluster: LocalCluster, ns: str) -> str:
    names = [f"{kind}/{ROUTER}" for kind in ROUTER_KINDS]
    return cluster.kubectl("get", *names, "-n", ns, "-o", "name", "--ignore-not-found").stdout


def test_service_reaches_replicas_of_the_right_mode_through_the_router_and_off_again(
    cluster: LocalCluster, namespace: str, operator: Operator, pod_runner: PodRunner
) -> None:
    ns = namespace
    obj = agd_object(replicas=2, adaptive={"paused": True})
    deploy(cluster, ns, obj, "2/2")

    # The children, with the fields users rely on.
    deployment = get(cluster, ns, "deployment", ROUTER)
    assert deployment["spec"]["replicas"] == 2
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == ROUTER
    (container,) = pod_spec["containers"]
    assert container["command"] == ["autoglm-router"]
    assert not [k for k in container["resources"]["limits"] if "gpu" in k]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert get(cluster, ns, "pdb", ROUTER)["spec"]["maxUnavailable"] == 1
    role = get(cluster, ns, "role", ROUTER)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = get(cluster, ns, "rolebinding", ROUTER)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ROUTER, "namespace": ns}]
    eventually(
        lambda: get(cluster, ns, "service", NAME)["spec"]["selector"] == ROUTING,
        30, every=0.5, what="Service <name> to select the router", ignoring=KUBECTL_FAILED,
    )
    for mode in ("streaming", "batching"):
        selector = get(cluster, ns, "service", f"{NAME}-{mode}")["spec"]["selector"]
        assert selector == {**SERVING, "autoglm.io/mode": mode}
    up = {"enabled": True, "replicas": 2, "readyReplicas": 2}
    eventually(lambda: status(cluster, ns).get("router") == up, 30, every=0.5,
               what="status.router ready", ignoring=KUBECTL_FAILED)

    # The router's ServiceAccount: pods of its own namespace, nothing else.
    account = f"system:serviceaccount:{ns}:{ROUTER}"
    assert _can(cluster, account, "list", "pods", ns)
    assert _can(cluster, account, "watch", "pods", ns)
    assert not _can(cluster, account, "list", "pods", "kube-system")
    assert not _can(cluster, account, "get", "secrets", ns)
    assert not _can(cluster, account, "list", "secrets", ns)
    assert not _can(cluster, account, "patch", "pods", ns)

    # One replica of each mode, run by the pod runner; the routers see both.
    pods = sorted(p["metadata"]["name"] for p in live_pods(cluster, ns))
    eventually(lambda: len(pod_runner.runtime_urls(ns)) == 2, 60, every=0.5,
               what="a sim per serving pod", ignoring=KUBECTL_FAILED)
    eventually(lambda: len(pod_runner.router_urls(ns)) == 2, 60, every=0.5,
               what="a router per router pod", ignoring=KUBECTL_FAILED)
    sims = pod_runner.runtime_urls(ns)
    _flip(cluster, ns, pods[1], pod_runner.admin_urls(ns)[pods[1]], "batching")
    routers = pod_runner.router_urls(ns)
    both = {"streaming": 1, "batching": 1, "unknown": 0}
    for url in pod_runner.router_ops_urls(ns).values():
        eventually(lambda url=url: _health(url).get("replicas") == both, 30, every=0.5,
                   what=f"router {url} to see both modes", ignoring=KUBECTL_FAILED)  # fmt: skip
    admitted_before = {p: _metrics(u).get("autoglm_requests_admitted_total", 0) for p, u in
                       sims.items()}  # fmt: skip

    # The official client through Service <name>: the local kube-proxy picks a router pod.
    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready router endpoints", ignoring=KUBECTL_FAILED)
        assert {e.pod for e in proxy.endpoints()} == set(routers)
        _send(proxy.url + "/v1")
        assert set(proxy.stats.connections) <= set(routers)

    # Each class reached its mode's replica: the routers' counts and the sims' own.
    counted = pod_runner.router_requests_once(ns, 2 * REQUESTS)
    assert counted == {
        ("streamed_chat", "streaming", "ok"): REQUESTS, ("other", "batching", "ok"): REQUESTS,
    }  # fmt: skip
    admitted = {p: _metrics(u)["autoglm_requests_admitted_total"] - admitted_before[p]
                for p, u in sims.items()}  # fmt: skip
    assert admitted == {pods[0]: REQUESTS, pods[1]: REQUESTS}

    # The routers watched pods as their ServiceAccount, and were refused nothing.
    events = cluster.audit_events(account)
    verbs = {(e["verb"], e["objectRef"]["resource"], e["objectRef"].get("namespace")) for e in
             events if e.get("objectRef")}  # fmt: skip
    assert verbs == {("list", "pods", ns), ("watch", "pods", ns)}, verbs
    decisions = {(e.get("annotations") or {}).get("authorization.k8s.io/decision") for e in events}
    assert decisions == {"allow"}

    # Off: Service <name> back on the serving pods, the router's children and pods gone.
    patch_agd(cluster, ns, {"spec": {"router": {"enabled": False}}})
    eventually(lambda: _router_children(cluster, ns) == "", 60, every=0.5,
               what="the router's children deleted", ignoring=KUBECTL_FAILED)  # fmt: skip
    assert get(cluster, ns, "service", NAME)["spec"]["selector"] == SERVING
    eventually(lambda: status(cluster, ns).get("router") == {
        "enabled": False, "replicas": 0, "readyReplicas": 0}, 30, every=0.5,
        what="status.router off", ignoring=KUBECTL_FAILED)  # fmt: skip
    eventually(lambda: not pod_runner.router_urls(ns), 60, every=0.5,
               what="the router processes stopped", ignoring=KUBECTL_FAILED)
    with ServiceProxy(cluster, ns, NAME, kubelet=pod_runner) as proxy:
        eventually(lambda: len(proxy.endpoints()) == 2, 30, every=0.5,
                   what="2 ready serving endpoints", ignoring=KUBECTL_FAILED)
        assert {e.pod for e in proxy.endpoints()} == set(pods)
