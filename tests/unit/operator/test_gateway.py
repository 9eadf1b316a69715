"""spec.gateway: the InferencePool and its picker's Service (children.gateway), how a pass plans
them, and what one pass does against an in-memory apiserver when the cluster lacks the CRD or a
pool of that name is someone else's: the serving children go ahead, status says why."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

import pytest
from operator_fakes import FakeKube
from test_reconcile_pass import NAME, NS, UID, body, observed, writes

from autoglm_api.profiles import Mode
from autoglm_operator.handlers import reconcile as handlers
from autoglm_operator.io import kube
from autoglm_operator.reconcile import status as status_
from autoglm_operator.reconcile.children import gateway, router, serving
from autoglm_operator.reconcile.memory import ReconcileMemory, gateway_due
from autoglm_operator.reconcile.observe import Observed, owned_by
from autoglm_operator.reconcile.pass_plan import Plan, key_of, plan_pass
from autoglm_operator.resource.spec import (
    AutoGLMDeploymentSpec,
    FailureMode,
    GatewaySettings,
    SwitchStrategy,
)
from testkit.paths import REPO

OWNER = serving.Owner(name=NAME, namespace=NS, uid=UID)
ON = AutoGLMDeploymentSpec.model_validate({"replicas": 2, "gateway": {"enabled": True}})
OFF = AutoGLMDeploymentSpec.model_validate({"replicas": 2})
POOL = ("InferencePool", NAME)
PICKER = ("Service", f"{NAME}-epp")
ROUTING = {"app.kubernetes.io/name": "autoglm-router", "app.kubernetes.io/instance": NAME}


@pytest.fixture(autouse=True)
def recorded_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []

    def record(body: Any, *, warning: bool = False, reason: str, message: str) -> None:
        seen.append((reason, message))

    monkeypatch.setattr(kube, "event", record)
    return seen


# -- the builders ----------------------------------------------------------------------------


def test_the_pool_is_the_gie_v1_object_for_the_serving_pods_and_the_picker() -> None:
    pool = gateway.inference_pool(OWNER, ON)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["kind"] == "InferencePool"
    meta = pool["metadata"]
    assert (meta["name"], meta["namespace"]) == (NAME, NS)
    assert meta["ownerReferences"] == [OWNER.reference()]  # deleted with the deployment
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "autoglm-operator"
    assert pool["spec"] == {
        # What the router watches: the serving pods of both modes, never the router's own.
        "selector": {"matchLabels": {
            "app.kubernetes.io/name": "autoglm", "app.kubernetes.io/instance": NAME,
            "app.kubernetes.io/component": "server"}},
        "targetPorts": [{"number": 8000}],
        "appProtocol": "http",
        "endpointPickerRef": {"group": "", "kind": "Service", "name": f"{NAME}-epp",
                              "port": {"number": 9002}, "failureMode": "FailClose"},
    }  # fmt: skip
    # The router's --selector is the same set of pods: the gateway and the picker agree.
    labels = pool["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    assert selector == serving.serving_pod_selector(NAME)
    open_ = AutoGLMDeploymentSpec.model_validate(
        {"gateway": {"enabled": True, "failureMode": "FailOpen"}}
    )
    assert gateway.inference_pool(OWNER, open_)["spec"]["endpointPickerRef"]["failureMode"] == (
        "FailOpen"
    )


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_pool_selects_both_modes_deployments_under_rolling_and_no_router_pod() -> None:
    rolling = ON.model_copy(update={"switch_strategy": SwitchStrategy.ROLLING})
    selector = gateway.inference_pool(OWNER, rolling)["spec"]["selector"]["matchLabels"]
    deployments = [c for c in serving.children(OWNER, rolling, split={Mode.STREAMING: 1,
                   Mode.BATCHING: 1}) if c["kind"] == "Deployment"]  # fmt: skip
    assert sorted(d["metadata"]["name"] for d in deployments) == [NAME, f"{NAME}-batching"]
    for deployment in deployments:
        assert _selects(selector, deployment["spec"]["template"]["metadata"]["labels"])
    assert _selects(selector, serving.pod_template(NAME, ON)["metadata"]["labels"])
    assert not _selects(selector, router.pod_template(OWNER, ON)["metadata"]["labels"])
    # Another deployment's serving pods in the namespace are not in this pool.
    assert not _selects(selector, serving.pod_template("other", ON)["metadata"]["labels"])


def test_the_picker_service_reaches_the_router_pods_ext_proc_port_only() -> None:
    service = gateway.picker_service(OWNER)
    assert service["metadata"]["name"] == f"{NAME}-epp"
    assert service["spec"]["type"] == "ClusterIP"  # for the gateway, never a LoadBalancer
    assert service["spec"]["selector"] == ROUTING
    (port,) = service["spec"]["ports"]
    assert port == {"name": "grpc-ext-proc", "port": 9002, "targetPort": "grpc-ext-proc",
                    "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}  # fmt: skip
    # The pool names this Service and its port.
    ref = gateway.inference_pool(OWNER, ON)["spec"]["endpointPickerRef"]
    assert (ref["name"], ref["port"]["number"]) == (service["metadata"]["name"], port["port"])
    # The target port is a port the router container has with the gateway on.
    container = router.deployment(OWNER, ON)["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == 9002
    assert container["args"][-2:] == ["--ext-proc-port", "9002"]


def test_with_the_gateway_off_the_router_is_as_before_and_nothing_is_published() -> None:
    assert gateway.children(OWNER, OFF) == []
    container = router.deployment(OWNER, OFF)["spec"]["template"]["spec"]["containers"][0]
    assert "--ext-proc-port" not in container["args"]
    assert [p["name"] for p in container["ports"]] == ["http", "metrics"]
    # The router keeps serving HTTP for users without a gateway when it is on.
    on = router.deployment(OWNER, ON)["spec"]["template"]["spec"]["containers"][0]
    assert on["args"][: len(container["args"])] == container["args"]
    assert [p["name"] for p in on["ports"]] == ["http", "metrics", "grpc-ext-proc"]


def test_the_tested_gie_release_is_the_one_the_repo_installs() -> None:
    script = (REPO / "hack" / "gie-crds.sh").read_text()
    (pinned,) = re.findall(r"^GIE_VERSION=(\S+)$", script, re.MULTILINE)
    assert pinned == gateway.GIE_VERSION
    assert f"download/{pinned}/manifests.yaml" in gateway.crd_missing_message(NAME)


# -- planning --------------------------------------------------------------------------------


def _observed(children: list[dict[str, Any]]) -> Observed:
    live = {key_of(c): copy.deepcopy(c) for c in children}
    meta = {"name": NAME, "namespace": NS, "uid": UID}
    return Observed(body={"metadata": meta}, deployment=None, children=live, secret=None, pods=[])


def _planned(
    spec: AutoGLMDeploymentSpec, obs: Observed, memory: ReconcileMemory | None = None,
    now: float = 0.0,
) -> Plan:
    return plan_pass(OWNER, spec, obs, memory or ReconcileMemory(), now=now)


def test_a_pass_plans_the_picker_then_the_pool_apart_from_the_serving_children() -> None:
    first = _planned(ON, _observed([]))
    assert [(a.verb, a.key) for a in first.gateway] == [("create", PICKER), ("create", POOL)]
    assert not {a.key for a in first.actions} & {PICKER, POOL}
    assert first.delete_gateway == ()
    # Published and in sync: nothing; a changed failure mode: the pool only.
    published = _observed(gateway.children(OWNER, ON))
    assert _planned(ON, published).gateway == ()
    open_ = ON.model_copy(update={"gateway": GatewaySettings(enabled=True,
                          failure_mode=FailureMode.FAIL_OPEN)})  # fmt: skip
    assert [(a.verb, a.key) for a in _planned(open_, published).gateway] == [("update", POOL)]


def test_a_failed_attempt_is_not_planned_again_before_its_backoff() -> None:
    problem = status_.Problem("InferencePoolCRDMissing", "no CRD")
    memory = ReconcileMemory(gateway_problem=problem, gateway_retry_at=30.0)
    assert _planned(ON, _observed([]), memory, now=10.0).gateway == ()
    assert not gateway_due(memory, 10.0) and gateway_due(memory, 30.0)
    assert len(_planned(ON, _observed([]), memory, now=30.0).gateway) == 2


def test_turning_the_gateway_off_deletes_the_pool_then_the_picker() -> None:
    published = _observed(gateway.children(OWNER, ON))
    off = _planned(OFF, published)
    assert off.delete_gateway == (POOL, PICKER)
    assert off.gateway == ()
    published.children[POOL]["metadata"]["deletionTimestamp"] = "t"
    assert _planned(OFF, published).delete_gateway == (PICKER,)
    # Nothing of ours: nothing to delete (a same-named object someone else made is not seen).
    assert _planned(OFF, _observed([])).delete_gateway == ()


def test_status_shows_the_pool_and_picker_held_and_ready_ignores_a_gateway_problem() -> None:
    assert status_.gateway_status(NAME, OFF, ()) == {
        "enabled": False, "inferencePool": "", "endpointPicker": ""}  # fmt: skip
    assert status_.gateway_status(NAME, ON, (PICKER,)) == {
        "enabled": True, "inferencePool": "", "endpointPicker": f"{NAME}-epp:9002"}  # fmt: skip
    assert status_.gateway_status(NAME, ON, (PICKER, POOL))["inferencePool"] == NAME
    problem = status_.Problem("InferencePoolCRDMissing", "install it")
    computed = status_.compute(
        name=NAME, namespace=NS, generation=1, spec=ON, deployment=None, pods=[], current=None,
        now="t", gateway_problem=problem,
    ).status  # fmt: skip
    conditions = {c["type"]: c for c in computed["conditions"]}
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == (
        "True", "InferencePoolCRDMissing")  # fmt: skip
    assert conditions["Ready"]["reason"] != "InferencePoolCRDMissing"


# -- one pass against an in-memory apiserver -------------------------------------------------


async def _pass(api: FakeKube, spec: dict[str, Any], state: handlers.ReconcileMemory) -> None:
    agd = body(spec)
    reconciler = handlers.Reconciler(api, logging.getLogger("test"))  # type: ignore[arg-type]
    await reconciler.pass_once(agd, observed(api, agd), state)  # type: ignore[arg-type]


def _conditions(api: FakeKube) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in api.statuses[-1]["conditions"]}


GATEWAY_ON = {"replicas": 1, "gateway": {"enabled": True}}


async def test_without_the_crd_everything_else_is_served_and_status_names_the_crd() -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    api.unserved.add("inferencepools")
    await _pass(api, GATEWAY_ON, state)
    for kind, name in [("Deployment", NAME), ("Service", NAME), ("Deployment", f"{NAME}-router"),
                       PICKER]:  # fmt: skip
        assert ("apply", kind, name) in api.calls
    assert ("apply", *POOL) not in api.calls  # asked discovery first, wrote nothing
    degraded = _conditions(api)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "InferencePoolCRDMissing")
    assert "inferencepools.inference.networking.k8s.io" in degraded["message"]
    assert "kubectl apply -f" in degraded["message"]
    assert _conditions(api)["Ready"]["reason"] != "InferencePoolCRDMissing"
    # Until its backoff ends, passes leave the gateway alone (no discovery call each second).
    api.calls.clear()
    await _pass(api, GATEWAY_ON, state)
    assert ("discover", gateway.API_VERSION, gateway.PLURAL) not in api.calls
    # Status says what the cluster holds: the picker, no pool.
    assert api.statuses[-1]["gateway"] == {
        "enabled": True, "inferencePool": "", "endpointPicker": f"{NAME}-epp:9002"}  # fmt: skip
    # The CRD installed and the backoff over: the pool is published, Degraded clears.
    api.unserved.clear()
    state.gateway_retry_at = 0.0
    await _pass(api, GATEWAY_ON, state)
    assert owned_by(api.objects[("InferencePool", NS, NAME)], UID)
    assert _conditions(api)["Degraded"]["status"] == "False"
    assert state.gateway_problem is None
    await _pass(api, GATEWAY_ON, state)
    assert api.statuses[-1]["gateway"]["inferencePool"] == NAME


async def test_a_pool_of_that_name_it_does_not_own_is_reported_and_left_alone() -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    theirs = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
              "metadata": {"name": NAME, "namespace": NS},
              "spec": {"selector": {"matchLabels": {"app": "theirs"}}}}  # fmt: skip
    api._store(theirs)
    await _pass(api, GATEWAY_ON, state)
    kept = api.objects[("InferencePool", NS, NAME)]
    assert kept["spec"] == theirs["spec"] and "ownerReferences" not in kept["metadata"]
    assert ("apply", *POOL) not in api.calls
    assert ("apply", "Deployment", NAME) in api.calls  # serving went ahead
    degraded = _conditions(api)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "NameTaken")
    assert f"InferencePool {NAME} already exists and is not owned by" in degraded["message"]
    assert api.statuses[-1]["gateway"]["inferencePool"] == ""
    # Turning the gateway off clears it and deletes nothing of theirs.
    api.calls.clear()
    await _pass(api, {"replicas": 1}, state)
    assert ("delete", *POOL) not in api.calls
    assert _conditions(api)["Degraded"]["status"] == "False"


async def test_turned_off_the_pool_and_the_picker_are_deleted(
    recorded_events: list[tuple[str, str]],
) -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    await _pass(api, GATEWAY_ON, state)
    assert owned_by(api.objects[("InferencePool", NS, NAME)], UID)
    api.calls.clear()
    await _pass(api, {"replicas": 1}, state)
    assert [c for c in writes(api) if c[0] == "delete"] == [("delete", *POOL), ("delete", *PICKER)]
    assert ("InferencePool", NS, NAME) not in api.objects
    assert ("Deleted", f"Deleted InferencePool {NAME}: gateway.enabled is false") in (
        recorded_events
    )
    assert api.statuses[-1]["gateway"] == {
        "enabled": False, "inferencePool": "", "endpointPicker": ""}  # fmt: skip
