"""The sim's scheduler: continuous batching with chunked prefill, priorities and a KV budget.

One asyncio task runs engine steps back to back (see `model.py` for the step-time equation).
Waiting requests are ordered by (priority, arrival), as vLLM's `--scheduling-policy priority`;
a step admits them while `max_num_seqs` and the KV budget allow. When decode growth would
overflow the KV budget the newest lowest-priority sequence is preempted and recomputed later,
as vLLM does. With prefix caching on (see `prefix_cache.py`) a sequence's cached leading blocks
count as prefilled when it is admitted: its steps pay only for the uncached prompt tokens, and an
image whose placeholder tokens are all cached skips the vision encoder.

With sleep mode on, it sleeps and wakes as vLLM 0.32's engine client does (`sleep(level, mode)`
in the "abort" or "wait" pause mode, `wake_up(tags)`, `is_sleeping`,
`collective_rpc("reload_weights")`, the calls the mode middleware makes), taking `SleepModel`'s
times; asleep, it runs no step: what it is given waits for the wake.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from testkit.sim.metrics import SimMetrics
from testkit.sim.model import (
    IMAGE_TOKENS,
    ApiServer,
    LatencyModel,
    MemoryModel,
    SleepModel,
    fill_step,
)
from testkit.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes, blocks_for


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_cache_tokens: int = 65536
    time_factor: float = 1.0
    enable_prefix_caching: bool = True
    latency: LatencyModel = field(default_factory=LatencyModel)
    memory: MemoryModel = field(default_factory=MemoryModel)
    enable_sleep_mode: bool = False  # vLLM's --enable-sleep-mode: off unless asked for
    sleep: SleepModel = field(default_factory=SleepModel)


@dataclass(frozen=True)
class SimModelConfig:
    """The part of vLLM's ModelConfig (`engine_client.model_config`) the middleware reads."""

    enable_sleep_mode: bool


# vLLM's engine_sleep_state labels (v1/metrics/loggers.py record_sleep_state) by sleep level.
SLEEP_STATES = {None: "awake", 1: "weights_offloaded", 2: "discard_all"}
# What a sleep puts to sleep and `wake_up(tags)` brings back (vllm/v1/executor/abstract.py).
SLEEP_TAGS = frozenset({"weights", "kv_cache"})


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
    image_tokens: tuple[int, ...] = ()  # each image's placeholder tokens (none given: IMAGE_TOKENS)
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    seq: int = 0
    prompt_total: int = 0  # prompt plus tokens to recompute after a preemption
    prefilled: int = 0
    generated: int = 0
    vision_done: bool = False
    images_to_encode: int = 0
    vision_tokens: int = 0  # the placeholder tokens of those images: what the encoder costs
    block_hashes: list[bytes] = field(default_factory=list)
    held_blocks: list[bytes] = field(default_factory=list)
    preempted: bool = False
    cancelled: bool = False
    finished: bool = False  # out of the engine
    recorded: bool = False  # its request metrics are observed
    handled: int = 0  # tokens the API server's output handler has read
    sent: int = 0  # tokens its stream has sent
    streaming: bool = False  # its stream waits for its turn to send
    delivered: bool = False  # the response is over (the end reached the client, or an abort)
    submitted_at: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    def sizes(self) -> tuple[int, ...]:
        """Each image's placeholder tokens."""
        return self.image_tokens or (IMAGE_TOKENS,) * self.images

    def __lt__(self, other: SimRequest) -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)


