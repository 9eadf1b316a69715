"""Generate the CustomResourceDefinition from the pydantic models in spec.py and status.py.

pydantic's JSON schema is close to a Kubernetes structural schema; this converts the rest:
inline every $ref, drop titles and nulls, mark int-or-string and free-form objects, and give
each nested object the model's default so the apiserver fills in the same values the code would.
"""

from __future__ import annotations

from typing import Any

from autoglm_api.profiles import CamelModel
from autoglm_operator.resource import spec
from autoglm_operator.resource.status import AutoGLMDeploymentStatus

PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Streaming", "type": "integer", "jsonPath": ".status.streamingReplicas"},
    {"name": "Batching", "type": "integer", "jsonPath": ".status.batchingReplicas"},
    {"name": "Routers", "type": "integer", "jsonPath": ".status.router.readyReplicas"},
    {"name": "Policy", "type": "string", "jsonPath": ".spec.modePolicy"},
    {"name": "Standby", "type": "string", "jsonPath": ".status.standby.state", "priority": 1},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.autoscaling.desiredReplicas",
     "priority": 1},
    {"name": "Scaling", "type": "string", "jsonPath": ".status.autoscaling.reason", "priority": 1},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# Kubernetes structural schemas have no propertyNames; map sizes are bounded by maxProperties.
_DROPPED_KEYS = {"title", "$defs", "propertyNames"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {k: _resolve(v, defs) for k, v in node.items() if k not in _DROPPED_KEYS}


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one resolved pydantic schema node into a Kubernetes structural schema node."""
    node = dict(node)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if node.get("default", "") is None:
            node.pop("default")
        types = {b.get("type") for b in branches}
        if types == {"integer", "string"}:
            node["x-kubernetes-int-or-string"] = True
            # Each branch's own checks (an integer's minimum, a string's pattern) still hold.
            for branch in branches:
                node.update({k: v for k, v in branch.items() if k != "type"})
        elif len(branches) == 1:
            node = {**branches[0], **node}
        else:
            raise ValueError(f"cannot express anyOf {branches} structurally")
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
        return node
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("type") == "object" or "properties" in node:
        node["type"] = "object"
        props = node.get("properties")
        if props:
            node["properties"] = {k: _structural(v) for k, v in props.items()}
        extra = node.get("additionalProperties")
        if extra is True or extra == {}:
            node.pop("additionalProperties")
            node["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(extra, dict):
            node["additionalProperties"] = _structural(extra)
        elif extra is False:
            node.pop("additionalProperties")
    if node.get("type") == "array" and "items" in node:
        items = node["items"]
        node["items"] = (
            {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            if items in ({}, {"type": "object", "additionalProperties": True}, {"type": "object"})
            else _structural(items)
        )
    if not node.get("type") and not node.get("x-kubernetes-preserve-unknown-fields"):
        node.update({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    return node


def _model_schema(model: type[CamelModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(_resolve(raw, raw.get("$defs", {})))


def _object_defaults(node: dict[str, Any], value: dict[str, Any]) -> None:
    """Give each nested object the model's whole default, so an absent parent still gets its
    children's defaults; the apiserver checks each default against the CEL rules, so it must
    be complete. Optional objects (None in the model) are absent from `value` and stay absent."""
    for key, child in node.get("properties", {}).items():
        child_value = value.get(key)
        if (
            child.get("type") == "object"
            and "properties" in child
            and isinstance(child_value, dict)
        ):
            child["default"] = child_value
            _object_defaults(child, child_value)


def openapi_schema() -> dict[str, Any]:
    spec_schema = _model_schema(spec.AutoGLMDeploymentSpec)
    _object_defaults(
        spec_schema,
        spec.AutoGLMDeploymentSpec().model_dump(by_alias=True, mode="json", exclude_none=True),
    )
    status_schema = _model_schema(AutoGLMDeploymentStatus)
    status_schema.pop("default", None)
    status_schema["x-kubernetes-preserve-unknown-fields"] = True
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        # No default for spec: an Adaptive deployment needs at least a Prometheus URL.
        "required": ["spec"],
        "x-kubernetes-validations": spec.OBJECT_VALIDATIONS,
    }


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{spec.PLURAL}.{spec.GROUP}"},
        "spec": {
            "group": spec.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": spec.KIND,
                "listKind": f"{spec.KIND}List",
                "plural": spec.PLURAL,
                "singular": spec.SINGULAR,
                "shortNames": spec.SHORT_NAMES,
                "categories": ["all", "autoglm"],
            },
            "versions": [
                {
                    "name": spec.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    import yaml

    header = (
        "# Generated from operator/autoglm_operator/resource/spec.py by `make crd`. "
        "Do not edit by hand.\n"
    )

    class NoAliases(yaml.SafeDumper):
        """Shared defaults written out in full: a CRD a reader can follow without anchors."""

        def ignore_aliases(self, data: object) -> bool:
            return True

    return header + yaml.dump(build_crd(), Dumper=NoAliases, sort_keys=False, width=100)
