"""hack/k8s_schema.py: Kubernetes' OpenAPI definitions cut down to CRD structural schema."""

from __future__ import annotations

import json
from typing import Any

from autoglm_operator.resource import scheduling
from testkit.paths import load_script

k8s_schema = load_script("hack/k8s_schema.py")

_P = "#/components/schemas/io.k8s.api.core.v1."
DOCUMENT: dict[str, Any] = {
    "components": {
        "schemas": {
            "io.k8s.api.core.v1.Outer": {
                "description": "dropped",
                "type": "object",
                "required": ["inner"],
                "properties": {
                    "inner": {"allOf": [{"$ref": _P + "Inner"}], "default": {}},
                    "many": {
                        "type": "array",
                        "items": {"allOf": [{"$ref": _P + "Inner"}], "default": {}},
                        "x-kubernetes-list-type": "atomic",
                        "x-kubernetes-patch-strategy": "merge",
                    },
                    # a property whose name is a schema keyword stays a property
                    "type": {"type": "string", "default": "", "description": "kept as data"},
                },
            },
            "io.k8s.api.core.v1.Inner": {
                "type": "object",
                "x-kubernetes-map-type": "atomic",
                "properties": {"seconds": {"type": "integer", "format": "int64"}},
            },
            "io.k8s.api.core.v1.Unreached": {"type": "string"},
        }
    }
}


def test_references_become_names_and_only_structural_keywords_stay() -> None:
    definitions = k8s_schema.extract(DOCUMENT, ["io.k8s.api.core.v1.Outer"])
    assert definitions == {
        "Inner": {
            "type": "object",
            "x-kubernetes-map-type": "atomic",
            "properties": {"seconds": {"type": "integer", "format": "int64"}},
        },
        "Outer": {
            "type": "object",
            "required": ["inner"],
            "properties": {
                "inner": {"$ref": "Inner"},
                "many": {
                    "type": "array",
                    "items": {"$ref": "Inner"},
                    "x-kubernetes-list-type": "atomic",
                },
                "type": {"type": "string"},
            },
        },
    }


def test_the_committed_file_holds_every_definition_toleration_and_affinity_reach() -> None:
    committed = json.loads(k8s_schema.OUTPUT.read_text())
    assert committed["source"].startswith(f"kubernetes {k8s_schema.KUBERNETES_VERSION} ")
    definitions = committed["definitions"]
    assert set(_refs(definitions)) <= set(definitions)
    assert {"Toleration", "Affinity", "LabelSelector", "NodeSelectorRequirement"} <= set(
        definitions
    )
    # scheduling.py inlines all of it: no reference is left in the CRD's scheduling fields
    assert "$ref" not in json.dumps(scheduling.k8s_schema("Affinity"))


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    return []
