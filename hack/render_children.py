"""Print, as YAML documents, the children the operator creates for an AutoGLMDeployment file.

    python hack/render_children.py [--namespace NS] examples/autoglm.yaml > children.yaml

The operator's pure builders make them from the spec (with the CRD's defaults filled in, as the
apiserver would), so no cluster is needed: hack/checkov.sh scans what this prints. The admin
Secret holds a random token per pod template in a cluster; here each is a placeholder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from autoglm_operator.reconcile.children import gateway as gateway_builders
from autoglm_operator.reconcile.children import router as router_builders
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import KIND, AutoGLMDeploymentSpec

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


def render(path: Path, namespace: str | None = None) -> str:
    obj = yaml.safe_load(path.read_text())
    if not isinstance(obj, dict) or obj.get("kind") != KIND:
        raise SystemExit(f"{path}: not an {KIND}")
    metadata = obj.get("metadata") or {}
    spec = AutoGLMDeploymentSpec.model_validate(obj.get("spec") or {})
    owner = builders.Owner(
        name=metadata["name"],
        namespace=namespace or metadata.get("namespace", "default"),
        uid=PLACEHOLDER_UID,
    )
    # As the cluster holds them once a router pod is ready: Service <name> selects the router.
    docs = [
        *builders.children(owner, spec, via_router=spec.router.enabled),
        *router_builders.children(owner, spec),
        *gateway_builders.children(owner, spec),
        builders.admin_secret(owner, dict.fromkeys(
            builders.desired_template_hashes(owner.name, spec), "placeholder")),
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", type=Path, help="an AutoGLMDeployment manifest")
    parser.add_argument("--namespace", help="default: the manifest's, else default")
    args = parser.parse_args(argv)
    sys.stdout.write(render(args.file, args.namespace))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
