"""Kubernetes' own schemas for Toleration and Affinity, as the CRD's scheduling fields use them.

Reads the OpenAPI v3 document the Kubernetes source publishes (api/openapi-spec/v3/
api__v1_openapi.json of the version hack/k8s-bin.sh builds) and writes the definitions the two
types reach, cut down to what a CRD's structural schema allows: `allOf: [$ref]` wrappers become
plain `$ref`s, and descriptions, defaults and the strategic-merge-patch hints are dropped. The
output is committed (operator/autoglm_operator/resource/k8s_scheduling_schema.json), so
`make crd` stays offline and deterministic; spec.py inlines it and adds the rules the pod
validator applies.

    python hack/k8s_schema.py [OPENAPI_JSON]   # rewrites the committed file
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "operator" / "autoglm_operator" / "resource" / "k8s_scheduling_schema.json"
KUBERNETES_VERSION = "v1.34.4"
ROOTS = ["io.k8s.api.core.v1.Toleration", "io.k8s.api.core.v1.Affinity"]
_REF_PREFIX = "#/components/schemas/"
# The schema keywords a CRD accepts that these definitions use; anything else is dropped.
_KEPT = {
    "type", "format", "properties", "items", "additionalProperties", "required", "enum",
    "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-list-map-keys",
}  # fmt: skip


def default_source() -> Path:
    modcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return (
        Path(modcache) / f"k8s.io/kubernetes@{KUBERNETES_VERSION}"
        / "api/openapi-spec/v3/api__v1_openapi.json"
    )  # fmt: skip


def short_name(ref: str) -> str:
    """io.k8s.api.core.v1.NodeAffinity -> NodeAffinity: the names do not clash in this closure."""
    return ref.removeprefix(_REF_PREFIX).rsplit(".", 1)[-1]


def _trim(node: Any, reached: set[str]) -> Any:
    if isinstance(node, list):
        return [_trim(item, reached) for item in node]
    if not isinstance(node, dict):
        return node
    refs = [node["$ref"]] if "$ref" in node else [b["$ref"] for b in node.get("allOf", [])]
    if refs:
        if len(refs) != 1:
            raise ValueError(f"cannot express allOf {refs} structurally")
        reached.add(refs[0].removeprefix(_REF_PREFIX))
        return {"$ref": short_name(refs[0])}
    trimmed = {k: _trim(v, reached) for k, v in node.items() if k in _KEPT - {"properties"}}
    if "properties" in node:  # property names are data, not keywords: keep them all
        trimmed["properties"] = {k: _trim(v, reached) for k, v in node["properties"].items()}
    return trimmed


def extract(document: dict[str, Any], roots: list[str]) -> dict[str, Any]:
    """The trimmed definitions of `roots` and of every type they reach, by short name."""
    schemas = document["components"]["schemas"]
    definitions: dict[str, Any] = {}
    pending = list(roots)
    while pending:
        full = pending.pop()
        name = short_name(full)
        if name in definitions:
            continue
        reached: set[str] = set()
        definitions[name] = _trim(schemas[full], reached)
        pending += sorted(reached)
    return dict(sorted(definitions.items()))


def main(argv: list[str]) -> None:
    source = Path(argv[0]) if argv else default_source()
    document = json.loads(source.read_text())
    result = {
        "source": f"kubernetes {KUBERNETES_VERSION} api/openapi-spec/v3/api__v1_openapi.json",
        "definitions": extract(document, ROOTS),
    }
    OUTPUT.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUTPUT.relative_to(REPO)} ({len(result['definitions'])} definitions)")


if __name__ == "__main__":
    main(sys.argv[1:])
