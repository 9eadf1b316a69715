"""AutoGLM serving runtime: the vLLM launcher, the live mode middleware and the `sim` CPU engine."""

from importlib.metadata import version

# pyproject.toml holds the version; the images are tagged with it (hack/images.sh).
__version__ = version("autoglm-operator")
