"""The router's real identity against the real kube-apiserver (issue 42).

The router parses every client's bytes, so it is the process an attacker takes first. Its
ServiceAccount, Role and RoleBinding are made here by the operator's own builders
(reconcile/children/router.py), for an AutoGLMDeployment with scaleToZero on, and a token of
that account from the TokenRequest API (what the kubelet mounts in the router's pod) is sent,
with raw HTTPS requests, everything a compromised router could try: every write to its own and
to another AutoGLMDeployment (each patch type, each subresource), Secrets, pod writes, its own
Deployment and Role. Each is refused 403. The same token lists and watches its namespace's
pods (so the refusals are not a broken token's), and the same requests from the admin pass (so
they are refused for who sends them, not for what they say).

Writes are server-side dry runs: the apiserver authorizes a dry run exactly as the write itself
(docs: "Authorization for dry-run and non-dry-run requests is identical"), and a refusal that
regressed changes nothing the other checks read.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from autoglm_operator.reconcile.children import router
from autoglm_operator.reconcile.children.serving import Owner
from autoglm_operator.resource.names import router_name
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.localcluster import LocalCluster
from testkit.operator_kit import NAME, agd_object

pytestmark = pytest.mark.timeout(300)

RecordInput = Callable[[str, str, bool], None]
BOUNDARY = "router's ServiceAccount token at the kube-apiserver"
GROUP_VERSION = "autoglm.io/v1alpha1"
OTHER = "other-9b"  # another AutoGLMDeployment in the namespace
ROUTER = router_name(NAME)
EVIL_IMAGE = "registry.example/evil:latest"
# The annotation a router wrote its demand to before issue 42, kept on the objects: a router
# could rewrite another router's demand through it.
OLD_DEMAND = f"demand.autoglm.io/{ROUTER}-5d8f7-abcde"
OLD_DEMAND_POINTER = "/metadata/annotations/" + OLD_DEMAND.replace("~", "~0").replace("/", "~1")
HOSTILE_DEMAND = json.dumps({"holding": 100, "heldSince": "2000-01-01T00:00:00Z"})
API_KEY_SECRET = f"{NAME}-api-key"
POD = f"{NAME}-serving-0"
DRY_RUN = {"dryRun": "All"}
APPLY = {"dryRun": "All", "fieldManager": "autoglm-router", "force": "true"}
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML


@dataclass(frozen=True)
class Call:
    """One request a compromised router could make."""

    what: str
    method: str
    path: str
    body: Any = None
    content_type: str = "application/json"
    params: dict[str, str] = field(default_factory=dict)
    # False where the apiserver carries it out for no one: the router's 403 is still the
    # authorizer's (its message names the account), and the admin gets another error.
    served: bool = True


@dataclass(frozen=True)
class Identity:
    """What the module set up: the namespace, the router's token and the admin's."""

    namespace: str
    token: str
    admin_token: str
    objects: dict[str, dict[str, Any]]  # the AutoGLMDeployments, as the admin read them


def restricted_pod(name: str) -> dict[str, Any]:
    """A pod the namespace's `restricted` Pod Security Standard admits."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/instance": NAME,
                                              "autoglm.io/mode": "streaming"}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "runtime", "image": "autoglm-runtime:test",
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip


def deployment_object(name: str) -> dict[str, Any]:
    obj = agd_object(scaleToZero={"enabled": True, "idleSeconds": 60},
                     apiKeySecretRef={"name": API_KEY_SECRET},
                     engine={"extraArgs": ["--max-log-len=100"]})
    obj["metadata"] = {"name": name, "annotations": {OLD_DEMAND: json.dumps({"holding": 0})}}
    return obj


