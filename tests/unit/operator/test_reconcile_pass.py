"""One reconcile pass against an in-memory apiserver: what it writes, and that a second pass
over the result writes nothing."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from operator_fakes import FakeKube
from prometheus_client import REGISTRY

from autoglm_operator.handlers import reconcile as handlers
from autoglm_operator.io import executor, kube
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.reconcile.memory import ADMIN_SECRET_RECHECK_SECONDS
from autoglm_operator.reconcile.observe import Key, owned_by
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

NS, NAME, UID = "serving", "phone-9b", "uid-1"


@pytest.fixture(autouse=True)
def recorded_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(
        kube,
        "event",
        lambda body, *, warning=False, reason, message: seen.append((reason, message)),
    )
    return seen


def body(
    spec: dict[str, Any], generation: int = 1, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "autoglm.io/v1alpha1",
        "kind": "AutoGLMDeployment",
        "metadata": {
            "name": NAME,
            "namespace": NS,
            "uid": UID,
            "generation": generation,
            "resourceVersion": str(generation),
        },
        "spec": spec,
        "status": status or {},
    }


def observed(
    api: FakeKube, agd: dict[str, Any], pods: list[dict[str, Any]] | None = None
) -> handlers.Observed:
    """What the indexes would hold, built from the fake apiserver's objects: this object's
    children (an ownerReference to it), as observe.py files them."""
    children: dict[Key, dict[str, Any]] = {}
    secret = None
    for (kind, _ns, name), obj in api.objects.items():
        if not owned_by(obj, UID):
            continue
        if kind == "Secret":
            secret = {
                "kind": "Secret",
                "metadata": obj["metadata"],
                "keys": {k: bool(v) for k, v in (obj.get("data") or {}).items()},
            }
        elif kind != "Pod":
            children[(kind, name)] = json.loads(json.dumps(obj))
    return handlers.Observed(
        body=agd,
        deployment=children.get(("Deployment", NAME)),
        children=children,
        secret=secret,
        pods=pods or [],
    )


def writes(api: FakeKube) -> list[tuple[str, str, str]]:
    return [c for c in api.calls if c[0] != "get"]


def tokens(api: FakeKube) -> dict[str, str]:
    """The admin Secret's data: a token per pod template digest."""
    return dict(api.objects[("Secret", NS, f"{NAME}-admin")]["data"])


def template_of(spec: dict[str, Any]) -> str:
    digests = builders.desired_template_hashes(NAME, AutoGLMDeploymentSpec.model_validate(spec))
    (digest,) = digests
    return digest


def pod(name: str, template: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "7",
                     "labels": {"autoglm.io/mode": "streaming"},
                     "annotations": {"autoglm.io/template-hash": template}},
        "status": {"phase": "Running"},
    }


async def run_pass(
    api: FakeKube, agd: dict[str, Any], state: handlers.ReconcileMemory, pods: Any = None
) -> Any:
    reconciler = handlers.Reconciler(api, logging.getLogger("test"))  # type: ignore[arg-type]
    obs = observed(api, agd, pods)
    await reconciler.pass_once(agd, obs, state)  # type: ignore[arg-type]
    return obs


async def test_first_pass_creates_everything_and_the_next_writes_nothing() -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    agd = body({"replicas": 2})
    await run_pass(api, agd, state)
    assert sorted(writes(api)) == sorted(
        [
            ("apply", "ConfigMap", f"{NAME}-config"),
            ("apply", "Deployment", NAME),
            ("apply", "Service", NAME),
            ("apply", "Service", f"{NAME}-streaming"),
            ("apply", "Service", f"{NAME}-batching"),
            ("apply", "PodDisruptionBudget", NAME),
            ("create", "Secret", f"{NAME}-admin"),
            ("apply_status", "AutoGLMDeployment", NAME),
            # The router (spec.router.enabled by default).
            ("apply", "ServiceAccount", f"{NAME}-router"),
            ("apply", "Role", f"{NAME}-router"),
            ("apply", "RoleBinding", f"{NAME}-router"),
            ("apply", "Deployment", f"{NAME}-router"),
            ("apply", "PodDisruptionBudget", f"{NAME}-router"),
        ]
    )
    token = tokens(api)
    assert list(token) == [builders.admin_token_key(template_of({"replicas": 2}))]
    # The status the apiserver now holds, and a new loop (as after a restart): nothing to write.
    written_status = [c for c in api.calls if c[0] == "apply_status"]
    assert written_status
    api.calls.clear()
    status = handlers.status_.compute(
        name=NAME, namespace=NS, generation=1,
        spec=AutoGLMDeploymentSpec.model_validate({"replicas": 2}),
        deployment=api.objects[("Deployment", NS, NAME)], pods=[], current=None, now="t",
    ).status  # fmt: skip
    await run_pass(api, body({"replicas": 2}, status=status), handlers.ReconcileMemory())
    assert writes(api) == []
    assert tokens(api) == token


