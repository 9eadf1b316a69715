"""kopf handlers: indexes of the children, and one level-based reconcile loop per object.

Each AutoGLMDeployment gets a daemon that, every second, compares the desired children (pure
builders) with the children kopf's indexes hold in memory (fed by watch streams, filtered
server-side by the managed-by label). Only a difference costs an API call, so a quiet cluster
costs none; a missed event, an operator restart or a hand edit is repaired on the next pass.
One loop per object also means one writer per object: no two handlers race on its children.

An iteration: observe (reconcile/observe.py, from the indexes; when spec.adaptive.intervalSeconds
is due, adaptive_pass.AdaptivePass.observe reads each pod's runtime mode and the metrics), plan
(iteration.plan_iteration, pure: one plan holding the mode repairs and flips, the children and the
planned status), execute (io/executor.py, which carries the plan out on the API server; after a
repair that did not go as planned the iteration plans again before anything flips), status
(iteration.settle, pure, folds what the executor reported into the planned status; one write, only
when it changed, apart from the hysteresis state written before a flip touches a pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from typing import Any

import kopf
from pydantic import ValidationError

from autoglm_api.standby import Activity, activity_of
from autoglm_operator.adaptive import pass_data
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.handlers import adaptive_pass
from autoglm_operator.handlers import settings as settings_
from autoglm_operator.io import executor
from autoglm_operator.io.metrics import METRICS
from autoglm_operator.io.router_client import RouterReader
from autoglm_operator.reconcile import status as status_
from autoglm_operator.reconcile.children import gateway, router, serving
from autoglm_operator.reconcile.iteration import (
    Inputs,
    IterationPlan,
    Settled,
    latest_status,
    plan_iteration,
    settle,
)
from autoglm_operator.reconcile.memory import ReconcileMemory, admin_secret_read_due
from autoglm_operator.reconcile.observe import INDEXES, Observed, admin_secret_view, observe
from autoglm_operator.reconcile.pass_plan import Plan
from autoglm_operator.reconcile.rolling import DELETION_COST_ANNOTATION, deployment_split
from autoglm_operator.reconcile.standby import StandbyPlan
from autoglm_operator.resource import names
from autoglm_operator.resource import pods as pods_
from autoglm_operator.resource.spec import GROUP, PLURAL, VERSION, AutoGLMDeploymentSpec

AGD = (GROUP, VERSION, PLURAL)
CHILD_FILTER = {names.MANAGED_BY_LABEL: names.MANAGER}

# -- indexes: the children, in memory, keyed by (namespace, owner name) ----------------------


def _key(namespace: str | None, labels: kopf.Labels) -> tuple[str, str]:
    return str(namespace), str(labels.get(names.INSTANCE_LABEL, ""))


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


# Unresolved (and so empty) while the cluster lacks the InferencePool CRD; kopf picks the CRD up
# when it is installed, in scope Cluster (it watches CRDs there).
@kopf.index(gateway.GROUP, gateway.VERSION, gateway.PLURAL, labels=CHILD_FILTER)
def owned_inferencepools(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> Any:
    return {_key(namespace, labels): _trim(body)}


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


# -- one iteration of the reconcile loop --------------------------------------------------


@dataclass(frozen=True)
class ModeStep:
    """The adaptive pass of this iteration, observed: its input, what it read, and where the
    plan's mode entries land (pod labels, the runtime admin API, the announce)."""

    input: pass_data.PassInput
    observation: pass_data.Observation
    io: adaptive_pass.KubeIO


@dataclass(frozen=True)
class Done:
    """What an iteration did: the status it left, and whether its adaptive part failed."""

    settled: Settled
    modes_failed: bool = False


