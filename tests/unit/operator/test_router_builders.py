"""The router's children (router_builders) and how a pass plans them: Service `<name>` moves
to the router once one is ready, and back, with the router's children deleted, when it is off."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from autoglm_operator.reconcile.children import router as router_builders
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.reconcile.diff import describe_update
from autoglm_operator.reconcile.memory import ReconcileMemory
from autoglm_operator.reconcile.observe import CHILD_INDEXES, Observed, observe
from autoglm_operator.reconcile.pass_plan import Plan, key_of, plan_pass
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_router import cli as router_cli

OWNER = builders.Owner(name="phone-9b", namespace="serving", uid="u1")
SPEC = AutoGLMDeploymentSpec.model_validate({"replicas": 2})
OFF = AutoGLMDeploymentSpec.model_validate({"replicas": 2, "router": {"enabled": False}})
ROUTER = "phone-9b-router"
SERVING = {"app.kubernetes.io/name": "autoglm", "app.kubernetes.io/instance": "phone-9b"}
ROUTING = {"app.kubernetes.io/name": "autoglm-router", "app.kubernetes.io/instance": "phone-9b"}


def by_key(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {key_of(m): m for m in manifests}


def test_the_router_has_its_account_rights_deployment_and_budget() -> None:
    children = by_key(router_builders.children(OWNER, SPEC))
    assert sorted(children) == sorted(
        [("ServiceAccount", ROUTER), ("Role", ROUTER), ("RoleBinding", ROUTER),
         ("Deployment", ROUTER), ("PodDisruptionBudget", ROUTER)]
    )  # fmt: skip
    for child in children.values():
        meta = child["metadata"]
        assert meta["namespace"] == "serving"
        assert meta["ownerReferences"][0]["uid"] == "u1"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "autoglm-operator"
        assert meta["labels"]["app.kubernetes.io/instance"] == "phone-9b"
    assert router_builders.children(OWNER, OFF) == []


def test_the_role_grants_what_the_pod_watch_calls_on_pods_of_its_namespace_only() -> None:
    children = by_key(router_builders.children(OWNER, SPEC))
    role = children[("Role", ROUTER)]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = children[("RoleBinding", ROUTER)]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": ROUTER}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ROUTER,
                                    "namespace": "serving"}]  # fmt: skip
    pod = children[("Deployment", ROUTER)]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == ROUTER
    assert pod["automountServiceAccountToken"] is True


def test_router_pods_are_cpu_only_restricted_and_spread() -> None:
    deployment = router_builders.deployment(OWNER, SPEC)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"] == {"matchLabels": ROUTING}
    # make before break: a router rollout never has fewer routers than asked for
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    pod = template["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/autoglm/autoglm-router:0.1.0"
    assert c["command"] == ["autoglm-router"]
    assert c["resources"] == {"requests": {"cpu": "250m", "memory": "128Mi"},
                              "limits": {"cpu": "1", "memory": "320Mi"}}  # fmt: skip
    assert not any("gpu" in k for part in c["resources"].values() for k in part)
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "tcpSocket" in c["livenessProbe"]  # a router without replicas is alive
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "tolerations" not in pod  # it stays off tainted GPU nodes
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"] == {"matchLabels": ROUTING}
    # preStop sleep, then the drain of streams in flight, then a margin
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    # The drain outlasts the longest hold (router.hold.waitSeconds), so nothing held is lost.
    assert pod["terminationGracePeriodSeconds"] == 5 + 180 + 10


def test_router_args_are_what_the_router_cli_accepts() -> None:
    spec = AutoGLMDeploymentSpec.model_validate({
        "router": {"sessionAffinity": {"loadFactor": "2"}, "spill": False},
        "profiles": {"streaming": {"maxConcurrency": 6}, "batching": {"maxConcurrency": 48}},
        "engine": {"shutdownTimeoutSeconds": 90},
        "maxModelLen": 25480,
    })  # fmt: skip
    args = router_builders.deployment(OWNER, spec)["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    parsed = router_cli.build_parser().parse_args(args)
    assert router_cli.check_discovery_flags(parsed) is None
    assert parsed.kubernetes and parsed.namespace == "serving"
    # only the serving pods: the router's own pods share the instance label
    assert parsed.selector == (
        "app.kubernetes.io/component=server,app.kubernetes.io/instance=phone-9b,"
        "app.kubernetes.io/name=autoglm"
    )
    assert (parsed.port, parsed.port_name) == (8000, "http")
    assert parsed.load_factor == 2.0 and parsed.spill is False
    assert (parsed.streaming_cap, parsed.batching_cap) == (6, 48)
    # Streamed chats run past the streaming cap up to the engine's --max-num-seqs (the
    # envelope, 48); batching puts no class first.
    assert (parsed.streaming_chat_cap, parsed.batching_chat_cap) == (48, 48)
    assert parsed.drain_seconds == 180  # the hold's bound, above the engine's 90 s drain
    assert (parsed.hold_queue_size, parsed.hold_seconds, parsed.hold_per_client) == (
        256, 180.0, None)
    assert parsed.hold_heartbeat_seconds == 15.0
    assert parsed.served_model_name == [spec.model.served_name]
    # Screenshots priced at the replicas' own budget: the official 5,000,000 at this context.
    assert parsed.image_max_pixels == spec.multimodal.effective_max_pixels(25480) == 5_000_000
    default = router_cli.build_parser().parse_args(router_builders.router_args(OWNER, SPEC))
    assert default.load_factor == 1.25 and default.spill is True


def test_under_a_rolling_switch_a_streaming_replica_counts_full_at_its_own_engines_sequences(
) -> None:
    # Rolling starts each mode with its own flags: the streaming engine has 8 sequences, so
    # streamed chats are admitted up to 8 there, and the router counts it full at 8.
    spec = AutoGLMDeploymentSpec.model_validate({"switchStrategy": "Rolling"})
    parsed = router_cli.build_parser().parse_args(router_builders.router_args(OWNER, spec))
    assert (parsed.streaming_chat_cap, parsed.streaming_cap) == (8, 8)
    in_place = router_cli.build_parser().parse_args(router_builders.router_args(OWNER, SPEC))
    assert (in_place.streaming_chat_cap, in_place.streaming_cap) == (64, 8)


def test_with_the_gateway_on_the_router_serves_the_picker_where_the_epp_service_points() -> None:
    spec = AutoGLMDeploymentSpec.model_validate({"gateway": {"enabled": True}})
    parsed = router_cli.build_parser().parse_args(router_builders.router_args(OWNER, spec))
    assert router_cli.check_discovery_flags(parsed) is None
    assert router_cli.check_picker_flags(parsed) is None
    assert parsed.ext_proc_port == router_builders.EXT_PROC_PORT
    assert parsed.port == 8000, "the HTTP front door stays for users without a gateway"
    off = router_cli.build_parser().parse_args(router_builders.router_args(OWNER, SPEC))
    assert off.ext_proc_port is None


LIMITS = {"maxHeaderBytes": 16384, "maxHeaders": 50, "headerTimeoutSeconds": 5,
          "bodyTimeoutSeconds": 60, "maxClientConnections": 4096, "maxInflight": 256,
          "maxBodyBytes": 32 << 20, "maxBufferedBodyBytes": 256 << 20,
          "keepAliveTimeoutSeconds": 120, "sendTimeoutSeconds": 20,
          "streamTimeoutSeconds": 7200}  # fmt: skip


def test_each_router_limit_in_the_spec_reaches_the_routers_own_flag() -> None:
    spec = AutoGLMDeploymentSpec.model_validate({"router": {"limits": LIMITS}})
    parsed = vars(router_cli.build_parser().parse_args(router_builders.router_args(OWNER, spec)))
    dest = {"max_client_connections": "max_client_connections",
            "header_timeout_seconds": "header_timeout", "body_timeout_seconds": "body_timeout",
            "keep_alive_timeout_seconds": "keep_alive_timeout",
            "send_timeout_seconds": "send_timeout", "stream_timeout_seconds": "stream_timeout"}
    for field, value in spec.router.limits.model_dump().items():
        assert parsed[dest.get(field, field)] == value, field
    # Unset, the router keeps its own defaults: the operator passes none of these flags.
    default = router_builders.router_args(OWNER, SPEC)
    assert not set(default) & set(router_builders.ROUTER_LIMIT_FLAGS.values())


def test_the_budget_lets_one_router_go_at_a_time() -> None:
    pdb = router_builders.pod_disruption_budget(OWNER)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == {"matchLabels": ROUTING}


def test_no_serving_selector_matches_router_pods() -> None:
    labels = router_builders.pod_template(OWNER, SPEC)["metadata"]["labels"]
    children = builders.children(OWNER, SPEC)
    selectors = [c["spec"]["selector"] for c in children if c["kind"] == "Service"]
    selectors += [
        c["spec"]["selector"]["matchLabels"]
        for c in children
        if c["kind"] in ("Deployment", "PodDisruptionBudget")
    ]
    for selector in selectors:
        assert not all(labels.get(k) == v for k, v in selector.items()), selector
    assert builders.selector_string("phone-9b") == (
        "app.kubernetes.io/instance=phone-9b,app.kubernetes.io/name=autoglm"
    )


# -- planning --------------------------------------------------------------------------------


def observed(children: list[dict[str, Any]], router_ready: int | None = None) -> Observed:
    live = {key_of(c): copy.deepcopy(c) for c in children}
    if router_ready is not None:
        live[("Deployment", ROUTER)]["status"] = {"replicas": 2, "readyReplicas": router_ready}
    body = {"metadata": {"name": "phone-9b", "namespace": "serving", "uid": "u1"}}
    return Observed(
        body=body, deployment=live.get(("Deployment", "phone-9b")), children=live, secret=None,
        pods=[],
    )  # fmt: skip


def planned(spec: AutoGLMDeploymentSpec, obs: Observed) -> Plan:
    return plan_pass(OWNER, spec, obs, ReconcileMemory(), now=0.0)


def service_selector(the_plan: Plan) -> dict[str, str] | None:
    for action in the_plan.actions:
        if action.key == ("Service", "phone-9b"):
            return dict(action.manifest["spec"]["selector"])
    return None


def test_a_new_deployment_creates_the_router_and_serves_directly_until_it_is_ready() -> None:
    first = planned(SPEC, observed([]))
    created = {a.key for a in first.actions if a.verb == "create"}
    assert {(k, ROUTER) for k in router_builders.KINDS} <= created
    assert service_selector(first) == SERVING  # no router is ready yet: no outage meanwhile
    assert first.delete_router == ()
    # The router's Deployment exists, none of its pods ready: the Service stays.
    children = [*builders.children(OWNER, SPEC), *router_builders.children(OWNER, SPEC)]
    assert service_selector(planned(SPEC, observed(children, router_ready=0))) is None
    # One router ready: Service <name> moves to the routers.
    moved = planned(SPEC, observed(children, router_ready=1))
    assert service_selector(moved) == ROUTING
    assert [a.key for a in moved.actions] == [("Service", "phone-9b")]


def test_the_service_stays_on_the_router_when_routers_go_unready() -> None:
    children = [
        *builders.children(OWNER, SPEC, via_router=True),
        *router_builders.children(OWNER, SPEC),
    ]
    assert planned(SPEC, observed(children, router_ready=0)).actions == ()


def test_turning_the_router_off_moves_the_service_back_then_deletes_the_router() -> None:
    children = [
        *builders.children(OWNER, SPEC, via_router=True),
        *router_builders.children(OWNER, SPEC),
    ]
    first = planned(OFF, observed(children, router_ready=2))
    assert service_selector(first) == SERVING
    # The routers still take requests until the Service's update is seen to have landed.
    assert first.delete_router == ()
    back = [*builders.children(OWNER, OFF), *router_builders.children(OWNER, SPEC)]
    second = planned(OFF, observed(back, router_ready=2))
    assert second.actions == ()
    assert sorted(second.delete_router) == sorted((k, ROUTER) for k in router_builders.KINDS)
    # Once they are gone, nothing more to do.
    assert planned(OFF, observed(builders.children(OWNER, OFF))).delete_router == ()


@pytest.mark.parametrize("kind", router_builders.KINDS)
def test_a_router_child_being_deleted_is_not_deleted_again(kind: str) -> None:
    children = [*builders.children(OWNER, OFF), *router_builders.children(OWNER, SPEC)]
    obs = observed(children)
    obs.children[(kind, ROUTER)]["metadata"]["deletionTimestamp"] = "t"
    assert (kind, ROUTER) not in planned(OFF, obs).delete_router


def test_the_service_move_is_described_as_such() -> None:
    direct = builders.service(OWNER, SPEC)
    via = builders.service(OWNER, SPEC, via_router=True)
    assert describe_update(direct, via) == "now selects the router pods"
    assert describe_update(via, direct) == "now selects the serving pods"


def test_observe_files_router_pods_apart_from_the_serving_pods_and_the_router_children() -> None:
    serving = builders.pod_template("phone-9b", SPEC)
    router = router_builders.pod_template(OWNER, SPEC)
    pods = [
        {"metadata": {"name": name, **template["metadata"]}, "status": {"phase": "Running"}}
        for name, template in (("phone-9b-abc", serving), ("phone-9b-router-xyz", router))
    ]
    children = {index: {("serving", "phone-9b"): []} for index, _ in CHILD_INDEXES}
    for manifest in router_builders.children(OWNER, SPEC):
        index = next(i for i, kind in CHILD_INDEXES if kind == manifest["kind"])
        children[index][("serving", "phone-9b")].append(manifest)
    indexes = {
        **children,
        "owned_pods": {("serving", "phone-9b"): pods},
    }
    body = {"metadata": {"name": "phone-9b", "namespace": "serving", "uid": "u1"}}
    seen = observe(body, "serving", "phone-9b", "u1", indexes)
    assert [p["metadata"]["name"] for p in seen.pods] == ["phone-9b-abc"]
    # The router pods are filed apart, for status to say why one is down.
    assert [p["metadata"]["name"] for p in seen.router_pods] == ["phone-9b-router-xyz"]
    assert sorted(seen.children) == sorted((k, ROUTER) for k in router_builders.KINDS)
