"""Where the operator, runtime and router images live by default, in one place.

`make images REGISTRY=...` (hack/images.sh) pushes `<registry>/<name>:<version>`; the chart
(values.yaml `image.registry`), the CRD's default `image` and the examples name the same
references, and tests/helm/test_images.py keeps them equal. The version is pyproject.toml's.
"""

from __future__ import annotations

from autoglm_api import __version__

DEFAULT_REGISTRY = "ghcr.io/autoglm"
OPERATOR_IMAGE = "autoglm-operator"
RUNTIME_IMAGE = "autoglm-runtime"
ROUTER_IMAGE = "autoglm-router"
VERSION = __version__


def reference(name: str, registry: str = DEFAULT_REGISTRY, tag: str = VERSION) -> str:
    return f"{registry}/{name}:{tag}"
