"""Pure: from the spec, what the cluster holds and the reconcile memory, the plan of one iteration.

`plan_iteration` is the one entry: one plan (IterationPlan) holding the adaptive pass's mode
entries (repairs, the hysteresis state to announce, the flips; plan_modes), the children to
create or apply, the pods to label or retire, whether the admin Secret needs a token, which
child to delete (plan_pass), and the status as planned; `settle` folds what the executor
reported (how each flip went, an API error) into that status. io/executor.py carries the plan out.

A child is in sync when every field the operator sets has the same value in the live object
(the apiserver adds defaults and status, which do not count), or when the live object is exactly
the version the operator's last write produced (so a value the apiserver normalizes differently
cannot make the operator write in a loop).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from autoglm_operator.adaptive import pass_data, planning
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive import report as report_
from autoglm_operator.reconcile import status as status_
from autoglm_operator.reconcile.children import gateway, router, serving
from autoglm_operator.reconcile.observe import Key, Observed
from autoglm_operator.resource import names
from autoglm_operator.resource import pods as pods_
from autoglm_operator.resource import spec as crd
from autoglm_operator.resource.conditions import without_empty
from autoglm_runtime.profiles import Mode

_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]{0,2})$")


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity as a number ("1Gi", "500m", 2), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value))
    if not match:
        return None
    number, suffix = match.groups()
    try:
        if suffix and suffix[0] in "eE":
            return Decimal(number + suffix)
        if suffix and suffix not in _SUFFIXES:
            return None
        return Decimal(number) * Decimal(str(_SUFFIXES[suffix]) if suffix else 1)
    except InvalidOperation:
        return None


def contains(actual: Any, desired: Any, *, path: tuple[str, ...] = ()) -> bool:
    """Whether `actual` holds every value `desired` sets (lists must match item by item)."""
    if isinstance(desired, dict):
        if not isinstance(actual, dict):
            return False
        return all(
            contains(actual[key], value, path=(*path, key))
            if key in actual
            else _omitted_zero(value)
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(actual) != len(desired):
            return False
        return all(contains(a, d, path=path) for a, d in zip(actual, desired, strict=True))
    if actual == desired:
        return True
    # Resource quantities come back canonicalized ("1000m" -> "1").
    if len(path) >= 2 and path[-2] in ("requests", "limits"):
        left, right = quantity(actual), quantity(desired)
        return left is not None and left == right
    return False


# How long a write may take to come back through the watch before it counts as lost.
WATCH_GRACE_SECONDS = 10.0
# How often the admin Secret is read again while a serving pod is not ready.
ADMIN_SECRET_RECHECK_SECONDS = 30.0


def _omitted_zero(value: Any) -> bool:
    """The API leaves out zero values of optional fields (`readOnly: false` is not echoed)."""
    return value is False or value is None or value in ("", 0) or value == {} or value == []


@dataclass(frozen=True)
class Written:
    """What the operator's last write of one child produced, and what it was based on."""

    digest: str
    resource_version: str
    based_on: str  # the resourceVersion the operator saw when it wrote ("" when absent)
    at: float  # monotonic time of the write


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


def has_pending(written: dict[Key, Written], now: float) -> bool:
    """A recent write still inside its grace time: the next pass must look again."""
    return any(now - w.at < WATCH_GRACE_SECONDS for w in written.values())


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


def describe_update(actual: dict[str, Any] | None, desired: dict[str, Any]) -> str:
    """A short human account of an update: a scale, or the fields that had drifted."""
    if actual is None:
        return "created"
    if desired["kind"] == "Deployment":
        have = (actual.get("spec") or {}).get("replicas")
        want = desired["spec"]["replicas"]
        rest_same = contains(
            {**actual, "spec": {**actual.get("spec", {}), "replicas": want}}, desired
        )
        if have != want and rest_same:
            return f"scaled from {have} to {want} replicas"
    if desired["kind"] == "Service":
        have = ((actual.get("spec") or {}).get("selector") or {}).get(names.NAME_LABEL)
        want = desired["spec"]["selector"].get(names.NAME_LABEL)
        if have != want:  # the router turned on or off
            pods = "router" if want == names.ROUTER_APP_NAME else "serving"
            return f"now selects the {pods} pods"
    drifted = differing_paths(actual, desired)
    shown = ", ".join(drifted[:3]) + (", ..." if len(drifted) > 3 else "")
    return f"restored {shown}" if drifted else "restored the desired state"


