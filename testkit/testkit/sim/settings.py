"""How one sim runs: its time factor, load time, engine limits, and latency, memory and sleep
models."""

from __future__ import annotations

from dataclasses import dataclass, field

from autoglm_runtime.config import RuntimeSettings
from testkit.sim.model import LatencyModel, MemoryModel, SleepModel


@dataclass(frozen=True)
class SimSettings:
    time_factor: float = 1.0
    model_load_seconds: float = 0.0
    max_num_seqs: int | None = None  # None: the profiles' envelope, as the operator sets it
    max_num_batched_tokens: int = 2048
    kv_cache_tokens: int = 65536
    enable_prefix_caching: bool = True
    with_middleware: bool = True
    runtime: RuntimeSettings | None = None  # None: the middleware reads the environment
    latency: LatencyModel = field(default_factory=LatencyModel)
    memory: MemoryModel = field(default_factory=MemoryModel)
    enable_sleep_mode: bool = False  # as vLLM's --enable-sleep-mode
    sleep: SleepModel = field(default_factory=SleepModel)

    def __post_init__(self) -> None:
        if self.time_factor <= 0:
            raise ValueError("time_factor must be above 0")
