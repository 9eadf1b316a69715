"""AutoGLM serving runtime: the vLLM launcher, the live mode middleware and the `sim` CPU engine."""

__version__ = "0.1.0"