async def test_a_deleted_secret_gets_a_new_token_and_an_edited_service_is_restored(
    recorded_events: list[tuple[str, str]],
) -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    await run_pass(api, body({}), state)
    old = tokens(api)
    api.objects.pop(("Secret", NS, f"{NAME}-admin"))
    api.objects[("Service", NS, NAME)]["spec"]["ports"][0]["port"] = 1234
    api.calls.clear()
    state.written.clear()  # long after the first pass
    await run_pass(api, body({}), state)
    assert ("apply", "Service", NAME) in api.calls
    assert ("create", "Secret", f"{NAME}-admin") in api.calls
    assert tokens(api).keys() == old.keys() and tokens(api) != old
    assert api.objects[("Service", NS, NAME)]["spec"]["ports"][0]["port"] == 8000
    assert any("restored spec.ports" in m for r, m in recorded_events if r == "Updated")


async def test_an_admin_token_emptied_right_after_its_creation_is_replaced_at_once() -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    await run_pass(api, body({}), state)
    secret = api.objects[("Secret", NS, f"{NAME}-admin")]
    (key,) = secret["data"]
    secret["data"][key] = ""
    api._store(secret)  # a hand edit: a new resourceVersion, inside the watch grace time
    api.calls.clear()
    emptied = await run_pass(api, body({}), state)
    assert ("merge_patch", "Secret", f"{NAME}-admin") in api.calls
    assert tokens(api)[key]
    # A pass that still sees the emptied Secret (the watch has not brought our write back):
    # no second token.
    api.calls.clear()
    reconciler = handlers.Reconciler(api, logging.getLogger("test"))  # type: ignore[arg-type]
    await reconciler.pass_once(body({}), emptied, state)  # type: ignore[arg-type]
    assert ("merge_patch", "Secret", f"{NAME}-admin") not in api.calls


async def test_a_rollout_gets_a_new_token_and_the_old_goes_with_its_last_pod(
    recorded_events: list[tuple[str, str]],
) -> None:
    """A token per pod template: the new template's pods start with a token of their own (it
    is written before the Deployment), the old pods keep theirs until they are gone."""
    api, state = FakeKube(), handlers.ReconcileMemory()
    old_spec, new_spec = {"replicas": 1}, {"replicas": 1, "maxModelLen": 4096}
    old, new = template_of(old_spec), template_of(new_spec)
    await run_pass(api, body(old_spec), state)
    first = tokens(api)
    state.written.clear()  # long after
    api.calls.clear()
    await run_pass(api, body(new_spec, generation=2), state, pods=[pod("old-1", old)])
    calls = writes(api)
    assert calls.index(("merge_patch", "Secret", f"{NAME}-admin")) < calls.index(
        ("apply", "Deployment", NAME))
    rolled = tokens(api)
    assert rolled.keys() == {builders.admin_token_key(old), builders.admin_token_key(new)}
    assert rolled[builders.admin_token_key(old)] == first[builders.admin_token_key(old)]
    assert any(f"a new admin token for pod template {new}" in m for _, m in recorded_events)
    # The old pod is gone: its token with it.
    state.written.clear()
    await run_pass(api, body(new_spec, generation=2), state, pods=[pod("new-1", new)])
    assert tokens(api) == {builders.admin_token_key(new): rolled[builders.admin_token_key(new)]}


async def test_an_admin_secret_deleted_right_after_its_creation_is_recreated_at_once() -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    await run_pass(api, body({}), state)  # creates the Secret
    await run_pass(api, body({}), state)  # sees it come back
    api.objects.pop(("Secret", NS, f"{NAME}-admin"))  # deleted, inside the watch grace time
    api.calls.clear()
    await run_pass(api, body({}), state)
    assert ("create", "Secret", f"{NAME}-admin") in api.calls


@pytest.mark.parametrize(("kind", "name"), [
    ("ConfigMap", f"{NAME}-config"), ("Role", f"{NAME}-router"), ("Secret", f"{NAME}-admin")])
