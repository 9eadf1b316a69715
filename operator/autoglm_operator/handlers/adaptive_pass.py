"""The adaptive pass's observe step and its I/O: Kubernetes, the runtime admin API, Prometheus.

AdaptivePass.observe reads what the pass needs (each ready pod's runtime mode, the metrics:
reads only) and hands the reconcile loop the pass's input; its iteration's one plan
(iteration.plan_iteration) holds its repairs and flips, the executor carries them out through
KubeIO, and AdaptivePass.finish counts what happened.

The pass runs inside each AutoGLMDeployment's one daemon (reconcile.reconcile), every
spec.adaptive.intervalSeconds (read live from the body on every pass). Pods come from that
daemon's pod index, not from a list call per pass, so a quiet pass costs the apiserver nothing:
API calls happen only to flip (pod label patch), to read the admin tokens (once per daemon,
again after a runtime refuses one or a pod of a new template appears: each pod template, each
rollout, has its own) and to write status when it changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import aiohttp
import kopf

from autoglm_api.keepalive import UPSTREAM_POOL_IDLE_SECONDS
from autoglm_api.profiles import Mode
from autoglm_operator.adaptive.pass_data import Observation, PassInput, PassResult
from autoglm_operator.adaptive.planning import PodView
from autoglm_operator.adaptive.signals import Reading
from autoglm_operator.io import executor
from autoglm_operator.io.metrics import METRICS, start_server
from autoglm_operator.io.prom import PrometheusReader
from autoglm_operator.io.runtime_client import (
    RuntimeAdminError,
    RuntimeClient,
    RuntimeMode,
    RuntimeUnauthorized,
)
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec, ModePolicy, PrometheusSource

logger = logging.getLogger(__name__)

# After an unexpected error a pass is retried sooner than a full interval, but not in a hot loop.
ERROR_RETRY_SECONDS = 5.0


# -- handlers --------------------------------------------------------------------------------


@kopf.on.startup()
async def start_operator_metrics(logger: kopf.Logger, **_: Any) -> None:
    port = start_server()
    if port:
        logger.info(f"Serving operator metrics on :{port}/metrics")


# Writes the fields the pass decides over the latest status (the reconcile loop's one status
# writer).
StatusWriter = Callable[[dict[str, Any]], Awaitable[None]]


class KubeIO(executor.ModeIO):
    """ReadIO: where the pass's entries land (executor.ModeIO), and what it reads there: each
    runtime's state and Prometheus."""

    def __init__(
        self,
        execute: executor.Executor,
        namespace: str,
        name: str,
        runtimes: Mapping[str, RuntimeClient],
        prometheus: PrometheusReader | None,
        write_status: StatusWriter,
    ) -> None:
        super().__init__(execute, namespace, name, runtimes, write_status)
        self.prometheus = prometheus

    async def read_metrics(self, pods: Sequence[str]) -> Reading:
        if self.prometheus is None:
            raise ValueError("adaptive.prometheus.url is not set")
        return await asyncio.to_thread(
            self.prometheus.read, self.namespace, pods, deployment=self.name
        )

    async def runtime_state(self, ip: str) -> RuntimeMode:
        try:
            return await self.runtime(ip).get_mode(ip)
        except RuntimeUnauthorized:
            self.unauthorized = True
            raise


class ReadIO(executor.ModeActuator, Protocol):
    """What a pass reads (the metrics, each pod's runtime mode) besides where it writes."""

    async def read_metrics(self, pods: Sequence[str]) -> Reading: ...

    async def runtime_state(self, ip: str) -> RuntimeMode: ...


async def read_observation(inp: PassInput, io: ReadIO) -> Observation:
    """Each ready pod's runtime mode (why not, where its admin API failed), and the metrics
    when the policy reads them."""
    targets = [p for p in inp.pods if p.ready and p.ip]
    errors: dict[str, str] = {}

    async def read(pod: PodView) -> RuntimeMode | None:
        assert pod.ip is not None
        try:
            return await io.runtime_state(pod.ip)
        except RuntimeAdminError as error:
            logger.warning("Could not read the mode of pod %s: %s", pod.name, error)
            errors[pod.name] = str(error)
            return None

    states = await asyncio.gather(*(read(p) for p in targets))
    read_ok = [(p.name, s) for p, s in zip(targets, states, strict=True) if s is not None]
    runtime_modes = {pod: s.mode for pod, s in read_ok}
    inflight = {pod: n for pod, s in read_ok if isinstance(n := s.raw.get("inflight"), int)}
    reading = None
    spec = inp.spec
    adaptive = spec.mode_policy is ModePolicy.ADAPTIVE and not spec.adaptive.paused
    if adaptive or spec.autoscaling.enabled:  # the fleet is sized by the demand it reads
        reading = await io.read_metrics([p.name for p in inp.pods])
    return Observation(runtime_modes, errors, reading, inflight)


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