def differing_paths(actual: Any, desired: Any, prefix: str = "") -> list[str]:
    if isinstance(desired, dict) and isinstance(actual, dict):
        paths: list[str] = []
        for key, value in desired.items():
            child = f"{prefix}.{key}" if prefix else key
            if key not in actual:
                paths.append(child)
            else:
                paths += differing_paths(actual[key], value, child)
        return paths
    return [] if contains(actual, desired) else [prefix or "."]


def is_rollout(action: Action, actual: dict[Key, dict[str, Any]]) -> bool:
    """An update that changes the pod template: the Deployment rolls its pods."""
    if action.verb != "update" or action.manifest["kind"] != "Deployment":
        return False
    live = actual.get(action.key) or {}
    live_hash = serving.template_hash((live.get("spec") or {}).get("template") or {})
    return live_hash != serving.template_hash(action.manifest["spec"]["template"])


def surge_allowed(
    spec: crd.AutoGLMDeploymentSpec,
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


# -- switchStrategy Rolling: a flip replaces a pod, make-before-break --------------------------

# The Kubernetes pod-deletion-cost annotation: a ReplicaSet scaling down removes the pod with
# the lowest cost among equally ready ones, so the operator picks which old-mode pod goes.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
RETIRE_COST = "-1000"


def rolling_batching_target(
    spec: crd.AutoGLMDeploymentSpec,
    stored_target: int | None,
    current: Mapping[Mode, int] | None,
) -> int:
    """How many replicas should run the batching template under switchStrategy Rolling.

    Pinned policies say it outright; Adaptive takes what the adaptive loop decided (kept in
    status.adaptiveState.batchingTarget); dryRun and a loop that decided nothing yet hold the
    split the Deployments have (all in the initial mode when there are none).
    """
    replicas = spec.replicas
    adaptive = spec.mode_policy is crd.ModePolicy.ADAPTIVE
    if spec.adaptive.dry_run or (adaptive and stored_target is None):
        if current is None:
            wanted = replicas if serving.initial_mode(spec) is Mode.BATCHING else 0
        else:
            wanted = current.get(Mode.BATCHING, 0)
    elif spec.mode_policy is crd.ModePolicy.BATCHING:
        wanted = replicas
    elif spec.mode_policy is crd.ModePolicy.STREAMING:
        wanted = 0
    else:
        assert stored_target is not None
        wanted = min(stored_target, replicas - min(spec.adaptive.min_streaming_replicas, replicas))
    return max(0, min(wanted, replicas))


@dataclass(frozen=True)
class RollingStep:
    """The replicas each mode's Deployment should have now, and the old pods to retire."""

    split: dict[Mode, int]
    retire: tuple[str, ...] = ()  # pods to mark with the lowest deletion cost first

    @property
    def in_progress(self) -> bool:
        return bool(self.retire)


def _other(mode: Mode) -> Mode:
    return Mode.STREAMING if mode is Mode.BATCHING else Mode.BATCHING


def rolling_step(
    replicas: int,
    batching_target: int,
    current: Mapping[Mode, int],
    pods: list[dict[str, Any]],
    current_hashes: Mapping[Mode, str],
    gpu_resource: str = "nvidia.com/gpu",
) -> RollingStep:
    """One make-before-break step from the Deployments' replica counts toward the target split.

    A mode's Deployment grows first, by at most one pod beyond `replicas` in all (a surge); the
    other mode's Deployment shrinks only by that surplus, and only once every pod of the growing
    mode runs its current template and is ready. So ready replicas never fall below `replicas`
    during a flip. When the surge pod cannot be scheduled for lack of GPUs, one old pod goes
    first instead (one replica down, as the PodDisruptionBudget's maxUnavailable 1 allows), so a
    cluster without a spare replica's GPUs still flips, one replica at a time.
    """
    want = {Mode.BATCHING: batching_target, Mode.STREAMING: replicas - batching_target}
    split = {mode: int(current.get(mode, 0)) for mode in Mode}
    live = [p for p in pods if pods_.is_live(p)]

    def ready(mode: Mode) -> int:
        return sum(
            1
            for p in live
            if pods_.pod_mode(p) is mode
            and pods_.pod_template_hash(p) == current_hashes[mode]
            and pods_.is_ready(p)
        )

    def starved(mode: Mode) -> int:
        of_mode = (p for p in live if pods_.pod_mode(p) is mode)
        return sum(1 for p in of_mode if pods_.lacks_gpu(p, gpu_resource))

    retire: list[str] = []
    # Break: remove the surplus of a mode above its share once the other mode's pods are up.
    for mode in Mode:
        surplus = min(split[mode] - want[mode], sum(split.values()) - replicas)
        other = _other(mode)
        if surplus > 0 and ready(other) < split[other] and starved(other):
            # Every new pod is up or waits for GPUs: free one old pod's GPUs, one at a time.
            surplus = 1 if ready(other) + starved(other) >= split[other] else 0
        elif ready(other) < split[other]:
            surplus = 0
        if surplus > 0:
            split[mode] -= surplus
            if 0 < split[other] <= want[other]:  # a replacement, not a plain scale-down
                retire += [p["metadata"]["name"] for p in _retire_order(live, mode)[:surplus]]
    # Make: grow a mode below its share, at most one pod beyond `replicas` in all.
    for mode in Mode:
        room = replicas + 1 - sum(split.values())
        if split[mode] < want[mode] and room > 0 and not starved(mode):
            split[mode] += min(want[mode] - split[mode], room)
    return RollingStep(split=split, retire=tuple(retire))


def _retire_order(live: list[dict[str, Any]], mode: Mode) -> list[dict[str, Any]]:
    """The pods of a mode in the order a ReplicaSet would remove them, marked ones first."""

    def key(pod: dict[str, Any]) -> tuple[bool, bool, str, str]:
        meta = pod.get("metadata") or {}
        marked = (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) == RETIRE_COST
        return (
            not marked,
            pods_.is_ready(pod),
            str(meta.get("creationTimestamp") or ""),
            str(meta.get("name")),
        )

    return sorted((p for p in live if pods_.pod_mode(p) is mode), key=key)


def deployment_split(children: Mapping[Key, dict[str, Any]], name: str) -> dict[Mode, int] | None:
    """The replicas each mode's Deployment has now under Rolling; None when neither exists."""
    found: dict[Mode, int] = {}
    for mode in Mode:
        live = children.get(("Deployment", serving.deployment_name(name, mode)))
        if live is not None:
            found[mode] = int((live.get("spec") or {}).get("replicas") or 0)
    return found or None


# -- the reconcile memory and the plan of one pass -------------------------------------------


@dataclass
class ReconcileMemory:
    """What one object's reconcile loop remembers between passes, in memory only (lost on
    restart, by design): what it wrote, which pods it labelled, backoff, the Rolling target."""

    written: dict[Key, Written] = field(default_factory=dict)
    labelled: dict[str, str] = field(default_factory=dict)  # pod -> resourceVersion seen
    fingerprint: Any = None
    checked_generation: int | None = None
    blocked: tuple[int, status_.Problem] | None = None  # permanent, until the spec changes
    failures: int = 0
    retry_at: float = 0.0
    # (resourceVersion the last status write was based on, the status it wrote)
    status_written: tuple[str, dict[str, Any]] | None = None
    # switchStrategy Rolling: the batching replicas the adaptive pass wants (None: not decided
    # in this process yet; the plan then reads what a previous operator persisted in status).
    batching_target: int | None = None
    # spec.gateway: why its objects could not be written (None: they were, or it is off), and
    # when to try again. They are written after the serving children and never hold them up.
    gateway_problem: status_.Problem | None = None
    gateway_failures: int = 0
    gateway_retry_at: float = 0.0
    # The admin Secret as its last named read saw it (observe.admin_secret_view), when that was,
    # and whether it must be read again (admin_secret_read_due).
    admin_secret: dict[str, Any] | None = None
    admin_secret_read_at: float = float("-inf")
    admin_secret_stale: bool = True
    admin_secret_pods: frozenset[str] = frozenset()  # the serving pods at that read


@dataclass(frozen=True)
class Retire:
    pod: str
    mode: Mode | None


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
    spec: crd.AutoGLMDeploymentSpec,
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
        split, retire = step.split, _to_mark(step, observed.pods)
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
        delete=() if serving.rolling(spec) else _batching_deployment_to_delete(
            owner, spec, observed, desired_hashes
        ),
        delete_router=router_children_to_delete(owner, spec, observed),
        gateway=tuple(gateway_actions),
        delete_gateway=gateway_children_to_delete(owner, spec, observed),
    )  # fmt: skip


