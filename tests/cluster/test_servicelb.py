"""testkit.servicelb's ServiceProxy follows its Service, as kube-proxy does: when the selector
changes (the operator moves Service `<name>` onto the router pods once one is ready), new
connections go to the newly selected pods, not to the ones selected when the proxy started.
And a pod counts only once its own process runs: kwok hands a deleted pod's IP to the next pod
at once, so a probe of the new pod's address can reach the old pod's process."""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_router_pod_watch import serving_pod

from testkit.localcluster import LocalCluster
from testkit.operator_kit import KUBECTL_FAILED
from testkit.servicelb import ServiceProxy
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(120)

ROLE = "example.com/role"


def pod(name: str, role: str) -> dict[str, Any]:
    manifest = serving_pod(name, "streaming")
    manifest["metadata"]["labels"][ROLE] = role
    return manifest


def service(role: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "front"},
        "spec": {"selector": {ROLE: role}, "ports": [{"port": 80, "targetPort": "http"}]},
    }  # fmt: skip


def test_endpoints_follow_a_selector_change(cluster: LocalCluster, namespace: str) -> None:
    cluster.apply(pod("serving", "serving"), namespace=namespace)
    cluster.apply(pod("router", "router"), namespace=namespace)
    cluster.apply(service("serving"), namespace=namespace)
    with ServiceProxy(cluster, namespace, "front") as proxy:
        eventually(lambda: [e.pod for e in proxy.endpoints()] == ["serving"], 30, every=0.5,
                   what="the serving pod as the endpoint", ignoring=KUBECTL_FAILED)  # fmt: skip
        cluster.apply(service("router"), namespace=namespace)
        eventually(lambda: [e.pod for e in proxy.endpoints()] == ["router"], 10, every=0.5,
                   what="the router pod as the endpoint", ignoring=KUBECTL_FAILED)  # fmt: skip
        assert proxy.endpoints()[0].address.endswith(":8000")


def test_a_pod_is_no_endpoint_until_its_own_process_runs(
    cluster: LocalCluster, namespace: str
) -> None:
    started: set[str] = set()

    class Kubelet:
        def running(self, pod_name: str) -> str | None:
            return pod_name if pod_name in started else None

    cluster.apply(pod("serving", "serving"), namespace=namespace)
    cluster.apply(service("serving"), namespace=namespace)
    with ServiceProxy(cluster, namespace, "front", kubelet=Kubelet()) as proxy:
        eventually(lambda: _ready_in_api(cluster, namespace), 30, every=0.5,
                   what="the pod Ready in the API", ignoring=KUBECTL_FAILED)
        time.sleep(2.0)  # four probe rounds
        assert proxy.endpoints() == []
        started.add("serving")
        eventually(lambda: [e.pod for e in proxy.endpoints()] == ["serving"], 10, every=0.5,
                   what="the running pod as the endpoint", ignoring=KUBECTL_FAILED)  # fmt: skip


def _ready_in_api(cluster: LocalCluster, namespace: str) -> bool:
    ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    return cluster.kubectl("get", "pod", "serving", "-n", namespace, "-o", ready).stdout == "True"
