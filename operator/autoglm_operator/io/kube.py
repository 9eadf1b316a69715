"""The Kubernetes client: the calls, their idempotence and their errors, for its two users
(executor.py, which acts for an AutoGLMDeployment, and leader.py, which holds the Lease).

Writes are idempotent: children go through server-side apply (PATCH with
`application/apply-patch+yaml`, one field manager, forced), so applying the same manifest twice
changes nothing and a hand edit of an owned field is taken back; `create` treats AlreadyExists
as success and `delete`/`get` treat NotFound as success/None. Errors are classified once, here:
`ApiError.temporary` says whether retrying can help.

The client is the official `kubernetes` package (synchronous); the async callers run its calls
in worker threads (`asyncio.to_thread`). Events go through kopf's own poster.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from autoglm_operator.reconcile.children import gateway
from autoglm_operator.resource import spec

FIELD_MANAGER = "autoglm-operator"
STATUS_FIELD_MANAGER = "autoglm-operator-status"
# Status managers of earlier versions: their fields are released on the first status write.
RETIRED_STATUS_MANAGERS = ("autoglm-adaptive",)
REQUEST_TIMEOUT_SECONDS = 30
USER_AGENT = "autoglm-operator"

log = logging.getLogger(__name__)

# kind -> (API path prefix, plural)
_RESOURCES = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Service": ("/api/v1", "services"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Pod": ("/api/v1", "pods"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    gateway.KIND: (f"/apis/{gateway.API_VERSION}", gateway.PLURAL),
    spec.KIND: (f"/apis/{spec.API_VERSION}", spec.PLURAL),
}


@dataclass
class ApiError(Exception):
    """A failed API call, classified."""

    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def temporary(self) -> bool:
        # Throttling, server trouble, lost connections and conflicts may pass; the rest will not.
        return self.status in (0, 408, 409, 429) or self.status >= 500

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"


def _error(exc: Exception) -> ApiError:
    if isinstance(exc, ApiException):
        try:
            body = json.loads(exc.body or "{}")
        except (TypeError, ValueError):
            body = {}
        return ApiError(
            status=int(exc.status or 0),
            reason=str(body.get("reason") or exc.reason or ""),
            message=str(body.get("message") or exc.body or ""),
        )
    return ApiError(status=0, reason="ConnectionError", message=str(exc))


def path_for(kind: str, namespace: str, name: str | None = None, subresource: str = "") -> str:
    prefix, plural = _RESOURCES[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name is not None:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class Kube:
    """A thin, counted JSON client over the kubernetes package's transport."""

    def __init__(
        self, api_client: client.ApiClient | None = None, user_agent: str = USER_AGENT
    ) -> None:
        self._api = api_client or client.ApiClient()
        # Names the caller in apiserver audit logs (and in the tests' call counts).
        self._api.user_agent = user_agent
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()

    @classmethod
    def from_environment(cls, user_agent: str = USER_AGENT) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(user_agent=user_agent)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        with self._lock:
            self.calls[method] += 1
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            method_, url, headers_, body_, post = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(
                method_, url, header_params=headers_, body=body_, post_params=post,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )  # fmt: skip
            response.read()
        except (ApiException, HTTPError, OSError) as exc:
            raise _error(exc) from exc
        if not 200 <= int(response.status) < 300:
            raise _error(ApiException(http_resp=response))
        data = response.data
        return json.loads(data) if data else {}

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether the apiserver serves `plural` in the group version `api_version` (discovery,
        which every authenticated client may read): False when its CRD is not installed."""
        try:
            found = self.request("GET", f"/apis/{api_version}")
        except ApiError as err:
            if err.not_found:
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources") or [])

    # -- objects -------------------------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path_for(kind, namespace, name))
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def list_objects(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        return list(self.request("GET", path_for(kind, namespace)).get("items") or [])

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply: create or bring every field this manager owns to `manifest`."""
        meta = manifest["metadata"]
        return self.request(
            "PATCH",
            path_for(manifest["kind"], meta["namespace"], meta["name"]),
            body=manifest,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create; None when it already exists (someone else's create won, which is fine)."""
        meta = manifest["metadata"]
        try:
            return self.request(
                "POST",
                path_for(manifest["kind"], meta["namespace"]),
                body=manifest,
                query=[("fieldManager", FIELD_MANAGER)],
            )
        except ApiError as err:
            if err.already_exists:
                return None
            raise

    def replace(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        return self.request(
            "PUT",
            path_for(manifest["kind"], meta["namespace"], meta["name"]),
            body=manifest,
            query=[("fieldManager", FIELD_MANAGER)],
        )

    def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            self.request("DELETE", path_for(kind, namespace, name))
        except ApiError as err:
            if not err.not_found:
                raise

    def merge_patch(
        self, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """JSON merge patch; None when the object is gone."""
        try:
            return self.request(
                "PATCH",
                path_for(kind, namespace, name),
                body=patch,
                query=[("fieldManager", FIELD_MANAGER)],
                content_type="application/merge-patch+json",
            )
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def apply_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the whole AutoGLMDeployment status, under one field manager:
        a field left out of `status` is removed."""
        return self._apply_status_as(STATUS_FIELD_MANAGER, namespace, name, {"status": status})

    def release_status(self, namespace: str, name: str, manager: str) -> dict[str, Any]:
        """Apply nothing under `manager`: it gives up every status field it owned. A field
        another manager owns too stays; server-side apply drops the manager's entry."""
        return self._apply_status_as(manager, namespace, name, {})

    def _apply_status_as(
        self, manager: str, namespace: str, name: str, content: Mapping[str, Any]
    ) -> dict[str, Any]:
        body = {
            "apiVersion": spec.API_VERSION,
            "kind": spec.KIND,
            "metadata": {"name": name, "namespace": namespace},
            **content,
        }
        return self.request(
            "PATCH",
            path_for(spec.KIND, namespace, name, "status"),
            body=body,
            query=[("fieldManager", manager), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )


def event(body: Any, *, warning: bool = False, reason: str, message: str) -> None:
    """A Kubernetes Event on the AutoGLMDeployment, through kopf's poster (never blocks)."""
    kopf.event(body, type="Warning" if warning else "Normal", reason=reason, message=message)
