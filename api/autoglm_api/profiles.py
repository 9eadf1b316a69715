"""The mode contract shared by the operator and the runtime.

A mode is a live admission policy, not an engine setting: the engine starts once with an
envelope large enough for both modes and the middleware enforces the active profile.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

MODE_LABEL = "autoglm.io/mode"
# The admin API: on a port of its own (served by the launcher, not the engine), with a token.
ADMIN_PORT = 8001
MODE_PATH = "/autoglm/v1/mode"
DRAIN_PATH = "/autoglm/v1/drain"


class Mode(StrEnum):
    STREAMING = "streaming"
    BATCHING = "batching"


class CamelModel(BaseModel):
    """Field names are snake_case in Python and camelCase on the wire (CRD, ConfigMap, JSON)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


# Constraints live on the types; the two profiles below differ only in their defaults.
MaxConcurrency = Annotated[
    int,
    Field(
        ge=1,
        le=1024,
        description="Requests running in the engine at once; the rest wait. Under "
        "prioritizeStreams it caps the others: streamed chats run up to the engine's sequences.",
    ),
]
MaxQueue = Annotated[
    int,
    Field(ge=0, le=10000, description="Requests allowed to wait; beyond this the answer is 429."),
]
QueueTimeoutSeconds = Annotated[
    int, Field(ge=1, le=3600, description="Longest wait for admission before the answer is 503.")
]
BatchWindowMillis = Annotated[
    int,
    Field(
        ge=0,
        le=5000,
        description="Hold admitted requests up to this long to release them together; 0 is off.",
    ),
]
BatchSize = Annotated[
    int, Field(ge=1, le=256, description="Release a held group as soon as this many wait.")
]
StreamCoalesceChunks = Annotated[
    int,
    Field(
        ge=1,
        le=64,
        description="Merge up to this many streamed token chunks into one SSE event; 1 is off.",
    ),
]
PrioritizeStreams = Annotated[
    bool,
    Field(
        description="Streamed chats first: a better vLLM priority than the rest, and admitted "
        "past maxConcurrency up to the engine's --max-num-seqs."
    ),
]

_BATCH_RULE: JsonDict = {
    "rule": "self.batchSize == 1 || self.batchWindowMillis > 0",
    "message": "batchSize above 1 needs batchWindowMillis above 0 (the window bounds the wait)",
}


class ModeProfile(CamelModel):
    """How one replica admits requests while it is in a mode."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_BATCH_RULE]})

    max_concurrency: MaxConcurrency
    max_queue: MaxQueue
    queue_timeout_seconds: QueueTimeoutSeconds
    batch_window_millis: BatchWindowMillis = 0
    batch_size: BatchSize = 1
    stream_coalesce_chunks: StreamCoalesceChunks = 1
    prioritize_streams: PrioritizeStreams = False

    def admission_cap(self, streamed_chat: bool, engine_max_num_seqs: int) -> int:
        """Requests in flight under which one more is admitted: a profile that puts streams
        first lets a streamed chat run up to the engine's own sequence limit, where vLLM's
        priority starts it ahead of the rest; the cap bounds everything else. The middleware
        admits by this rule and the router counts a replica full by it."""
        if self.prioritize_streams and streamed_chat:
            return max(engine_max_num_seqs, self.max_concurrency)
        return self.max_concurrency


class StreamingProfile(ModeProfile):
    """Quiet hours: few sequences at once, streamed requests first, lowest time-to-first-token."""

    max_concurrency: MaxConcurrency = 8
    max_queue: MaxQueue = 64
    queue_timeout_seconds: QueueTimeoutSeconds = 30
    batch_window_millis: BatchWindowMillis = 0
    batch_size: BatchSize = 1
    stream_coalesce_chunks: StreamCoalesceChunks = 1
    prioritize_streams: PrioritizeStreams = True


class BatchingProfile(ModeProfile):
    """Peaks: many sequences at once, coalesced streaming; the micro-batch window is off."""

    max_concurrency: MaxConcurrency = 64
    max_queue: MaxQueue = 512
    queue_timeout_seconds: QueueTimeoutSeconds = 60
    # Off by measurement (docs/benchmarks/batching_window.md). vLLM 0.32 batches continuously:
    # each engine step admits every waiting request the token budget allows, so holding
    # requests only delays them; off beat every window tried, on every trace. The window stays
    # for servers that batch statically.
    batch_window_millis: BatchWindowMillis = 0
    batch_size: BatchSize = 1
    stream_coalesce_chunks: StreamCoalesceChunks = 4
    prioritize_streams: PrioritizeStreams = False


class ModeProfiles(CamelModel):
    streaming: StreamingProfile = Field(default_factory=StreamingProfile)
    batching: BatchingProfile = Field(default_factory=BatchingProfile)

    def for_mode(self, mode: Mode) -> ModeProfile:
        return self.streaming if mode is Mode.STREAMING else self.batching

    @property
    def envelope_max_num_seqs(self) -> int:
        """vLLM's --max-num-seqs must hold the larger mode: the engine starts once for both."""
        return max(self.streaming.max_concurrency, self.batching.max_concurrency)
