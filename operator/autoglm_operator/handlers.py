"""kopf handlers: indexes of the children, and one level-based reconcile loop per object.

Each AutoGLMDeployment gets a daemon that, every second, compares the desired children (pure
builders) with the children kopf's indexes hold in memory (fed by watch streams, filtered
server-side by the managed-by label). Only a difference costs an API call, so a quiet cluster
costs none; a missed event, an operator restart or a hand edit is repaired on the next pass.
One loop per object also means one writer per object: no two handlers race on its children.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from autoglm_operator import adaptive_handlers, builders, kube, plan
from autoglm_operator import pods as pods_
from autoglm_operator import policy as pol
from autoglm_operator import settings as settings_
from autoglm_operator import spec as crd
from autoglm_operator import status as status_
from autoglm_operator.operator_metrics import METRICS
from autoglm_runtime.profiles import MODE_LABEL, Mode

AGD = (crd.GROUP, crd.VERSION, crd.PLURAL)
CHILD_FILTER = {builders.MANAGED_BY_LABEL: builders.MANAGER}

# -- indexes: the children, in memory, keyed by (namespace, owner name) ----------------------


def _key(namespace: str | None, labels: kopf.Labels) -> tuple[str, str]:
    return str(namespace), str(labels.get(builders.INSTANCE_LABEL, ""))


def _trim(body: kopf.Body) -> dict[str, Any]:
    obj = {k: v for k, v in dict(body).items() if k not in ("status",)}
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    obj["metadata"] = meta
    return obj


@kopf.index("apps", "v1", "deployments", labels=CHILD_FILTER)
def owned_deployments(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    obj = _trim(body)
    obj["status"] = dict(body.get("status") or {})  # the rollout's progress
    return {_key(namespace, labels): obj}


@kopf.index("", "v1", "services", labels=CHILD_FILTER)
def owned_services(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {_key(namespace, labels): _trim(body)}


@kopf.index("", "v1", "configmaps", labels=CHILD_FILTER)
def owned_configmaps(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {_key(namespace, labels): _trim(body)}


@kopf.index("policy", "v1", "poddisruptionbudgets", labels=CHILD_FILTER)
def owned_pdbs(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {_key(namespace, labels): _trim(body)}


@kopf.index("", "v1", "secrets", labels=CHILD_FILTER)
def owned_secrets(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    # Only whether a token is there: the token itself stays out of the operator's memory.
    data = body.get("data") or {}
    return {
        _key(namespace, labels): {
            "kind": "Secret",
            "metadata": _trim(body)["metadata"],
            "hasToken": bool(data.get(builders.ADMIN_TOKEN_KEY)),
        }
    }


@kopf.index("", "v1", "pods", labels=CHILD_FILTER)
def owned_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    status = body.get("status") or {}
    return {
        _key(namespace, labels): {
            "metadata": _trim(body)["metadata"],
            "status": {
                "phase": status.get("phase"),
                "podIP": status.get("podIP"),
                "conditions": list(status.get("conditions") or []),
                "containerStatuses": list(status.get("containerStatuses") or []),
            },
        }
    }


# -- one reconcile pass ----------------------------------------------------------------------


def _owned(obj: dict[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


@dataclass
class LoopState:
    """What one object's loop remembers between passes (lost on restart, by design)."""

    written: dict[plan.Key, plan.Written] = field(default_factory=dict)
    labelled: dict[str, str] = field(default_factory=dict)  # pod -> resourceVersion seen
    fingerprint: Any = None
    checked_generation: int | None = None
    blocked: tuple[int, status_.Problem] | None = None  # permanent, until the spec changes
    failures: int = 0
    retry_at: float = 0.0
    status_written: tuple[dict[str, Any], str] | None = None  # (status, rv it was based on)
    # switchStrategy Rolling: the batching replicas the adaptive pass wants (None: not decided
    # in this process yet; the plan then reads what a previous operator persisted in status).
    batching_target: int | None = None


@dataclass(frozen=True)
class Observed:
    body: dict[str, Any]
    deployment: dict[str, Any] | None
    children: dict[plan.Key, dict[str, Any]]
    secret: dict[str, Any] | None
    pods: list[dict[str, Any]]

    def fingerprint(self) -> Any:
        def rv(obj: dict[str, Any]) -> str:
            return str((obj.get("metadata") or {}).get("resourceVersion"))

        objs = [*self.children.values(), *self.pods, *([self.secret] if self.secret else [])]
        return rv(self.body), tuple(sorted(rv(o) for o in objs))