@pytest.fixture(scope="module")
def identity(cluster: LocalCluster, crd: str, module_namespace: str) -> Identity:
    """Two AutoGLMDeployments with scaleToZero on, the first one's router identity as the
    operator builds it, and what the router must not touch: a Secret, a pod, its Deployment."""
    ns = module_namespace
    for name in (NAME, OTHER):
        cluster.apply(deployment_object(name), namespace=ns)
    objects = {name: cluster.get_json("autoglmdeployment", name, "-n", ns)
               for name in (NAME, OTHER)}
    own = objects[NAME]
    owner = Owner(NAME, ns, own["metadata"]["uid"])
    spec = AutoGLMDeploymentSpec.model_validate(own["spec"])
    assert spec.scale_to_zero.enabled and spec.router.enabled
    routers_deployment = router.deployment(owner, spec)
    routers_deployment["spec"]["replicas"] = 0  # the object to patch, no pods of it
    for manifest in (router.service_account(owner), router.role(owner),
                     router.role_binding(owner), routers_deployment):
        cluster.apply(manifest, namespace=ns)
    cluster.kubectl("create", "secret", "generic", API_KEY_SECRET, "-n", ns,
                    "--from-literal=api-key=not-for-the-router")
    cluster.apply(restricted_pod(POD), namespace=ns)
    # The TokenRequest API, as the kubelet asks it for the router pod's projected token.
    token = cluster.kubectl("create", "token", ROUTER, "-n", ns,
                            "--duration=1h").stdout.strip()
    return Identity(ns, token, cluster.admin_token, objects)


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> Iterator[Callable[[str, Call], httpx.Response]]:
    """send(token, call): one raw HTTPS request to the apiserver, as the token's owner."""
    tls = ssl.create_default_context(cafile=cluster.ca_file)
    with httpx.Client(base_url=cluster.server, verify=tls, timeout=20) as client:

        def send(token: str, call: Call) -> httpx.Response:
            content = None if call.body is None else json.dumps(call.body).encode()
            headers = {"Authorization": f"Bearer {token}"}
            if content is not None:
                headers["Content-Type"] = call.content_type
            return client.request(call.method, call.path, content=content, params=call.params,
                                  headers=headers)

        yield send


# --- what the router may not do ------------------------------------------------------------------


def _agd_path(ns: str, name: str = "") -> str:
    collection = f"/apis/{GROUP_VERSION}/namespaces/{ns}/autoglmdeployments"
    return f"{collection}/{name}" if name else collection


def _patches(path: str, what: str, merge: dict[str, Any], json_patch: list[dict[str, Any]],
             applied: dict[str, Any]) -> list[Call]:
    """`what` changed by each patch type the apiserver takes for a custom resource."""
    return [
        Call(f"merge patch of {what}", "PATCH", path, merge, MERGE, DRY_RUN),
        Call(f"JSON patch of {what}", "PATCH", path, json_patch, JSON_PATCH, DRY_RUN),
        # Kubernetes 1.34 cannot apply to a custom resource's /scale (500 "request to convert
        # CR to an invalid group/version: autoscaling/v1"), even for the admin.
        Call(f"server-side apply of {what}", "PATCH", path, applied, APPLY_PATCH, APPLY,
             served=not path.endswith("/scale")),
    ]


def agd_writes(ns: str, live: dict[str, Any]) -> list[Call]:
    """Every write to one AutoGLMDeployment: each field that matters, by each patch type; its
    status and scale subresources; a whole PUT of each; its deletion."""
    name = live["metadata"]["name"]
    path = _agd_path(ns, name)

    def applied(**fields: Any) -> dict[str, Any]:
        meta = fields.pop("metadata", {})
        return {"apiVersion": GROUP_VERSION, "kind": "AutoGLMDeployment",
                "metadata": {"name": name, **meta}, **fields}

    extra_args = ["--trust-remote-code"]
    calls = [
        *_patches(path, f"{name} spec.image", {"spec": {"image": EVIL_IMAGE}},
                  [{"op": "replace", "path": "/spec/image", "value": EVIL_IMAGE}],
                  applied(spec={"image": EVIL_IMAGE})),
        *_patches(path, f"{name} spec.engine.extraArgs",
                  {"spec": {"engine": {"extraArgs": extra_args}}},
                  [{"op": "add", "path": "/spec/engine/extraArgs/-", "value": extra_args[0]}],
                  applied(spec={"engine": {"extraArgs": extra_args}})),
        *_patches(path, f"{name} spec.replicas", {"spec": {"replicas": 8}},
                  [{"op": "replace", "path": "/spec/replicas", "value": 8}],
                  applied(spec={"replicas": 8})),
        *_patches(path, f"{name} spec.apiKeySecretRef",
                  {"spec": {"apiKeySecretRef": {"name": "attacker"}}},
                  [{"op": "replace", "path": "/spec/apiKeySecretRef/name", "value": "attacker"}],
                  applied(spec={"apiKeySecretRef": {"name": "attacker"}})),
        *_patches(path, f"{name} its demand annotation",
                  {"metadata": {"annotations": {OLD_DEMAND: HOSTILE_DEMAND}}},
                  [{"op": "replace", "path": OLD_DEMAND_POINTER, "value": HOSTILE_DEMAND}],
                  applied(metadata={"annotations": {OLD_DEMAND: HOSTILE_DEMAND}})),
        *_patches(f"{path}/status", f"{name} /status", {"status": {"ready": "8/8"}},
                  [{"op": "add", "path": "/status", "value": {"ready": "8/8"}}],
                  applied(status={"ready": "8/8"})),
        *_patches(f"{path}/scale", f"{name} /scale", {"spec": {"replicas": 8}},
                  [{"op": "replace", "path": "/spec/replicas", "value": 8}],
                  {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name},
                   "spec": {"replicas": 8}}),
    ]
    replaced = copy.deepcopy(live)
    replaced["spec"]["image"] = EVIL_IMAGE
    with_status = copy.deepcopy(live)
    with_status["status"] = {"ready": "8/8"}
    scale = {"apiVersion": "autoscaling/v1", "kind": "Scale",
             "metadata": {"name": name, "namespace": ns,
                          "resourceVersion": live["metadata"]["resourceVersion"]},
             "spec": {"replicas": 8}}
    calls += [
        Call(f"PUT of {name}", "PUT", path, replaced, params=DRY_RUN),
        Call(f"PUT of {name} /status", "PUT", f"{path}/status", with_status, params=DRY_RUN),
        Call(f"PUT of {name} /scale", "PUT", f"{path}/scale", scale, params=DRY_RUN),
        Call(f"DELETE of {name}", "DELETE", path, params=DRY_RUN),
        Call(f"GET of {name}", "GET", path),
    ]
    return calls