class PodEntries:
    """Where the plan's pod entries that need a runtime's admin token go: scaleToZero's sleeps
    and wakes (executor.sleep_and_wake, with the adaptive pass's clients and tokens). A pod
    whose entry failed waits STANDBY_RETRY_SECONDS before the next try."""

    def __init__(self, adaptive: adaptive_pass.AdaptivePass, logger: kopf.Logger) -> None:
        self.adaptive = adaptive
        self.logger = logger

    async def sleep_and_wake(self, plan: StandbyPlan, inputs: Inputs, state: ReconcileMemory
                             ) -> list[executor.PodOutcome]:  # fmt: skip
        now = time.monotonic()
        views = {pods_.name(p): pods_.view(p) for p in inputs.observed.pods}
        due = [(pod, views[pod].ip, pod in plan.sleep) for pod in (*plan.sleep, *plan.wake)
               if pod in views and state.standby_retry_at.get(pod, 0.0) <= now]
        if not due:
            return []
        try:
            clients = await self.adaptive.clients([views[pod] for pod, _, _ in due])
        except executor.MissingAdminToken as missing:
            clients = {}
            self.logger.warning(f"Sleep and wake wait for the admin token: {missing}")
        outcomes = await executor.sleep_and_wake(
            self.adaptive.executor, inputs.owner.namespace, due, clients,
            inputs.spec.scale_to_zero.sleep.level)
        for outcome in outcomes:
            if outcome.done:
                state.standby_retry_at.pop(outcome.pod, None)
                self.logger.info(f"Pod {outcome.pod}: {outcome.action}")
            else:
                self.logger.warning(f"Pod {outcome.pod}: not {outcome.action.lower()}, "
                                    f"retrying: {outcome.detail}")
                state.standby_retry_at[outcome.pod] = now + settings_.STANDBY_RETRY_SECONDS
        return outcomes


