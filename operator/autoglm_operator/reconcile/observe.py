"""Observe: what the cluster holds for one AutoGLMDeployment, read from the kopf indexes (memory).

The indexes are fed by watch streams filtered server-side by the managed-by label, so a pass
reads no API at all. Pods are placed by the instance label (their owners are ReplicaSets); the
other children by their ownerReference to this object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoglm_operator.resource import names

Key = tuple[str, str]  # (kind, name)

# The kopf index handlers (handlers/reconcile.py) by the kind of child they hold.
CHILD_INDEXES = (
    ("owned_deployments", "Deployment"),
    ("owned_services", "Service"),
    ("owned_configmaps", "ConfigMap"),
    ("owned_pdbs", "PodDisruptionBudget"),
    ("owned_serviceaccounts", "ServiceAccount"),
    ("owned_roles", "Role"),
    ("owned_rolebindings", "RoleBinding"),
    ("owned_inferencepools", "InferencePool"),
)
INDEXES = (*(index for index, _ in CHILD_INDEXES), "owned_pods")

# An index as kopf hands it to a daemon: (namespace, instance) -> the objects filed there.
Index = Mapping[tuple[str, str], Iterable[Any]]


@dataclass(frozen=True)
class Observed:
    body: dict[str, Any]
    deployment: dict[str, Any] | None
    children: dict[Key, dict[str, Any]]
    secret: dict[str, Any] | None
    pods: list[dict[str, Any]]  # the serving pods
    router_pods: list[dict[str, Any]] = field(default_factory=list)

    def fingerprint(self) -> Any:
        """Changes whenever any observed object does (resourceVersions)."""

        def rv(obj: dict[str, Any]) -> str:
            return str((obj.get("metadata") or {}).get("resourceVersion"))

        objs = [*self.children.values(), *self.pods, *self.router_pods]
        objs += [self.secret] if self.secret else []
        return rv(self.body), tuple(sorted(rv(o) for o in objs))


def admin_secret_view(secret: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a pass keeps of the admin Secret: its metadata and which keys hold a token. The
    tokens themselves stay out of the reconcile loop's memory."""
    if secret is None:
        return None
    meta = {k: v for k, v in (secret.get("metadata") or {}).items() if k != "managedFields"}
    data = secret.get("data") or {}
    return {"kind": "Secret", "metadata": meta, "keys": {k: bool(v) for k, v in data.items()}}


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def observe(
    body: Mapping[str, Any],
    namespace: str,
    name: str,
    uid: str,
    indexes: Mapping[str, Index],
    admin_secret: dict[str, Any] | None = None,
) -> Observed:
    """What the indexes hold of this object's children and pods, with the admin Secret as its
    last named read saw it (admin_secret_view: no index, so no list or watch on Secrets)."""
    key = (namespace, name)

    def owned(index: str) -> list[dict[str, Any]]:
        return [o for o in indexes[index].get(key, []) if owned_by(o, uid)]

    children: dict[Key, dict[str, Any]] = {}
    for index, kind in CHILD_INDEXES:
        for obj in owned(index):
            children[(kind, obj["metadata"]["name"])] = {"kind": kind, **obj}
    # Pods are owned by ReplicaSets, not by us: the instance label places them, the app name
    # tells the serving pods from the router's.
    placed = list(indexes["owned_pods"].get(key, []))

    def app(pod: dict[str, Any]) -> Any:
        return (pod["metadata"].get("labels") or {}).get(names.NAME_LABEL)

    pods = [p for p in placed if app(p) == names.APP_NAME]
    router_pods = [p for p in placed if app(p) == names.ROUTER_APP_NAME]
    return Observed(
        body=dict(body),
        deployment=children.get(("Deployment", name)),
        children=children,
        secret=admin_secret if admin_secret is not None and owned_by(admin_secret, uid) else None,
        pods=pods,
        router_pods=router_pods,
    )
