"""spec.scheduling: Kubernetes' own Toleration and Affinity schemas, plus the pod validator's rules.

The schemas come from the Kubernetes source (hack/k8s_schema.py writes k8s_scheduling_schema.json);
k8s_schema inlines one with its rules laid over it, and the field carries it as its whole schema.
The rules are those of k8s.io/kubernetes pkg/apis/core/validation (ValidateTolerations,
validateAffinity, ValidateLabelSelector), so an object the apiserver accepts here never has its
Deployment refused. Lists and strings are bounded so CEL's cost estimate stays in budget.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from pydantic.json_schema import JsonDict

from autoglm_api.profiles import CamelModel
from autoglm_operator.resource.rules import DNS_SUBDOMAIN, cel

# A label value (nodeSelector): empty, or alphanumerics with -_. inside, at most 63 characters.
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

_K8S_DEFINITIONS: dict[str, Any] = json.loads(
    Path(__file__).with_name("k8s_scheduling_schema.json").read_text()
)["definitions"]
# A label key (IsQualifiedName): an optional DNS-subdomain prefix and '/', then a name of at
# most 63 characters; the prefix's own limit of 253 is a second rule.
_QUALIFIED_NAME = (
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_PREFIX_AT_MOST_253 = r"^([^/]{1,253}/)?[^/]*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_MAX_TERMS = 32  # terms, requirements or keys in one list
_MAX_VALUES = 64  # values of one requirement, tolerations, namespaces, matchLabels


def _label_key(field: str, *, optional: bool = False) -> JsonDict:
    return {
        "maxLength": 253 + 1 + 63,
        "pattern": f"^({_QUALIFIED_NAME})?$" if optional else f"^{_QUALIFIED_NAME}$",
        "x-kubernetes-validations": [
            cel(
                f"self.matches(r'{_PREFIX_AT_MOST_253}')",
                f"{field}: a label key's prefix (before '/') is at most 253 characters",
            )
        ],
    }


_LABEL_VALUE_SCHEMA: JsonDict = {"maxLength": 63, "pattern": _LABEL_VALUE}
_SELECTOR_VALUES: JsonDict = {"maxItems": _MAX_VALUES, "items": _LABEL_VALUE_SCHEMA}
_WEIGHT: JsonDict = {"properties": {"weight": {"minimum": 1, "maximum": 100}}}
_AFFINITY = "scheduling.affinity"


def _values_by_operator(what: str) -> list[JsonDict]:
    return [
        cel(
            "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
            f"{_AFFINITY}: a {what} with operator In or NotIn needs values",
            ".values",
        ),
        cel(
            "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || "
            "size(self.values) == 0",
            f"{_AFFINITY}: a {what} with operator Exists or DoesNotExist takes no values",
            ".values",
        ),
    ]


def _pod_affinity_lists() -> dict[str, Any]:
    terms = {"maxItems": _MAX_TERMS}
    return {
        "properties": {
            "requiredDuringSchedulingIgnoredDuringExecution": terms,
            "preferredDuringSchedulingIgnoredDuringExecution": terms,
        }
    }


_MATCH_FIELD_RULES: dict[str, Any] = {
    "properties": {"values": {"items": {"maxLength": 253, "pattern": DNS_SUBDOMAIN}}},
    "x-kubernetes-validations": [
        cel(
            "self.key == 'metadata.name'",
            f"{_AFFINITY}: matchFields can only select on the key metadata.name",
            ".key",
        ),
        cel(
            "self.operator in ['In', 'NotIn'] && has(self.values) && size(self.values) == 1",
            f"{_AFFINITY}: matchFields needs operator In or NotIn with exactly one node name",
            ".operator",
        ),
    ],
}

_POD_AFFINITY_TERM_RULES: list[JsonDict] = [
    cel(
        f"(!has(self.{keys}) || size(self.{keys}) == 0) || has(self.labelSelector)",
        f"{_AFFINITY}: {keys} needs labelSelector",
        f".{keys}",
    )
    for keys in ("matchLabelKeys", "mismatchLabelKeys")
] + [
    cel(
        "!has(self.matchLabelKeys) || !has(self.mismatchLabelKeys) || "
        "!self.matchLabelKeys.exists(k, k in self.mismatchLabelKeys)",
        f"{_AFFINITY}: a key may not be in both matchLabelKeys and mismatchLabelKeys",
        ".matchLabelKeys",
    ),
    cel(
        "!has(self.matchLabelKeys) || !has(self.labelSelector) || "
        "!self.matchLabelKeys.exists(k, "
        "(has(self.labelSelector.matchLabels) && k in self.labelSelector.matchLabels) || "
        "(has(self.labelSelector.matchExpressions) && "
        "self.labelSelector.matchExpressions.exists(e, e.key == k)))",
        f"{_AFFINITY}: a key in matchLabelKeys may not also be in labelSelector",
        ".matchLabelKeys",
    ),
]

_K8S_RULES: dict[str, dict[str, Any]] = {
    "Toleration": {
        "properties": {
            "key": _label_key("scheduling.tolerations", optional=True),
            "operator": {"enum": ["", "Equal", "Exists"]},
            "value": _LABEL_VALUE_SCHEMA,
            "effect": {"enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"]},
        },
        "x-kubernetes-validations": [
            cel(
                "(has(self.key) && self.key != '') || "
                "(has(self.operator) && self.operator == 'Exists')",
                "scheduling.tolerations: a toleration without a key must have operator Exists "
                "(it then tolerates every taint)",
                ".operator",
            ),
            cel(
                "!(has(self.operator) && self.operator == 'Exists') || "
                "!has(self.value) || self.value == ''",
                "scheduling.tolerations: value must be empty when operator is Exists",
                ".value",
            ),
            cel(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "scheduling.tolerations: tolerationSeconds needs effect NoExecute",
                ".effect",
            ),
        ],
    },
    "NodeAffinity": {
        "properties": {"preferredDuringSchedulingIgnoredDuringExecution": {"maxItems": _MAX_TERMS}}
    },
    "NodeSelector": {"properties": {"nodeSelectorTerms": {"minItems": 1, "maxItems": _MAX_TERMS}}},
    "NodeSelectorTerm": {
        "properties": {
            "matchExpressions": {"maxItems": _MAX_TERMS},
            "matchFields": {"maxItems": _MAX_TERMS, "items": _MATCH_FIELD_RULES},
        }
    },
    "NodeSelectorRequirement": {
        "properties": {
            "key": _label_key(_AFFINITY),
            "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]},
            "values": _SELECTOR_VALUES,
        },
        "x-kubernetes-validations": [
            *_values_by_operator("node selector requirement"),
            cel(
                "!(self.operator in ['Gt', 'Lt']) || (has(self.values) && "
                "size(self.values) == 1 && self.values[0].matches('^-?[0-9]+$'))",
                f"{_AFFINITY}: a node selector requirement with operator Gt or Lt needs "
                "exactly one integer value",
                ".values",
            ),
        ],
    },
    "PreferredSchedulingTerm": _WEIGHT,
    "WeightedPodAffinityTerm": _WEIGHT,
    "PodAffinity": _pod_affinity_lists(),
    "PodAntiAffinity": _pod_affinity_lists(),
    "PodAffinityTerm": {
        "properties": {
            "topologyKey": _label_key(_AFFINITY),
            "namespaces": {
                "maxItems": _MAX_VALUES,
                "items": {"maxLength": 63, "pattern": _DNS_LABEL},
            },
            "matchLabelKeys": {"maxItems": _MAX_TERMS, "items": _label_key(_AFFINITY)},
            "mismatchLabelKeys": {"maxItems": _MAX_TERMS, "items": _label_key(_AFFINITY)},
        },
        "x-kubernetes-validations": _POD_AFFINITY_TERM_RULES,
    },
    "LabelSelector": {
        "properties": {
            "matchExpressions": {"maxItems": _MAX_TERMS},
            "matchLabels": {
                "maxProperties": _MAX_VALUES,
                "additionalProperties": _LABEL_VALUE_SCHEMA,
                "x-kubernetes-validations": [
                    cel(
                        f"self.all(k, k.size() <= 317 && k.matches(r'^{_QUALIFIED_NAME}$') && "
                        f"k.matches(r'{_PREFIX_AT_MOST_253}'))",
                        f"{_AFFINITY}: every matchLabels key must be a label key",
                    )
                ],
            },
        }
    },
    "LabelSelectorRequirement": {
        "properties": {
            "key": _label_key(_AFFINITY),
            "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
            "values": _SELECTOR_VALUES,
        },
        "x-kubernetes-validations": _values_by_operator("label selector requirement"),
    },
}


def _merged(base: Any, extra: Any) -> Any:
    """`base` with `extra` laid over it; CEL rule lists add up."""
    if not (isinstance(base, dict) and isinstance(extra, dict)):
        return copy.deepcopy(extra)
    merged = dict(base)
    for key, value in extra.items():
        if key == "x-kubernetes-validations":
            merged[key] = [*base.get(key, []), *value]
        else:
            merged[key] = _merged(base[key], value) if key in base else copy.deepcopy(value)
    return merged


def _inlined(node: Any) -> Any:
    if isinstance(node, list):
        return [_inlined(item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return k8s_schema(node["$ref"])
    return {key: _inlined(value) for key, value in node.items()}


def k8s_schema(name: str) -> JsonDict:
    """Kubernetes' structural schema of core/v1 `name`, inlined, with the pod validator's rules."""
    result: JsonDict = _merged(_inlined(_K8S_DEFINITIONS[name]), _K8S_RULES.get(name, {}))
    return result


def _schema_is(schema: JsonDict) -> Callable[[JsonDict], None]:
    """For json_schema_extra: the field's whole schema is `schema` (the Python type stays a
    plain dict, passed to the pod template as it is)."""

    def replace(field_schema: JsonDict) -> None:
        field_schema.clear()
        field_schema.update(copy.deepcopy(schema))

    return replace


class SchedulingSettings(CamelModel):
    node_selector: dict[str, Annotated[str, Field(max_length=63, pattern=_LABEL_VALUE)]] | None = (
        None
    )
    tolerations: list[dict[str, Any]] | None = Field(
        default=None,
        json_schema_extra=_schema_is(
            {"type": "array", "maxItems": _MAX_VALUES, "items": k8s_schema("Toleration")}
        ),
    )
    affinity: dict[str, Any] | None = Field(
        default=None, json_schema_extra=_schema_is(k8s_schema("Affinity"))
    )
    priority_class_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN)