# -- the router ------------------------------------------------------------------------------


def router_ready_replicas(name: str, observed: Observed) -> int:
    """Ready pods of `<name>-router`, as its Deployment's status says."""
    live = observed.children.get(("Deployment", router.router_name(name))) or {}
    return int((live.get("status") or {}).get("readyReplicas") or 0)


def service_via_router(
    owner: serving.Owner, spec: crd.AutoGLMDeploymentSpec, observed: Observed
) -> bool:
    """Whether Service `<name>` selects the router: once a router pod is ready (make before
    break: until then it keeps selecting the serving pods), and from then on for good, so a
    router that loses its replicas for a while does not flip the Service back and forth."""
    if not spec.router.enabled:
        return False
    live = observed.children.get(("Service", serving.service_name(owner.name))) or {}
    selector = (live.get("spec") or {}).get("selector") or {}
    already = selector == serving.router_selector_labels(owner.name)
    return already or router_ready_replicas(owner.name, observed) > 0


def router_children_to_delete(
    owner: serving.Owner, spec: crd.AutoGLMDeploymentSpec, observed: Observed
) -> tuple[Key, ...]:
    """spec.router.enabled false: the router's children that still exist, once Service
    `<name>` selects the serving pods again (this pass's update comes back first)."""
    if spec.router.enabled:
        return ()
    live = observed.children.get(("Service", serving.service_name(owner.name))) or {}
    selector = (live.get("spec") or {}).get("selector") or {}
    if selector == serving.router_selector_labels(owner.name):
        return ()
    return tuple(
        key
        for key in router.keys(owner.name)
        if key in observed.children and not pods_.is_terminating(observed.children[key])
    )


