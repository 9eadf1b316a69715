"""The reconcile loop's memory of one object between iterations, and what it alone decides.

In memory only (lost on restart, by design): what the operator wrote and when, so a write still on
its way back through the watch keeps the next iteration looking (has_pending), the gateway's
backoff (gateway_due), and when the admin Secret is read again (admin_secret_read_due).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autoglm_api.standby import Reading
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.reconcile import status as status_
from autoglm_operator.reconcile.observe import Key
from autoglm_operator.resource import pods as pods_

# How long a write may take to come back through the watch before it counts as lost.
WATCH_GRACE_SECONDS = 10.0
# How often the admin Secret is read again while a serving pod is not ready.
ADMIN_SECRET_RECHECK_SECONDS = 30.0


@dataclass(frozen=True)
class Written:
    """What the operator's last write of one child produced, and what it was based on."""

    digest: str
    resource_version: str
    based_on: str  # the resourceVersion the operator saw when it wrote ("" when absent)
    at: float  # monotonic time of the write


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
    # scaleToZero: the HorizontalPodAutoscalers that scale this object as last listed, and when
    # to list them again; a pod whose sleep or wake failed, and when to try it again.
    scalers: tuple[str, ...] = ()
    scalers_due_at: float = 0.0
    standby_retry_at: dict[str, float] = field(default_factory=dict)
    # The last report each live router pod gave (io/router_client.py), by pod name.
    router_readings: dict[str, Reading] = field(default_factory=dict)
    # autoscaling: the adaptive pass's last metrics and when it read them (monotonic), and each
    # pod's requests in flight as its runtime then said.
    samples: tuple[float, Samples] | None = None
    inflight: dict[str, int] = field(default_factory=dict)


def has_pending(written: dict[Key, Written], now: float) -> bool:
    """A recent write still inside its grace time: the next pass must look again."""
    return any(now - w.at < WATCH_GRACE_SECONDS for w in written.values())


def gateway_due(memory: ReconcileMemory, now: float) -> bool:
    """A failed attempt at the gateway's objects has waited out its backoff."""
    return memory.gateway_problem is not None and now >= memory.gateway_retry_at


def admin_secret_read_due(memory: ReconcileMemory, pods: Sequence[pods_.Pod], now: float) -> bool:
    """Whether this pass reads the admin Secret by name. The operator neither lists nor watches
    Secrets (least privilege: a watch RBAC grants on Secrets covers every Secret in scope), so it
    reads this one when something says it may have changed or be needed: on the reconcile loop's
    first pass, after its own write, after a refused or missing token (memory.admin_secret_stale),
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