async def test_a_name_held_by_an_object_it_does_not_own_is_never_taken_over(
    kind: str, name: str, recorded_events: list[tuple[str, str]]
) -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    theirs = {"kind": kind, "metadata": {"name": name, "namespace": NS}, "data": {"theirs": "1"}}
    api._store(theirs)
    await run_pass(api, body({}), state)
    kept = api.objects[(kind, NS, name)]
    assert kept["data"] == {"theirs": "1"} and "ownerReferences" not in kept["metadata"]
    assert ("apply", kind, name) not in api.calls
    taken = [m for reason, m in recorded_events if reason == "NameTaken"]
    assert taken and all(
        f"{kind} {name} already exists and is not owned by AutoGLMDeployment {NAME}" in m
        for m in taken
    )
    degraded = {c["type"]: c for c in api.statuses[-1]["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "NameTaken")
    assert f"delete or rename that {kind}" in degraded["message"]
    # Gone: the next pass after the backoff makes its own.
    del api.objects[(kind, NS, name)]
    state.retry_at = 0.0
    await run_pass(api, body({}), state)
    assert owned_by(api.objects[(kind, NS, name)], UID)
    degraded = {c["type"]: c for c in api.statuses[-1]["conditions"]}["Degraded"]
    assert degraded["status"] == "False"


def ready(pod_: dict[str, Any], is_ready: bool = True) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if is_ready else "False"}
    return {**pod_, "status": {"phase": "Running", "conditions": [condition]}}


async def loop_pass(api: FakeKube, agd: dict[str, Any], state: handlers.ReconcileMemory,
                    pods: Any = None) -> None:
    """One turn of the reconcile loop: the children and pods as the indexes hold them, the admin
    Secret as the loop's own named reads saw it (no index: nothing lists or watches Secrets)."""
    reconciler = handlers.Reconciler(api, logging.getLogger("test"))  # type: ignore[arg-type]
    obs = observed(api, agd, pods)
    await reconciler.read_admin_secret(replace(obs, secret=None), state)
    seen = state.admin_secret if state.admin_secret and owned_by(state.admin_secret, UID) else None
    await reconciler.pass_once(agd, replace(obs, secret=seen), state)  # type: ignore[arg-type]


def secret_reads(api: FakeKube) -> int:
    return api.calls.count(("get", "Secret", f"{NAME}-admin"))


async def test_the_admin_secret_is_read_by_name_only_when_something_says_it_changed() -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    digest = template_of({})
    await loop_pass(api, body({}), state)  # the first pass reads it (absent) and creates it
    assert secret_reads(api) == 1 and ("create", "Secret", f"{NAME}-admin") in api.calls
    api.calls.clear()
    await loop_pass(api, body({}), state, pods=[ready(pod("p-1", digest))])
    assert secret_reads(api) == 1, "after its own write the loop reads it back once"
    api.calls.clear()
    for _ in range(3):  # quiet: every pod ready, nothing refused
        await loop_pass(api, body({}), state, pods=[ready(pod("p-1", digest))])
    assert api.calls == []
    # A refused token (the adaptive pass) makes the next pass read it again.
    state.admin_secret_stale = True
    await loop_pass(api, body({}), state, pods=[ready(pod("p-1", digest))])
    assert secret_reads(api) == 1 and writes(api) == []


async def test_a_secret_deleted_by_hand_is_made_again_once_a_new_pod_needs_it() -> None:
    """Running pods keep the token they mounted; a new pod cannot start without the Secret, so
    a serving pod that appeared since the last read brings a read, and the read a new Secret;
    a pod that stays unready brings one every ADMIN_SECRET_RECHECK_SECONDS."""
    api, state = FakeKube(), handlers.ReconcileMemory()
    digest = template_of({})
    running = [ready(pod("p-1", digest))]
    await loop_pass(api, body({}), state)
    await loop_pass(api, body({}), state, pods=running)
    api.objects.pop(("Secret", NS, f"{NAME}-admin"))
    state.written.clear()  # long after the first pass
    api.calls.clear()
    await loop_pass(api, body({}), state, pods=running)
    assert api.calls == [], "the same pods, every one ready: nothing reads the Secret"
    replaced = [ready(pod("p-2", digest), is_ready=False)]
    await loop_pass(api, body({}), state, pods=replaced)
    assert secret_reads(api) == 1 and ("create", "Secret", f"{NAME}-admin") in api.calls
    assert list(tokens(api)) == [builders.admin_token_key(digest)]
    # Still not ready: read again once ADMIN_SECRET_RECHECK_SECONDS have passed, not before.
    await loop_pass(api, body({}), state, pods=replaced)  # reads back its own write
    api.calls.clear()
    await loop_pass(api, body({}), state, pods=replaced)
    assert secret_reads(api) == 0
    state.admin_secret_read_at -= ADMIN_SECRET_RECHECK_SECONDS  # that long later
    await loop_pass(api, body({}), state, pods=replaced)
    assert secret_reads(api) == 1 and writes(api) == []


async def test_missing_api_key_secret_blocks_until_the_generation_changes(
    recorded_events: list[tuple[str, str]],
) -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    spec = {"apiKeySecretRef": {"name": "keys"}}
    await run_pass(api, body(spec), state)
    assert api.calls[0] == ("get", "Secret", "keys")
    assert [c for c in writes(api) if c[0] != "apply_status"] == []
    assert ("SecretNotFound", recorded_events[0][1]) == recorded_events[0]
    api.calls.clear()
    await run_pass(api, body(spec), state)
    assert [c for c in api.calls if c[0] == "get"] == []  # permanent: no retry
    api.objects[("Secret", NS, "keys")] = {
        "kind": "Secret",
        "metadata": {"name": "keys", "namespace": NS},
        "data": {"api-key": "eA=="},
    }
    await run_pass(api, body(spec, generation=2), state)
    assert ("apply", "Deployment", NAME) in api.calls


@pytest.mark.parametrize(("policy", "mode"), [("Adaptive", "streaming"), ("Batching", "batching")])
async def test_new_pods_get_the_initial_mode_once(policy: str, mode: str) -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    spec = {"modePolicy": policy, "adaptive": {"paused": True}}
    await run_pass(api, body(spec), state)
    pod = {
        "kind": "Pod",
        "metadata": {"name": "p1", "namespace": NS, "labels": {}, "resourceVersion": "7"},
        "status": {"phase": "Pending"},
    }
    api.objects[("Pod", NS, "p1")] = pod
    api.calls.clear()
    await run_pass(api, body(spec), state, pods=[pod])
    assert ("merge_patch", "Pod", "p1") in api.calls
    assert api.objects[("Pod", NS, "p1")]["metadata"]["labels"]["autoglm.io/mode"] == mode
    api.calls.clear()
    await run_pass(api, body(spec), state, pods=[pod])  # the watch has not caught up yet
    assert ("merge_patch", "Pod", "p1") not in api.calls


def test_api_errors_are_classified() -> None:
    exists = kube._error(ApiException(status=409, reason="Conflict"))
    assert exists.status == 409 and exists.temporary
    body_exists = ApiException(status=409, reason="Conflict")
    body_exists.body = json.dumps({"reason": "AlreadyExists", "message": "already there"})
    assert kube._error(body_exists).already_exists
    assert kube.ApiError(503, "ServiceUnavailable", "").temporary
    assert kube.ApiError(429, "TooManyRequests", "").temporary
    assert kube.ApiError(0, "ConnectionError", "").temporary
    assert not kube.ApiError(422, "Invalid", "").temporary
    assert not kube.ApiError(403, "Forbidden", "").temporary
    assert kube.ApiError(404, "NotFound", "").not_found
    assert (
        kube.path_for("Deployment", "ns", "d", "scale")
        == "/apis/apps/v1/namespaces/ns/deployments/d/scale"
    )
    assert builders.admin_secret_name(NAME) == f"{NAME}-admin"


async def test_replica_gauges_follow_the_status() -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    await run_pass(api, body({"replicas": 3}), state)
    labels = {"namespace": NS, "name": NAME}
    assert REGISTRY.get_sample_value("autoglm_operator_replicas", labels) == 3
    assert REGISTRY.get_sample_value("autoglm_operator_ready_replicas", labels) == 0


async def test_rolling_steps_toward_the_adaptive_target_in_memory_or_the_persisted_one() -> None:
    """The adaptive pass hands its batching share to the plan in memory (no round trip through
    status); a restarted operator, with nothing in memory yet, steps toward the share the last
    one persisted in status.adaptiveState."""
    spec = {
        "replicas": 2,
        "switchStrategy": "Rolling",
        "adaptive": {"prometheus": {"url": "http://p:9090"}, "minStreamingReplicas": 0},
    }

    async def batching_replicas(state: handlers.ReconcileMemory, status: dict[str, Any]) -> int:
        api = FakeKube()
        await run_pass(api, body(spec, status=status), state)
        deployment = api.objects[("Deployment", NS, f"{NAME}-batching")]
        return int(deployment["spec"]["replicas"])

    assert await batching_replicas(handlers.ReconcileMemory(batching_target=1), {}) == 1
    persisted = {"adaptiveState": {"batchingTarget": 2}}
    assert await batching_replicas(handlers.ReconcileMemory(), persisted) == 2
    assert await batching_replicas(handlers.ReconcileMemory(batching_target=1), persisted) == 1


def test_the_admin_tokens_are_read_through_the_executor() -> None:
    """Missing Secret: not there yet (None); no token in it: its own error, which the loop logs
    and retries soon (not a kopf.TemporaryError that nothing catches)."""
    api = FakeKube()
    execute = executor.Executor(api, logging.getLogger("test"))  # type: ignore[arg-type]
    assert execute.read_admin_tokens(NS, NAME) is None
    secret = {"kind": "Secret", "metadata": {"name": f"{NAME}-admin", "namespace": NS}}
    api.objects[("Secret", NS, f"{NAME}-admin")] = {**secret, "data": {"token-abc": ""}}
    with pytest.raises(executor.MissingAdminToken, match="holds no token"):
        execute.read_admin_tokens(NS, NAME)
    api.objects[("Secret", NS, f"{NAME}-admin")] = {
        **secret, "data": {"token-abc": "czNjcmV0", "token": "b2xk", "token-def": ""}}
    assert execute.read_admin_tokens(NS, NAME) == {"abc": "s3cret"}


IDLE_SPEC = {"replicas": 2, "scaleToZero": {"enabled": True, "idleSeconds": 60}}


async def test_scale_to_zero_scales_the_deployment_and_reports_it(
    recorded_events: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle past the window: the serving Deployment goes to 0 (the router stays), status and an
    Event say why, and the replica gauge follows what should run, so no alert fires."""
    api, state = FakeKube(), handlers.ReconcileMemory()
    clock = [1_800_000_000.0]
    monkeypatch.setattr(handlers.time, "time", lambda: clock[0])
    await run_pass(api, body(IDLE_SPEC), state)
    assert api.objects[("Deployment", NS, NAME)]["spec"]["replicas"] == 2
    serving = api.statuses[-1]["standby"]
    assert serving["state"] == "Serving"
    router = api.objects[("Deployment", NS, f"{NAME}-router")]
    assert router["spec"]["replicas"] == 2
    clock[0] += 61
    await run_pass(api, body(IDLE_SPEC, status=api.statuses[-1]), state)
    assert api.objects[("Deployment", NS, NAME)]["spec"]["replicas"] == 0
    assert api.objects[("Deployment", NS, f"{NAME}-router")]["spec"]["replicas"] == 2
    standby = api.statuses[-1]["standby"]
    assert standby["state"] == "Idle"
    ready = next(c for c in api.statuses[-1]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")
    assert "holds the next request" in ready["message"]
    assert any(reason == "ScaledToZero" for reason, _ in recorded_events)
    labels = {"namespace": NS, "name": NAME}
    assert REGISTRY.get_sample_value("autoglm_operator_replicas", labels) == 0


async def test_an_autoscaler_on_the_object_keeps_its_replicas(
    recorded_events: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, state = FakeKube(), handlers.ReconcileMemory()
    api.objects[("HorizontalPodAutoscaler", NS, "keda-hpa-phone")] = {
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-phone", "namespace": NS},
        "spec": {"scaleTargetRef": {"apiVersion": "autoglm.io/v1alpha1",
                                    "kind": "AutoGLMDeployment", "name": NAME}},
    }
    clock = [1_800_000_000.0]
    monkeypatch.setattr(handlers.time, "time", lambda: clock[0])
    await run_pass(api, body(IDLE_SPEC), state)
    clock[0] += 600
    await run_pass(api, body(IDLE_SPEC, status=api.statuses[-1]), state)
    assert api.objects[("Deployment", NS, NAME)]["spec"]["replicas"] == 2
    assert api.statuses[-1]["standby"]["state"] == "AutoscalerConflict"
    assert [r for r, _ in recorded_events if r == "AutoscalerConflict"] == ["AutoscalerConflict"]
