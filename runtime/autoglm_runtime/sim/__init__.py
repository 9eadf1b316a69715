"""`autoglm-runtime sim`: a CPU engine: vLLM's OpenAI API and metrics, to work without a GPU."""

from autoglm_runtime.sim.app import SimSettings, create_app

__all__ = ["SimSettings", "create_app"]
