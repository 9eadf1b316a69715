"""The contract the operator, the router and the runtime share: modes and their profiles, traffic
classes, vLLM's engine arguments, the image budget, keep-alive times, API keys, paths, and how
the router and the runtime read an ASGI request body (asgi_body).

It imports none of the three (pyproject.toml's import contracts).
"""

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version() -> str:
    """pyproject.toml's version (the images are tagged with it: hack/images.sh)."""
    try:
        return version("autoglm-operator")
    except PackageNotFoundError:
        # A checkout used without installing it (the vLLM tier's cached environment).
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])


__version__ = _version()
