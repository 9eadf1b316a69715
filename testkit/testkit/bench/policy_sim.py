"""A fast-forward, discrete-event simulation of a pool of AutoGLM replicas (policy benchmark).

Each replica is the runtime as deployed: the mode middleware (concurrency cap, bounded priority
wait queue with a timeout, micro-batch window, SSE coalescing, stream priority), then vLLM's API
server preprocessing, then the engine's continuous batching with chunked prefill. The admission
is the middleware's own code (`autoglm_runtime.admission.AdmissionQueue` and `BatchWindow`) on
the pool's simulated clock. The engine plans each step with the sim's own `fill_step` and times
it with the sim's step model (`testkit.sim.model.LatencyModel`, the same equations
`testkit.sim.engine` runs in real time):

    step T = max(floor, t0 + t1 * b + c_p * p + c_img * i / IMAGE_TOKENS)

and its preprocessing runs where the model says (`ApiServer`: in parallel, or in one API-server
process in arrival order), on the whole prompt, images included.

Prefix caching is vLLM's automatic one as the sim models it (`testkit.sim.prefix_cache`,
16-token blocks, least recently used evicted from the part of `kv_cache_tokens` running
sequences leave free). Only phone-agent steps share prefixes (policy_traces.AgentPrompt): every
step's system prompt, and within a conversation the text of the earlier steps; a step's own
message and screenshot are never sent again. A step starts its prefill past its cached blocks,
as vLLM's scheduler does (the last prompt token always computed).

Steps that only decode, with nothing new to admit, are identical, so the simulator jumps over a
run of them at once (to the next completion, or to the end of the step in progress when a new
request reaches the engine). That is exact for the step model and makes a simulated day take
seconds to minutes instead of a day.

Memory is `testkit.sim.model.MemoryModel` (what the sim reports as autoglm_gpu_memory_*).

Routing is the router's own `autoglm_router.routing.decide` (`routing="router"`): each request's
features as `autoglm_router.features` would read them (a streamed chat or other; an agent step
keyed by its conversation, as the router keys a chat without a session id by its system prompt
and first user message, or by its session id with `session_ids=True`; its first step new; cost
from its prompt, and the part its home holds cached), the pool state from the replicas (mode,
the requests the router has open on each and their summed cost, that cost averaged over
`RECENT_LOAD_SECONDS` (rule 2), how many it sent each within the last `fresh_seconds` (rule 1d),
the modes' caps; no replica is draining, flips are in place), where each conversation went last
(`autoglm_router.sessions.SessionMemory`), and one retry elsewhere on a full queue as the proxy
does (`routing.retry_route`). `routing="random"` sends each request to a uniformly random
replica: what clients get from the plain Service with the router off.

Nothing here does I/O; `policy_goodput.py` drives it.
"""

from __future__ import annotations

import copy
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from autoglm_api.profiles import Mode, ModeProfile, ModeProfiles
from autoglm_router import routing
from autoglm_router.features import (
    IMAGE_DELIMITER_TOKENS,
    TOKENS_PER_LOAD_UNIT,
    KeyKind,
    RequestFeatures,
    TrafficClass,
)
from autoglm_router.sessions import (
    RECENT_LOAD_SECONDS,
    SESSION_MEMORY,
    SessionMemory,
    session_of,
    settled,
)
from autoglm_runtime.admission import AdmissionQueue, BatchWindow, Woken
from autoglm_runtime.requests import DEFAULT_PRIORITY, STREAM_PRIORITY
from testkit.bench.policy_traces import AGENT, AgentPrompt
from testkit.bench.policy_traces import Arrival as ShapedArrival
from testkit.sim.model import (
    IMAGE_TOKENS,
    ApiServer,
    LatencyModel,
    MemoryModel,
    fill_step,
)
from testkit.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, blocks_for
from testkit.stats import percentile

CHAT = 0  # interactive, streamed; SLO on time to first visible token
BATCH = 1  # batch job, not streamed; SLO on completion time
ROUTINGS = ("router", "random")
Arrival = tuple[float, int] | ShapedArrival  # (time, kind): the calibration shape