class Reconciler:
    """One iteration of the reconcile loop after the indexes are read: check the spec and what
    it references (observe), plan (one pure function, iteration.plan_iteration), execute, write
    status once."""

    def __init__(self, client: executor.Kube, logger: kopf.Logger):
        self.executor = executor.Executor(client, logger)
        self.logger = logger
        self.routers = RouterReader(router.METRICS_PORT)

    async def pass_once(
        self,
        body: kopf.Body,
        observed: Observed,
        state: ReconcileMemory,
        step: ModeStep | None = None,
        entries: PodEntries | None = None,
    ) -> Done:
        """Observe the rest (spec, references), plan once, execute (modes, then children),
        settle the status and write it once. A failed adaptive part is planned away: the
        children and the status go ahead without it."""
        inputs = await self._inputs(body, observed, state, step)
        now = time.monotonic()
        the_plan = plan_iteration(inputs, state, now)
        if the_plan.standby.lowers(sum(1 for p in observed.pods if pods_.is_live(p))):
            # Scaling down or to sleep cuts what a router relays: decide on reports read
            # right now, never on one a second old.
            inputs = replace(inputs, activity=await self._activity(inputs.spec, observed, state))
            the_plan = plan_iteration(inputs, state, now)
        flips: list[pass_data.FlipOutcome] = []
        failed = False
        if the_plan.modes is not None and step is not None:
            try:
                the_plan, flips = await self._modes(the_plan, step.io, state, now)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.logger.exception("Adaptive pass failed; retrying")
                failed = True
                the_plan = plan_iteration(replace(inputs, modes=None), state, now)
        marked = await self._mark_victims(the_plan)
        problem = await self._children(body, the_plan, state)
        outcomes: list[executor.PodOutcome] = []
        if entries is not None:
            outcomes = await entries.sleep_and_wake(the_plan.standby, inputs, state)
        METRICS.observe_pod_entries(inputs.owner.namespace, inputs.owner.name,
                                    [*marked, *outcomes])
        settled = settle(the_plan, state, flips, problem or inputs.problem)
        try:
            await self._write_status(body, the_plan, state, settled)
        except executor.ApiError as err:
            state.fingerprint = None
            problem = _failed(self.logger, body, inputs, state, err)
            settled = settle(the_plan, state, flips, problem)
            await self._write_status(body, the_plan, state, settled)  # reports the failure
        return Done(settled, failed)

    async def read_admin_secret(self, observed: Observed, state: ReconcileMemory) -> bool:
        """Read the admin Secret by name when memory.admin_secret_read_due says so; whether it
        was read (into state.admin_secret)."""
        now = time.monotonic()
        if not admin_secret_read_due(state, observed.pods, now):
            return False
        meta = observed.body["metadata"]
        try:
            secret = await self.executor.get(
                "Secret", meta["namespace"], serving.admin_secret_name(meta["name"])
            )
        except executor.ApiError as err:
            self.logger.warning(f"Could not read the admin Secret; retrying: {err}")
            return False
        state.admin_secret = admin_secret_view(secret)
        state.admin_secret_read_at, state.admin_secret_stale = now, False
        state.admin_secret_pods = frozenset(p["metadata"]["name"] for p in observed.pods)
        return True

    async def _inputs(
        self, body: kopf.Body, observed: Observed, state: ReconcileMemory, step: ModeStep | None
    ) -> Inputs:
        """The spec (or why it cannot be used) and the referenced objects (observe)."""
        meta = observed.body["metadata"]
        generation = int(meta.get("generation") or 1)
        problem: status_.Problem | None = None
        try:
            spec = AutoGLMDeploymentSpec.model_validate(observed.body.get("spec") or {})
        except ValidationError as exc:
            spec = AutoGLMDeploymentSpec()
            problem = status_.Problem("InvalidSpec", str(exc).replace("\n", " "))
        if state.blocked and state.blocked[0] != generation:
            state.blocked = None  # the spec changed: try again
        if state.blocked:
            problem = state.blocked[1]
        elif problem is None and time.monotonic() >= state.retry_at:
            problem = await self._check_references(body, spec, meta["namespace"], generation, state)
        await self._read_scalers(spec, meta, state)
        activity = await self._activity(spec, observed, state)
        if step is not None:
            seen = step.observation
            if seen.reading is not None and seen.reading.samples is not None:
                state.samples = (time.monotonic(), seen.reading.samples)
            state.inflight = dict(seen.inflight)
        return Inputs(
            owner=serving.Owner(meta["name"], meta["namespace"], meta["uid"]),
            observed=observed,
            spec=spec,
            generation=generation,
            now=time.time(),
            problem=problem,
            modes=step.input if step else None,
            observation=step.observation if step else None,
            scalers=state.scalers if _sized(spec) else (),
            activity=activity,
            samples=_recent(state, spec),
            inflight=state.inflight,
        )

    async def _activity(
        self, spec: AutoGLMDeploymentSpec, observed: Observed, state: ReconcileMemory
    ) -> Activity:
        """With scaleToZero or autoscaling on, what the router pods hold and relay, read from
        each; a router pod that is gone is forgotten at once."""
        if not (_sized(spec) and spec.router.enabled):
            state.router_readings = {}
            return Activity()
        pods = [(pods_.name(p), ip) for p in observed.router_pods
                if (ip := (p.get("status") or {}).get("podIP"))]
        limit = spec.router.hold.queue_size + (spec.router.limits.max_inflight or 65536)
        fresh = await self.routers.read(pods, limit)
        live = {name for name, _ in pods}
        state.router_readings = {name: reading for name, reading in
                                 {**state.router_readings, **fresh}.items() if name in live}
        # A held request waits at most waitSeconds: a report older than that and a read
        # interval is of requests that are gone, whatever became of its router.
        stale_after = spec.router.hold.wait_seconds + settings_.RECONCILE_INTERVAL_SECONDS
        return activity_of(list(state.router_readings.values()), time.time(), stale_after)

    async def _read_scalers(
        self, spec: AutoGLMDeploymentSpec, meta: dict[str, Any], state: ReconcileMemory
    ) -> None:
        """With scaleToZero or autoscaling on, list the autoscalers of the namespace now and
        then (no watch: they are not our children); one the list cannot see is kept as last
        seen."""
        if not _sized(spec) or time.monotonic() < state.scalers_due_at:
            return
        state.scalers_due_at = time.monotonic() + settings_.SCALERS_INTERVAL_SECONDS
        try:
            state.scalers = await self.executor.call(
                self.executor.scalers_of, meta["namespace"], meta["name"])
        except executor.ApiError as err:
            self.logger.warning(f"Could not list HorizontalPodAutoscalers: {err}")

    async def _mark_victims(self, the_plan: IterationPlan) -> list[executor.PodOutcome]:
        """Before a step down: its victims marked cheapest to delete (once each)."""
        marked = {pods_.name(p) for p in the_plan.inputs.observed.pods
                  if DELETION_COST_ANNOTATION in (p["metadata"].get("annotations") or {})}
        due = [pod for pod in the_plan.victims if pod not in marked]
        outcomes = await executor.mark_for_removal(
            self.executor, the_plan.inputs.owner.namespace, due)
        for outcome in outcomes:
            if not outcome.done:
                self.logger.warning(f"Could not mark pod {outcome.pod} for removal (the "
                                    f"ReplicaSet chooses): {outcome.detail}")
        return outcomes

    async def _modes(
        self,
        the_plan: IterationPlan,
        io: executor.ModeActuator,
        state: ReconcileMemory,
        now: float,
    ) -> tuple[IterationPlan, list[pass_data.FlipOutcome]]:
        """The plan's mode entries; after a repair that did not go as planned, the whole
        iteration is planned again (the Rolling share, and so the children, may change)."""
        carried = [the_plan]

        def replan(repaired: list[pass_data.RepairOutcome]) -> pass_data.ModePlan:
            carried.append(plan_iteration(the_plan.inputs, state, now, repaired))
            assert carried[-1].modes is not None
            return carried[-1].modes

        assert the_plan.modes is not None
        _, flips = await executor.execute_modes(the_plan.modes, io, replan)
        state.batching_target = carried[-1].batching_target
        return carried[-1], flips

    async def _children(
        self, body: kopf.Body, the_plan: IterationPlan, state: ReconcileMemory
    ) -> status_.Problem | None:
        """Apply the plan's children; an API error is the iteration's problem (retried)."""
        if not the_plan.reconcile:
            return None
        try:
            if the_plan.children is not None:
                await self.executor.apply(body, the_plan.children, the_plan.inputs.observed, state)
                await self._gateway(body, the_plan.children, the_plan.inputs, state)
        except executor.ApiError as err:
            state.fingerprint = None
            return _failed(self.logger, body, the_plan.inputs, state, err)
        except executor.NameTaken as taken:
            # Retried with backoff: the other object's deletion is no event this operator sees.
            state.fingerprint = None
            delay = _back_off(state)
            problem = status_.Problem("NameTaken", f"{taken} (checking again in {delay:.0f}s)")
            return _warn(self.logger, body, problem)
        state.fingerprint = the_plan.fingerprint
        state.failures = 0
        return None

    async def _gateway(
        self, body: kopf.Body, children: Plan, inputs: Inputs, state: ReconcileMemory
    ) -> None:
        """spec.gateway's objects: a problem with them is kept for the status (Degraded) and
        retried on its own backoff; the serving children went ahead already."""
        if not inputs.spec.gateway.enabled:
            state.gateway_problem, state.gateway_failures, state.gateway_retry_at = None, 0, 0.0
        if not children.gateway and not children.delete_gateway:
            return
        problem = await self.executor.apply_gateway(body, children, inputs.observed, state)
        if problem is None:
            state.gateway_problem, state.gateway_failures, state.gateway_retry_at = None, 0, 0.0
            return
        state.gateway_failures += 1
        state.gateway_retry_at = time.monotonic() + _delay(state.gateway_failures)
        if problem != state.gateway_problem:
            self.logger.warning(problem.message)
        state.gateway_problem = problem

    async def _check_references(
        self,
        body: kopf.Body,
        spec: AutoGLMDeploymentSpec,
        namespace: str,
        generation: int,
        state: ReconcileMemory,
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
        self, body: kopf.Body, the_plan: IterationPlan, state: ReconcileMemory, settled: Settled
    ) -> None:
        """The iteration's one status write, only when it changes status; then its Events."""
        observed = the_plan.inputs.observed
        meta = observed.body["metadata"]
        METRICS.observe_standby(meta["namespace"], meta["name"], the_plan.standby.status)
        if settled.ready_replicas is not None:
            # The replicas that should run now: none are missing while scaleToZero holds 0.
            METRICS.replicas.labels(meta["namespace"], meta["name"]).set(
                the_plan.standby.replicas)
            METRICS.ready_replicas.labels(meta["namespace"], meta["name"]).set(
                settled.ready_replicas
            )
        written = await self.executor.write_status_if_changed(observed, state, settled.status)
        METRICS.observe_fleet(meta["namespace"], meta["name"], the_plan.fleet.status,
                              [e.reason for e in the_plan.fleet.events] if written else [])
        if written:
            for cond in settled.flipped:
                _announce(body, cond, previous=observed.body.get("status") or {})
            standby = the_plan.standby
            for event in (*the_plan.fleet.events, *standby.events):
                executor.event(body, warning=event.warning, reason=event.reason,
                               message=event.message)
            if standby.woke_after is not None:
                METRICS.wake_seconds.labels(meta["namespace"], meta["name"]).observe(
                    standby.woke_after)

    async def write_part(
        self, observed: Observed, state: ReconcileMemory, part: dict[str, Any]
    ) -> None:
        """Fields of the adaptive pass over the latest status: the announce before a flip, the
        one write an iteration makes besides its last (a crash mid-flip keeps the cooldown)."""
        latest = latest_status(observed, state)
        await self.executor.write_status_if_changed(observed, state, status_.overlay(latest, part))