def gateway_children_to_delete(
    owner: serving.Owner, spec: crd.AutoGLMDeploymentSpec, observed: Observed
) -> tuple[Key, ...]:
    """spec.gateway.enabled false: the pool and the picker's Service that still exist (only
    ours are observed: a same-named object someone else made is left alone)."""
    if spec.gateway.enabled:
        return ()
    return tuple(
        key
        for key in gateway.keys(owner.name)
        if key in observed.children and not pods_.is_terminating(observed.children[key])
    )


def gateway_observed(name: str, observed: Observed) -> tuple[Key, ...]:
    """Which of spec.gateway's objects this deployment holds now."""
    return tuple(key for key in gateway.keys(name) if key in observed.children)


def gateway_due(memory: ReconcileMemory, now: float) -> bool:
    """A failed attempt at the gateway's objects has waited out its backoff."""
    return memory.gateway_problem is not None and now >= memory.gateway_retry_at


def rolling_step_for(
    owner: serving.Owner,
    spec: crd.AutoGLMDeploymentSpec,
    observed: Observed,
    decided: int | None,
) -> RollingStep:
    """switchStrategy Rolling: the replicas each mode's Deployment should have now."""
    current = deployment_split(observed.children, owner.name)
    if decided is None:  # a restarted operator: what the last one decided, from status
        stored = ((observed.body.get("status") or {}).get("adaptiveState") or {}).get(
            "batchingTarget"
        )
        decided = int(stored) if stored is not None else None
    target = rolling_batching_target(spec, decided, current)
    hashes = {
        mode: serving.template_hash(serving.pod_template(owner.name, spec, mode)) or ""
        for mode in Mode
    }
    return rolling_step(
        spec.replicas, target, current or {}, observed.pods, hashes, spec.gpu_resource_name
    )


def _to_mark(step: RollingStep, pods: list[dict[str, Any]]) -> tuple[Retire, ...]:
    """The pods to retire that do not carry the lowest deletion cost yet."""
    by_name = {p["metadata"]["name"]: p for p in pods}
    marks = []
    for name in step.retire:
        pod = by_name[name]
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get(DELETION_COST_ANNOTATION) != RETIRE_COST:
            marks.append(Retire(name, pods_.pod_mode(pod)))
    return tuple(marks)


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