def all_agd_calls(identity: Identity) -> list[Call]:
    ns = identity.namespace
    created = deployment_object("evil-9b")
    created["spec"]["image"] = EVIL_IMAGE
    return [
        *agd_writes(ns, identity.objects[NAME]),
        *agd_writes(ns, identity.objects[OTHER]),
        Call("create of a new AutoGLMDeployment", "POST", _agd_path(ns), created,
             params=DRY_RUN),
        Call("delete of every AutoGLMDeployment", "DELETE", _agd_path(ns), params=DRY_RUN),
        Call("list of AutoGLMDeployments", "GET", _agd_path(ns)),
    ]


def other_calls(identity: Identity) -> list[Call]:
    """Secrets, pod writes, its own Deployment, its own rights, pods beyond its namespace."""
    ns = identity.namespace
    pods = f"/api/v1/namespaces/{ns}/pods"
    deployment = f"/apis/apps/v1/namespaces/{ns}/deployments/{ROUTER}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "router-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": ROUTER, "namespace": ns}],
    }  # fmt: skip
    more_rights = [{"op": "add", "path": "/rules/-",
                    "value": {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}}]
    return [
        Call("get of the API key Secret", "GET", f"/api/v1/namespaces/{ns}/secrets/"
             f"{API_KEY_SECRET}"),
        Call("list of Secrets", "GET", f"/api/v1/namespaces/{ns}/secrets"),
        Call("watch of Secrets", "GET", f"/api/v1/namespaces/{ns}/secrets",
             params={"watch": "1", "timeoutSeconds": "1"}),
        Call("create of a pod", "POST", pods, restricted_pod("evil"), params=DRY_RUN),
        Call("patch of a pod's mode label", "PATCH", f"{pods}/{POD}",
             {"metadata": {"labels": {"autoglm.io/mode": "batching"}}}, MERGE, DRY_RUN),
        Call("delete of a pod", "DELETE", f"{pods}/{POD}", params=DRY_RUN),
        Call("get of a pod", "GET", f"{pods}/{POD}"),
        Call("patch of its Deployment's image", "PATCH", deployment,
             [{"op": "replace", "path": "/spec/template/spec/containers/0/image",
               "value": EVIL_IMAGE}], JSON_PATCH, DRY_RUN),
        Call("patch of its Deployment's replicas", "PATCH", deployment,
             {"spec": {"replicas": 3}}, MERGE, DRY_RUN),
        Call("patch of its own Role", "PATCH", f"{rbac}/roles/{ROUTER}", more_rights,
             JSON_PATCH, DRY_RUN),
        Call("create of a RoleBinding to cluster-admin", "POST", f"{rbac}/rolebindings",
             binding, params=DRY_RUN),
        Call("list of pods in another namespace", "GET", "/api/v1/namespaces/default/pods"),
        Call("list of every namespace's pods", "GET", "/api/v1/pods"),
    ]


