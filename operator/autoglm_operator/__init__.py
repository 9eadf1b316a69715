"""Kubernetes operator for AutoGLM-Phone-9B on vLLM."""
