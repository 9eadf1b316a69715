"""The labels, annotation and names every child of an AutoGLMDeployment carries, in one place.

Pure: the children builders stamp them, the kopf watches filter on them, the pod view reads them
and the Prometheus queries select the router's pods by its name.
"""

from __future__ import annotations

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
APP_NAME = "autoglm"
ROUTER_APP_NAME = "autoglm-router"
MANAGER = "autoglm-operator"
# The pod template's digest: pods carry it, so out-of-date pods are found without a diff.
TEMPLATE_HASH_ANNOTATION = "autoglm.io/template-hash"


def router_name(name: str) -> str:
    """The Deployment, PodDisruptionBudget, ServiceAccount, Role and RoleBinding share it."""
    return f"{name}-router"