class SimEngine:
    def __init__(self, config: EngineConfig, metrics: SimMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock  # the event loop's clock (a virtual one fast-forwards the engine)
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
        # vLLM's API server: one process for preprocessing and for streaming out the tokens.
        self.api_server = ApiServer(config.latency.shared_api_server)
        self._outputs: deque[tuple[float, list[tuple[SimRequest, int]]]] = deque()
        self._streams: set[asyncio.Task[None]] = set()
        self._last_output = float("-inf")
        self.model_config = SimModelConfig(config.enable_sleep_mode)
        self.paused = False  # vLLM pauses its scheduler for a sleep, until the wake
        # False from a sleep until the wake: waiting sequences stay queued (vLLM's PAUSED_NEW).
        self.admitting = True
        self._ran_dry = asyncio.Event()  # the step loop found no running sequence left
        self.sleep_level: int | None = None  # the weights are off the GPUs at this level
        self.sleeping_tags: set[str] = set()
        self._record_sleep_state()

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for stream in list(self._streams):
            stream.cancel()
        for request in [*self.running, *self.waiting]:
            self._finish(request, "abort")

    # --- requests ---------------------------------------------------------------------------

    async def receive(self) -> None:
        """vLLM's API server reads and checks a new request (`a_http`), once its turn comes,
        before it starts the request's clock (vLLM's arrival time)."""
        await self.api_server.intake(self.config.latency.a_http * self._scale(), self.clock)

    async def admit(self, request: SimRequest) -> None:
        """Then it preprocesses the request (its chat template, tokens and images), once its
        turn comes again: its tokenizer runs apart, and the loop serves what is ready first
        meanwhile (in its one process, or at once in parallel, as the model says); then the
        engine queues it. The wait is part of the request's TTFT."""
        latency = self.config.latency
        seconds = latency.preprocess_seconds(request.prompt_tokens, sum(request.sizes()))
        await self.api_server.intake(seconds * self._scale(), self.clock)
        self.submit(request)

    def submit(self, request: SimRequest) -> None:
        request.seq = next(self._seq)
        request.prompt_total = request.prompt_tokens
        request.images_to_encode = request.images
        request.vision_tokens = sum(request.sizes())
        if self.prefix_cache.enabled:
            request.block_hashes = block_hashes(request.token_ids)
        request.submitted_at = self.clock()
        heapq.heappush(self.waiting, request)
        self._wake.set()
        self._update_gauges()

    def abort(self, request: SimRequest) -> None:
        """The client went away: stop spending steps on it."""
        request.cancelled = True
        self._wake.set()

    # --- sleep mode (vLLM's EngineClient: sleep, wake_up, is_sleeping, collective_rpc) -------

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """Pause the scheduler in vLLM's pause `mode` (vllm/v1/engine/core.py pause_scheduler):
        "abort" ends what it holds, "wait" lets the running sequences finish and keeps the
        waiting ones queued for the wake; then move the weights off the GPUs (level 1) or drop
        them (level 2)."""
        if not self.config.enable_sleep_mode:
            raise RuntimeError("Sleep mode is not enabled: start the sim with --enable-sleep-mode")
        if mode not in ("abort", "wait"):
            raise NotImplementedError(f"the sim has no pause mode {mode!r}")
        self.admitting = False
        if mode == "abort":
            for request in [*self.running, *self.waiting]:
                self._finish(request, "abort")
            self.waiting.clear()
            self._update_gauges()
        while self.running and self._task is not None and not self._task.done():
            self._ran_dry.clear()
            self._wake.set()
            await self._ran_dry.wait()
        self.paused = True
        if self.sleep_level is None:
            await asyncio.sleep(self.config.sleep.sleep_seconds * self._scale())
            self.sleep_level = level
            self.sleeping_tags = set(SLEEP_TAGS)
        self._record_sleep_state()

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Bring back the memory `tags` names (all without): the weights take the wake's time,
        the KV cache none. The scheduler resumes once nothing is asleep; True then, as vLLM's
        (vllm/v1/engine/core.py wake_up)."""
        waking = self.sleeping_tags & (SLEEP_TAGS if tags is None else set(tags))
        if "weights" in waking:
            await asyncio.sleep(self.config.sleep.wake_seconds * self._scale())
        self.sleeping_tags -= waking
        if self.sleeping_tags:
            return False
        self.sleep_level = None
        self.paused = False
        self.admitting = True
        self._record_sleep_state()
        self._wake.set()
        return True

    async def is_sleeping(self) -> bool:
        return self.paused or not self.admitting or self.sleep_level is not None

    async def collective_rpc(self, method: str) -> None:
        """Only the call the middleware makes in a level-2 wake: reload the weights."""
        if method != "reload_weights":
            raise NotImplementedError(f"the sim's engine has no {method}")
        await asyncio.sleep(self.config.sleep.reload_weights_seconds * self._scale())

    def _record_sleep_state(self) -> None:
        current = SLEEP_STATES[self.sleep_level]
        for state in SLEEP_STATES.values():
            self.metrics.sleep_state.labels(*self._labels, state).set(int(state == current))

    @property
    def kv_used(self) -> int:
        return sum(r.prefilled + r.generated for r in self.running)

    def memory_used_bytes(self) -> int:
        return self.config.memory.used_bytes(len(self.running), self.last_prefill_tokens)

    def gpu_memory(self) -> list[tuple[int, int, int]]:
        return self.config.memory.per_gpu(self.memory_used_bytes())

    # --- the step loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        deadline = self.clock()
        while True:
            if self.paused or not (self.running or (self.waiting and self.admitting)):
                self._ran_dry.set()
                self._wake.clear()
                await self._wake.wait()
                deadline = self.clock()
                continue
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
            now = self.clock()
            duration = seconds * self._scale()
            # Absolute deadlines keep sleep overshoot from accumulating; lag of one step is
            # caught up, more is forgiven so a stalled loop does not burst.
            deadline = max(deadline, now - duration) + duration
            await asyncio.sleep(max(0.0, deadline - now))
            self._apply(decoding, plan, prefill_tokens)

    def _scale(self) -> float:
        return self.config.time_factor

    def _schedule(self) -> tuple[list[SimRequest], list[tuple[SimRequest, int]], int]:
        """This step's decoding sequences, prefill plan, and image tokens to encode."""
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
            while self.admitting and self.waiting and len(self.running) < self.config.max_num_seqs:
                head = self.waiting[0]
                if head.cancelled:
                    heapq.heappop(self.waiting)
                    self._finish(head, "abort")
                    continue
                if head.prompt_total + 1 > kv_free:
                    return None  # vLLM's priority scheduler also waits rather than skip the head
                heapq.heappop(self.waiting)
                head.scheduled_at = head.scheduled_at or self.clock()
                self.running.append(head)
                self._use_cached_prefix(head)
                kv_free -= head.prompt_total + 1
                return head, head.prompt_total - head.prefilled
            return None

        started = [(r, r.prompt_total - r.prefilled) for r in self.running
                   if r.prompt_total > r.prefilled]
        plan = fill_step(budget, started, admit_next)
        images = sum(r.vision_tokens for r, _ in plan if not r.vision_done)
        self._evict()
        self._update_gauges()
        return decoding, plan, images

    def _use_cached_prefix(self, request: SimRequest) -> None:
        """Start the sequence after its cached prefix, counted as vLLM counts it (in tokens;
        not for a preempted sequence coming back)."""
        if not self.prefix_cache.enabled:
            return
        request.held_blocks, cached = self.prefix_cache.admit(request.block_hashes,
                                                              request.prompt_total)
        request.prefilled = cached
        uncached = [size for end, size in zip(request.image_ends, request.sizes(), strict=False)
                    if end > cached]
        request.images_to_encode = len(uncached)
        request.vision_tokens = sum(uncached)
        if not request.preempted:
            self.metrics.prefix_cache_queries.labels(*self._labels).inc(request.prompt_total)
            self.metrics.prefix_cache_hits.labels(*self._labels).inc(cached)

    def _cache_prompt_blocks(self, request: SimRequest) -> None:
        """The prefill is done: its full prompt blocks are now cached and held."""
        request.held_blocks = self.prefix_cache.fill(request.block_hashes, request.held_blocks)

    def _release_blocks(self, request: SimRequest) -> None:
        self.prefix_cache.release(request.held_blocks)
        request.held_blocks = []

    def _evict(self) -> None:
        """Unreferenced cached blocks live in the part of the KV budget running sequences
        leave free."""
        self.prefix_cache.evict_to(self.config.kv_cache_tokens // BLOCK_TOKENS
                                   - blocks_for(self.kv_used))

    def _apply(
        self, decoding: list[SimRequest], plan: list[tuple[SimRequest, int]], prefilled: int
    ) -> None:
        self.steps += 1
        now = self.clock()
        emitted: list[SimRequest] = []
        for request in decoding:
            if request.finished:
                continue  # preempted or aborted during the step
            self._emit(request, now, emitted)
        for request, chunk in plan:
            if request.finished or request not in self.running:
                continue
            request.vision_done = True
            request.prefilled += chunk
            if request.prefilled >= request.prompt_total:
                self._cache_prompt_blocks(request)
                self._emit(request, now, emitted)
        labels = self._labels
        self.metrics.prompt_tokens.labels(*labels).inc(prefilled)
        self.metrics.generation_tokens.labels(*labels).inc(len(emitted))
        self.metrics.iteration_tokens.labels(*labels).observe(prefilled + len(emitted))
        self._evict()
        self._update_gauges()
        self._output(emitted, now)

    def _emit(self, request: SimRequest, now: float, emitted: list[SimRequest]) -> None:
        """The engine's side of a new token: vLLM's inter-token latency is timed by the engine
        core's own clock; a sequence that is done leaves the engine at once."""
        if request.cancelled:
            self._finish(request, "abort")
            return
        request.generated += 1
        if request.first_token_at is None:
            request.first_token_at = now
        elif request.last_token_at is not None:
            self.metrics.itl.labels(*self._labels).observe(now - request.last_token_at)
        request.last_token_at = now
        emitted.append(request)
        if request.generated >= request.target_tokens:
            self._retire(request)

    def _output(self, emitted: list[SimRequest], now: float) -> None:
        """The API server's side of a step: its output handler reads the step's tokens
        (`out_step`), ahead of anything else it has to do but the job in progress, and in the
        order of the steps; vLLM's TTFT and E2E are timed then."""
        if not emitted:
            return
        seconds = self.config.latency.out_step * self._scale()
        done = max(self.api_server.reserve(now, seconds), self._last_output)
        self._last_output = done
        batch = [(request, request.generated) for request in emitted]
        if done <= now and not self._outputs:
            self._handled(batch)
            return
        self._outputs.append((done, batch))
        asyncio.get_running_loop().call_later(done - now, self._handled_due)

    def _handled_due(self) -> None:
        now = self.clock()
        while self._outputs and self._outputs[0][0] <= now:
            self._handled(self._outputs.popleft()[1])

    def _handled(self, batch: list[tuple[SimRequest, int]]) -> None:
        now = self.clock()
        for request, count in batch:
            if request.delivered:
                continue  # aborted meanwhile
            if count == 1:
                self.metrics.ttft.labels(*self._labels).observe(now - request.arrival)
            if count >= request.target_tokens:
                self._record(request, request.finish_reason, now)
            request.handled = count
            if not request.streaming:
                request.streaming = True
                self._stream_out(request)

    def _stream_out(self, request: SimRequest) -> None:
        """Each request's stream sends what its output handler has read, in one SSE event
        (`out_chunk`) when its turn on the API server comes: tokens read meanwhile join it, as
        vLLM merges a stream's outputs while it waits."""
        seconds = self.config.latency.out_chunk * self._scale()
        if not seconds:
            self._send(request, request.handled)
            request.streaming = False
            return

        async def send_when_served() -> None:
            upto = 0

            def take() -> None:
                nonlocal upto
                upto = request.handled  # what it has when its turn comes goes in this event

            while request.sent < request.handled and not request.delivered:
                await self.api_server.intake(seconds, self.clock, take)
                self._send(request, upto)
            request.streaming = False

        task = asyncio.get_running_loop().create_task(send_when_served())
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    def _send(self, request: SimRequest, upto: int) -> None:
        if request.delivered:
            return
        for count in range(request.sent + 1, upto + 1):
            request.tokens.put_nowait(count)
        request.sent = max(request.sent, upto)
        if request.sent >= request.target_tokens:
            request.delivered = True
            request.tokens.put_nowait(None)

    def _preempt(self, request: SimRequest) -> None:
        self.running.remove(request)
        self._release_blocks(request)
        request.preempted = True
        # Recompute: the prompt and what was generated so far are prefilled again.
        request.prompt_total = request.prompt_tokens + request.generated
        request.prefilled = 0
        heapq.heappush(self.waiting, request)
        self.metrics.preemptions.labels(*self._labels).inc()

    def _retire(self, request: SimRequest) -> None:
        """The sequence leaves the engine: its slot and its blocks are free."""
        request.finished = True
        if request in self.running:
            self.running.remove(request)
        self._release_blocks(request)

    def _finish(self, request: SimRequest, reason: str) -> None:
        """Ended in the engine and answered at once (an abort)."""
        if request.finished:
            return
        self._retire(request)
        self._record(request, reason, self.clock())
        if not request.delivered:
            request.delivered = True
            request.tokens.put_nowait(None)

    def _record(self, request: SimRequest, reason: str, now: float) -> None:
        """The request's own metrics, timed as vLLM times them: E2E when the API server's
        output handler has read its last token, the phases by the engine core's timestamps."""
        if request.recorded:
            return
        request.recorded = True
        labels = self._labels
        self.metrics.success.labels(*labels, reason).inc()
        self.metrics.e2e.labels(*labels).observe(now - request.arrival)
        self.metrics.prompt_tokens_request.labels(*labels).observe(request.prompt_tokens)
        self.metrics.generation_tokens_request.labels(*labels).observe(request.generated)
        scheduled = request.scheduled_at
        if scheduled is not None:
            last = request.last_token_at or now
            self.metrics.queue_time.labels(*labels).observe(scheduled - request.submitted_at)
            self.metrics.inference_time.labels(*labels).observe(last - scheduled)
            first = request.first_token_at or last
            self.metrics.prefill_time.labels(*labels).observe(first - scheduled)
            self.metrics.decode_time.labels(*labels).observe(last - first)

    def _update_gauges(self) -> None:
        labels = self._labels
        self.metrics.running.labels(*labels).set(len(self.running))
        self.metrics.waiting.labels(*labels).set(sum(1 for r in self.waiting if not r.finished))
        self.metrics.kv_usage.labels(*labels).set(self.kv_used / self.config.kv_cache_tokens)
