"""AutoGLM serving runtime: the vLLM launcher and the live mode middleware inside a vLLM pod."""
