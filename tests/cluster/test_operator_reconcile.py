"""The operator on the real control plane with kwok GPU nodes.

Each test runs `autoglm-operator run --namespace <ns>` as a real subprocess (through a small
wrapper that logs every request it sends to the apiserver; see
operator_kit.py) and asserts on the API objects.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from testkit.localcluster import LocalCluster, free_port, http_ok
from testkit.operator_kit import (
    EXAMPLE,
    HASH_ANNOTATION,
    INSTANCE,
    KUBECTL_FAILED,
    MODE_LABEL,
    NAME,
    Operator,
    admin_tokens,
    agd_object,
    apiserver_requests,
    condition,
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


def test_example_yields_two_ready_gpu_pods_and_a_ready_status(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    started = time.monotonic()
    st = deploy(cluster, namespace, EXAMPLE, "2/2")
    elapsed = time.monotonic() - started
    print(f"example applied -> Ready 2/2 in {elapsed:.1f}s")
    assert elapsed < 30

    assert (st["replicas"], st["readyReplicas"], st["streamingReplicas"]) == (2, 2, 2)
    assert st["endpoint"] == f"http://{NAME}.{namespace}.svc:8000/v1"
    assert (
        st["observedGeneration"] == get(cluster, namespace, "agd", NAME)["metadata"]["generation"]
    )
    assert condition(st, "Degraded")["status"] == "False"

    nodes = {n["metadata"]["name"]: n for n in cluster.get_json("nodes")["items"]}
    for pod in live_pods(cluster, namespace):
        assert (
            nodes[pod["spec"]["nodeName"]]["metadata"]["annotations"]["kwok.x-k8s.io/node"]
            == "fake"
        )
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert "--tensor-parallel-size" in container["args"]
        assert pod["metadata"]["labels"][MODE_LABEL] == "streaming"
        ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"

    eventually(lambda: get(cluster, namespace, "agd", NAME)["status"]
               .get("router", {}).get("readyReplicas") == 2, 60, every=0.5,
               what="both routers ready", ignoring=KUBECTL_FAILED)  # fmt: skip
    table = cluster.kubectl("get", "agd", "-n", namespace).stdout
    print(table)
    header, row = table.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "READY", "STREAMING", "BATCHING", "ROUTERS", "POLICY"]
    assert row.split()[:6] == [NAME, "2/2", "2", "0", "2", "Adaptive"]

    uid = get(cluster, namespace, "agd", NAME)["metadata"]["uid"]
    for kind, name in [
        ("deployment", NAME),
        ("service", NAME),
        ("service", f"{NAME}-streaming"),
        ("service", f"{NAME}-batching"),
        ("pdb", NAME),
        ("configmap", f"{NAME}-config"),
        ("secret", f"{NAME}-admin"),
        *((kind, f"{NAME}-router") for kind in
          ("deployment", "pdb", "serviceaccount", "role", "rolebinding")),
    ]:  # fmt: skip
        refs = get(cluster, namespace, kind, name)["metadata"]["ownerReferences"]
        assert [(r["uid"], r["controller"]) for r in refs] == [(uid, True)], (kind, name)
    reasons = {e["reason"] for e in events(cluster, namespace)}
    assert "Created" in reasons


def test_scale_up_down_and_delete_cascades(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    deploy(cluster, namespace, EXAMPLE, "2/2")
    before = {p["metadata"]["name"] for p in live_pods(cluster, namespace)}

    cluster.kubectl("scale", "agd", NAME, "-n", namespace, "--replicas=3")
    eventually(ready_as(cluster, namespace, "3/3"), 60, every=0.5, what="3/3",
               ignoring=KUBECTL_FAILED)
    after = {p["metadata"]["name"] for p in live_pods(cluster, namespace)}
    assert before < after and len(after) == 3  # one more, none replaced

    cluster.kubectl("scale", "agd", NAME, "-n", namespace, "--replicas=1")
    eventually(ready_as(cluster, namespace, "1/1"), 60, every=0.5, what="1/1",
               ignoring=KUBECTL_FAILED)
    assert get(cluster, namespace, "deployment", NAME)["spec"]["replicas"] == 1

    cluster.kubectl("delete", "agd", NAME, "-n", namespace, "--timeout=30s")

    def all_gone() -> bool:
        left = cluster.kubectl(
            "get", "deploy,rs,pods,svc,pdb,cm,secret", "-n", namespace, "-l", INSTANCE, "-o", "name"
        ).stdout.split()
        return not left

    eventually(all_gone, 60, every=0.5, what="every child deleted", ignoring=KUBECTL_FAILED)


def test_insufficient_gpu_is_reported_and_heals_when_a_node_is_added(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    pool = {"autoglm.io/test-pool": namespace}
    obj = agd_object(gpusPerReplica=4, scheduling={"nodeSelector": pool})
    nodes = [f"{namespace}-gpu-a", f"{namespace}-gpu-b"]
    try:
        cluster.add_gpu_node(nodes[0], gpus=4, labels=pool)
        cluster.apply(obj, namespace=namespace)

        # The scheduler marks the second pod unschedulable before kwok reports the first one
        # Ready, so a pass can see Degraded at 0/2 first: wait for both.
        def degraded() -> dict[str, Any] | None:
            st = status(cluster, namespace)
            cond = condition(st, "Degraded")
            return st if cond.get("reason") == "InsufficientGPU" and st["ready"] == "1/2" else None

        st = eventually(degraded, 60, every=0.5, what="Degraded/InsufficientGPU at 1/2 ready",
                        ignoring=KUBECTL_FAILED)
        cond = condition(st, "Degraded")
        print(cond["message"])
        assert cond["status"] == "True"
        assert "Insufficient nvidia.com/gpu" in cond["message"]
        assert condition(st, "Ready")["status"] == "False"

        def warned() -> bool:  # the Event is posted after the status write, asynchronously
            return any(e["type"] == "Warning" and e["reason"] == "InsufficientGPU"
                       for e in events(cluster, namespace))

        eventually(warned, 15, every=0.5, what="an InsufficientGPU Warning event",
                   ignoring=KUBECTL_FAILED)

        cluster.add_gpu_node(nodes[1], gpus=4, labels=pool)
        st = eventually(ready_as(cluster, namespace, "2/2"), 60, every=0.5, what="healed to 2/2",
                        ignoring=KUBECTL_FAILED)
        assert condition(st, "Degraded")["status"] == "False"
    finally:
        cluster.kubectl("delete", "agd", NAME, "-n", namespace, "--timeout=30s", check=False)
        for node in nodes:
            cluster.delete_node(node)


def test_tolerations_and_affinity_reach_the_deployment_and_its_pods(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    scheduling = {
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 600},
        ],
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
                    {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1"]},
                ]}]}},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": NAME}},
                    "topologyKey": "kubernetes.io/hostname"}},
            ]},
        },
    }  # fmt: skip
    deploy(cluster, namespace, agd_object(scheduling=scheduling), "2/2")
    template = get(cluster, namespace, "deployment", NAME)["spec"]["template"]["spec"]
    # after the operator's own toleration of the GPU taint
    assert template["tolerations"][1:] == scheduling["tolerations"]
    assert template["affinity"] == scheduling["affinity"]
    for pod in live_pods(cluster, namespace):
        assert pod["spec"]["affinity"] == scheduling["affinity"]
        assert all(t in pod["spec"]["tolerations"] for t in scheduling["tolerations"])
        assert pod["spec"]["nodeName"]


def test_drift_is_repaired(cluster: LocalCluster, namespace: str, operator: Operator) -> None:
    deploy(cluster, namespace, EXAMPLE, "2/2")
    tokens = admin_tokens(cluster, namespace)
    svc_uid = get(cluster, namespace, "service", f"{NAME}-streaming")["metadata"]["uid"]
    want_args = get(cluster, namespace, "deployment", NAME)["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]

    cluster.kubectl("delete", "service", f"{NAME}-streaming", "-n", namespace)
    cluster.kubectl("delete", "configmap", f"{NAME}-config", "-n", namespace)
    hand_edit = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/args/1", "value": "edited"},
        {"op": "replace", "path": "/spec/replicas", "value": 4},
    ]
    cluster.kubectl(
        "patch", "deployment", NAME, "-n", namespace, "--type=json", "-p", json.dumps(hand_edit)
    )

    def repaired() -> bool:
        svc = cluster.kubectl("get", "service", f"{NAME}-streaming", "-n", namespace, check=False)
        cm = cluster.kubectl("get", "configmap", f"{NAME}-config", "-n", namespace, check=False)
        dep = get(cluster, namespace, "deployment", NAME)["spec"]
        return (
            svc.returncode == 0
            and cm.returncode == 0
            and dep["replicas"] == 2
            and dep["template"]["spec"]["containers"][0]["args"] == want_args
        )

    eventually(repaired, 30, every=0.5, what="drift repaired", ignoring=KUBECTL_FAILED)
    assert get(cluster, namespace, "service", f"{NAME}-streaming")["metadata"]["uid"] != svc_uid
    eventually(ready_as(cluster, namespace, "2/2"), 60, every=0.5, what="back to 2/2",
               ignoring=KUBECTL_FAILED)
    # The admin token is generated once per pod template, not on every pass.
    assert admin_tokens(cluster, namespace) == tokens
    assert any(e["reason"] == "Updated" for e in events(cluster, namespace))


def test_mode_label_flip_restarts_nothing_and_engine_change_rolls(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    obj = agd_object(adaptive={"paused": True})
    deploy(cluster, namespace, obj, "2/2")
    pods = live_pods(cluster, namespace)
    uids = {p["metadata"]["uid"] for p in pods}
    old_hash = pods[0]["metadata"]["annotations"][HASH_ANNOTATION]
    replicasets = get(cluster, namespace, "rs", "-l", INSTANCE)["items"]
    assert len(replicasets) == 1

    # A flip, as the adaptive pass does it: the pod's label.
    flipped = pods[0]["metadata"]["name"]
    cluster.kubectl(
        "label", "pod", flipped, "-n", namespace, f"{MODE_LABEL}=batching", "--overwrite"
    )
    eventually(lambda: status(cluster, namespace).get("batchingReplicas") == 1, 60, every=0.5,
               what="batchingReplicas 1", ignoring=KUBECTL_FAILED)
    # A live profile change: the ConfigMap changes, the pods do not.
    patch_agd(cluster, namespace, {"spec": {"profiles": {"streaming": {"maxConcurrency": 4}}}})
    eventually(
        lambda: (
            '"maxConcurrency": 4'
            in get(cluster, namespace, "configmap", f"{NAME}-config")["data"]["config.json"]
        ),
        60, every=0.5, what="ConfigMap updated", ignoring=KUBECTL_FAILED,
    )
    time.sleep(3)
    assert {p["metadata"]["uid"] for p in live_pods(cluster, namespace)} == uids
    assert len(get(cluster, namespace, "rs", "-l", INSTANCE)["items"]) == 1
    assert get(cluster, namespace, "pod", flipped)["metadata"]["labels"][MODE_LABEL] == "batching"

    # An engine setting: the Deployment rolls to new pods with the new flag.
    patch_agd(cluster, namespace, {"spec": {"maxModelLen": 4096}})

    def rolled() -> bool:
        now = live_pods(cluster, namespace)
        return (
            len(now) == 2
            and not {p["metadata"]["uid"] for p in now} & uids
            and all(p["metadata"]["annotations"][HASH_ANNOTATION] != old_hash for p in now)
        )

    eventually(rolled, 60, every=0.5, what="rolled to new pods", ignoring=KUBECTL_FAILED)
    st = eventually(ready_as(cluster, namespace, "2/2"), 60, every=0.5,
                    what="2/2 after the rollout", ignoring=KUBECTL_FAILED)
    assert (
        st["observedGeneration"] == get(cluster, namespace, "agd", NAME)["metadata"]["generation"]
    )
    for pod in live_pods(cluster, namespace):
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--max-model-len") + 1] == "4096"
        assert pod["metadata"]["labels"][MODE_LABEL] == "streaming"  # a new pod starts streaming
    assert any(e["reason"] == "RollingOut" for e in events(cluster, namespace))


def test_operator_restart_in_the_middle_of_a_rollout_converges(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    deploy(cluster, namespace, agd_object(adaptive={"paused": True}), "2/2")
    old_hash = live_pods(cluster, namespace)[0]["metadata"]["annotations"][HASH_ANNOTATION]
    patch_agd(cluster, namespace, {"spec": {"engine": {"gpuMemoryUtilizationPercent": 85}}})

    def template_changed() -> bool:
        dep = get(cluster, namespace, "deployment", NAME)
        return bool(dep["spec"]["template"]["metadata"]["annotations"][HASH_ANNOTATION] != old_hash)

    eventually(template_changed, 30, every=0.1, what="the operator started the rollout",
               ignoring=KUBECTL_FAILED)
    operator.stop(signal.SIGKILL)  # no clean exit: the Lease stays held until it expires
    pods = live_pods(cluster, namespace)
    print("pods at the kill:", [p["metadata"]["annotations"][HASH_ANNOTATION] for p in pods])
    # While it is down, more changes land: a scale and a deleted Service.
    cluster.kubectl("scale", "agd", NAME, "-n", namespace, "--replicas=3")
    cluster.kubectl("delete", "service", NAME, "-n", namespace)

    operator.start()
    st = eventually(ready_as(cluster, namespace, "3/3"), 90, every=0.5, what="converged at 3/3",
                    ignoring=KUBECTL_FAILED)
    hashes = {p["metadata"]["annotations"][HASH_ANNOTATION] for p in live_pods(cluster, namespace)}
    assert len(hashes) == 1 and old_hash not in hashes
    assert cluster.kubectl("get", "service", NAME, "-n", namespace).returncode == 0
    assert (
        st["observedGeneration"] == get(cluster, namespace, "agd", NAME)["metadata"]["generation"]
    )


def test_missing_api_key_secret_is_permanent_until_the_spec_changes(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    obj = agd_object(apiKeySecretRef={"name": "client-keys", "key": "api-key"})
    cluster.apply(obj, namespace=namespace)

    def blocked() -> dict[str, Any] | None:
        cond = condition(status(cluster, namespace), "Degraded")
        return cond if cond.get("reason") == "SecretNotFound" else None

    cond = eventually(blocked, 60, every=0.5, what="Degraded/SecretNotFound",
                      ignoring=KUBECTL_FAILED)
    assert "client-keys" in cond["message"]
    assert condition(status(cluster, namespace), "Ready")["status"] == "False"
    absent = cluster.kubectl("get", "deployment", NAME, "-n", namespace, check=False)
    assert absent.returncode != 0
    assert any(e["reason"] == "SecretNotFound" for e in events(cluster, namespace))

    # The Secret alone does not retry (permanent); a spec change does.
    cluster.kubectl(
        "create", "secret", "generic", "client-keys", "-n", namespace, "--from-literal=api-key=k1"
    )
    time.sleep(3)
    assert cluster.kubectl("get", "deployment", NAME, "-n", namespace, check=False).returncode != 0
    patch_agd(cluster, namespace, {"spec": {"service": {"annotations": {"retry": "1"}}}})
    eventually(ready_as(cluster, namespace, "2/2"), 60, every=0.5,
               what="2/2 once the Secret is there", ignoring=KUBECTL_FAILED)
    env = get(cluster, namespace, "deployment", NAME)["spec"]["template"]["spec"]["containers"][0][
        "env"
    ]
    assert {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "client-keys", "key": "api-key"}},
    } in env


def test_a_service_of_that_name_it_did_not_create_is_reported_and_left_alone(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    theirs = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME},
              "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}}  # fmt: skip
    cluster.apply(theirs, namespace=namespace)
    cluster.apply(agd_object(), namespace=namespace)

    def taken() -> dict[str, Any] | None:
        cond = condition(status(cluster, namespace), "Degraded")
        return cond if cond.get("reason") == "NameTaken" else None

    cond = eventually(taken, 60, every=0.5, what="Degraded/NameTaken", ignoring=KUBECTL_FAILED)
    assert f"Service {NAME} already exists and is not owned by" in cond["message"]
    service = get(cluster, namespace, "service", NAME)
    assert service["spec"]["selector"] == {"app": "theirs"}
    assert "ownerReferences" not in service["metadata"]
    assert any(e["reason"] == "NameTaken" for e in events(cluster, namespace))
    # Once it is gone, the operator's own takes its place (the retry is on a backoff).
    cluster.kubectl("delete", "service", NAME, "-n", namespace)
    eventually(ready_as(cluster, namespace, "2/2"), 120, every=0.5, what="2/2 with its own Service",
               ignoring=KUBECTL_FAILED)
    assert get(cluster, namespace, "service", NAME)["metadata"]["ownerReferences"]
    assert condition(status(cluster, namespace), "Degraded")["status"] == "False"


def test_a_quiet_minute_costs_no_api_calls(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    deploy(cluster, namespace, agd_object(adaptive={"paused": True}), "2/2")
    time.sleep(15)  # let the last writes come back through the watches
    before = apiserver_requests(cluster)
    start = time.time()
    time.sleep(60)
    calls = operator.calls(start, time.time())
    seen = apiserver_requests(cluster)
    delta = {k: v - before.get(k, 0) for k, v in seen.items() if v - before.get(k, 0) > 0}
    # The apiserver's own count for the kinds the operator touches (every client, not only it).
    print(
        "apiserver_request_total deltas:",
        json.dumps({f"{r} {v}": n for (r, v), n in delta.items()}),
    )
    leases = [c for c in calls if "/leases/" in c["url"]]
    # kopf re-opens a watch that brought no event (not even a bookmark) for 70 s: a stream, not
    # a poll; the cluster-wide CRD and namespace watches it keeps for discovery do that.
    rewatches = [c for c in calls if "watch=true" in c["url"]]
    others = [c for c in calls if c not in leases and c not in rewatches]
    print(
        f"quiet minute: {len(calls)} API calls: {len(leases)} Lease renewals, "
        f"{len(rewatches)} watch re-opens, {len(others)} others"
    )
    for call in [*rewatches, *others]:
        print("  ", call["client"], call["method"], call["url"])
    mine = [c for c in others if c["client"] in ("kopf", "autoglm-operator/reconciler")]
    assert mine == [], "the reconciler (or kopf) made calls in a quiet minute"
    assert others == [], "the operator process made calls in a quiet minute (see the list)"
    assert len(rewatches) <= 4
    # Leader election renews every lease-seconds/3 (5 s with the 15 s Lease here): 12 a
    # minute, each one PUT (6 a minute with the default 30 s Lease).
    # The log saw the operator's calls in this minute: at least its Lease renewals.
    assert 1 <= len(leases) <= 13 and all(c["method"] == "PUT" for c in leases)


def test_two_replicas_never_fight_and_a_standby_takes_over(
    cluster: LocalCluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    eventually(lambda: "Acquired leadership" in operator.logs(), 30, every=0.5, what="leader",
               ignoring=KUBECTL_FAILED)
    standby_dir = tmp_path / "standby"
    standby_dir.mkdir()
    health = f"http://127.0.0.1:{free_port()}/healthz"
    standby = Operator(cluster, namespace, standby_dir).start("--liveness", health)
    try:
        deploy(cluster, namespace, EXAMPLE, "2/2")
        # A cold start (kopf, kubernetes, pydantic imported) can take seconds on 2 busy cores.
        eventually(lambda: "Waiting for Lease" in standby.logs(), 30, every=0.5,
                   what="the standby waiting", ignoring=KUBECTL_FAILED)
        time.sleep(2)
        assert "Acquired leadership" not in standby.logs()
        standby_calls = standby.calls(0, time.time())
        assert [c for c in standby_calls if "/leases/" in c["url"]], "the standby's Lease reads"
        assert not [c for c in standby_calls if "/leases/" not in c["url"]]
        # A waiting replica is alive: its liveness endpoint answers before kopf runs.
        assert eventually(lambda: http_ok(health), 10, every=0.5, what="standby liveness",
                          ignoring=KUBECTL_FAILED)

        operator.stop()  # a clean exit releases the Lease
        eventually(lambda: "Acquired leadership" in standby.logs(), 30, every=0.5,
                   what="standby leads", ignoring=KUBECTL_FAILED)
        assert eventually(lambda: http_ok(health), 20, every=0.5, what="leader liveness (kopf)",
                          ignoring=KUBECTL_FAILED)
        cluster.kubectl("delete", "service", f"{NAME}-batching", "-n", namespace)
        eventually(
            lambda: (
                cluster.kubectl(
                    "get", "service", f"{NAME}-batching", "-n", namespace, check=False
                ).returncode
                == 0
            ),
            30, every=0.5, what="the new leader repairs", ignoring=KUBECTL_FAILED,
        )
    finally:
        cluster.kubectl("delete", "agd", "--all", "-n", namespace, "--timeout=30s", check=False)
        standby.stop()
        print(standby.logs()[-3000:])


def test_an_object_the_apiserver_rejects_is_reported_until_the_spec_changes(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    # The CRD checks node selector values, not keys: this key only the Deployment refuses.
    bad = agd_object(scheduling={"nodeSelector": {"not a label key!": "gpu"}})
    cluster.apply(bad, namespace=namespace)

    def rejected() -> dict[str, Any] | None:
        cond = condition(status(cluster, namespace), "Degraded")
        return cond if cond.get("reason") == "ReconcileRejected" else None

    cond = eventually(rejected, 60, every=0.5, what="Degraded/ReconcileRejected",
                      ignoring=KUBECTL_FAILED)
    print(cond["message"])
    assert "422" in cond["message"] and "nodeSelector" in cond["message"]
    # Permanent: no retry loop against the apiserver while the spec stays as it is. Lease
    # renewals and watch re-opens go on, and the rejection's Events may still be posting; a
    # pass may read back the admin Secret it wrote just before the rejection.
    since = time.time()
    # The log holds the Deployment the apiserver rejected, so its absence below means something.
    assert [c for c in operator.calls(0, since) if "/deployments" in c["url"]]
    time.sleep(5)
    calls = [c for c in operator.calls(since, time.time())
             if not any(part in c["url"] for part in ("/leases/", "/events", "watch=true"))]
    assert not [c for c in calls if "/deployments" in c["url"]], "the rejected object re-sent"
    assert len(calls) <= 2, calls
    patch_agd(cluster, namespace, {"spec": {"scheduling": {"nodeSelector": None}}})
    eventually(ready_as(cluster, namespace, "2/2"), 60, every=0.5, what="2/2 after the fix",
               ignoring=KUBECTL_FAILED)


def test_a_rollout_on_a_full_cluster_goes_one_down_at_a_time(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    pool = {"autoglm.io/test-pool": namespace}
    node = f"{namespace}-gpu-full"
    obj = agd_object(scheduling={"nodeSelector": pool}, adaptive={"paused": True})
    try:
        cluster.add_gpu_node(node, gpus=4, labels=pool)  # room for exactly 2 replicas
        deploy(cluster, namespace, obj, "2/2")
        strategy = get(cluster, namespace, "deployment", NAME)["spec"]["strategy"]
        assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        old = {p["metadata"]["uid"] for p in live_pods(cluster, namespace)}

        patch_agd(cluster, namespace, {"spec": {"maxModelLen": 1024}})

        def fell_back() -> bool:
            rolling = get(cluster, namespace, "deployment", NAME)["spec"]["strategy"]
            return bool(rolling["rollingUpdate"]["maxSurge"] == 0)

        eventually(fell_back, 60, every=0.5,
                   what="the surge pod found no GPU and the strategy fell back",
                   ignoring=KUBECTL_FAILED)
        eventually(
            lambda: not {p["metadata"]["uid"] for p in live_pods(cluster, namespace)} & old,
            60, every=0.5, what="every pod replaced", ignoring=KUBECTL_FAILED,
        )
        eventually(ready_as(cluster, namespace, "2/2"), 60, every=0.5, what="2/2 after the rollout",
                   ignoring=KUBECTL_FAILED)
        # Settled: back to make-before-break for the next rollout.
        eventually(lambda: not fell_back(), 60, every=0.5, what="surge restored",
                   ignoring=KUBECTL_FAILED)
    finally:
        cluster.kubectl("delete", "agd", NAME, "-n", namespace, "--timeout=30s", check=False)
        cluster.delete_node(node)
