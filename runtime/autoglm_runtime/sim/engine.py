"""The sim's scheduler: continuous batching with chunked prefill, priorities and a KV budget.

One asyncio task runs engine steps back to back (see `model.py` for the step-time equation).
Waiting requests are ordered by (priority, arrival), as vLLM's `--scheduling-policy priority`;
a step admits them while `max_num_seqs` and the KV budget allow. When decode growth would
overflow the KV budget the newest lowest-priority sequence is preempted and recomputed later,
as vLLM does. With prefix caching on (see `prefix_cache.py`) a sequence's cached leading blocks
count as prefilled when it is admitted: its steps pay only for the uncached prompt tokens, and an
image whose placeholder tokens are all cached skips the vision encoder.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from autoglm_runtime.sim.metrics import SimMetrics
from autoglm_runtime.sim.model import LatencyModel, MemoryModel, fill_step
from autoglm_runtime.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_cache_tokens: int = 65536
    time_factor: float = 1.0
    enable_prefix_caching: bool = True
    latency: LatencyModel = field(default_factory=LatencyModel)
    memory: MemoryModel = field(default_factory=MemoryModel)


@dataclass(eq=False)
class SimRequest:
    """One sequence; the handler reads its tokens from `tokens` (None marks the end)."""

    priority: int
    prompt_tokens: int
    images: int
    target_tokens: int
    finish_reason: str
    arrival: float
    token_ids: Sequence[int] = ()  # the prompt's ids, for prefix caching
    image_ends: tuple[int, ...] = ()  # where each image's placeholder tokens end in the prompt
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    seq: int = 0
    prompt_total: int = 0  # prompt plus tokens to recompute after a preemption
    prefilled: int = 0
    generated: int = 0
    vision_done: bool = False
    images_to_encode: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    held_blocks: list[bytes] = field(default_factory=list)
    preempted: bool = False
    cancelled: bool = False
    finished: bool = False
    submitted_at: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    def __lt__(self, other: SimRequest) -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)


class SimEngine:
    def __init__(self, config: EngineConfig, metrics: SimMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self.last_prefill_tokens = 0
        self.peak_memory_bytes = config.memory.used_bytes(0, 0)
        self._labels = metrics.labels
        self.prefix_cache = PrefixCache(config.enable_prefix_caching)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for request in [*self.running, *self.waiting]:
            self._finish(request, "abort")

    # --- requests ---------------------------------------------------------------------------

    def submit(self, request: SimRequest) -> None:
        request.seq = next(self._seq)
        request.prompt_total = request.prompt_tokens
        request.images_to_encode = request.images
        if self.prefix_cache.enabled:
            request.block_hashes = block_hashes(request.token_ids)
        request.submitted_at = time.monotonic()
        heapq.heappush(self.waiting, request)
        self._wake.set()
        self._update_gauges()

    def abort(self, request: SimRequest) -> None:
        """The client went away: stop spending steps on it."""
        request.cancelled = True
        self._wake.set()

    @property
    def kv_used(self) -> int:
        return sum(r.prefilled + r.generated for r in self.running)

    def memory_used_bytes(self) -> int:
        return self.config.memory.used_bytes(len(self.running), self.last_prefill_tokens)

    def gpu_memory(self) -> list[tuple[int, int, int]]:
        return self.config.memory.per_gpu(self.memory_used_bytes())

    # --- the step loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        deadline = time.monotonic()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                deadline = time.monotonic()
            decoding, plan, images = self._schedule()
            if not decoding and not plan:
                # Everything left was cancelled or cannot fit; wait for a change.
                self._wake.clear()
                if self.running or self.waiting:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=0.05 * self._scale())
                continue
            prefill_tokens = sum(chunk for _, chunk in plan)
            self.last_prefill_tokens = prefill_tokens
            self.peak_memory_bytes = max(self.peak_memory_bytes, self.memory_used_bytes())
            seconds = self.config.latency.step_seconds(len(decoding), prefill_tokens, images)
            now = time.monotonic()
            duration = seconds * self._scale()
            # Absolute deadlines keep sleep overshoot from accumulating; lag of one step is
            # caught up, more is forgiven so a stalled loop does not burst.
            deadline = max(deadline, now - duration) + duration
            await asyncio.sleep(max(0.0, deadline - now))
            self._apply(decoding, plan, prefill_tokens)

    def _scale(self) -> float:
        return self.config.time_factor

    def _schedule(self) -> tuple[list[SimRequest], list[tuple[SimRequest, int]], int]:
        for request in [r for r in self.running if r.cancelled]:
            self._finish(request, "abort")
        budget = self.config.max_num_batched_tokens
        decoding = [r for r in self.running if r.prefilled >= r.prompt_total]
        budget -= len(decoding)
        # Decode grows every sequence by one token; preempt until that fits the budget.
        while decoding and self.kv_used + len(decoding) > self.config.kv_cache_tokens:
            victim = max(self.running)  # worst priority, newest
            self._preempt(victim)
            if victim in decoding:
                decoding.remove(victim)
                budget += 1
        kv_free = self.config.kv_cache_tokens - self.kv_used - len(decoding)

        def admit_next() -> tuple[SimRequest, int] | None:
            nonlocal kv_free
            while self.waiting and len(self.running) < self.config.max_num_seqs:
                head = self.waiting[0]
                if head.cancelled:
                    heapq.heappop(self.waiting)
                    self._finish(head, "abort")
                    continue
                if head.prompt_total + 1 > kv_free:
                    return None  # vLLM's priority scheduler also waits rather than skip the head
                heapq.heappop(self.waiting)
                head.scheduled_at = head.scheduled_at or time.monotonic()
                self.running.append(head)
                self._use_cached_prefix(head)
                kv_free -= head.prompt_total + 1
                return head, head.prompt_total - head.prefilled
            return None

        started = [(r, r.prompt_total - r.prefilled) for r in self.running
                   if r.prompt_total > r.prefilled]
        plan = fill_step(budget, started, admit_next)
        images = sum(r.images_to_encode for r, _ in plan if not r.vision_done)
        self._evict()
        self._update_gauges()
        return decoding, plan, images

    def _use_cached_prefix(self, request: SimRequest) -> None:
        """Start the sequence after its cached prefix, counted as vLLM counts it (in tokens;
        not for a preempted sequence coming back)."""
        if not self.prefix_cache.enabled:
            return
        cached = self.prefix_cache.cached_tokens(request.block_hashes, request.prompt_total)
        request.held_blocks = request.block_hashes[: cached // BLOCK_TOKENS]
        self.prefix_cache.hold(request.held_blocks)
        request.prefilled = cached
        request.images_to_encode = sum(1 for end in request.image_ends if end > cached)
        if not request.preempted:
            self.metrics.prefix_cache_queries.labels(*self._labels).inc(request.prompt_total)
            self.metrics.prefix_cache_hits.labels(*self._labels).inc(cached)

    def _cache_prompt_blocks(self, request: SimRequest) -> None:
        """The prefill is done: its full prompt blocks are now cached and held."""
        computed = request.block_hashes[len(request.held_blocks) :]
        self.prefix_cache.hold(computed)
        request.held_blocks = [*request.held_blocks, *computed]

    def _release_blocks(self, request: SimRequest) -> None:
        self.prefix_cache.release(request.held_blocks)
        request.held_blocks = []

    def _evict(self) -> None:
        """Unreferenced cached blocks live in the part of the KV budget running sequences
        leave free."""
        used_blocks = -(-self.kv_used // BLOCK_TOKENS)
        self.prefix_cache.evict_to(self.config.kv_cache_tokens // BLOCK_TOKENS - used_blocks)

    def _apply(
        self, decoding: list[SimRequest], plan: list[tuple[SimRequest, int]], prefilled: int
    ) -> None:
        self.steps += 1
        now = time.monotonic()
        generated = 0
        for request in decoding:
            if request.finished:
                continue  # preempted or aborted during the step
            self._emit(request, now)
            generated += 1
        for request, chunk in plan:
            if request.finished or request not in self.running:
                continue
            request.vision_done = True
            request.prefilled += chunk
            if request.prefilled >= request.prompt_total:
                self._cache_prompt_blocks(request)
                self._emit(request, now)
                generated += 1
        labels = self._labels
        self.metrics.prompt_tokens.labels(*labels).inc(prefilled)
        self.metrics.generation_tokens.labels(*labels).inc(generated)
        self.metrics.iteration_tokens.labels(*labels).observe(prefilled + generated)
        self._evict()
        self._update_gauges()

    def _emit(self, request: SimRequest, now: float) -> None:
        if request.cancelled:
            self._finish(request, "abort")
            return
        request.generated += 1
        labels = self._labels
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.ttft.labels(*labels).observe(now - request.arrival)
        elif request.last_token_at is not None:
            self.metrics.itl.labels(*labels).observe(now - request.last_token_at)
        request.last_token_at = now
        request.tokens.put_nowait(request.generated)
        if request.generated >= request.target_tokens:
            self._finish(request, request.finish_reason)

    def _preempt(self, request: SimRequest) -> None:
        self.running.remove(request)
        self._release_blocks(request)
        request.preempted = True
        # Recompute: the prompt and what was generated so far are prefilled again.
        request.prompt_total = request.prompt_tokens + request.generated
        request.prefilled = 0
        heapq.heappush(self.waiting, request)
        self.metrics.preemptions.labels(*self._labels).inc()

    def _finish(self, request: SimRequest, reason: str) -> None:
        if request.finished:
            return
        request.finished = True
        if request in self.running:
            self.running.remove(request)
        self._release_blocks(request)
        now = time.monotonic()
        labels = self._labels
        self.metrics.success.labels(*labels, reason).inc()
        self.metrics.e2e.labels(*labels).observe(now - request.arrival)
        self.metrics.prompt_tokens_request.labels(*labels).observe(request.prompt_tokens)
        self.metrics.generation_tokens_request.labels(*labels).observe(request.generated)
        scheduled = request.scheduled_at
        if scheduled is not None:
            self.metrics.queue_time.labels(*labels).observe(scheduled - request.submitted_at)
            self.metrics.inference_time.labels(*labels).observe(now - scheduled)
            first = request.first_token_at or now
            self.metrics.prefill_time.labels(*labels).observe(first - scheduled)
            self.metrics.decode_time.labels(*labels).observe(now - first)
        request.tokens.put_nowait(None)

    def _update_gauges(self) -> None:
        labels = self._labels
        self.metrics.running.labels(*labels).set(len(self.running))
        self.metrics.waiting.labels(*labels).set(sum(1 for r in self.waiting if not r.finished))
        self.metrics.kv_usage.labels(*labels).set(self.kv_used / self.config.kv_cache_tokens)
