"""Pure: the plan of one reconcile pass, from the spec, what the cluster holds and the memory.

`plan_pass` is the one entry: the children to create or apply, the pods to label or retire,
whether the admin Secret needs a token, and which children to delete (Plan). io/executor.py
carries it out.

A child is in sync when every field the operator sets has the same value in the live object
(diff.contains), or when the live object is exactly the version the operator's last write
produced (so a value the apiserver normalizes differently cannot make the operator write in a
loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoglm_api.profiles import Mode
from autoglm_operator.reconcile.children import gateway, router, serving
from autoglm_operator.reconcile.diff import contains
from autoglm_operator.reconcile.memory import WATCH_GRACE_SECONDS, ReconcileMemory, Written
from autoglm_operator.reconcile.observe import Key, Observed
from autoglm_operator.reconcile.rolling import (
    Retire,
    batching_deployment_to_delete,
    retire_marks,
    rolling_step_for,
)
from autoglm_operator.reconcile.router_plan import (
    gateway_children_to_delete,
    router_children_to_delete,
    service_via_router,
)
from autoglm_operator.resource import pods as pods_
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec


@dataclass(frozen=True)
class Action:
    verb: str  # "create" or "update"
    manifest: dict[str, Any]
    reason: str

    @property
    def key(self) -> Key:
        return key_of(self.manifest)


def key_of(manifest: dict[str, Any]) -> Key:
    return str(manifest["kind"]), str(manifest["metadata"]["name"])


def _rv(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def in_sync(
    actual: dict[str, Any] | None,
    desired: dict[str, Any],
    written: Written | None,
    now: float,
) -> bool:
    """Whether no write is needed for this child now."""
    if written is not None and written.digest == serving.digest(desired):
        if actual is not None and _rv(actual) == written.resource_version:
            return True  # exactly what our write produced
        if _rv(actual) == written.based_on and now - written.at < WATCH_GRACE_SECONDS:
            return True  # the watch has not delivered our write yet
    return actual is not None and contains(actual, desired)


def plan_children(
    desired: list[dict[str, Any]],
    actual: dict[Key, dict[str, Any]],
    written: dict[Key, Written],
    now: float,
) -> list[Action]:
    actions = []
    for manifest in desired:
        key = key_of(manifest)
        live = actual.get(key)
        if live is not None and (live.get("metadata") or {}).get("deletionTimestamp"):
            continue  # being deleted; it is recreated once it is gone
        if in_sync(live, manifest, written.get(key), now):
            continue
        if live is None:
            actions.append(Action("create", manifest, f"{key[0]} {key[1]} does not exist"))
        else:
            actions.append(Action("update", manifest, f"{key[0]} {key[1]} differs"))
    return actions


def is_rollout(action: Action, actual: dict[Key, dict[str, Any]]) -> bool:
    """An update that changes the pod template: the Deployment rolls its pods."""
    if action.verb != "update" or action.manifest["kind"] != "Deployment":
        return False
    live = actual.get(action.key) or {}
    live_hash = serving.template_hash((live.get("spec") or {}).get("template") or {})
    return live_hash != serving.template_hash(action.manifest["spec"]["template"])


def surge_allowed(
    spec: AutoGLMDeploymentSpec,
    desired_hash: str | frozenset[str],
    deployment: dict[str, Any] | None,
    pods: list[dict[str, Any]],
) -> bool:
    """Make-before-break unless a rollout is stuck because the surge pod finds no GPU.

    Then the rollout goes one replica down at a time, and stays so until it completes.
    desired_hash: the current template's digest, or the set of them (one per mode, Rolling).
    """
    hashes = {desired_hash} if isinstance(desired_hash, str) else desired_hash
    live = [p for p in pods if pods_.is_live(p)]
    outdated = [p for p in live if pods_.pod_template_hash(p) not in hashes]
    if not outdated:
        return True
    current = [p for p in live if pods_.pod_template_hash(p) in hashes]
    if any(pods_.lacks_gpu(p, spec.gpu_resource_name) for p in current):
        return False
    strategy = ((deployment or {}).get("spec") or {}).get("strategy") or {}
    live_template = ((deployment or {}).get("spec") or {}).get("template") or {}
    already_fell_back = (strategy.get("rollingUpdate") or {}).get("maxSurge") in (0, "0", "0%")
    return not (already_fell_back and serving.template_hash(live_template) in hashes)


def pods_to_label(pods: list[dict[str, Any]]) -> list[str]:
    """Live pods without a valid mode label: each gets the initial mode."""
    return sorted(
        p["metadata"]["name"] for p in pods if pods_.is_live(p) and pods_.pod_mode(p) is None
    )


@dataclass(frozen=True)
class AdminSecretWrite:
    """The admin Secret's write: a new token for each pod template that has none, and the keys
    no template or pod uses any more dropped."""

    verb: str  # "create" or "patch"
    add: tuple[str, ...] = ()  # template digests that get a new token
    drop: tuple[str, ...] = ()  # Secret keys to remove


@dataclass(frozen=True)
class Plan:
    """Everything one reconcile pass writes, in the order the executor writes it."""

    owner: serving.Owner
    desired_hash: str  # the pod template digests, for event messages
    retire: tuple[Retire, ...] = ()  # old-mode pods a shrinking Deployment must remove first
    # Before the children: a new template's pods start with their token in place.
    admin_secret: AdminSecretWrite | None = None
    actions: tuple[Action, ...] = ()  # children to create or apply
    settled: tuple[Key, ...] = ()  # writes that came back through the watch: forget them
    label: tuple[tuple[str, str], ...] = ()  # (pod, resourceVersion) to label
    label_mode: Mode = Mode.STREAMING
    delete: tuple[Key, ...] = ()
    delete_router: tuple[Key, ...] = ()  # spec.router.enabled is false: the router's children
    # spec.gateway, carried out last: the picker's Service and the pool to create or apply
    # (none while a failed attempt waits out its backoff), or, turned off, what to delete.
    gateway: tuple[Action, ...] = ()
    delete_gateway: tuple[Key, ...] = ()


def plan_pass(
    owner: serving.Owner,
    spec: AutoGLMDeploymentSpec,
    observed: Observed,
    memory: ReconcileMemory,
    now: float,
) -> Plan:
    """The one planning function of a reconcile pass (no I/O, no clock: `now` is given)."""
    desired_hashes = serving.desired_template_hashes(owner.name, spec)
    surge = surge_allowed(spec, desired_hashes, observed.deployment, observed.pods)
    split: dict[Mode, int] | None = None
    retire: tuple[Retire, ...] = ()
    if serving.rolling(spec):
        step = rolling_step_for(owner, spec, observed, memory.batching_target)
        split, retire = step.split, retire_marks(step, observed.pods)
    desired = [
        *serving.children(owner, spec, surge=surge, split=split,
                           via_router=service_via_router(owner, spec, observed)),
        *router.children(owner, spec),
    ]  # fmt: skip
    # A token for every template current or still running a pod (a rollout's old pods).
    templates = desired_hashes | {h for p in observed.pods if (h := pods_.pod_template_hash(p))}
    secret, settled = admin_secret_action(owner, observed.secret, templates, memory.written, now)
    gateway_actions = []
    if now >= memory.gateway_retry_at:
        gateway_actions = plan_children(
            gateway.children(owner, spec), observed.children, memory.written, now
        )
    return Plan(
        owner=owner,
        desired_hash=", ".join(sorted(desired_hashes)),
        retire=retire,
        actions=tuple(plan_children(desired, observed.children, memory.written, now)),
        admin_secret=secret,
        settled=settled,
        label=_to_label(observed.pods, memory.labelled),
        label_mode=serving.initial_mode(spec),
        delete=() if serving.rolling(spec) else batching_deployment_to_delete(
            owner, spec, observed, desired_hashes
        ),
        delete_router=router_children_to_delete(owner, spec, observed),
        gateway=tuple(gateway_actions),
        delete_gateway=gateway_children_to_delete(owner, spec, observed),
    )  # fmt: skip


def _to_label(
    pods: list[dict[str, Any]], labelled: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """New pods start in the initial mode; one labelled at this version already is skipped
    (the watch has not caught up with our patch)."""
    by_name = {p["metadata"]["name"]: p for p in pods}
    wanted = (
        (pod, str(by_name[pod]["metadata"].get("resourceVersion"))) for pod in pods_to_label(pods)
    )
    return tuple((pod, rv) for pod, rv in wanted if labelled.get(pod) != rv)


def admin_secret_action(
    owner: serving.Owner,
    secret: dict[str, Any] | None,
    templates: frozenset[str],
    written: Mapping[Key, Written],
    now: float,
) -> tuple[AdminSecretWrite | None, tuple[Key, ...]]:
    """A token per pod template, generated once: each of `templates` without one gets a new
    token, and a key no template in `templates` uses is dropped (its pods are gone).

    Returns the write (None: none needed) and the keys whose write came back."""
    key = ("Secret", serving.admin_secret_name(owner.name))
    seen = _rv(secret)
    ours = written.get(key)
    held: Mapping[str, bool] = (secret or {}).get("keys") or {}  # key -> holds a token
    wanted = {serving.admin_token_key(t): t for t in templates}
    add = tuple(sorted(t for k, t in wanted.items() if not held.get(k)))
    drop = tuple(sorted(k for k in held if k not in wanted))
    if not add and not drop:
        # Our write is back: what happens next is someone else's.
        return None, (key,) if ours and seen == ours.resource_version else ()
    if ours and ours.based_on == seen and now - ours.at < WATCH_GRACE_SECONDS:
        return None, ()  # we still see what our write replaced: it has not come back yet
    return AdminSecretWrite("create" if secret is None else "patch", add, drop), ()