class Reconciler:
    def __init__(self, client: kube.Kube, logger: kopf.Logger):
        self.kube = client
        self.logger = logger

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def pass_once(self, body: kopf.Body, observed: Observed, state: LoopState) -> None:
        meta = observed.body["metadata"]
        namespace = meta["namespace"]
        generation = int(meta.get("generation") or 1)
        problem: status_.Problem | None = None
        try:
            spec = crd.AutoGLMDeploymentSpec.model_validate(observed.body.get("spec") or {})
        except ValidationError as exc:
            spec = crd.AutoGLMDeploymentSpec()
            problem = status_.Problem("InvalidSpec", str(exc).replace("\n", " "))

        if state.blocked and state.blocked[0] != generation:
            state.blocked = None  # the spec changed: try again
        if state.blocked:
            problem = state.blocked[1]
        elif problem is None:
            problem = await self._check_references(body, spec, namespace, generation, state)
        if problem is None:
            problem = await self._converge(body, observed, spec, state)

        await self._write_status(body, observed, spec, generation, problem, state)

    async def _check_references(
        self,
        body: kopf.Body,
        spec: crd.AutoGLMDeploymentSpec,
        namespace: str,
        generation: int,
        state: LoopState,
    ) -> status_.Problem | None:
        """Referenced objects the user owns: checked once per generation (one GET)."""
        if state.checked_generation == generation or spec.api_key_secret_ref is None:
            return None
        ref = spec.api_key_secret_ref
        secret = await self.call(self.kube.get, "Secret", namespace, ref.name)
        if secret is None or ref.key not in (secret.get("data") or {}):
            what = "does not exist" if secret is None else f"has no key {ref.key!r}"
            problem = status_.Problem(
                "SecretNotFound",
                f"apiKeySecretRef: Secret {ref.name!r} {what}; "
                "fix the Secret, then change the spec to retry.",
            )
            state.blocked = (generation, problem)
            kube.event(body, warning=True, reason=problem.reason, message=problem.message)
            self.logger.warning(problem.message)
            return problem
        state.checked_generation = generation
        return None

    async def _converge(
        self,
        body: kopf.Body,
        observed: Observed,
        spec: crd.AutoGLMDeploymentSpec,
        state: LoopState,
    ) -> status_.Problem | None:
        meta = observed.body["metadata"]
        owner = builders.Owner(meta["name"], meta["namespace"], meta["uid"])
        desired_hashes = builders.desired_template_hashes(owner.name, spec)
        desired_hash = ", ".join(sorted(desired_hashes))
        surge = plan.surge_allowed(spec, desired_hashes, observed.deployment, observed.pods)
        split = None
        if builders.rolling(spec):
            step = self._rolling_step(owner, spec, observed, state.batching_target)
            await self._retire(body, owner, step, observed.pods)
            split = step.split
        desired = builders.children(owner, spec, surge=surge, split=split)
        now = time.monotonic()
        actions = plan.plan_children(desired, observed.children, state.written, now=now)
        for action in actions:
            kind, child = action.key
            rollout = plan.is_rollout(action, observed.children)
            old = observed.children.get(action.key)
            result = await self.call(self.kube.apply, action.manifest)
            state.written[action.key] = plan.Written(
                digest=builders.digest(action.manifest),
                resource_version=str(result["metadata"]["resourceVersion"]),
                based_on=str((old or {}).get("metadata", {}).get("resourceVersion") or ""),
                at=now,
            )
            if action.verb == "create":
                message = f"Created {kind} {child}"
                kube.event(body, reason="Created", message=message)
            elif rollout:
                message = f"Rolling Deployment {child} to pod template {desired_hash}"
                kube.event(body, reason="RollingOut", message=message)
            else:
                message = f"Updated {kind} {child}: {plan.describe_update(old, action.manifest)}"
                kube.event(body, reason="Updated", message=message)
            self.logger.info(message)

        await self._ensure_admin_secret(body, owner, observed.secret, state)
        await self._label_new_pods(owner, spec, observed.pods, state)
        if not builders.rolling(spec):
            await self._remove_batching_deployment(body, owner, spec, observed, desired_hashes)
        return None

    def _rolling_step(
        self,
        owner: builders.Owner,
        spec: crd.AutoGLMDeploymentSpec,
        observed: Observed,
        decided: int | None,
    ) -> plan.RollingStep:
        """switchStrategy Rolling: the replicas each mode's Deployment should have now."""
        current = plan.deployment_split(observed.children, owner.name)
        if decided is None:  # a restarted operator: what the last one decided, from status
            stored = ((observed.body.get("status") or {}).get("adaptiveState") or {}).get(
                "batchingTarget"
            )
            decided = int(stored) if stored is not None else None
        target = plan.rolling_batching_target(spec, decided, current)
        hashes = {
            mode: builders.template_hash(builders.pod_template(owner.name, spec, mode)) or ""
            for mode in Mode
        }
        return plan.rolling_step(
            spec.replicas, target, current or {}, observed.pods, hashes, spec.gpu_resource_name
        )

    async def _retire(
        self,
        body: kopf.Body,
        owner: builders.Owner,
        step: plan.RollingStep,
        pods: list[dict[str, Any]],
    ) -> None:
        """Mark the old-mode pods a shrinking Deployment must remove (their replacements are
        ready, or cannot start without their GPUs): the ReplicaSet removes the lowest deletion
        cost first."""
        by_name = {p["metadata"]["name"]: p for p in pods}
        for name in step.retire:
            pod = by_name[name]
            annotations = pod["metadata"].get("annotations") or {}
            if annotations.get(plan.DELETION_COST_ANNOTATION) == plan.RETIRE_COST:
                continue
            patch = {"metadata": {"annotations": {plan.DELETION_COST_ANNOTATION: plan.RETIRE_COST}}}
            await self.call(self.kube.merge_patch, "Pod", owner.namespace, name, patch)
            mode = pods_.pod_mode(pod)
            new = "batching" if mode is Mode.STREAMING else "streaming"
            message = (
                f"Replacing {mode.value if mode else 'unlabelled'} pod {name} with a {new} pod "
                "(switchStrategy Rolling): removing it now that its replacement is ready, or "
                "needs its GPUs"
            )
            kube.event(body, reason="PodReplaced", message=message)
            self.logger.info(message)

    async def _remove_batching_deployment(
        self,
        body: kopf.Body,
        owner: builders.Owner,
        spec: crd.AutoGLMDeploymentSpec,
        observed: Observed,
        desired_hashes: frozenset[str],
    ) -> None:
        """Back from Rolling to InPlace: drop `<name>-batching` once `<name>` serves every
        replica with the current template (make-before-break for the strategy change too)."""
        name = builders.deployment_name(owner.name, Mode.BATCHING)
        stale = observed.children.get(("Deployment", name))
        if stale is None or pods_.is_terminating(stale):
            return
        current_ready = sum(
            1
            for p in observed.pods
            if pods_.is_live(p)
            and pods_.is_ready(p)
            and pods_.pod_template_hash(p) in desired_hashes
        )
        if current_ready < spec.replicas:
            return
        await self.call(self.kube.delete, "Deployment", owner.namespace, name)
        message = f"Deleted Deployment {name}: switchStrategy is InPlace"
        kube.event(body, reason="Deleted", message=message)
        self.logger.info(message)

    async def _ensure_admin_secret(
        self,
        body: kopf.Body,
        owner: builders.Owner,
        secret: dict[str, Any] | None,
        state: LoopState,
    ) -> None:
        """Generate the admin token once; only a missing or emptied Secret gets a new one."""
        key = ("Secret", builders.admin_secret_name(owner.name))
        seen = str(((secret or {}).get("metadata") or {}).get("resourceVersion") or "")
        written = state.written.get(key)
        if secret is not None and secret.get("hasToken"):
            if written and seen == written.resource_version:
                del state.written[key]  # our write is back: what happens next is someone else's
            return
        if (
            written
            and written.based_on == seen
            and time.monotonic() - written.at < plan.WATCH_GRACE_SECONDS
        ):
            return  # we still see what our write replaced: it has not come back yet
        manifest = builders.admin_secret(owner, secrets.token_urlsafe(32))
        if secret is None:
            result = await self.call(self.kube.create, manifest)
            verb = "Created"
        else:
            result = await self.call(self.kube.apply, manifest)
            verb = "Updated"
        if result is not None:
            message = f"{verb} Secret {key[1]} with a new admin token"
            kube.event(body, reason=verb, message=message)
            self.logger.info(message)
        rv = str(((result or {}).get("metadata") or {}).get("resourceVersion") or "")
        state.written[key] = plan.Written("", rv, seen, time.monotonic())

    async def _label_new_pods(
        self,
        owner: builders.Owner,
        spec: crd.AutoGLMDeploymentSpec,
        pods: list[dict[str, Any]],
        state: LoopState,
    ) -> None:
        """A new pod starts in the initial mode; the label routes it to its mode's Service."""
        mode = builders.initial_mode(spec).value
        by_name = {p["metadata"]["name"]: p for p in pods}
        state.labelled = {k: v for k, v in state.labelled.items() if k in by_name}
        for pod in plan.pods_to_label(pods):
            rv = str(by_name[pod]["metadata"].get("resourceVersion"))
            if state.labelled.get(pod) == rv:
                continue  # labelled already; the watch has not caught up
            patch = {"metadata": {"labels": {MODE_LABEL: mode}}}
            await self.call(self.kube.merge_patch, "Pod", owner.namespace, pod, patch)
            state.labelled[pod] = rv
            self.logger.info(f"Labelled pod {pod} {MODE_LABEL}={mode}")

    async def _write_status(
        self,
        body: kopf.Body,
        observed: Observed,
        spec: crd.AutoGLMDeploymentSpec,
        generation: int,
        problem: status_.Problem | None,
        state: LoopState,
    ) -> None:
        meta = observed.body["metadata"]
        update = status_.compute(
            name=meta["name"],
            namespace=meta["namespace"],
            generation=generation,
            spec=spec,
            deployment=observed.deployment,
            pods=observed.pods,
            current=observed.body.get("status"),
            now=pol.iso_time(time.time()),
            problem=problem,
        )
        METRICS.replicas.labels(meta["namespace"], meta["name"]).set(spec.replicas)
        METRICS.ready_replicas.labels(meta["namespace"], meta["name"]).set(
            update.status["readyReplicas"]
        )
        if not update.changed:
            state.status_written = None
            return
        rv = str(meta.get("resourceVersion"))
        if state.status_written == (_comparable(update.status), rv):
            return  # written already from this very version; the watch has not caught up
        await self.call(self.kube.apply_status, meta["namespace"], meta["name"], update.status)
        state.status_written = (_comparable(update.status), rv)
        for cond in update.flipped:
            _announce(body, cond, previous=observed.body.get("status") or {})


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    """The status without transition times (a second compute in the same pass gives a new now)."""
    return {
        **status,
        "conditions": [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status["conditions"]
        ],
    }


