"""The local control plane schedules GPU pods like a real cluster would."""

from __future__ import annotations

import time
from typing import Any

from testkit.localcluster import LocalCluster


def _gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main",
                "image": "registry.invalid/none:1",
                "resources": {"limits": {"nvidia.com/gpu": gpus}},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "runAsUser": 1000,
                },
            }],
        },
    }  # fmt: skip


def test_fake_gpu_nodes_are_ready(cluster: LocalCluster) -> None:
    nodes = cluster.get_json("nodes")["items"]
    gpu_nodes = [n for n in nodes if n["status"]["allocatable"].get("nvidia.com/gpu") == "8"]
    assert len(gpu_nodes) >= 2
    for node in gpu_nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True"


def test_pod_asking_for_two_gpus_runs(cluster: LocalCluster, namespace: str) -> None:
    cluster.apply(_gpu_pod("two-gpus", 2), namespace)
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/two-gpus", "-n", namespace, "--timeout=60s"
    )
    pod = cluster.get_json("pod", "two-gpus", "-n", namespace)
    assert pod["spec"]["nodeName"].startswith("gpu-node-")
    assert pod["status"]["podIP"]


def test_pod_asking_for_more_gpus_than_any_node_stays_pending(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.apply(_gpu_pod("too-many", 16), namespace)
    deadline = time.monotonic() + 30
    scheduled: dict[str, Any] = {}
    while time.monotonic() < deadline and not scheduled:
        pod = cluster.get_json("pod", "too-many", "-n", namespace)
        conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
        scheduled = conditions.get("PodScheduled", {})
        time.sleep(0.5)
    assert pod["status"]["phase"] == "Pending"
    assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in scheduled["message"]


def test_restricted_pod_security_is_enforced(cluster: LocalCluster, namespace: str) -> None:
    privileged = _gpu_pod("privileged", 1)
    privileged["spec"]["containers"][0]["securityContext"].update(
        privileged=True, allowPrivilegeEscalation=True
    )
    result = cluster.apply(privileged, namespace, check=False)
    assert result.returncode != 0 and "violates PodSecurity" in result.stderr
