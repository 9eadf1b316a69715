"""The operator's own settings in one place: kopf's configuration, the reconcile loop's timing."""

from __future__ import annotations

import logging

import kopf

from autoglm_operator.reconcile.children import gateway
from autoglm_operator.resource import names

# How often each object's loop compares memory with the desired state (no API call unless
# they differ).
RECONCILE_INTERVAL_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
# scaleToZero: how often the namespace's HorizontalPodAutoscalers are listed (a conflict with
# one shows within this), and how soon a failed sleep or wake of a pod is tried again.
SCALERS_INTERVAL_SECONDS = 15.0
STANDBY_RETRY_SECONDS = 5.0
ANNOTATION_PREFIX = "autoglm.io"
FINALIZER = "autoglm.io/operator"
# Modules whose import registers kopf handlers; a module that is not installed is skipped.
HANDLER_MODULES = (
    "autoglm_operator.handlers.reconcile",
    "autoglm_operator.handlers.adaptive_pass",
)
# Child kinds the operator watches, each filtered server-side to the objects it manages.
WATCHED_CHILDREN = (
    ("apps", "deployments"),
    ("", "services"),
    ("", "configmaps"),
    ("policy", "poddisruptionbudgets"),
    ("", "pods"),
    ("", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    (gateway.GROUP, gateway.PLURAL),
)


def managed_selector() -> str:
    return f"{names.MANAGED_BY_LABEL}={names.MANAGER}"


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    # Progress and the diff base go to annotations under our own prefix; status stays ours.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    # Only warnings become Events by themselves; the operator posts its own, one per change.
    settings.posting.level = logging.WARNING
    # Watch only our children: no other Secret or Pod in the cluster reaches the operator.
    for group, plural in WATCHED_CHILDREN:
        settings.watching.label_selectors[group, plural] = managed_selector()
    settings.execution.max_workers = 8