def _announce(body: kopf.Body, cond: dict[str, Any], previous: dict[str, Any]) -> None:
    """Events for the condition changes people act on."""
    was = {c.get("type"): c.get("status") for c in previous.get("conditions") or []}
    kind, state = cond["type"], cond["status"]
    if kind == status_.DEGRADED and state == "True":
        kube.event(body, warning=True, reason=cond["reason"], message=cond["message"])
    elif kind == status_.DEGRADED and was.get(kind) == "True":
        kube.event(body, reason="Recovered", message="No problems observed any more.")
    elif kind == status_.PROGRESSING and state == "False" and was.get(kind) == "True":
        kube.event(body, reason=cond["reason"], message=cond["message"])


def observe(
    body: kopf.Body,
    namespace: str,
    name: str,
    uid: str,
    indexes: dict[str, kopf.Index[Any, Any]],
) -> Observed:
    key = (namespace, name)

    def owned(index: str) -> list[dict[str, Any]]:
        return [o for o in indexes[index].get(key, []) if _owned(o, uid)]

    children: dict[plan.Key, dict[str, Any]] = {}
    for index, kind in (
        ("owned_deployments", "Deployment"),
        ("owned_services", "Service"),
        ("owned_configmaps", "ConfigMap"),
        ("owned_pdbs", "PodDisruptionBudget"),
    ):
        for obj in owned(index):
            children[(kind, obj["metadata"]["name"])] = {"kind": kind, **obj}
    secret_name = builders.admin_secret_name(name)
    secret = next((s for s in owned("owned_secrets") if s["metadata"]["name"] == secret_name), None)
    # Pods are owned by ReplicaSets, not by us: the instance label places them.
    pods = list(indexes["owned_pods"].get(key, []))
    return Observed(
        body=dict(body),
        deployment=children.get(("Deployment", name)),
        children=children,
        secret=secret,
        pods=pods,
    )