def admin_secret_read_due(memory: ReconcileMemory, pods: Sequence[pods_.Pod], now: float) -> bool:
    """Whether this pass reads the admin Secret by name. The operator neither lists nor watches
    Secrets (least privilege: a watch RBAC grants on Secrets covers every Secret in scope), so it
    reads this one when something says it may have changed or be needed: on the loop's first
    pass, after its own write, after a refused or missing token (memory.admin_secret_stale),
    when a serving pod appeared since the last read (it mounts the Secret: one deleted or
    emptied by hand is made again before it is missed), and while a serving pod is not ready,
    at most every ADMIN_SECRET_RECHECK_SECONDS. A quiet deployment costs no read."""
    if memory.admin_secret_stale:
        return True
    live = [p for p in pods if pods_.is_live(p)]
    if any(p["metadata"]["name"] not in memory.admin_secret_pods for p in live):
        return True
    waiting = any(not pods_.is_ready(p) for p in live)
    return waiting and now - memory.admin_secret_read_at >= ADMIN_SECRET_RECHECK_SECONDS


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


def _batching_deployment_to_delete(
    owner: serving.Owner,
    spec: crd.AutoGLMDeploymentSpec,
    observed: Observed,
    desired_hashes: frozenset[str],
) -> tuple[Key, ...]:
    """Back from Rolling to InPlace: drop `<name>-batching` once `<name>` serves every
    replica with the current template (make-before-break for the strategy change too)."""
    key = ("Deployment", serving.deployment_name(owner.name, Mode.BATCHING))
    stale = observed.children.get(key)
    if stale is None or pods_.is_terminating(stale):
        return ()
    current_ready = sum(
        1
        for p in observed.pods
        if pods_.is_live(p) and pods_.is_ready(p) and pods_.pod_template_hash(p) in desired_hashes
    )
    return (key,) if current_ready >= spec.replicas else ()


# -- the adaptive pass's modes ---------------------------------------------------------------


def plan_modes(
    inp: pass_data.PassInput,
    observation: pass_data.Observation,
    repaired: Sequence[pass_data.RepairOutcome] | None = None,
) -> pass_data.ModePlan:
    """The modes part of an iteration's plan: the repairs, the decision (policy, pure) over the
    pods as they leave them (as planned, or as `repaired` says they went), then flips in place
    or the Rolling share. InPlace and Rolling differ only in the plan this returns."""
    repairs = planning.plan_repairs(inp.pods, observation) if repaired is None else ()
    done = [r.expected for r in repairs] if repaired is None else list(repaired)
    seen = planning.seen(inp, observation, done)
    decision = planning.pass_decision(inp, seen)

    def target(decided: int | None) -> int:
        return rolling_batching_target(inp.spec, decided, inp.deployment_split)

    return planning.mode_plan(inp, repairs, seen, decision, target)


