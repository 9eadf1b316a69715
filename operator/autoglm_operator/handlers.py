"""kopf handlers: indexes of the children, and one level-based reconcile loop per object.

Each AutoGLMDeployment gets a daemon that, every second, compares the desired children (pure
builders) with the children kopf's indexes hold in memory (fed by watch streams, filtered
server-side by the managed-by label). Only a difference costs an API call, so a quiet cluster
costs none; a missed event, an operator restart or a hand edit is repaired on the next pass.
One loop per object also means one writer per object: no two handlers race on its children.

A pass: observe (observe.py, from the indexes), the adaptive pass when
spec.adaptive.intervalSeconds is due (adaptive_handlers.py: it flips modes in place, or under
switchStrategy Rolling hands the batching share to the plan in memory), plan (plan.plan_pass,
pure), execute (executor.py, the one module that writes to the API server), status: one
write per iteration, only when it changed, carrying both passes' fields (the adaptive pass's
wait in LoopState.adaptive_status for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import kopf
from pydantic import ValidationError

from autoglm_operator import adaptive_handlers, builders, executor, plan, router_builders
from autoglm_operator import pods as pods_
from autoglm_operator import policy as pol
from autoglm_operator import settings as settings_
from autoglm_operator import spec as crd
from autoglm_operator import status as status_
from autoglm_operator.observe import INDEXES, Observed, observe
from autoglm_operator.operator_metrics import METRICS

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


@kopf.index("", "v1", "serviceaccounts", labels=CHILD_FILTER)
def owned_serviceaccounts(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> Any:
    return {_key(namespace, labels): _trim(body)}


@kopf.index("rbac.authorization.k8s.io", "v1", "roles", labels=CHILD_FILTER)
def owned_roles(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {_key(namespace, labels): _trim(body)}


@kopf.index("rbac.authorization.k8s.io", "v1", "rolebindings", labels=CHILD_FILTER)
def owned_rolebindings(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> Any:
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

LoopState = plan.LoopState


class Reconciler:
    """One reconcile pass: validate, check references, plan (pure), execute, status."""

    def __init__(self, client: executor.Kube, logger: kopf.Logger):
        self.executor = executor.Executor(client, logger)
        self.logger = logger

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
            owner = builders.Owner(meta["name"], namespace, meta["uid"])
            the_plan = plan.plan_pass(owner, spec, observed, state, time.monotonic())
            await self.executor.apply(body, the_plan, observed, state)

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
        secret = await self.executor.get("Secret", namespace, ref.name)
        if secret is None or ref.key not in (secret.get("data") or {}):
            what = "does not exist" if secret is None else f"has no key {ref.key!r}"
            problem = status_.Problem(
                "SecretNotFound",
                f"apiKeySecretRef: Secret {ref.name!r} {what}; "
                "fix the Secret, then change the spec to retry.",
            )
            state.blocked = (generation, problem)
            executor.event(body, warning=True, reason=problem.reason, message=problem.message)
            self.logger.warning(problem.message)
            return problem
        state.checked_generation = generation
        return None

    async def _write_status(
        self,
        body: kopf.Body,
        observed: Observed,
        spec: crd.AutoGLMDeploymentSpec,
        generation: int,
        problem: status_.Problem | None,
        state: LoopState,
    ) -> None:
        """The iteration's one status write: the reconcile fields and the adaptive pass's part
        over the latest status, applied only when that changes it."""
        meta = observed.body["metadata"]
        current = status_.overlay(latest_status(observed, state), state.adaptive_status or {})
        update = status_.compute(
            name=meta["name"],
            namespace=meta["namespace"],
            generation=generation,
            spec=spec,
            deployment=observed.deployment,
            pods=observed.pods,
            current=current,
            now=pol.iso_time(time.time()),
            problem=problem,
            router=observed.children.get(("Deployment", router_builders.router_name(meta["name"]))),
        )
        METRICS.replicas.labels(meta["namespace"], meta["name"]).set(spec.replicas)
        METRICS.ready_replicas.labels(meta["namespace"], meta["name"]).set(
            update.status["readyReplicas"]
        )
        if await self._write(observed, state, status_.overlay(current, update.status)):
            for cond in update.flipped:
                _announce(body, cond, previous=observed.body.get("status") or {})

    async def write_part(self, observed: Observed, state: LoopState, part: dict[str, Any]) -> None:
        """Fields of the adaptive pass over the latest status: the announce before a flip, or
        the pass's part in an iteration that runs no reconcile pass."""
        await self._write(observed, state, status_.overlay(latest_status(observed, state), part))

    async def _write(self, observed: Observed, state: LoopState, full: dict[str, Any]) -> bool:
        """Apply `full` when it differs from the latest status; whether it was written."""
        meta = observed.body["metadata"]
        full = status_.without_empty(full)
        if full == status_.without_empty(latest_status(observed, state)):
            state.adaptive_status = None  # status says it already
            return False
        await self.executor.write_status(meta["namespace"], meta["name"], full)
        state.status_written = (str(meta.get("resourceVersion")), full)
        state.adaptive_status = None  # written
        return True