# -- kopf wiring -----------------------------------------------------------------------------


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings_.configure_kopf(settings)
    memo.kube = kube.Kube.from_environment(user_agent=f"{kube.USER_AGENT}/reconciler")


INDEXES = (
    "owned_deployments",
    "owned_services",
    "owned_configmaps",
    "owned_pdbs",
    "owned_secrets",
    "owned_pods",
)


@kopf.daemon(*AGD, id="reconcile", cancellation_timeout=10.0)
async def reconcile(
    body: kopf.Body,
    name: str,
    namespace: str | None,
    uid: str,
    memo: Any,
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
    **kwargs: Any,
) -> None:
    """The one loop per object: observe (memory), the adaptive pass when due, plan (pure),
    write only the difference."""
    indexes = {index: kwargs[index] for index in INDEXES}
    reconciler = Reconciler(memo.kube, logger)
    state = LoopState()
    adaptive = adaptive_handlers.AdaptiveLoop(memo.kube, str(namespace), name)
    interval = settings_.RECONCILE_INTERVAL_SECONDS
    try:
        while not stopped:
            observed = observe(body, str(namespace), name, uid, indexes)
            if time.monotonic() >= adaptive.due_at:
                await _adaptive_pass(adaptive, body, observed, state, logger)
            fingerprint = (observed.fingerprint(), state.batching_target)
            now = time.monotonic()
            due = now >= state.retry_at
            if due and (fingerprint != state.fingerprint or plan.has_pending(state.written, now)):
                try:
                    await reconciler.pass_once(body, observed, state)
                    state.fingerprint = fingerprint
                    state.failures = 0
                except kube.ApiError as err:
                    state.fingerprint = None
                    await _failed(reconciler, body, observed, state, err)
            await stopped.wait(interval)
    finally:
        await adaptive.close()
        METRICS.forget(str(namespace), name)
        for gauge in (METRICS.replicas, METRICS.ready_replicas):
            with contextlib.suppress(KeyError):
                gauge.remove(str(namespace), name)


