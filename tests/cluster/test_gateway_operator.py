"""spec.gateway on the local control plane with the real InferencePool CRD of the Gateway API
Inference Extension (hack/gie-crds.sh, the pinned release): the apiserver accepts the pool the
operator builds, the pool follows the spec and hand edits are taken back, turning the gateway off
deletes it, a pool of that name someone else made is reported and left alone, and a cluster
without the CRD gets a status that names it while everything else is served.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testkit.localcluster import LocalCluster
from testkit.operator_kit import (
    KUBECTL_FAILED,
    NAME,
    Operator,
    agd_object,
    condition,
    deploy,
    events,
    get,
    live_pods,
    patch_agd,
    status,
)
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(300)

PICKER = f"{NAME}-epp"
SERVING = {"app.kubernetes.io/name": "autoglm", "app.kubernetes.io/instance": NAME,
           "app.kubernetes.io/component": "server"}  # fmt: skip
ROUTING = {"app.kubernetes.io/name": "autoglm-router", "app.kubernetes.io/instance": NAME}


UNPUBLISHED = {"enabled": True, "inferencePool": "", "endpointPicker": f"{PICKER}:9002"}


def degraded(cluster: LocalCluster, ns: str) -> str | None:
    return condition(status(cluster, ns), "Degraded").get("status")


def _pool(cluster: LocalCluster, ns: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "inferencepool", NAME, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _gone(cluster: LocalCluster, ns: str, *names: str) -> bool:
    out = cluster.kubectl("get", *names, "-n", ns, "-o", "name", "--ignore-not-found")
    return out.stdout.strip() == ""


def _router_container(cluster: LocalCluster, ns: str) -> dict[str, Any]:
    deployment = get(cluster, ns, "deployment", f"{NAME}-router")
    return deployment["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def _selected(cluster: LocalCluster, ns: str, match_labels: dict[str, str]) -> set[str]:
    selector = ",".join(f"{k}={v}" for k, v in match_labels.items())
    items = get(cluster, ns, "pods", "-l", selector)["items"]
    return {p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")}


def test_the_pool_is_accepted_follows_the_spec_and_goes_when_turned_off(
    cluster: LocalCluster, inference_pool_crd: str, namespace: str, operator: Operator
) -> None:
    ns = namespace
    obj = agd_object(replicas=2, adaptive={"paused": True}, gateway={"enabled": True})
    deploy(cluster, ns, obj, "2/2")
    pool = eventually(lambda: _pool(cluster, ns), 60, every=0.5, what="the InferencePool",
                      ignoring=KUBECTL_FAILED)
    uid = get(cluster, ns, "agd", NAME)["metadata"]["uid"]
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("AutoGLMDeployment", uid, True)
    # As the apiserver stored it, defaults of the real CRD included.
    assert pool["spec"] == {
        "selector": {"matchLabels": SERVING},
        "targetPorts": [{"number": 8000}],
        "appProtocol": "http",
        "endpointPickerRef": {"group": "", "kind": "Service", "name": PICKER,
                              "port": {"number": 9002}, "failureMode": "FailClose"},
    }  # fmt: skip
    # It selects this deployment's serving pods, and not its router pods.
    serving = {p["metadata"]["name"] for p in live_pods(cluster, ns)}
    assert len(serving) == 2
    assert _selected(cluster, ns, pool["spec"]["selector"]["matchLabels"]) == serving
    # The picker: Service <name>-epp on the router pods' ext_proc port, which the routers serve.
    picker = get(cluster, ns, "service", PICKER)
    assert picker["spec"]["type"] == "ClusterIP"
    assert picker["spec"]["selector"] == ROUTING
    assert [(p["port"], p["targetPort"]) for p in picker["spec"]["ports"]] == [
        (9002, "grpc-ext-proc")]  # fmt: skip
    container = _router_container(cluster, ns)
    args = container["args"]
    assert args[args.index("--ext-proc-port") + 1] == "9002"
    assert {"name": "grpc-ext-proc", "containerPort": 9002, "protocol": "TCP"} in container["ports"]
    # The clients' Service <name> still goes to the routers' HTTP port.
    assert get(cluster, ns, "service", NAME)["spec"]["selector"] == ROUTING
    published = {"enabled": True, "inferencePool": NAME, "endpointPicker": f"{PICKER}:9002"}
    eventually(lambda: status(cluster, ns).get("gateway") == published, 60, every=0.5,
               what="status.gateway", ignoring=KUBECTL_FAILED)
    assert degraded(cluster, ns) == "False"

    # The spec changes: the pool follows.
    patch_agd(cluster, ns, {"spec": {"gateway": {"failureMode": "FailOpen"}}})
    eventually(
        lambda: (_pool(cluster, ns) or {})["spec"]["endpointPickerRef"]["failureMode"]
        == "FailOpen",
        60, every=0.5, what="failureMode FailOpen", ignoring=KUBECTL_FAILED,
    )
    # A hand edit is taken back.
    edit = json.dumps([{"op": "replace", "path": "/spec/targetPorts", "value": [{"number": 9}]}])
    cluster.kubectl("patch", "inferencepool", NAME, "-n", ns, "--type=json", "-p", edit)
    eventually(
        lambda: (_pool(cluster, ns) or {})["spec"]["targetPorts"] == [{"number": 8000}],
        60, every=0.5, what="targetPorts restored", ignoring=KUBECTL_FAILED,
    )

    # Off: the pool and the picker go, the routers lose the port, HTTP serving stays.
    patch_agd(cluster, ns, {"spec": {"gateway": {"enabled": False}}})
    eventually(lambda: _gone(cluster, ns, f"inferencepool/{NAME}", f"service/{PICKER}"), 60,
               every=0.5, what="the pool and the picker deleted",
               ignoring=KUBECTL_FAILED)  # fmt: skip
    eventually(lambda: "--ext-proc-port" not in _router_container(cluster, ns)["args"], 60,
               every=0.5, what="the routers without --ext-proc-port",
               ignoring=KUBECTL_FAILED)  # fmt: skip
    off = {"enabled": False, "inferencePool": "", "endpointPicker": ""}
    eventually(lambda: status(cluster, ns).get("gateway") == off, 60, every=0.5,
               what="status.gateway off", ignoring=KUBECTL_FAILED)
    assert get(cluster, ns, "service", NAME)["spec"]["selector"] == ROUTING


def test_a_pool_of_that_name_it_did_not_create_is_reported_and_left_alone(
    cluster: LocalCluster, inference_pool_crd: str, namespace: str, operator: Operator
) -> None:
    ns = namespace
    theirs = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": "their-model"}},
            "targetPorts": [{"number": 8080}],
            "endpointPickerRef": {"name": "their-epp", "port": {"number": 9002}},
        },
    }
    cluster.apply(theirs, namespace=ns)
    before = _pool(cluster, ns)
    assert before is not None
    deploy(cluster, ns, agd_object(replicas=1, adaptive={"paused": True},
                                   gateway={"enabled": True}), "1/1")  # fmt: skip

    def taken() -> dict[str, Any] | None:
        cond = condition(status(cluster, ns), "Degraded")
        return cond if cond.get("reason") == "NameTaken" else None

    cond = eventually(taken, 60, every=0.5, what="Degraded/NameTaken", ignoring=KUBECTL_FAILED)
    assert cond["status"] == "True"
    assert f"InferencePool {NAME} already exists and is not owned by" in cond["message"]
    # Serving is as it was: Ready, the routers and the picker's Service are there.
    st = status(cluster, ns)
    assert condition(st, "Ready")["status"] == "True"
    assert st["gateway"] == UNPUBLISHED
    warnings = [e for e in events(cluster, ns) if e["reason"] == "NameTaken"]
    assert warnings and warnings[0]["type"] == "Warning"
    # Theirs, untouched: never adopted, never applied over.
    after = _pool(cluster, ns)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "ownerReferences" not in after["metadata"]
    assert after["spec"] == before["spec"]
    # Gone: the operator publishes its own on its next attempt.
    cluster.kubectl("delete", "inferencepool", NAME, "-n", ns)
    eventually(lambda: (_pool(cluster, ns) or {}).get("metadata", {})
               .get("ownerReferences"), 90, every=0.5, what="its own pool",
               ignoring=KUBECTL_FAILED)  # fmt: skip
    eventually(lambda: degraded(cluster, ns) == "False", 60, every=0.5, what="Degraded cleared",
               ignoring=KUBECTL_FAILED)


def test_without_the_crd_it_names_the_crd_to_install_and_serves_everything_else(
    cluster: LocalCluster,
    no_inference_pool_crd: str,
    inference_pool_crd_file: Path,
    namespace: str,
    operator: Operator,
) -> None:
    """The fixtures take the CRD away before the operator starts, as in a cluster that never
    had a GIE gateway."""
    ns = namespace
    deploy(cluster, ns, agd_object(replicas=1, adaptive={"paused": True},
                                   gateway={"enabled": True}), "1/1")  # fmt: skip
    # kopf found no InferencePools to watch as the operator started.
    assert any("Unresolved resources cannot be served" in line and "inferencepools" in line
               for line in operator.logs().splitlines())  # fmt: skip

    def missing() -> dict[str, Any] | None:
        cond = condition(status(cluster, ns), "Degraded")
        return cond if cond.get("reason") == "InferencePoolCRDMissing" else None

    cond = eventually(missing, 60, every=0.5, what="Degraded/InferencePoolCRDMissing",
                      ignoring=KUBECTL_FAILED)
    assert cond["status"] == "True"
    assert no_inference_pool_crd in cond["message"]  # inferencepools.inference.networking.k8s.io
    assert "kubectl apply -f" in cond["message"]
    assert [e["type"] for e in events(cluster, ns) if e["reason"] == "InferencePoolCRDMissing"]
    # Everything else: ready replicas behind the routers, the picker's Service, the routers'
    # ext_proc port; the operator alive.
    st = status(cluster, ns)
    assert condition(st, "Ready")["status"] == "True"
    assert st["gateway"] == UNPUBLISHED
    assert get(cluster, ns, "service", PICKER)["spec"]["selector"] == ROUTING
    assert "--ext-proc-port" in _router_container(cluster, ns)["args"]
    assert operator.proc is not None and operator.proc.poll() is None
    # The CRD installed: the pool follows on the operator's next attempt, Degraded clears.
    cluster.install_crd(inference_pool_crd_file)
    eventually(lambda: _pool(cluster, ns), 90, every=0.5, what="the InferencePool",
               ignoring=KUBECTL_FAILED)
    published = {"enabled": True, "inferencePool": NAME, "endpointPicker": f"{PICKER}:9002"}
    eventually(lambda: status(cluster, ns).get("gateway") == published, 60, every=0.5,
               what="status.gateway published", ignoring=KUBECTL_FAILED)  # fmt: skip
    assert degraded(cluster, ns) == "False"