# -- one loop iteration: one plan --------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """What one loop iteration observed: the object, the spec (or why it cannot be used), and,
    when the adaptive pass is due, what it read (each pod's runtime mode, the metrics)."""

    owner: serving.Owner
    observed: Observed
    spec: crd.AutoGLMDeploymentSpec
    generation: int
    now: float  # wall-clock time, for the status's timestamps
    problem: status_.Problem | None = None  # invalid spec, missing Secret, blocked
    modes: pass_data.PassInput | None = None  # the adaptive pass is due
    observation: pass_data.Observation | None = None


@dataclass(frozen=True)
class IterationPlan:
    """Everything one loop iteration does, in the order the executor does it: the modes (the
    repairs, the hysteresis state to announce, the flips), the children (create or apply, pods to
    label or retire, the admin Secret, a child to delete), and the status as planned."""

    inputs: Inputs
    modes: pass_data.ModePlan | None  # None: the adaptive pass is not due
    children: Plan | None  # None: nothing changed since the last pass, or a problem blocks it
    reconcile: bool  # the reconcile pass is due: its status fields are computed
    fingerprint: Any  # what the reconcile pass saw (the loop remembers it once applied)
    batching_target: int | None  # switchStrategy Rolling: the share the children step toward
    status: Settled  # the status as planned: every entry going as planned


@dataclass(frozen=True)
class Settled:
    """The status one iteration leaves, and what goes with it (condition Events, the adaptive
    pass's report, the ready replicas for the gauges)."""

    status: dict[str, Any]
    flipped: tuple[dict[str, Any], ...] = ()  # reconcile conditions whose status changed
    report: pass_data.PassResult | None = None
    ready_replicas: int | None = None


def latest_status(observed: Observed, memory: ReconcileMemory) -> dict[str, Any]:
    """The status as last written when the watch has not delivered that write yet (the object
    is still at the version the write was based on), else as observed."""
    rv = str(observed.body["metadata"].get("resourceVersion"))
    if memory.status_written is not None and memory.status_written[0] == rv:
        return memory.status_written[1]
    return dict(without_empty(observed.body.get("status") or {}))


def plan_iteration(
    inputs: Inputs,
    memory: ReconcileMemory,
    now: float,
    repaired: Sequence[pass_data.RepairOutcome] | None = None,
) -> IterationPlan:
    """The one planning function of a loop iteration (no I/O, no clock: `now` is monotonic
    time, the adaptive pass's wall time is in its input). `repaired`: plan again from what the
    repairs did, when that was not what the first plan expected."""
    modes = None
    if inputs.modes is not None and inputs.observation is not None:
        modes = plan_modes(inputs.modes, inputs.observation, repaired)
    target = memory.batching_target  # no pass now: what the last one decided
    if modes is not None:  # the pass decides it (None under InPlace)
        target = modes.rolling.batching_target if modes.rolling is not None else None
    fingerprint = (inputs.observed.fingerprint(), target)
    reconcile = now >= memory.retry_at and (
        fingerprint != memory.fingerprint
        or has_pending(memory.written, now)
        or gateway_due(memory, now)
    )
    children = None
    if reconcile and inputs.problem is None:
        children = plan_pass(
            inputs.owner, inputs.spec, inputs.observed, _with_target(memory, target), now
        )
    expected = [
        pass_data.FlipOutcome(s.flip.pod, s.flip.from_mode, s.flip.to_mode, True)
        for s in (modes.switches if modes is not None else ())
    ]
    partial = IterationPlan(inputs, modes, children, reconcile, fingerprint, target, Settled({}))
    return IterationPlan(
        inputs, modes, children, reconcile, fingerprint, target,
        settle(partial, memory, expected, inputs.problem),
    )  # fmt: skip


def _with_target(memory: ReconcileMemory, target: int | None) -> ReconcileMemory:
    """The loop's memory as the children plan reads it: with this iteration's Rolling share."""
    if target == memory.batching_target:
        return memory
    return replace(memory, batching_target=target)


def settle(
    the_plan: IterationPlan,
    memory: ReconcileMemory,
    flips: Sequence[pass_data.FlipOutcome],
    problem: status_.Problem | None,
) -> Settled:
    """The status the iteration leaves: the planned one with what the executor reported
    folded in (how each flip went, an API error the children hit). Pure."""
    inputs = the_plan.inputs
    report = None
    current = latest_status(inputs.observed, memory)
    if the_plan.modes is not None and inputs.modes is not None:
        report = report_.report(inputs.modes, the_plan.modes, flips)
        part = report_.status_part(inputs.modes, report)
        current = status_.overlay(current, part or {})
    if not the_plan.reconcile and problem is None:
        return Settled(current, (), report)
    meta = inputs.observed.body["metadata"]
    router_deployment = inputs.observed.children.get(
        ("Deployment", router.router_name(meta["name"]))
    )
    update = status_.compute(
        name=meta["name"],
        namespace=meta["namespace"],
        generation=inputs.generation,
        spec=inputs.spec,
        deployment=inputs.observed.deployment,
        pods=inputs.observed.pods,
        router_pods=inputs.observed.router_pods,
        current=current,
        now=pol.iso_time(inputs.now),
        problem=problem,
        router=router_deployment,
        gateway_children=gateway_observed(meta["name"], inputs.observed),
        gateway_problem=memory.gateway_problem if inputs.spec.gateway.enabled else None,
    )
    full = status_.overlay(current, update.status)
    return Settled(full, tuple(update.flipped), report, int(update.status["readyReplicas"]))
