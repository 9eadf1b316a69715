"""The sim (`python -m testkit.sim`): a CPU engine: vLLM's OpenAI API and metrics, to work
without a GPU. The harness's, never in the runtime image (docs/runtime/sim.md)."""

from testkit.sim.app import create_app
from testkit.sim.settings import SimSettings

__all__ = ["SimSettings", "create_app"]
