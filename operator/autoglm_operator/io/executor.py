"""Execute: the one module that carries out a pass's plan for an AutoGLMDeployment, on the API
server (through kube.py's client) and on the runtimes' admin API.

It carries out every part of an iteration's plan (iteration.IterationPlan) and reports what each
entry did: the mode entries (pass_data.ModePlan: repairs, the announce, in-place flips: pod
labels, and the runtime admin API through runtime_client; ModeIO, FlipOutcome); the pods a step
down removes (mark_for_removal) and the pods scale to zero puts to sleep or wakes
(sleep_and_wake; PodOutcome); the children (pass_plan.Plan), reporting what it wrote (in the
reconcile memory, and as Events); it writes status (one writer,
one field manager, only when it changed: write_status_if_changed); and it reads the two
objects a pass needs beyond the indexes (a referenced Secret, the admin token). Apart
from leader election (leader.py), nothing else in the operator uses the Kubernetes client
(kube.py); the import contracts keep it so.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

from autoglm_api.profiles import MODE_LABEL, Mode
from autoglm_operator.adaptive import pass_data, report
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive.pass_data import FlipOutcome, RepairOutcome
from autoglm_operator.io import kube
from autoglm_operator.io.runtime_client import (
    RuntimeAdminError,
    RuntimeClient,
    RuntimeUnauthorized,
    SetModeResult,
)
from autoglm_operator.reconcile.children import gateway, serving
from autoglm_operator.reconcile.diff import describe_update
from autoglm_operator.reconcile.iteration import latest_status
from autoglm_operator.reconcile.memory import ReconcileMemory, Written
from autoglm_operator.reconcile.observe import Observed, owned_by
from autoglm_operator.reconcile.pass_plan import Action, AdminSecretWrite, Plan, is_rollout
from autoglm_operator.reconcile.rolling import DELETION_COST_ANNOTATION, RETIRE_COST, Retire
from autoglm_operator.reconcile.standby import SLEEPING_ANNOTATION
from autoglm_operator.reconcile.status import Problem
from autoglm_operator.resource.conditions import without_empty
from autoglm_operator.resource.spec import GROUP, KIND

ApiError = kube.ApiError
Kube = kube.Kube
T = TypeVar("T")

# One field manager owns the whole status (the reconcile pass's fields and the adaptive
# pass's); the managers of earlier versions are released from live objects (write_status).
STATUS_FIELD_MANAGER = kube.STATUS_FIELD_MANAGER


class NameTaken(Exception):
    """A child's name is held by an object this AutoGLMDeployment does not own. Forced
    server-side apply would take it over (a same-named Secret, Role or Deployment someone else
    made); the operator never adopts: it stops and says which object is in the way."""

    def __init__(self, kind: str, name: str, owner: serving.Owner) -> None:
        super().__init__(
            f"{kind} {name} already exists and is not owned by AutoGLMDeployment {owner.name} "
            f"(no ownerReference to it); the operator does not take over objects it did not "
            f"create: delete or rename that {kind}, or give this AutoGLMDeployment another name"
        )


class MissingAdminToken(LookupError):
    """The admin Secret exists but holds no token (yet): the adaptive pass waits and retries."""


def connect(role: str) -> kube.Kube:
    """The client of one role (its user agent names it in the apiserver's audit log)."""
    return kube.Kube.from_environment(user_agent=f"{kube.USER_AGENT}/{role}")


def event(body: Any, *, warning: bool = False, reason: str, message: str) -> None:
    """A Kubernetes Event on the AutoGLMDeployment, through kopf's poster (never blocks)."""
    kube.event(body, warning=warning, reason=reason, message=message)


def retired_status_managers(obj: Mapping[str, Any]) -> list[str]:
    """Retired managers with an entry on the status subresource of `obj` (an apply's answer)."""
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    return sorted(
        {
            str(e.get("manager"))
            for e in entries
            if e.get("manager") in kube.RETIRED_STATUS_MANAGERS and e.get("subresource") == "status"
        }
    )


class Executor:
    def __init__(self, client: kube.Kube, logger: Any) -> None:
        self.kube = client
        self.logger = logger

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    # -- reads a pass needs beyond the indexes ---------------------------------------------------

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.call(self.kube.get, kind, namespace, name)

    def read_admin_tokens(self, namespace: str, name: str) -> dict[str, str] | None:
        """The runtime admin tokens, by pod template digest; None while the Secret does not
        exist yet."""
        secret = self.kube.get("Secret", namespace, serving.admin_secret_name(name))
        if secret is None:
            return None
        tokens = {
            template: base64.b64decode(encoded).decode()
            for key, encoded in (secret.get("data") or {}).items()
            if encoded and (template := serving.template_of_token_key(key))
        }
        if not tokens:
            raise MissingAdminToken(f"Secret {serving.admin_secret_name(name)} holds no token")
        return tokens

    # -- writes ----------------------------------------------------------------------------------

    async def write_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Apply the whole status; then release what a retired manager still owns there."""
        result = await self.call(self.kube.apply_status, namespace, name, status)
        for manager in retired_status_managers(result):
            await self.call(self.kube.release_status, namespace, name, manager)
            self.logger.info(f"Released the status fields field manager {manager} owned")
        return result

    async def write_status_if_changed(
        self, observed: Observed, memory: ReconcileMemory, full: Mapping[str, Any]
    ) -> bool:
        """Apply the whole status `full` when it differs from the latest (iteration.latest_status);
        whether it was written. The loop's memory keeps what was written until the watch
        delivers it, so a stale copy never takes a decision back."""
        meta = observed.body["metadata"]
        pruned = dict(without_empty(full))
        if pruned == without_empty(latest_status(observed, memory)):
            return False
        await self.write_status(meta["namespace"], meta["name"], pruned)
        memory.status_written = (str(meta.get("resourceVersion")), pruned)
        return True

    def scalers_of(self, namespace: str, name: str) -> tuple[str, ...]:
        """The HorizontalPodAutoscalers in `namespace` whose target is this AutoGLMDeployment
        (KEDA's ScaledObject works through one, keda-hpa-<name>)."""
        found = self.kube.list_objects("HorizontalPodAutoscaler", namespace)
        return tuple(sorted(hpa["metadata"]["name"] for hpa in found if _targets(hpa, name)))

    def mark_sleeping(self, namespace: str, pod: str, level: int | None) -> None:
        """Record on the pod that the operator put it to sleep (None: it woke it)."""
        value = None if level is None else str(level)
        self.kube.merge_patch(
            "Pod", namespace, pod, {"metadata": {"annotations": {SLEEPING_ANNOTATION: value}}})

    def mark_for_removal(self, namespace: str, pod: str) -> None:
        """The pod a shrinking Deployment removes (a Rolling switch's old pod, a step down's
        victim): the lowest pod-deletion-cost, which the ReplicaSet controller deletes first."""
        self.kube.merge_patch("Pod", namespace, pod, {"metadata": {"annotations": {
            DELETION_COST_ANNOTATION: RETIRE_COST}}})

    def label_pod(self, namespace: str, pod: str, mode: Mode) -> None:
        """A flip's first and last step: the label routes the pod to its mode's Service."""
        patched = self.kube.merge_patch(
            "Pod", namespace, pod, {"metadata": {"labels": {MODE_LABEL: mode.value}}}
        )
        if patched is None:
            raise LookupError(f"pod {pod} is gone")

    async def apply(
        self, body: Any, the_plan: Plan, observed: Observed, state: ReconcileMemory
    ) -> None:
        """Apply a reconcile plan in order; record each write in the reconcile memory."""
        for retire in the_plan.retire:
            await self._retire(body, the_plan.owner, retire)
        if the_plan.admin_secret:
            await self._admin_secret(body, the_plan.owner, the_plan.admin_secret, observed, state)
        now = time.monotonic()
        for action in the_plan.actions:
            await self._apply_child(body, the_plan, action, observed, state, now)
        for key in the_plan.settled:
            state.written.pop(key, None)
        await self._label(the_plan, observed, state)
        for kind, name in the_plan.delete:
            await self.call(self.kube.delete, kind, the_plan.owner.namespace, name)
            self._report(body, "Deleted", f"Deleted {kind} {name}: switchStrategy is InPlace")
        for kind, name in the_plan.delete_router:
            await self.call(self.kube.delete, kind, the_plan.owner.namespace, name)
            self._report(body, "Deleted", f"Deleted {kind} {name}: router.enabled is false")

    async def apply_gateway(
        self, body: Any, the_plan: Plan, observed: Observed, state: ReconcileMemory
    ) -> Problem | None:
        """spec.gateway's writes, after the serving children and apart from them: what stops
        them (a same-named object not ours, a cluster without the InferencePool CRD, an API
        error) is returned as the gateway's problem, and nothing else waits for it."""
        namespace = the_plan.owner.namespace
        try:
            for kind, name in the_plan.delete_gateway:
                await self.call(self.kube.delete, kind, namespace, name)
                self._report(body, "Deleted", f"Deleted {kind} {name}: gateway.enabled is false")
            now = time.monotonic()
            for action in the_plan.gateway:
                if action.verb == "create" and action.key[0] == gateway.KIND:
                    served = await self.call(self.kube.serves, gateway.API_VERSION, gateway.PLURAL)
                    if not served:
                        return Problem(
                            "InferencePoolCRDMissing", gateway.crd_missing_message(action.key[1])
                        )
                await self._apply_child(body, the_plan, action, observed, state, now)
        except NameTaken as taken:
            return Problem("NameTaken", str(taken))
        except ApiError as err:
            return Problem("GatewayApplyFailed", f"spec.gateway: {err}")
        return None

    def _report(self, body: Any, reason: str, message: str) -> None:
        event(body, reason=reason, message=message)
        self.logger.info(message)

    async def _retire(self, body: Any, owner: serving.Owner, retire: Retire) -> None:
        """Mark an old-mode pod a shrinking Deployment must remove (its replacement is ready,
        or cannot start without its GPUs): the ReplicaSet removes the lowest deletion cost
        first."""
        await self.call(self.mark_for_removal, owner.namespace, retire.pod)
        new = "batching" if retire.mode is Mode.STREAMING else "streaming"
        self._report(
            body,
            "PodReplaced",
            f"Replacing {retire.mode.value if retire.mode else 'unlabelled'} pod {retire.pod} "
            f"with a {new} pod (switchStrategy Rolling): removing it now that its replacement "
            "is ready, or needs its GPUs",
        )

    async def _apply_child(
        self,
        body: Any,
        the_plan: Plan,
        action: Action,
        observed: Observed,
        state: ReconcileMemory,
        now: float,
    ) -> None:
        kind, child = action.key
        rollout = is_rollout(action, observed.children)
        old = observed.children.get(action.key)
        if action.verb == "create":
            await self._refuse_taken(the_plan.owner, kind, child)
        result = await self.call(self.kube.apply, action.manifest)
        state.written[action.key] = Written(
            digest=serving.digest(action.manifest),
            resource_version=str(result["metadata"]["resourceVersion"]),
            based_on=str((old or {}).get("metadata", {}).get("resourceVersion") or ""),
            at=now,
        )
        if action.verb == "create":
            self._report(body, "Created", f"Created {kind} {child}")
        elif rollout:
            message = f"Rolling Deployment {child} to pod template {the_plan.desired_hash}"
            self._report(body, "RollingOut", message)
        else:
            message = f"Updated {kind} {child}: {describe_update(old, action.manifest)}"
            self._report(body, "Updated", message)

    async def _refuse_taken(self, owner: serving.Owner, kind: str, name: str) -> None:
        """The indexes hold only this object's children: one they lack may still exist,
        someone else's (or ours, not delivered yet by the watch)."""
        live = await self.get(kind, owner.namespace, name)
        if live is not None and not owned_by(live, owner.uid):
            raise NameTaken(kind, name, owner)

    async def _admin_secret(
        self,
        body: Any,
        owner: serving.Owner,
        write: AdminSecretWrite,
        observed: Observed,
        state: ReconcileMemory,
    ) -> None:
        """New admin tokens for new pod templates, in a new Secret or the existing one; the
        tokens of templates no pod runs any more dropped."""
        key = ("Secret", serving.admin_secret_name(owner.name))
        seen = str(((observed.secret or {}).get("metadata") or {}).get("resourceVersion") or "")
        tokens = {template: secrets.token_urlsafe(32) for template in write.add}
        if write.verb == "create":
            result = await self.call(self.kube.create, serving.admin_secret(owner, tokens))
            if result is None:  # it exists: another replica's create won, or not ours at all
                await self._refuse_taken(owner, *key)
            verb = "Created"
        else:
            data: dict[str, str | None] = {k: None for k in write.drop}
            data.update(serving.admin_secret(owner, tokens)["data"])
            result = await self.call(
                self.kube.merge_patch, "Secret", owner.namespace, key[1], {"data": data}
            )
            verb = "Updated"
        if result is not None:
            done = [f"a new admin token for pod template {t}" for t in write.add]
            if write.drop:
                done.append(f"dropped {', '.join(write.drop)} (no pod or template uses it)")
            self._report(body, verb, f"{verb} Secret {key[1]}: {'; '.join(done)}")
        rv = str(((result or {}).get("metadata") or {}).get("resourceVersion") or "")
        state.written[key] = Written("", rv, seen, time.monotonic())
        state.admin_secret_stale = True  # no watch brings it back: the next pass reads it

    async def _label(
        self, the_plan: Plan, observed: Observed, state: ReconcileMemory
    ) -> None:
        """A new pod starts in the initial mode; the label routes it to its mode's Service."""
        names = {p["metadata"]["name"] for p in observed.pods}
        state.labelled = {k: v for k, v in state.labelled.items() if k in names}
        mode = the_plan.label_mode.value
        for pod, rv in the_plan.label:
            patch = {"metadata": {"labels": {MODE_LABEL: mode}}}
            await self.call(self.kube.merge_patch, "Pod", the_plan.owner.namespace, pod, patch)
            state.labelled[pod] = rv
            self.logger.info(f"Labelled pod {pod} {MODE_LABEL}={mode}")


# -- pod entries: sleep and wake (scaleToZero), marks before a step down (autoscaling) --------


@dataclass(frozen=True)
class PodOutcome:
    """What one pod entry of a plan did (flips report theirs as FlipOutcome)."""

    pod: str
    action: str  # Slept | Woke | MarkedForRemoval
    done: bool
    detail: str = ""


async def sleep_and_wake(
    executor: Executor,
    namespace: str,
    entries: Sequence[tuple[str, str | None, bool]],
    runtimes: Mapping[str, RuntimeClient],
    level: int,
) -> list[PodOutcome]:
    """Put pods to sleep or wake them through their runtime's admin API, then mark each
    (SLEEPING_ANNOTATION); `entries` are (pod, ip, to_sleep), `runtimes` a client per IP."""

    async def one(pod: str, ip: str | None, to_sleep: bool) -> PodOutcome:
        action = "Slept" if to_sleep else "Woke"
        client = runtimes.get(ip or "")
        try:
            if client is None or ip is None:
                raise RuntimeAdminError(f"pod {pod}: no address or admin token yet")
            if to_sleep:
                await client.sleep_engine(ip, level)
            else:
                await client.wake_engine(ip)
            await executor.call(executor.mark_sleeping, namespace, pod,
                                level if to_sleep else None)
        except (RuntimeAdminError, ApiError) as err:
            return PodOutcome(pod, action, False, str(err))
        return PodOutcome(pod, action, True)

    return list(await asyncio.gather(*(one(*entry) for entry in entries)))


async def mark_for_removal(
    executor: Executor, namespace: str, pods: Sequence[str]
) -> list[PodOutcome]:
    """Before a step down: the pods it removes get the lowest pod-deletion-cost. One that
    cannot be marked leaves the choice to the ReplicaSet (its drain still runs)."""
    outcomes = []
    for pod in pods:
        try:
            await executor.call(executor.mark_for_removal, namespace, pod)
        except ApiError as err:
            outcomes.append(PodOutcome(pod, "MarkedForRemoval", False, str(err)))
        else:
            outcomes.append(PodOutcome(pod, "MarkedForRemoval", True))
    return outcomes


# -- the adaptive pass's plan entries: repairs and in-place flips -----------------------------


class ModeIO:
    """Where a mode plan's entries land (ModeActuator): a pod's label, its runtime's admin API
    (a client per pod IP, with that pod's admin token), and status (the announce)."""

    def __init__(
        self,
        execute: Executor,
        namespace: str,
        name: str,
        runtimes: Mapping[str, RuntimeClient],
        write_status: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        self.executor = execute
        self.namespace = namespace
        self.name = name
        self.runtimes = runtimes  # pod IP -> a client with that pod's admin token
        self.write_status = write_status
        self.unauthorized = False  # a runtime refused its token: read the Secret again
        self.status: Mapping[str, Any] = {}

    def runtime(self, ip: str) -> RuntimeClient:
        runtime = self.runtimes.get(ip)
        if runtime is None:
            raise RuntimeUnauthorized(
                f"no admin token for the pod at {ip} in {self.namespace}/{self.name} yet"
            )
        return runtime

    async def set_label(self, pod: str, mode: Mode) -> None:
        await self.executor.call(self.executor.label_pod, self.namespace, pod, mode)

    async def set_runtime_mode(self, ip: str, mode: Mode) -> SetModeResult:
        try:
            return await self.runtime(ip).set_mode(ip, mode)
        except RuntimeUnauthorized:
            self.unauthorized = True
            raise

    async def announce(self, status_patch: dict[str, Any]) -> None:
        await self.write_status(report.owned_status(self.status, status_patch))


def _targets(hpa: Mapping[str, Any], name: str) -> bool:
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    return (ref.get("kind") == KIND and ref.get("name") == name
            and str(ref.get("apiVersion", "")).split("/")[0] == GROUP)


class ModeActuator(Protocol):
    """Where a mode plan's entries land: a pod's label (Kubernetes), its runtime's admin API
    (runtime_client), and status (the announce before a flip)."""

    async def set_label(self, pod: str, mode: Mode) -> None: ...

    async def set_runtime_mode(self, ip: str, mode: Mode) -> SetModeResult: ...

    async def announce(self, status_patch: dict[str, Any]) -> None: ...


async def repair(repairs: Sequence[pass_data.Repair], io: ModeActuator) -> list[RepairOutcome]:
    """Carry out a plan's repairs, all pods at once; what each did."""
    return list(await asyncio.gather(*(_repair(r, io) for r in repairs)))


async def execute_modes(
    the_plan: pass_data.ModePlan,
    io: ModeActuator,
    replan: Callable[[list[RepairOutcome]], pass_data.ModePlan],
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[pass_data.ModePlan, list[FlipOutcome]]:
    """Carry out a plan's mode entries: the repairs; when one did not go as planned, `replan`
    from what they did before anything flips; then the announce and the flips. The plan
    carried out, and what each flip did."""
    repaired = await repair(the_plan.repairs, io)
    if repaired != [r.expected for r in the_plan.repairs]:
        the_plan = replan(repaired)
    return the_plan, await switch(the_plan, io, clock=clock)


async def switch(
    the_plan: pass_data.ModePlan,
    io: ModeActuator,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> list[FlipOutcome]:
    """Carry out a plan's in-place flips: the announce first (status holds the hysteresis state
    before any pod is touched), then every flip at once; what each did."""
    if not the_plan.switches:
        return []
    assert the_plan.announce is not None
    await io.announce(the_plan.announce)
    flips = (apply_flip(s.flip, s.ip, io, clock=clock) for s in the_plan.switches)
    return list(await asyncio.gather(*flips))


async def apply_flip(
    flip: pol.Flip,
    ip: str | None,
    io: ModeActuator,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> FlipOutcome:
    """Label, PUT, verify; on failure put runtime and label back to where they were."""
    started = clock()
    outcome = partial(FlipOutcome, flip.pod, flip.from_mode, flip.to_mode)
    if not ip:
        return outcome(False, "pod has no IP")
    try:
        await io.set_label(flip.pod, flip.to_mode)
    except Exception as error:
        return outcome(False, f"label patch failed: {error}")
    try:
        result = await io.set_runtime_mode(ip, flip.to_mode)
    except RuntimeAdminError as error:
        detail = f"runtime did not take the mode: {error}"
        if error.retriable:
            # The PUT may have landed before the failure: put the runtime back first.
            try:
                await io.set_runtime_mode(ip, flip.from_mode)
            except RuntimeAdminError as undo:
                detail += f"; runtime revert failed too: {undo}"
        try:
            await io.set_label(flip.pod, flip.from_mode)
        except Exception as undo:
            return outcome(False, f"{detail}; label revert failed: {undo}", mismatch=True)
        return outcome(False, f"{detail}; label reverted")
    return outcome(True, "", seconds=clock() - started, attempts=result.attempts)


async def _repair(entry: pass_data.Repair, io: ModeActuator) -> RepairOutcome:
    pod, label, runtime = entry.pod, entry.label, entry.runtime
    if label is None:
        try:
            await io.set_label(pod, runtime)
        except Exception as error:
            return RepairOutcome(pod, None, runtime, "Failed", f"label patch failed: {error}")
        return RepairOutcome(pod, None, runtime, "Adopted")
    # Finish the flip in flight; if the runtime will not take it, fall back to what it runs.
    try:
        await io.set_runtime_mode(entry.ip, label)
        return RepairOutcome(pod, label, runtime, "Finished")
    except RuntimeAdminError as error:
        detail = f"runtime refused {label.value}: {error}"
    try:
        await io.set_label(pod, runtime)
    except Exception as error:
        return RepairOutcome(pod, label, runtime, "Failed", f"{detail}; {error}")
    return RepairOutcome(pod, label, runtime, "Reverted", detail)