def _names(inputs: Inputs) -> tuple[str, str]:
    return inputs.owner.namespace, inputs.owner.name


def _sized(spec: AutoGLMDeploymentSpec) -> bool:
    """The replica count follows demand: scale to zero, or autoscaling."""
    return spec.scale_to_zero.enabled or spec.autoscaling.enabled


def _recent(state: ReconcileMemory, spec: AutoGLMDeploymentSpec) -> Samples | None:
    """The adaptive pass's last metrics while they are recent (three of its intervals): older
    ones say nothing about the demand now."""
    if state.samples is None:
        return None
    read_at, samples = state.samples
    recent = time.monotonic() - read_at <= 3 * spec.adaptive.interval_seconds
    return samples if recent else None


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
    """The one loop per object: observe (memory; the runtimes and metrics when the adaptive
    pass is due), plan (pure), execute, write status once and only the difference."""
    indexes = {index: kwargs[index] for index in INDEXES}
    reconciler = Reconciler(memo.kube, logger)
    state = ReconcileMemory()
    adaptive = adaptive_pass.AdaptivePass(reconciler.executor, str(namespace), name)
    entries = PodEntries(adaptive, logger)
    try:
        while not stopped:
            observed = observe(body, str(namespace), name, uid, indexes, state.admin_secret)
            if await reconciler.read_admin_secret(observed, state):
                observed = observe(body, str(namespace), name, uid, indexes, state.admin_secret)
            step = None
            if adaptive.due(observed.body):
                step = await _observe_modes(adaptive, reconciler, observed, state, logger)
            try:
                done = await reconciler.pass_once(body, observed, state, step, entries)
            except executor.ApiError as err:
                logger.warning(f"Could not write status; retrying: {err}")
                adaptive.retry_soon()
            else:
                _after_modes(adaptive, step, done, body)
                if step is not None and step.io.unauthorized:
                    state.admin_secret_stale = True  # a token was refused: read it again
            await stopped.wait(settings_.RECONCILE_INTERVAL_SECONDS)
    finally:
        await adaptive.close()
        await reconciler.routers.close()
        METRICS.forget(str(namespace), name)
        for gauge in (METRICS.replicas, METRICS.ready_replicas):
            with contextlib.suppress(KeyError):
                gauge.remove(str(namespace), name)


