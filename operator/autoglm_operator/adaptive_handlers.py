"""kopf wiring of the adaptive loop: one daemon per AutoGLMDeployment, a pod index, metrics.

kopf timers have one fixed interval per handler, but spec.adaptive.intervalSeconds differs per
object and may change, so each object gets a daemon that sleeps its own interval (read live
from the body on every pass) and stops at once when the object goes away.

Pods come from a kopf index fed by the pod watch, not from a list call per pass, so a quiet
loop costs the apiserver nothing: API calls happen only to flip (pod label patch), to read the
admin token (once per daemon, again after the runtime refuses it) and to write status when it
changed.

Import this module (for example from handlers.py) to register the handlers.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import kopf

from autoglm_operator import builders, kube
from autoglm_operator import spec as crd
from autoglm_operator.adaptive import (
    OWNED_CONDITIONS,
    PassInput,
    PassResult,
    PodView,
    run_pass,
)
from autoglm_operator.operator_metrics import METRICS, start_server
from autoglm_operator.prom import PrometheusReader, Reading
from autoglm_operator.runtime_client import (
    RuntimeClient,
    RuntimeUnauthorized,
    SetModeResult,
)
from autoglm_runtime.profiles import MODE_LABEL, Mode

logger = logging.getLogger(__name__)

# After an unexpected error a pass is retried sooner than a full interval, but not in a hot loop.
ERROR_RETRY_SECONDS = 5.0


# -- Kubernetes access -----------------------------------------------------------------------

# Our own field manager: server-side apply then owns exactly the status fields this loop writes
# (its two conditions, lastDecision, decisionHistory, adaptiveState); status.py's manager owns
# the rest, and neither apply can remove the other's conditions from the list-map.
FIELD_MANAGER = "autoglm-adaptive"
OWNED_STATUS_FIELDS = ("lastDecision", "decisionHistory", "adaptiveState")

_kube: kube.Kube | None = None


def kube_client() -> kube.Kube:
    global _kube
    if _kube is None:
        _kube = kube.Kube.from_environment()
    return _kube


def read_admin_token(namespace: str, name: str) -> str | None:
    """The runtime admin token; None while the Secret does not exist yet."""
    secret = kube_client().get("Secret", namespace, builders.admin_secret_name(name))
    if secret is None:
        return None
    encoded = (secret.get("data") or {}).get(builders.ADMIN_TOKEN_KEY)
    if not encoded:
        raise kopf.TemporaryError(
            f"Secret {builders.admin_secret_name(name)} has no key {builders.ADMIN_TOKEN_KEY!r}",
            delay=15,
        )
    return base64.b64decode(encoded).decode()


def patch_pod_mode(namespace: str, pod: str, mode: Mode) -> None:
    patched = kube_client().merge_patch(
        "Pod", namespace, pod, {"metadata": {"labels": {MODE_LABEL: mode.value}}}
    )
    if patched is None:
        raise LookupError(f"pod {pod} is gone")


def _without_empty(value: Any) -> Any:
    """Drop empty objects: server-side apply stores an applied `{}` as null, which the
    schema then rejects (`metrics: Invalid value: "null"`); the CRD default fills them back."""
    if isinstance(value, Mapping):
        pruned = {k: _without_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v != {} and v is not None}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


def owned_status(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Every status field this loop owns: an apply that omitted one would delete it."""
    merged = {**current, **patch}
    owned: dict[str, Any] = {
        "conditions": [
            c for c in merged.get("conditions") or [] if c.get("type") in OWNED_CONDITIONS
        ]
    }
    for key in OWNED_STATUS_FIELDS:
        if merged.get(key) is not None:
            owned[key] = merged[key]
    return dict(_without_empty(owned))


def apply_status(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    body = {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "status": dict(status),
    }
    kube_client().request(
        "PATCH",
        kube.path_for(crd.KIND, namespace, name, "status"),
        body=body,
        query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        content_type="application/apply-patch+yaml",
    )


def pod_view(pod: Mapping[str, Any]) -> PodView:
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    label = (metadata.get("labels") or {}).get(MODE_LABEL)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return PodView(
        name=metadata["name"],
        ip=status.get("podIP") or None,
        mode=Mode(label) if label in {m.value for m in Mode} else None,
        ready=ready,
    )


# -- handlers --------------------------------------------------------------------------------


@kopf.on.startup()
async def start_operator_metrics(logger: kopf.Logger, **_: Any) -> None:
    port = start_server()
    if port:
        logger.info(f"Serving operator metrics on :{port}/metrics")


@kopf.index("", "v1", "pods", labels={builders.MANAGED_BY_LABEL: builders.MANAGER})
def adaptive_pods(
    namespace: str | None, meta: kopf.Meta, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], PodView] | None:
    """Live pods of each AutoGLMDeployment, keyed by (namespace, instance)."""
    instance = labels.get(builders.INSTANCE_LABEL)
    phase = (body.get("status") or {}).get("phase")
    if not instance or meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
        return None
    return {(namespace, instance): pod_view(body)}


