"""Write the AutoGLMDeployment reference page (docs/reference/resource.md) from the CRD schema.

The page is read from the same schema the apiserver enforces (crd.build_crd, itself generated
from spec.py): every field with its type, bounds, default and description, and every CEL rule's
message, one section per object. `make crd` writes it and a unit test keeps it equal.
"""

from __future__ import annotations

import json
import re
from typing import Any

from autoglm_operator.resource import crd

# Kubernetes' own core/v1 schemas, embedded whole: named here rather than unfolded field by field.
EMBEDDED_SCHEMAS = {
    "spec.scheduling.tolerations": "a list of core/v1 Toleration",
    "spec.scheduling.affinity": "core/v1 Affinity",
}
_LONG_PATTERN = 48
# `<name>` would read as an HTML tag and vanish from the rendered page.
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!])")


def _text(value: str) -> str:
    """Prose for a table cell: one line, no cell breaks, no stray HTML."""
    return _TAG_OPEN.sub("&lt;", " ".join(value.split()).replace("|", "\\|"))


def _code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return "`" + text.replace("|", "\\|") + "`" if text != "" else '`""`'


def _bounds(node: dict[str, Any], low: str, high: str, unit: str) -> str:
    if low in node and high in node:
        return f"{node[low]}..{node[high]}{unit}"
    if low in node:
        return f">= {node[low]}{unit}"
    if high in node:
        return f"<= {node[high]}{unit}"
    return ""


def _is_object(node: dict[str, Any]) -> bool:
    return bool(node.get("properties"))


def type_of(node: dict[str, Any], path: str) -> str:
    """The field's type with its bounds, as a reader checks a value against it."""
    if path in EMBEDDED_SCHEMAS:
        return EMBEDDED_SCHEMAS[path] + _only(_bounds(node, "minItems", "maxItems", " items"))
    if node.get("x-kubernetes-int-or-string"):
        kind = "integer or string"
    elif "enum" in node:
        return "one of " + ", ".join(_code(v) for v in node["enum"])
    else:
        kind = str(node.get("type", "any"))
    parts = [kind]
    if kind == "array":
        item = node.get("items", {})
        of = "objects (below)" if _is_object(item) else type_of(item, path + "[]")
        parts = [f"list of {of}"]
        parts.append(_bounds(node, "minItems", "maxItems", " items"))
    elif isinstance(node.get("additionalProperties"), dict):
        parts = ["map of " + type_of(node["additionalProperties"], path + "{}")]
        parts.append(_bounds(node, "minProperties", "maxProperties", " entries"))
    elif kind == "object" and _is_object(node):
        parts = ["object (below)"]
    parts.append(_bounds(node, "minimum", "maximum", ""))
    parts.append(_bounds(node, "minLength", "maxLength", " characters"))
    pattern = node.get("pattern")
    if pattern:
        parts.append(f"matching {_code(pattern)}" if len(pattern) <= _LONG_PATTERN else "a pattern")
    return ", ".join(p for p in parts if p)


def _only(bounds: str) -> str:
    return f", {bounds}" if bounds else ""


def _default(node: dict[str, Any]) -> str:
    if "default" not in node or _is_object(node):
        return ""
    return _code(node["default"])


def _rules(node: dict[str, Any]) -> list[str]:
    return [_text(str(rule["message"])) for rule in node.get("x-kubernetes-validations", [])]


def _objects(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every object with fields under `node`, depth first, itself first."""
    found = [(path, node)]
    for key, child in node.get("properties", {}).items():
        child_path = f"{path}.{key}"
        if child_path in EMBEDDED_SCHEMAS:
            continue
        if _is_object(child):
            found += _objects(child, child_path)
        elif child.get("type") == "array" and _is_object(child.get("items", {})):
            found += _objects(child["items"], child_path + "[]")
    return found


def _section(path: str, node: dict[str, Any]) -> list[str]:
    lines = [f"## {path}", ""]
    if node.get("description"):
        lines += [_text(node["description"]), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for key, child in node["properties"].items():
        child_path = f"{path}.{key}"
        row = [f"`{key}`", type_of(child, child_path).replace("|", "\\|"), _default(child),
               _text(child.get("description", ""))]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    field_rules = [
        (key, rule) for key, child in node["properties"].items() for rule in _rules(child)
        if not _is_object(child)
    ]  # fmt: skip
    own_rules = _rules(node)
    if own_rules or field_rules:
        lines += ["", "Refused at admission:", ""]
        lines += [f"- {rule}" for rule in own_rules]
        lines += [f"- `{key}`: {rule}" for key, rule in field_rules]
    return [*lines, ""]


def render_reference_markdown() -> str:
    resource = crd.build_crd()
    names = resource["spec"]["names"]
    version = resource["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    scale = version["subresources"]["scale"]
    lines = [
        f"# {names['kind']} reference",
        "",
        "<!-- Generated from operator/autoglm_operator/resource/spec.py by `make crd`. "
        "Do not edit by hand. -->",
        "",
        f"`{resource['spec']['group']}/{version['name']}`, kind `{names['kind']}`, plural "
        f"`{names['plural']}`, short name {', '.join(_code(n) for n in names['shortNames'])}, "
        f"{resource['spec']['scope'].lower()}. Subresources: `status`, and `scale` "
        f"(`{scale['specReplicasPath']}`, `{scale['statusReplicasPath']}`, selector "
        f"`{scale['labelSelectorPath']}`), so `kubectl scale` and HPAs work. Every field below "
        "is also in `kubectl explain agd.spec`. What the defaults mean and why they are what "
        "they are: [resource-notes.md](resource-notes.md).",
        "",
        "## Columns of `kubectl get agd`",
        "",
        "| column | type | from |",
        "|---|---|---|",
        *(
            f"| {c['name']} | {c['type']} | `{c['jsonPath']}` |"
            for c in version["additionalPrinterColumns"]
        ),
        "",
        "## The object",
        "",
        "Refused at admission:",
        "",
        *(f"- {rule}" for rule in _rules(schema)),
        "",
    ]
    for part in ("spec", "status"):
        for path, node in _objects(schema["properties"][part], part):
            lines += _section(path, node)
    return "\n".join(lines).rstrip("\n") + "\n"
