"""What survives a control-plane crash under a running operator.

etcd and kube-apiserver are killed (SIGKILL) and started again on the same data, ports and
certificates, three times: etcd alone, the apiserver alone, then both while a rollout is in
flight. After each, a change made through the API must be reconciled within a bound (so the
operator's watches resumed), and at the end every child exists exactly once, owned once, and
the admin Secret holds the token of the rollout's new pod template, written once: nothing was
created twice or regenerated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from testkit.localcluster import LocalCluster
from testkit.operator_kit import (
    EXAMPLE,
    HASH_ANNOTATION,
    INSTANCE,
    KUBECTL_FAILED,
    NAME,
    Operator,
    admin_tokens,
    deploy,
    events,
    get,
    live_pods,
    patch_agd,
    ready_as,
    status,
)
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(300)

# A change made after the control plane is back must be reconciled within this many seconds.
CONVERGE_SECONDS = 60
# A rollout replaces the pods one at a time (maxSurge 1, maxUnavailable 0), each a runtime
# process starting on the shared 2-core machine while the control plane resyncs after a crash.
ROLLOUT_SECONDS = 180
CHILDREN = {
    "deployments": {NAME},
    "services": {NAME, f"{NAME}-streaming", f"{NAME}-batching"},
    "configmaps": {f"{NAME}-config"},
    "secrets": {f"{NAME}-admin"},
    "poddisruptionbudgets": {NAME},
}


def children(cluster: LocalCluster, ns: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of the child kinds that carries this deployment's instance label."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for kind in CHILDREN:
        for obj in get(cluster, ns, kind, "-l", INSTANCE)["items"]:
            found[kind, obj["metadata"]["name"]] = obj
    return found


def timed(what: str, probe: Callable[[], Any], timeout: float = CONVERGE_SECONDS) -> float:
    started = time.monotonic()
    eventually(probe, timeout, every=0.2, what=what, ignoring=KUBECTL_FAILED)
    return time.monotonic() - started


def test_watches_resume_after_etcd_and_apiserver_crashes_and_nothing_is_duplicated(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    # A renew deadline longer than an apiserver restart takes here. Past it the operator steps
    # down and exits by design (its pod restarts); this test is about the watches of one process.
    operator.stop()
    operator.start("--lease-seconds", "90")
    deploy(cluster, namespace, EXAMPLE, "2/2")
    before = children(cluster, namespace)
    tokens = admin_tokens(cluster, namespace)
    bystanders = {
        n: cluster.processes[n].pid for n in ("kube-controller-manager", "kube-scheduler", "kwok")
    }
    figures: dict[str, float] = {}

    # 1. etcd crashes; the apiserver stays up, so clients keep their connections to it.
    figures["etcd restart"] = cluster.restart("etcd")
    cluster.kubectl("scale", "agd", NAME, "-n", namespace, "--replicas=3")
    figures["then scale 2->3 to Ready"] = timed("3/3", ready_as(cluster, namespace, "3/3"))

    # 2. The apiserver crashes: every watch of every client drops.
    figures["apiserver restart"] = cluster.restart("kube-apiserver")
    old_uid = before["services", NAME]["metadata"]["uid"]
    cluster.kubectl("delete", "service", NAME, "-n", namespace)

    def service_recreated() -> bool:
        found = get(cluster, namespace, "services", "-l", INSTANCE)["items"]
        return any(s["metadata"]["name"] == NAME and s["metadata"]["uid"] != old_uid for s in found)

    figures["then deleted Service recreated"] = timed("Service recreated", service_recreated)

    # 3. Both crash while a rollout is in flight: the template changed, old pods still run. The
    # nodes are cordoned first, so the rollout's first new pod stays Pending, and maxUnavailable 0
    # keeps every old pod, until the control plane is back (CI once saw the whole rollout finish
    # between the test seeing it start and reading the pods).
    nodes = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").stdout
    cluster.kubectl("cordon", *nodes.split())
    try:
        old_hash = live_pods(cluster, namespace)[0]["metadata"]["annotations"][HASH_ANNOTATION]
        patch_agd(cluster, namespace, {"spec": {"engine": {"gpuMemoryUtilizationPercent": 85}}})

        def rollout_started() -> bool:
            dep = get(cluster, namespace, "deployment", NAME)
            template = dep["spec"]["template"]["metadata"]["annotations"]
            return bool(template[HASH_ANNOTATION] != old_hash)

        eventually(rollout_started, 30, every=0.1, what="the operator started the rollout",
                   ignoring=KUBECTL_FAILED)
        pods = live_pods(cluster, namespace)
        old_left = sum(p["metadata"]["annotations"][HASH_ANNOTATION] == old_hash for p in pods)
        assert old_left == 3, f"{old_left} of 3 pods on the old template with the nodes cordoned"
        # The new template's token is in the Secret before the template reaches the Deployment.
        tokens_mid_rollout = admin_tokens(cluster, namespace)
        figures["etcd+apiserver restart mid-rollout"] = cluster.restart("etcd", "kube-apiserver")
    finally:
        cluster.kubectl("uncordon", *nodes.split())

    def rolled_out() -> bool:
        pods = live_pods(cluster, namespace)
        hashes = {p["metadata"]["annotations"][HASH_ANNOTATION] for p in pods}
        return bool(ready_as(cluster, namespace, "3/3")()) and old_hash not in hashes

    figures["then rollout done, 3/3 Ready"] = timed("rollout done", rolled_out, ROLLOUT_SECONDS)
    new_hash = get(cluster, namespace, "deployment", NAME)["spec"]["template"]["metadata"][
        "annotations"][HASH_ANNOTATION]

    # The old template's token goes with its last pod, terminating ones included (a draining
    # pod still holds it), within a pass or two of that pod's removal.
    def old_token_dropped() -> bool:
        pods = get(cluster, namespace, "pods", "-l", INSTANCE)["items"]
        gone = all(p["metadata"]["annotations"][HASH_ANNOTATION] != old_hash for p in pods)
        return gone and admin_tokens(cluster, namespace).keys() == {new_hash}

    figures["then old admin token dropped"] = timed("old admin token dropped", old_token_dropped)

    # Nothing twice: exactly the expected children, each owned once by this AutoGLMDeployment.
    after = children(cluster, namespace)
    assert {kind: {n for k, n in after if k == kind} for kind in CHILDREN} == CHILDREN
    owner = get(cluster, namespace, "agd", NAME)["metadata"]["uid"]
    for (kind, name), obj in after.items():
        refs = [(r["uid"], r.get("controller")) for r in obj["metadata"]["ownerReferences"]]
        assert refs == [(owner, True)], (kind, name, refs)
        if (kind, name) != ("services", NAME):
            assert obj["metadata"]["uid"] == before[kind, name]["metadata"]["uid"], (kind, name)
    # The new template's token was written once and kept. (Its Event may be lost: kopf posts
    # Events asynchronously and drops one the crashing apiserver refuses.)
    assert tokens.keys() == {old_hash}
    assert admin_tokens(cluster, namespace)[new_hash] == tokens_mid_rollout[new_hash]
    written = [e for e in events(cluster, namespace)
               if f"a new admin token for pod template {new_hash}" in e.get("message", "")]
    assert sum(e.get("count") or 1 for e in written) <= 1, "the admin token was regenerated"
    replica_sets = get(cluster, namespace, "replicasets", "-l", INSTANCE)["items"]
    active = [rs for rs in replica_sets if rs["spec"]["replicas"] > 0]
    assert len(active) == 1, [rs["metadata"]["name"] for rs in active]
    pods = live_pods(cluster, namespace)
    assert len(pods) == 3
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in pods} == {
        active[0]["metadata"]["uid"]
    }
    st = status(cluster, namespace)
    assert (st["replicas"], st["readyReplicas"], st["streamingReplicas"]) == (3, 3, 3)

    # The cluster is left healthy for the tests after this one: same token, controllers alive.
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    for name, pid in bystanders.items():
        assert cluster.processes[name].pid == pid and cluster.processes[name].poll() is None, name
    assert operator.proc is not None and operator.proc.poll() is None, "the operator exited"
    print(
        "\nFAULTS control plane: "
        + "; ".join(f"{k} {v:.1f}s" for k, v in figures.items())
    )