class KubeIO:
    """AdaptiveIO over the Kubernetes API, the runtime admin API and Prometheus."""

    def __init__(
        self,
        namespace: str,
        name: str,
        spec: crd.AutoGLMDeploymentSpec,
        runtime: RuntimeClient | None,
        prometheus: PrometheusReader | None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.spec = spec
        self.runtime = runtime
        self.prometheus = prometheus
        self.unauthorized = False
        self.status: Mapping[str, Any] = {}

    def _runtime(self) -> RuntimeClient:
        if self.runtime is None:
            raise RuntimeUnauthorized(f"no admin token for {self.namespace}/{self.name}")
        return self.runtime

    async def read_metrics(self, pods: Sequence[str]) -> Reading:
        if self.prometheus is None:
            raise ValueError("adaptive.prometheus.url is not set")
        return await asyncio.to_thread(self.prometheus.read, self.namespace, pods)

    async def set_label(self, pod: str, mode: Mode) -> None:
        await asyncio.to_thread(patch_pod_mode, self.namespace, pod, mode)

    async def runtime_mode(self, ip: str) -> Mode:
        try:
            return (await self._runtime().get_mode(ip)).mode
        except RuntimeUnauthorized:
            self.unauthorized = True
            raise

    async def set_runtime_mode(self, ip: str, mode: Mode) -> SetModeResult:
        try:
            return await self._runtime().set_mode(ip, mode)
        except RuntimeUnauthorized:
            self.unauthorized = True
            raise

    async def announce(self, status_patch: dict[str, Any]) -> None:
        owned = owned_status(self.status, status_patch)
        await asyncio.to_thread(apply_status, self.namespace, self.name, owned)


def _plain(value: Any) -> Any:
    """kopf's body views to plain dicts and lists, for pydantic."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def record(namespace: str, name: str, result: PassResult, dry_run: bool) -> None:
    if result.decision is not None:
        METRICS.decisions.labels(namespace, name, result.decision.reason).inc()
        if dry_run:
            for flip in result.decision.flips:
                METRICS.flips.labels(namespace, name, flip.to_mode.value, "dry_run").inc()
    for outcome in result.flips:
        status = "applied" if outcome.applied else "failed"
        METRICS.flips.labels(namespace, name, outcome.to_mode.value, status).inc()
        if outcome.applied:
            METRICS.flip_seconds.observe(outcome.seconds)
    for repair in result.repairs:
        METRICS.repairs.labels(namespace, name, repair.action).inc()
    METRICS.observe_reading(namespace, name, result.reading)


class DeploymentLoop:
    """The state one daemon keeps in memory: HTTP sessions (runtime and Prometheus, kept alive
    between passes) and the admin token."""

    def __init__(self, namespace: str, name: str) -> None:
        self.namespace = namespace
        self.name = name
        self.session: aiohttp.ClientSession | None = None
        self.token: str | None = None
        self.prometheus: PrometheusReader | None = None

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.prometheus is not None:
            self.prometheus.close()

    def _prometheus(self, source: crd.PrometheusSource) -> PrometheusReader | None:
        """One reader per deployment, made again only when its Prometheus settings change."""
        if self.prometheus is not None and self.prometheus.source == source:
            return self.prometheus
        if self.prometheus is not None:
            self.prometheus.close()
            self.prometheus = None
        if source.url:
            self.prometheus = PrometheusReader(source, observer=METRICS.observe_query)
        return self.prometheus

    async def _client(self) -> RuntimeClient | None:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        if self.token is None:
            self.token = await asyncio.to_thread(read_admin_token, self.namespace, self.name)
            if self.token is None:
                logger.info("Admin Secret of %s/%s not there yet", self.namespace, self.name)
                return None
        return RuntimeClient(self.session, self.token)

    async def run_once(
        self, body: Mapping[str, Any], pods: Sequence[PodView], posted: kopf.Body
    ) -> float:
        spec = crd.AutoGLMDeploymentSpec.model_validate(_plain(body.get("spec") or {}))
        started = time.perf_counter()
        status = _plain(body.get("status") or {})
        io = KubeIO(
            self.namespace,
            self.name,
            spec,
            await self._client(),
            self._prometheus(spec.adaptive.prometheus),
        )
        io.status = status
        result = await run_pass(
            PassInput(
                namespace=self.namespace,
                name=self.name,
                generation=(body.get("metadata") or {}).get("generation"),
                spec=spec,
                status=status,
                pods=sorted(pods, key=lambda p: p.name),
                now=time.time(),
            ),
            io,
        )
        if io.unauthorized:
            self.token = None  # rotated or not yet mounted: read the Secret again next pass
        if result.status_patch:
            owned = owned_status(status, result.status_patch)
            await asyncio.to_thread(apply_status, self.namespace, self.name, owned)
        for event in result.events:
            kopf.event(posted, type=event.type, reason=event.reason, message=event.message)
        METRICS.pass_seconds.observe(time.perf_counter() - started)
        record(self.namespace, self.name, result, spec.adaptive.dry_run)
        return float(spec.adaptive.interval_seconds)


@kopf.daemon(crd.GROUP, crd.VERSION, crd.PLURAL, id="adaptive", cancellation_timeout=10.0)
async def adaptive_daemon(
    name: str,
    namespace: str | None,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    index: kopf.Index[tuple[str | None, str], PodView] = kwargs["adaptive_pods"]
    loop = DeploymentLoop(str(namespace), name)
    try:
        while not stopped:
            try:
                pods: list[PodView] = list(index.get((namespace, name), []))
                interval = await loop.run_once(body, pods, body)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Adaptive pass failed; retrying")
                interval = ERROR_RETRY_SECONDS
            await stopped.wait(interval)
    finally:
        await loop.close()
        METRICS.forget(str(namespace), name)