async def _adaptive_pass(
    adaptive: adaptive_handlers.AdaptiveLoop,
    body: kopf.Body,
    observed: Observed,
    state: LoopState,
    logger: kopf.Logger,
) -> None:
    """Flip modes (InPlace) or decide the batching share the plan steps toward (Rolling)."""
    live = [pods_.view(p) for p in observed.pods if pods_.is_live(p)]
    split = plan.deployment_split(observed.children, observed.body["metadata"]["name"])
    try:
        result = await adaptive.run_once(observed.body, live, body, split)
    except asyncio.CancelledError:
        raise
    except adaptive_handlers.MissingAdminToken as missing:
        logger.warning(f"Adaptive pass waits for the admin token: {missing}")
        adaptive.retry_soon()
    except Exception:
        logger.exception("Adaptive pass failed; retrying")
        adaptive.retry_soon()
    else:
        state.batching_target = result.batching_target


async def _failed(
    reconciler: Reconciler,
    body: kopf.Body,
    observed: Observed,
    state: LoopState,
    err: kube.ApiError,
) -> None:
    """Temporary errors retry with exponential backoff; permanent ones wait for a spec change."""
    state.failures += 1
    meta = observed.body["metadata"]
    generation = int(meta.get("generation") or 1)
    if err.temporary:
        delay = min(settings_.MAX_BACKOFF_SECONDS, 2.0 ** min(state.failures, 10))
        state.retry_at = time.monotonic() + delay
        problem = status_.Problem("ReconcileFailed", f"{err} (retrying in {delay:.0f}s)")
    else:
        problem = status_.Problem("ReconcileRejected", f"{err}; change the spec to retry.")
        state.blocked = (generation, problem)
    kube.event(body, warning=True, reason=problem.reason, message=problem.message)
    reconciler.logger.warning(problem.message)
    try:
        spec = crd.AutoGLMDeploymentSpec.model_validate(observed.body.get("spec") or {})
        await reconciler._write_status(body, observed, spec, generation, problem, state)
    except (kube.ApiError, ValidationError) as again:
        reconciler.logger.warning(f"Could not report the failure in status: {again}")