def assert_token_works(send: Callable[[str, Call], httpx.Response], identity: Identity) -> None:
    """The positive control: the token lists and watches its namespace's pods."""
    pods = f"/api/v1/namespaces/{identity.namespace}/pods"
    listed = send(identity.token, Call("list of its pods", "GET", pods))
    assert listed.status_code == 200, listed.text
    assert POD in [p["metadata"]["name"] for p in listed.json()["items"]]
    watched = send(identity.token, Call("watch of its pods", "GET", pods,
                                        params={"watch": "1", "timeoutSeconds": "1"}))
    assert watched.status_code == 200, watched.text
    # A watch from the start shows the pod as ADDED.
    events = [json.loads(line) for line in watched.text.splitlines() if line]
    assert any(e["type"] == "ADDED" and e["object"]["metadata"]["name"] == POD for e in events)


def assert_refused(send: Callable[[str, Call], httpx.Response], identity: Identity,
                   calls: list[Call], record_input: RecordInput) -> None:
    answered = {}
    for call in calls:
        response = send(identity.token, call)
        answered[call.what] = response.status_code
        refused = response.status_code == 403
        record_input(BOUNDARY, "refused 403", refused)
        if refused:  # the authorizer's refusal, naming the router's account
            assert f"system:serviceaccount:{identity.namespace}:{ROUTER}" in response.text
    let_through = {what: status for what, status in answered.items() if status != 403}
    assert not let_through, f"not refused 403 for the router's token: {let_through}"
    print(f"{len(calls)} requests with the router's token, each refused 403")


def test_every_write_to_any_autoglmdeployment_is_refused(
    identity: Identity, api: Callable[[str, Call], httpx.Response], record_input: RecordInput
) -> None:
    assert_token_works(api, identity)
    assert_refused(api, identity, all_agd_calls(identity), record_input)
    assert_token_works(api, identity)


def test_no_secret_no_pod_write_no_deployment_or_role_patch(
    identity: Identity, api: Callable[[str, Call], httpx.Response], record_input: RecordInput
) -> None:
    assert_token_works(api, identity)
    assert_refused(api, identity, other_calls(identity), record_input)


def test_the_same_requests_pass_for_the_admin(
    identity: Identity, api: Callable[[str, Call], httpx.Response]
) -> None:
    """Each request above is one the apiserver carries out (as a dry run) for a client
    allowed to: refused for the router's identity, not for its form."""
    failed = {}
    for call in all_agd_calls(identity) + other_calls(identity):
        response = api(identity.admin_token, call)
        if response.is_success != call.served or response.status_code == 403:
            failed[call.what] = f"{response.status_code} {response.text[:300]}"
    assert not failed, failed


# --- what the router may do ----------------------------------------------------------------------


CAN_I_ROW = re.compile(r"^(\S*)\s+(\[.*?\])\s+(\[.*?\])\s+(\[.*?\])\s*$")
# Every authenticated identity may ask the apiserver who it is and what it may do.
SELF_REVIEWS = {
    ("selfsubjectreviews.authentication.k8s.io", "[create]"),
    ("selfsubjectaccessreviews.authorization.k8s.io", "[create]"),
    ("selfsubjectrulesreviews.authorization.k8s.io", "[create]"),
}


def rights(listing: str) -> tuple[set[tuple[str, str]], set[str]]:
    """`kubectl auth can-i --list`'s table: (resource, verbs) rows, and the verbs of the
    non-resource URL rows."""
    resources, url_verbs = set(), set()
    for line in listing.splitlines()[1:]:
        match = CAN_I_ROW.match(line)
        assert match, f"not a row of can-i --list: {line!r}"
        resource, urls, names, verbs = match.groups()
        assert names == "[]", line  # no right narrowed to, or widened by, a name
        if resource:
            resources.add((resource, verbs))
        else:
            assert urls != "[]", line
            url_verbs.add(verbs)
    return resources, url_verbs


def test_the_router_may_only_list_and_watch_pods(cluster: LocalCluster, identity: Identity) -> None:
    ns = identity.namespace
    account = f"system:serviceaccount:{ns}:{ROUTER}"
    as_account = cluster.kubectl("auth", "can-i", "--list", "-n", ns, "--as", account).stdout
    with_token = cluster.kubectl("auth", "can-i", "--list", "-n", ns,
                                 "--token", identity.token).stdout
    print(with_token)
    for listing in (as_account, with_token):
        resources, url_verbs = rights(listing)
        assert resources == SELF_REVIEWS | {("pods", "[list watch]")}, resources
        assert url_verbs == {"[get]"}, url_verbs  # discovery, health, version: reads
    assert rights(as_account) == rights(with_token)
