"""Status field managers on a live object: an object whose status an earlier operator wrote
under two managers (autoglm-operator-status and autoglm-adaptive) ends up with one, and keeps
every field either of them wrote that is still current."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from autoglm_operator.io import kube
from testkit.localcluster import LocalCluster
from testkit.operator_kit import KUBECTL_FAILED, NAME, Operator, agd_object, condition, get, status
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(180)

HISTORY = [
    {
        "time": "2026-01-01T00:00:00Z",
        "fromBatching": 0,
        "toBatching": 1,
        "reason": "QpsAboveHigh",
        "message": "written by an earlier operator",
        "applied": True,
    }
]


def _status_managers(cluster: LocalCluster, namespace: str) -> set[str]:
    obj = get(cluster, namespace, "agd", NAME, "--show-managed-fields")
    entries = obj["metadata"].get("managedFields") or []
    return {e["manager"] for e in entries if e.get("subresource") == "status"}


def _write_as_the_earlier_operator(client: kube.Kube, namespace: str) -> None:
    """Status as the two managers of the earlier operator applied it, disjoint fields each."""
    reconcile: dict[str, Any] = {
        "observedGeneration": 1,
        "replicas": 0,
        "readyReplicas": 0,
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "NoReplicasReady", "message": "m",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ],
    }  # fmt: skip
    adaptive: dict[str, Any] = {
        "conditions": [
            {"type": "ModeTransitioning", "status": "False", "reason": "Stable", "message": "m",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ],
        "lastDecision": HISTORY[-1],
        "decisionHistory": HISTORY,
        "adaptiveState": {"highSince": "2026-01-01T00:00:00Z", "lastFlips": []},
    }  # fmt: skip
    for manager, part in (("autoglm-operator-status", reconcile), ("autoglm-adaptive", adaptive)):
        client._apply_status_as(manager, namespace, NAME, {"status": part})


def test_an_object_written_under_two_status_managers_ends_up_with_one(
    cluster: LocalCluster, crd: str, namespace: str, tmp_path: Path
) -> None:
    cluster.apply(agd_object(modePolicy="Adaptive", adaptive={"paused": True}), namespace=namespace)
    client = kube.Kube(config.new_client_from_config(config_file=cluster.kubeconfig))
    _write_as_the_earlier_operator(client, namespace)
    assert _status_managers(cluster, namespace) == {"autoglm-operator-status", "autoglm-adaptive"}

    op = Operator(cluster, namespace, tmp_path).start()
    try:
        eventually(
            lambda: _status_managers(cluster, namespace) == {kube.STATUS_FIELD_MANAGER} or None,
            60, every=0.5, what="one status manager", ignoring=KUBECTL_FAILED,
        )
        eventually(
            lambda: (
                status(cluster, namespace).get("lastDecision", {}).get("reason") == "Paused" or None
            ),
            60, every=0.5, what="the paused decision recorded", ignoring=KUBECTL_FAILED,
        )
        st = status(cluster, namespace)
        assert _status_managers(cluster, namespace) == {kube.STATUS_FIELD_MANAGER}
        assert st["decisionHistory"][0] == HISTORY[0], "the earlier decisions are kept"
        assert "adaptiveState" in st
        assert condition(st, "ModeTransitioning")["reason"] == "Stable"
        assert condition(st, "MetricsAvailable")["reason"] == "Paused"
        assert condition(st, "Ready") and condition(st, "Degraded")
        assert "released the status fields field manager autoglm-adaptive" in op.logs().lower()
    finally:
        cluster.kubectl("delete", "agd", "--all", "-n", namespace, "--wait=true", check=False)
        op.stop()