async def _observe_modes(
    adaptive: adaptive_pass.AdaptivePass,
    reconciler: Reconciler,
    observed: Observed,
    state: ReconcileMemory,
    logger: kopf.Logger,
) -> ModeStep | None:
    """The adaptive pass's observe step (each pod's runtime mode, the metrics); None when it
    cannot run now (it is retried soon)."""
    live = [pods_.view(p) for p in observed.pods if pods_.is_live(p)]
    split = deployment_split(observed.children, observed.body["metadata"]["name"])

    async def announce(part: dict[str, Any]) -> None:
        await reconciler.write_part(observed, state, part)

    try:
        inp, observation, io = await adaptive.observe(observed.body, live, announce, split)
    except asyncio.CancelledError:
        raise
    except executor.MissingAdminToken as missing:
        logger.warning(f"Adaptive pass waits for the admin token: {missing}")
        state.admin_secret_stale = True
    except Exception:
        logger.exception("Adaptive pass failed; retrying")
    else:
        return ModeStep(inp, observation, io)
    adaptive.retry_soon()
    return None


def _after_modes(
    adaptive: adaptive_pass.AdaptivePass,
    step: ModeStep | None,
    done: Done,
    body: kopf.Body,
) -> None:
    """The adaptive pass's metrics and Events, once its status is written."""
    report = done.settled.report
    if done.modes_failed:
        adaptive.retry_soon()
    elif step is not None and report is not None:
        adaptive.finish(step.input, report, step.io)
        adaptive.post_events(report, body)


def _failed(
    logger: kopf.Logger,
    body: kopf.Body,
    inputs: Inputs,
    state: ReconcileMemory,
    err: executor.ApiError,
) -> status_.Problem:
    """Temporary errors retry with exponential backoff; permanent ones wait for a spec change."""
    if err.temporary:
        delay = _back_off(state)
        problem = status_.Problem("ReconcileFailed", f"{err} (retrying in {delay:.0f}s)")
    else:
        state.failures += 1
        problem = status_.Problem("ReconcileRejected", f"{err}; change the spec to retry.")
        state.blocked = (inputs.generation, problem)
    return _warn(logger, body, problem)


def _back_off(state: ReconcileMemory) -> float:
    """One more failure in a row: the next pass waits exponentially longer (its delay)."""
    state.failures += 1
    delay = _delay(state.failures)
    state.retry_at = time.monotonic() + delay
    return delay


def _delay(failures: int) -> float:
    """Exponential backoff after `failures` failures in a row, capped."""
    return min(settings_.MAX_BACKOFF_SECONDS, 2.0 ** min(failures, 10))


def _warn(logger: kopf.Logger, body: kopf.Body, problem: status_.Problem) -> status_.Problem:
    executor.event(body, warning=True, reason=problem.reason, message=problem.message)
    logger.warning(problem.message)
    return problem
