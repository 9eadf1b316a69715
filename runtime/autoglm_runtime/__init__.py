"""AutoGLM serving runtime: the vLLM launcher, the live mode middleware and the `sim` CPU engine."""

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