@dataclass(frozen=True)
class Workload:
    """Request shapes and SLOs; shape 0 is the calibration workload of the sim model."""

    chat_output_tokens: int = 64
    batch_output_tokens: int = 40
    chat_ttft_slo: float = 0.5
    chat_tpot_slo: float = 0.1
    batch_e2e_slo: float = 30.0
    # Per-request shapes (text tokens, images), indexed by an arrival's shape; AGENT: `agent`.
    shapes: tuple[tuple[int, int], ...] = ((60, 1),)
    agent: AgentPrompt = field(default_factory=AgentPrompt)


@dataclass(frozen=True)
class EngineEnvelope:
    """The engine's start-up flags (one envelope for both modes) and the latency/memory models."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_cache_tokens: int = 65536  # the sim's default (python -m testkit.sim --kv-cache-tokens)
    latency: LatencyModel = field(default_factory=LatencyModel)
    memory: MemoryModel = field(default_factory=MemoryModel)

    def __post_init__(self) -> None:
        if self.latency.out_step or self.latency.out_chunk:
            # A token's way out through the API server would cut the jumps over decode steps.
            raise ValueError("the pool model times tokens at the step's end: out_step and "
                             "out_chunk must be 0")


@dataclass(slots=True, eq=False)
class Req:
    kind: int
    arrival: float
    rid: int
    target: int
    prio: int = 0
    visible: int = 1  # the token whose arrival the client sees first (SSE coalescing)
    prompt: int = 316  # prompt tokens (text + image placeholders)
    image_tokens: int = IMAGE_TOKENS
    cost: float = 1.0  # the router's load units, as charged where it went (charged_cost)
    replica: int = -1  # where it was routed (the router's open-request books)
    pre_seconds: float = 0.0  # vLLM's preprocessing of it
    features: RequestFeatures | None = None  # as the router reads them (router routing only)
    blocks: tuple[bytes, ...] = ()  # its prompt's full blocks, as the prefix cache keys them
    held: list[bytes] = field(default_factory=list)  # the blocks it holds in its replica's cache
    prefilled: int = 0
    first_token: float = -1.0  # client-visible first token
    done: float = -1.0
    rejected: bool = False


@dataclass(slots=True)
class Outcome:
    kind: int
    arrival: float
    ttft: float  # -1 when never seen (rejected or unfinished)
    e2e: float  # -1 when not finished
    met: bool
    tpot: float = -1.0  # chats: seconds per output token after the first visible one


# Event kinds.
_STEP_END = 0
_GROUP = 1
_PRE_DONE = 2


class Replica:
    def __init__(
        self,
        index: int,
        mode: Mode,
        profiles: ModeProfiles,
        env: EngineEnvelope,
        clock: Callable[[], float],
    ) -> None:
        self.index = index
        self.name = f"replica-{index}"
        self.profiles = profiles
        self.env = env
        self.mode = mode
        # the middleware's own admission rule, on the pool's simulated clock
        self.admission: AdmissionQueue[Req] = AdmissionQueue(profiles.for_mode(mode), clock,
                                                             env.max_num_seqs)
        self.window: BatchWindow[Req] = BatchWindow()
        self.api_server = ApiServer(env.latency.shared_api_server)
        # engine
        self.waiting: list[tuple[int, int, Req]] = []
        self.prefilling: list[Req] = []
        self.decoding: list[tuple[int, int, Req]] = []  # (finish counter, rid, req)
        self.watch: list[tuple[int, int, Req]] = []  # (counter of the visible token, rid, req)
        self.counter = 0  # decode steps done (each gives every decoding sequence one token)
        self.cache = PrefixCache()
        self.kv_blocks = 0  # blocks running sequences take (their prompt and output)
        self.prompt_tokens = 0  # vllm:prefix_cache_queries_total: prompt tokens it admitted
        self.cached_tokens = 0  # vllm:prefix_cache_hits_total: those found in its cache
        self.busy = False
        self.step_version = 0
        self.step_start = 0.0
        self.step_len = 0.0
        self.step_count = 0  # steps in the current jump (1 for a step with prefill)
        self.step_plan: list[tuple[Req, int]] = []
        self.step_prefill_tokens = 0
        self.completed = 0  # requests finished here (vllm:request_success_total of this pod)
        # requests its middleware received, admitted or not, by class: [streamed chats, others]
        # (autoglm_requests_received_total{traffic_class} of this pod)
        self.received = [0, 0]
        # the router's books: requests it has open here and their summed cost
        self.open = 0
        self.open_cost = 0.0
        self.recent = (0.0, 0.0)  # open_cost averaged over RECENT_LOAD_SECONDS, as of when
        self.sent: deque[float] = deque()  # when the router sent requests here, newest last

    def router_state(self, now: float, fresh_seconds: float) -> routing.ReplicaState:
        """What the router knows of this replica (autoglm_router.routing.ReplicaState)."""
        while self.sent and self.sent[0] <= now - fresh_seconds:
            self.sent.popleft()
        return routing.ReplicaState(
            self.name, self.mode, inflight=self.open, load=self.open_cost,
            fresh=len(self.sent), recent_load=self._settle(now),
        )

    def book(self, req: Req, sign: int, now: float) -> None:
        """The router opens (+1) or closes (-1) a request on this replica."""
        self._settle(now)
        self.open += sign
        self.open_cost += sign * req.cost

    def _settle(self, now: float) -> float:
        # The cost has stood at its value since the last change (the proxy's LoadBook).
        average, since = self.recent
        self.recent = (settled(average, self.open_cost, now - since, RECENT_LOAD_SECONDS), now)
        return self.recent[0]

    @property
    def profile(self) -> ModeProfile:
        return self.admission.profile

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def inflight(self) -> int:
        return self.admission.inflight

    @property
    def queued(self) -> int:
        return self.admission.queued

    def load(self) -> float:
        return (self.inflight + self.queued) / self.profile.max_concurrency


def agent_blocks(agent: AgentPrompt, conversation: int, step: int) -> tuple[bytes, ...]:
    """A phone-agent step's full prompt blocks as the prefix cache keys them: the system
    prompt's are every conversation's, then the conversation's text the later steps send
    again, then this step's own (its message and screenshot)."""
    shared = agent.shared_with_later_steps(step)
    blocks = []
    for index in range(agent.prompt(step) // BLOCK_TOKENS):
        end = (index + 1) * BLOCK_TOKENS
        if end <= agent.system:
            blocks.append(b"system:%d" % index)
        elif end <= shared:
            blocks.append(b"%d:%d" % (conversation, index))
        else:
            blocks.append(b"%d:%d:%d" % (conversation, step, index))
    return tuple(blocks)


def routing_config(profiles: ModeProfiles, engine_max_num_seqs: int) -> routing.RoutingConfig:
    """The router's defaults, with the modes' caps from the profiles the replicas run (as the
    operator sets them: reconcile/children/router.py)."""
    return routing.RoutingConfig(
        caps={mode: profiles.for_mode(mode).max_concurrency for mode in Mode},
        chat_caps={mode: profiles.for_mode(mode).admission_cap(True, engine_max_num_seqs)
                   for mode in Mode},
    )


class Pool:
    """The replicas, the router and the event loop; `run_until` advances simulated time."""

    def __init__(
        self,
        modes: Sequence[Mode],
        arrivals: Sequence[Arrival],
        *,
        profiles: ModeProfiles | None = None,
        env: EngineEnvelope | None = None,
        workload: Workload | None = None,
        track_metrics: bool = True,
        routing: str = "router",
        session_ids: bool = False,
        seed: int = 1,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
        self.profiles = profiles or ModeProfiles()
        self.env = env or EngineEnvelope()
        self.workload = workload or Workload()
        self.replicas = [
            Replica(i, m, self.profiles, self.env, self.clock) for i, m in enumerate(modes)
        ]
        self.arrivals = arrivals  # shared, never mutated: excluded from clone()
        self.next_arrival = 0
        self.now = 0.0
        self.events: list[tuple[float, int, int, object, int]] = []
        self.seq = 0
        self.outcomes: list[Outcome] = []
        self.track_metrics = track_metrics
        self.completions: deque[float] = deque()  # engine completions (vllm:request_success_total)
        self.ttfts: deque[tuple[float, float]] = deque()  # (time, engine TTFT) for the histogram
        self.routing = routing
        self.rng = random.Random(seed)
        self.route_config = routing_config(self.profiles, self.env.max_num_seqs)
        self.session_ids = session_ids  # agent steps carry a session id (else: none, as sent)
        self.sessions = SessionMemory(SESSION_MEMORY)
        self._features: dict[tuple[int, float], RequestFeatures] = {}
        self._pre_seconds: dict[tuple[int, int], float] = {}

    def clock(self) -> float:
        return self.now

    # --- cloning (the oracle's hindsight) ---------------------------------------------------

    def clone(self) -> Pool:
        arrivals = self.arrivals
        self.arrivals = ()
        try:
            twin = copy.deepcopy(self)
        finally:
            self.arrivals = arrivals
        twin.arrivals = arrivals
        return twin

    # --- modes --------------------------------------------------------------------------------

    def set_mode(self, replica: Replica, mode: Mode) -> None:
        if replica.mode is mode:
            return
        replica.mode = mode
        profile = self.profiles.for_mode(mode)
        self._preprocess(replica, replica.window.on_profile(profile))
        self._settle(replica, replica.admission.set_profile(profile))

    # --- event loop ---------------------------------------------------------------------------

    def _push(self, when: float, kind: int, obj: object, aux: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, obj, aux))

    def run_until(self, end: float, *, arrivals: bool = True) -> None:
        events = self.events
        arr = self.arrivals
        n = len(arr)
        while True:
            t_ev = events[0][0] if events else math.inf
            t_arr = arr[self.next_arrival][0] if arrivals and self.next_arrival < n else math.inf
            if t_arr <= t_ev:
                if t_arr >= end:
                    break
                item = arr[self.next_arrival]
                self.next_arrival += 1
                self.now = item[0]
                self._arrive(item, self.next_arrival)
                continue
            if t_ev >= end:
                break
            when, _, kind, obj, aux = heapq.heappop(events)
            self.now = when
            if kind == _STEP_END:
                assert isinstance(obj, Replica)
                if aux == obj.step_version:
                    self._step_end(obj, when)
            elif kind == _PRE_DONE:
                pair = cast(tuple[Req, Replica], obj)
                self._engine_submit(pair[1], pair[0], when)
            elif kind == _GROUP:
                assert isinstance(obj, Replica)
                self._preprocess(obj, obj.window.on_timer(aux))
        self.now = max(self.now, end)

    def drain(self, limit: float) -> None:
        """No more arrivals: let work in flight finish (up to `limit` more seconds)."""
        self.run_until(self.now + limit, arrivals=False)

    # --- router -------------------------------------------------------------------------------

    def route(self, req: Req, tried: Sequence[int] = ()) -> Replica | None:
        """The router's decision for `req` (see the module docstring), its cost there set;
        None: refused."""
        if self.routing == "random":
            return None if tried else self.rng.choice(self.replicas)
        features = req.features
        assert features is not None
        fresh = self.route_config.fresh_seconds
        states = [r.router_state(self.now, fresh) for r in self.replicas]
        if tried:
            names = [self.replicas[i].name for i in tried]
            route = routing.retry_route(
                routing.Failure.QUEUE_FULL, features, states, self.route_config, names
            )
        else:
            decided = routing.decide(features, states, self.route_config,
                                     placed=self.sessions.last(features))
            route = decided if isinstance(decided, routing.Route) else None
        if route is None:
            return None
        req.cost = routing.charged_cost(features, route)
        return self.replicas[int(route.replica.rsplit("-", 1)[1])]

    def _features_of(self, kind: int, cost: float, arrival: Arrival) -> RequestFeatures:
        """What autoglm_router.features reads from the request."""
        traffic_class = TrafficClass.STREAMED_CHAT if kind == CHAT else TrafficClass.OTHER
        if not isinstance(arrival, ShapedArrival) or arrival.shape != AGENT:
            features = self._features.get((kind, cost))
            if features is None:
                features = RequestFeatures(traffic_class, None, KeyKind.NONE, cost)
                self._features[(kind, cost)] = features
            return features
        step = arrival.step
        return RequestFeatures(
            traffic_class, f"conversation-{arrival.conversation}",
            KeyKind.SESSION if self.session_ids else KeyKind.CONVERSATION, cost,
            new_conversation=step == 0,
            cached_tokens=self.workload.agent.shared_with_later_steps(step - 1) if step else 0.0,
        )

    # --- middleware ---------------------------------------------------------------------------

    def _arrive(self, arrival: Arrival, rid: int) -> None:
        w = self.workload
        t, kind = arrival[0], arrival[1]
        target = w.chat_output_tokens if kind == CHAT else w.batch_output_tokens
        blocks: tuple[bytes, ...] = ()
        if isinstance(arrival, ShapedArrival) and arrival.shape == AGENT:
            prompt, image_tokens = w.agent.prompt(arrival.step), w.agent.image
            priced = prompt  # its text counts the image's delimiters
            blocks = agent_blocks(w.agent, arrival.conversation, arrival.step)
        else:
            text, images = w.shapes[arrival[2] if isinstance(arrival, ShapedArrival) else 0]
            prompt = text + IMAGE_TOKENS * images
            image_tokens = IMAGE_TOKENS * images
            # The router prices an image as the engine counts it (features.prefill_tokens).
            priced = text + images * (IMAGE_TOKENS + IMAGE_DELIMITER_TOKENS)
        cost = 1.0 + priced / TOKENS_PER_LOAD_UNIT
        pre = self._pre_seconds.get((prompt, image_tokens))
        if pre is None:
            pre = self.env.latency.preprocess_seconds(prompt, image_tokens)
            self._pre_seconds[prompt, image_tokens] = pre
        req = Req(kind, t, rid, target, prompt=prompt, image_tokens=image_tokens, cost=cost,
                  pre_seconds=pre, blocks=blocks)
        if self.routing == "router":
            req.features = self._features_of(kind, cost, arrival)
        tried: list[int] = []
        while (replica := self.route(req, tried)) is not None:
            tried.append(replica.index)
            if self._offer(replica, req, t):
                return
        self._reject(req)

    def _offer(self, replica: Replica, req: Req, t: float) -> bool:
        """The replica's middleware takes `req` (admitted or queued); False: queue full (429)."""
        p = replica.profile
        stream = req.kind == CHAT
        replica.received[0 if stream else 1] += 1
        admission = replica.admission
        prio = (STREAM_PRIORITY if stream else DEFAULT_PRIORITY) if p.prioritize_streams else 0
        if admission.is_full() and not admission.has_free_slot(prio):
            return False
        req.prio = prio
        # vLLM's first streamed event carries only the role; the coalescer flushes after
        # `coalesce` events, so the client sees token `coalesce - 1` first (token 1 if off).
        req.visible = max(1, (p.stream_coalesce_chunks if stream else 1) - 1)
        req.replica = replica.index
        replica.book(req, +1, t)
        if req.features is not None:
            replica.sent.append(t)
            session = session_of(req.features)
            if session is not None:
                self.sessions.place(session, replica.name)
        if admission.try_admit(req.prio):
            self._admitted(replica, req)
        else:
            admission.wait(req, req.prio)
        return True

    def _admitted(self, replica: Replica, req: Req) -> None:
        """Past the cap: the batch window, then vLLM's preprocessing, then the engine."""
        released, timer_seconds = replica.window.hold(req, replica.profile)
        if timer_seconds is not None:
            self._push(self.now + timer_seconds, _GROUP, replica, replica.window.generation)
        self._preprocess(replica, released)

    def _preprocess(self, replica: Replica, reqs: list[Req]) -> None:
        for req in reqs:
            # Nothing streams out through it here, so requests are served in arrival order.
            done = replica.api_server.reserve(self.now, req.pre_seconds)
            self._push(done, _PRE_DONE, (req, replica))

    def _settle(self, replica: Replica, woken: Woken[Req]) -> None:
        for req in woken.timed_out:
            self._reject(req)  # QueueTimeout: it gave up waiting (503)
        for req in woken.admitted:
            self._admitted(replica, req)

    def expire_queues(self) -> None:
        """Drop waiters past their queue timeout (the live middleware does this on a timer)."""
        for replica in self.replicas:
            for req in replica.admission.expire():
                self._reject(req)

    def _reject(self, req: Req) -> None:
        req.rejected = True
        self._close(req)
        self.outcomes.append(Outcome(req.kind, req.arrival, -1.0, -1.0, False))

    def _close(self, req: Req) -> None:
        """The response ended: off the router's books."""
        if req.replica >= 0:
            self.replicas[req.replica].book(req, -1, self.now)
            req.replica = -1

    # --- engine -------------------------------------------------------------------------------

    def _engine_submit(self, replica: Replica, req: Req, t: float) -> None:
        heapq.heappush(replica.waiting, (req.prio, req.rid, req))
        if not replica.busy:
            self._start_step(replica, t)
        elif replica.step_count > 1:
            # Cut a run of decode-only steps at the end of the step in progress.
            done = int((t - replica.step_start) / replica.step_len)
            if done + 1 < replica.step_count:
                replica.step_count = done + 1
                replica.step_version += 1
                end = replica.step_start + replica.step_count * replica.step_len
                self._push(end, _STEP_END, replica, replica.step_version)

    def _start_step(self, replica: Replica, t: float) -> None:
        env = self.env
        lat = env.latency
        b = len(replica.decoding)
        image_tokens = 0

        def admit_next() -> tuple[Req, int] | None:
            nonlocal image_tokens
            if not replica.waiting or len(replica.prefilling) + b >= env.max_num_seqs:
                return None
            _, _, req = heapq.heappop(replica.waiting)
            replica.prefilling.append(req)
            image_tokens += req.image_tokens  # a screenshot is never among the cached blocks
            self._start_prefill(replica, req)
            return req, req.prompt - req.prefilled

        started = [(req, req.prompt - req.prefilled) for req in replica.prefilling]
        plan = fill_step(env.max_num_batched_tokens - b, started, admit_next)
        replica.step_version += 1
        replica.step_start = t
        if plan:
            p = sum(c for _, c in plan)
            replica.step_len = lat.step_seconds(b, p, image_tokens)
            replica.step_count = 1
            replica.step_plan = plan
            replica.step_prefill_tokens = p
        elif b:
            replica.step_len = lat.step_seconds(b, 0, 0)
            replica.step_count = replica.decoding[0][0] - replica.counter
            replica.step_plan = []
            replica.step_prefill_tokens = 0
        else:
            replica.busy = False
            replica.step_prefill_tokens = 0
            return
        replica.busy = True
        end = t + replica.step_count * replica.step_len
        self._push(end, _STEP_END, replica, replica.step_version)

    def _start_prefill(self, replica: Replica, req: Req) -> None:
        """The engine schedules `req`: its cached leading blocks are not prefilled again."""
        req.held, cached = replica.cache.admit(req.blocks, req.prompt)
        req.prefilled = cached
        replica.kv_blocks += blocks_for(req.prompt + req.target)
        replica.prompt_tokens += req.prompt
        replica.cached_tokens += cached

    def _end_sequence(self, replica: Replica, req: Req) -> None:
        """Its blocks stay cached, unreferenced, until the KV budget needs room."""
        replica.cache.release(req.held)
        req.held = []
        replica.kv_blocks -= blocks_for(req.prompt + req.target)
        replica.cache.evict_to(self.env.kv_cache_tokens // BLOCK_TOKENS - replica.kv_blocks)

    def _step_end(self, replica: Replica, t: float) -> None:
        start, length, k = replica.step_start, replica.step_len, replica.step_count
        c0 = replica.counter
        replica.counter = c1 = c0 + k
        # Visible first tokens reached during these steps (counter c after step c - c0).
        watch = replica.watch
        while watch and watch[0][0] <= c1:
            c, _, req = heapq.heappop(watch)
            req.first_token = start + (c - c0) * length
        decoding = replica.decoding
        while decoding and decoding[0][0] <= c1:
            c, _, req = heapq.heappop(decoding)
            self._finish(replica, req, start + (c - c0) * length)
        for req, chunk in replica.step_plan:
            req.prefilled += chunk
            if req.prefilled >= req.prompt:
                replica.prefilling.remove(req)
                req.held = replica.cache.fill(req.blocks, req.held)
                # First token at the end of the step that finished its prefill.
                if self.track_metrics:
                    self.ttfts.append((t, t - req.arrival))
                if req.visible <= 1:
                    req.first_token = t
                else:
                    heapq.heappush(watch, (c1 + req.visible - 1, req.rid, req))
                if req.target <= 1:
                    self._finish(replica, req, t)
                else:
                    heapq.heappush(decoding, (c1 + req.target - 1, req.rid, req))
        replica.step_plan = []
        self._start_step(replica, t)

    def _finish(self, replica: Replica, req: Req, t: float) -> None:
        req.done = t
        w = self.workload
        tpot = -1.0
        if req.kind == CHAT:
            ttft = req.first_token - req.arrival
            later = req.target - req.visible
            tpot = (t - req.first_token) / later if later > 0 else 0.0
            met = ttft <= w.chat_ttft_slo and tpot <= w.chat_tpot_slo
        else:
            ttft = -1.0
            met = t - req.arrival <= w.batch_e2e_slo
        self._close(req)
        self._end_sequence(replica, req)
        replica.completed += 1
        self.outcomes.append(Outcome(req.kind, req.arrival, ttft, t - req.arrival, met, tpot))
        if self.track_metrics:
            self.completions.append(t)
        # The middleware releases the slot when the response ends.
        saved, self.now = self.now, t
        self._settle(replica, replica.admission.release())
        self.now = saved

    def prefix_cache_hit_ratio(self) -> float | None:
        """Cached over admitted prompt tokens, the pool's (vllm:prefix_cache_hits / _queries)."""
        queries = sum(r.prompt_tokens for r in self.replicas)
        return sum(r.cached_tokens for r in self.replicas) / queries if queries else None

    # --- what Prometheus would see ------------------------------------------------------------

    def pending(self) -> list[Req]:
        """Requests admitted or queued but not finished (for the end-of-trace accounting)."""
        seen: dict[int, Req] = {}
        for r in self.replicas:
            for req in r.admission.waiting():
                seen[req.rid] = req
            for req in r.window.held:
                seen[req.rid] = req
            for _, _, req in r.waiting:
                seen[req.rid] = req
            for req in r.prefilling:
                seen[req.rid] = req
            for _, _, req in r.decoding:
                seen[req.rid] = req
        for _, _, kind, obj, _ in self.events:
            if kind == _PRE_DONE:
                req = obj[0]  # type: ignore[index]
                seen[req.rid] = req
        return [r for r in seen.values() if r.done < 0 and not r.rejected]

    def scrape(self, window: float = 60.0) -> dict[str, float | None]:
        """The default PromQL of autoglm_operator.io.prom, evaluated on the simulated pool.

        qps: sum(rate(vllm:request_success_total[1m])) -- completions in the last minute / 60
        (the elapsed time while the trace is younger than a minute); queue: vLLM waiting plus the
        middleware's admission queue, of streaming replicas only; gpu memory: 100 * max over
        pods of used / total; TTFT p95 over the last minute (the exact values' nearest rank,
        not histogram buckets).
        """
        now = self.now
        self.expire_queues()
        horizon = now - window
        while self.completions and self.completions[0] <= horizon:
            self.completions.popleft()
        while self.ttfts and self.ttfts[0][0] <= horizon:
            self.ttfts.popleft()
        span = min(window, now) or 1.0
        qps = len(self.completions) / span
        queue = float(
            sum(len(r.waiting) + r.queued for r in self.replicas if r.mode is Mode.STREAMING)
        )
        mem = self.env.memory
        total = mem.gpus * mem.gpu_total_bytes
        gpu = max(
            100.0 * mem.used_bytes(r.running, r.step_prefill_tokens if r.busy else 0) / total
            for r in self.replicas
        )
        ttft_p95 = percentile((v for _, v in self.ttfts), 0.95)
        kv = None
        return {
            "qps": qps,
            "queue_depth": queue,
            "gpu_memory_percent": gpu,
            "ttft_p95_seconds": ttft_p95,
            "kv_cache_percent": kv,
        }