def latest_status(observed: Observed, state: LoopState) -> dict[str, Any]:
    """The status as last written when the watch has not delivered that write yet (the object
    is still at the version the write was based on), else as observed."""
    rv = str(observed.body["metadata"].get("resourceVersion"))
    if state.status_written is not None and state.status_written[0] == rv:
        return state.status_written[1]
    return dict(status_.without_empty(observed.body.get("status") or {}))


def _announce(body: kopf.Body, cond: dict[str, Any], previous: dict[str, Any]) -> None:
    """Events for the condition changes people act on."""
    was = {c.get("type"): c.get("status") for c in previous.get("conditions") or []}
    kind, state = cond["type"], cond["status"]
    if kind == status_.DEGRADED and state == "True":
        executor.event(body, warning=True, reason=cond["reason"], message=cond["message"])
    elif kind == status_.DEGRADED and was.get(kind) == "True":
        executor.event(body, reason="Recovered", message="No problems observed any more.")
    elif kind == status_.PROGRESSING and state == "False" and was.get(kind) == "True":
        executor.event(body, reason=cond["reason"], message=cond["message"])


# -- kopf wiring -----------------------------------------------------------------------------


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings_.configure_kopf(settings)
    memo.kube = executor.connect("reconciler")


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
    adaptive = adaptive_handlers.AdaptiveLoop(reconciler.executor, str(namespace), name)
    interval = settings_.RECONCILE_INTERVAL_SECONDS
    try:
        while not stopped:
            observed = observe(body, str(namespace), name, uid, indexes)
            result = None
            if adaptive.due(observed.body):
                result = await _adaptive_pass(adaptive, reconciler, body, observed, state, logger)
            fingerprint = (observed.fingerprint(), state.batching_target)
            now = time.monotonic()
            due = now >= state.retry_at
            if due and (fingerprint != state.fingerprint or plan.has_pending(state.written, now)):
                try:
                    await reconciler.pass_once(body, observed, state)
                    state.fingerprint = fingerprint
                    state.failures = 0
                except executor.ApiError as err:
                    state.fingerprint = None
                    await _failed(reconciler, body, observed, state, err)
            written = await _write_adaptive_part(adaptive, reconciler, observed, state, logger)
            if result is not None and written:
                adaptive.post_events(result, body)
            await stopped.wait(interval)
    finally:
        await adaptive.close()
        METRICS.forget(str(namespace), name)
        for gauge in (METRICS.replicas, METRICS.ready_replicas):
            with contextlib.suppress(KeyError):
                gauge.remove(str(namespace), name)


async def _adaptive_pass(
    adaptive: adaptive_handlers.AdaptiveLoop,
    reconciler: Reconciler,
    body: kopf.Body,
    observed: Observed,
    state: LoopState,
    logger: kopf.Logger,
) -> adaptive_handlers.PassResult | None:
    """Flip modes (InPlace) or decide the batching share the plan steps toward (Rolling); the
    pass's status part waits in `state` for this iteration's one status write."""
    live = [pods_.view(p) for p in observed.pods if pods_.is_live(p)]
    split = plan.deployment_split(observed.children, observed.body["metadata"]["name"])

    async def announce(part: dict[str, Any]) -> None:
        await reconciler.write_part(observed, state, part)

    try:
        result, part = await adaptive.run_once(observed.body, live, announce, split)
    except asyncio.CancelledError:
        raise
    except executor.MissingAdminToken as missing:
        logger.warning(f"Adaptive pass waits for the admin token: {missing}")
        adaptive.retry_soon()
    except Exception:
        logger.exception("Adaptive pass failed; retrying")
        adaptive.retry_soon()
    else:
        state.batching_target = result.batching_target
        state.adaptive_status = part
        return result
    return None


async def _write_adaptive_part(
    adaptive: adaptive_handlers.AdaptiveLoop,
    reconciler: Reconciler,
    observed: Observed,
    state: LoopState,
    logger: kopf.Logger,
) -> bool:
    """The adaptive pass's part when no reconcile pass wrote status in this iteration;
    whether status now holds it."""
    if state.adaptive_status is None:
        return True
    try:
        await reconciler.write_part(observed, state, state.adaptive_status)
    except executor.ApiError as err:
        logger.warning(f"Could not write the adaptive pass's status; retrying: {err}")
        state.adaptive_status = None
        adaptive.retry_soon()
        return False
    return True


async def _failed(
    reconciler: Reconciler,
    body: kopf.Body,
    observed: Observed,
    state: LoopState,
    err: executor.ApiError,
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
    executor.event(body, warning=True, reason=problem.reason, message=problem.message)
    reconciler.logger.warning(problem.message)
    try:
        spec = crd.AutoGLMDeploymentSpec.model_validate(observed.body.get("spec") or {})
        await reconciler._write_status(body, observed, spec, generation, problem, state)
    except (executor.ApiError, ValidationError) as again:
        reconciler.logger.warning(f"Could not report the failure in status: {again}")