class AdaptivePass:
    """What the adaptive pass keeps in memory between passes: HTTP sessions (runtime and
    Prometheus, kept alive between passes), the admin tokens, and when the next pass is due."""

    def __init__(self, execute: executor.Executor, namespace: str, name: str) -> None:
        self.executor = execute
        self.namespace = namespace
        self.name = name
        self.session: aiohttp.ClientSession | None = None
        self.tokens: dict[str, str] | None = None  # pod template digest -> admin token
        self.prometheus: PrometheusReader | None = None
        self.due_at = 0.0  # monotonic; the first pass runs at once
        self.generation: int | None = None  # of the spec the last pass read
        self.started = 0.0  # perf_counter when the pass being run began

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.prometheus is not None:
            self.prometheus.close()

    def _prometheus(self, source: PrometheusSource) -> PrometheusReader | None:
        """One reader per deployment, made again only when its Prometheus settings change."""
        if self.prometheus is not None and self.prometheus.source == source:
            return self.prometheus
        if self.prometheus is not None:
            self.prometheus.close()
            self.prometheus = None
        if source.url:
            self.prometheus = PrometheusReader(source, observer=METRICS.observe_query)
        return self.prometheus

    async def clients(self, pods: Sequence[PodView]) -> dict[str, RuntimeClient]:
        """A client per reachable pod, with the token of its pod template."""
        if self.session is None:
            # Idle connections retire before the runtime's keep-alive could close one under a
            # flip (autoglm_api.keepalive).
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=UPSTREAM_POOL_IDLE_SECONDS)
            )
        templates = {p.template for p in pods if p.ip and p.template}
        if self.tokens is None or not templates <= self.tokens.keys():
            # A new template (a rollout) has a new token: read the Secret again.
            self.tokens = await asyncio.to_thread(
                self.executor.read_admin_tokens, self.namespace, self.name
            )
            if self.tokens is None:
                logger.info("Admin Secret of %s/%s not there yet", self.namespace, self.name)
                return {}
        session, tokens = self.session, self.tokens
        return {
            p.ip: RuntimeClient(session, tokens[p.template])
            for p in pods
            if p.ip and p.template in tokens
        }

    async def observe(
        self,
        body: Mapping[str, Any],
        pods: Sequence[PodView],
        write_status: StatusWriter,
        deployment_split: Mapping[Mode, int] | None = None,
    ) -> tuple[PassInput, Observation, KubeIO]:
        """The pass's observe step: its input, what it read (each ready pod's runtime mode, the
        metrics) and where its plan's entries land (`write_status`: the announce)."""
        # Set first: a spec this pass cannot read waits out retry_soon, not a pass per second.
        self.generation = (body.get("metadata") or {}).get("generation")
        spec = AutoGLMDeploymentSpec.model_validate(_plain(body.get("spec") or {}))
        self.started = time.perf_counter()
        status = _plain(body.get("status") or {})
        io = KubeIO(
            self.executor,
            self.namespace,
            self.name,
            await self.clients(pods),
            self._prometheus(spec.adaptive.prometheus),
            write_status,
        )
        io.status = status
        inp = PassInput(
            namespace=self.namespace,
            name=self.name,
            generation=self.generation,
            spec=spec,
            status=status,
            pods=sorted(pods, key=lambda p: p.name),
            now=time.time(),
            deployment_split=deployment_split,
        )
        return inp, await read_observation(inp, io), io

    def finish(self, inp: PassInput, result: PassResult, io: KubeIO) -> None:
        """After the pass: its metrics, the admin tokens to read again, when the next is due."""
        if io.unauthorized:
            self.tokens = None  # regenerated, or not mounted yet: read the Secret next pass
        METRICS.pass_seconds.observe(time.perf_counter() - self.started)
        record(self.namespace, self.name, result, inp.spec.adaptive.dry_run)
        self.due_at = time.monotonic() + inp.spec.adaptive.interval_seconds

    @staticmethod
    def post_events(result: PassResult, posted: kopf.Body) -> None:
        """The pass's Events, posted once its status is written."""
        for event in result.events:
            kopf.event(posted, type=event.type, reason=event.reason, message=event.message)

    def due(self, body: Mapping[str, Any]) -> bool:
        """A pass every intervalSeconds, and at once when the spec changed: a new modePolicy,
        pause or threshold takes effect (and is reported) without waiting out the interval."""
        generation = (body.get("metadata") or {}).get("generation")
        return time.monotonic() >= self.due_at or generation != self.generation

    def retry_soon(self) -> None:
        """After an unexpected error a pass comes sooner than a full interval."""
        self.due_at = time.monotonic() + ERROR_RETRY_SECONDS
