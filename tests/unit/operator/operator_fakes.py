"""An in-memory stand-in for autoglm_operator.io.kube.Kube: objects, resourceVersions, conflicts."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from autoglm_operator.io import kube


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []
        self._rv = itertools.count(1)
        self.fail_with: kube.ApiError | None = None
        self.statuses: list[dict[str, Any]] = []  # every status written, in order
        self.unserved: set[str] = set()  # plurals whose CRD this apiserver lacks

    def _check(self, verb: str, kind: str, name: str) -> None:
        self.calls.append((verb, kind, name))
        if self.fail_with is not None:
            raise self.fail_with

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return copy.deepcopy(obj)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._check("get", kind, name)
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def list_objects(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        self._check("list", kind, namespace)
        return [copy.deepcopy(obj) for (k, ns, _), obj in self.objects.items()
                if (k, ns) == (kind, namespace)]

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._check("apply", manifest["kind"], manifest["metadata"]["name"])
        if f"{manifest['kind'].lower()}s" in self.unserved:
            raise kube.ApiError(404, "NotFound", "the server could not find the requested resource")
        return self._store(manifest)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        meta = manifest["metadata"]
        self._check("create", manifest["kind"], meta["name"])
        if (manifest["kind"], meta["namespace"], meta["name"]) in self.objects:
            return None
        return self._store(manifest)

    def replace(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        self._check("replace", manifest["kind"], meta["name"])
        current = self.objects.get((manifest["kind"], meta["namespace"], meta["name"]))
        if current is None:
            raise kube.ApiError(404, "NotFound", "gone")
        if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise kube.ApiError(409, "Conflict", "the object has been modified")
        return self._store(manifest)

    def merge_patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> Any:
        self._check("merge_patch", kind, name)
        current = self.objects.get((kind, namespace, name))
        if current is None:
            return None
        return self._store(_merged(current, patch))

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self._check("delete", kind, name)
        self.objects.pop((kind, namespace, name), None)

    def serves(self, api_version: str, plural: str) -> bool:
        self._check("discover", api_version, plural)
        return plural not in self.unserved

    def apply_status(
        self, namespace: str, name: str, status: dict[str, Any], field_manager: str = ""
    ) -> dict[str, Any]:
        self._check("apply_status", "AutoGLMDeployment", name)
        self.statuses.append(copy.deepcopy(status))
        return {"metadata": {"resourceVersion": str(next(self._rv))}, "status": status}


def _merged(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(out.get(key), value)
    return out
