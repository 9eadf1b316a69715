"""Scale to zero against what users pick instead, over a week of agent traffic: GPU-hours, the
wait, and the requests refused.

    .venv/bin/python bench/scale_to_zero.py [--seeds 1,2,3,4] [--jobs 2] [--days 7]

A deployment of 2 replicas (2 GPUs each) in virtual time (a discrete-event simulation: no real
sleep, no cluster), one week of AutoGLM phone-agent traffic per seed, under each policy:

- always-on: spec.replicas run all week (scaleToZero off), and always-on x1: one replica;
- ours (scale-to-zero, s2z + sleep, warm standby): the operator's shipped planner,
  `autoglm_operator.reconcile.standby.plan_standby`, called once a second as the operator runs
  it, on the `Activity` that `autoglm_api.standby.activity_of` makes of the router's report,
  which the router's own `autoglm_router.demand.DemandBook` writes (an inference request counts
  from its relay to its last byte; a held one once it waited WAKE_AFTER_SECONDS with its client
  still there; GET /v1/models never, as router/autoglm_router/proxy.py counts only POSTs). The
  router holds a request while no replica is ready, up to router.hold.waitSeconds, then answers
  503 with Retry-After HOLD_RETRY_AFTER_SECONDS. Ticks whose inputs did not change are skipped
  and the first one whose answer changes is found by galloping and bisection: the decisions of a
  call every second (tests/unit/bench/test_scale_to_zero.py holds the two to the same result).
- keda http add-on: its interceptor holds a request while no endpoint is ready, up to its
  readiness timeout (then 504), counts every request it sees, in flight or held (GET /v1/models
  too), and its scaler reads those counts every HTTP_QUEUE_TICK_SECONDS: a count above zero at a
  tick is activity; KEDA scales 0 -> 1 at once on it (external-push) and back to 0 once no tick
  saw activity for scaledownPeriod, checked every HTTP_POLLING_SECONDS; its HPA (concurrency
  targetValue 100 per replica) asks for no second replica at this load (the run prints the peak).
- keda: a ScaledObject as the vLLM production stack documents scale to zero: minReplicaCount 0,
  a vllm:num_requests_waiting trigger (threshold 5) and a keepalive on the router's
  `sum(rate(vllm:num_incoming_requests_total[1m]) > bool 0)`. Nothing holds: the router answers
  503 while no replica is ready, and the request it refuses is what the keepalive counts once
  Prometheus scrapes it (PROM_SCRAPE_SECONDS) and KEDA polls it (pollingInterval); GET
  /v1/models is answered by that router and counts nothing. keda + retries: the same, with the
  client's max_retries raised.

Every client is the official openai client: max_retries 2 (more for keda + retries), retrying
408/409/429/5xx and connection errors after 0.5 s x 2^n (at most 8 s, less up to 25% jitter), or
after the answer's Retry-After when it is 120 s or less. An agent task is closed loop: each step
is a request sent 3-8 s after the previous answer; a step whose client gives up fails the task.

Each policy's own knobs are tuned on seed 0 by one rule (TUNING_RULE) over a small grid of
them, and reported on seeds 1-4. GPU-scale constants (the cold start, the wake, a step's service
time) are extrapolations, not measurements: the page names their sources, and sensitivity
tables rerun the report seeds with other values. Ties: GPU-hours within 1% (TIE_GPU), waits
within 0.1 s (TIE_WAIT), counts only when equal; a tie never meets a "fewer" or "beats" target.

Writes out/bench/scale_to_zero.json and .png; the page's latest run on docs/benchmarks/
scale_to_zero.md (full runs only: 7 days, seeds 1-4). Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import textwrap
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from autoglm_api.standby import WAKE_AFTER_SECONDS, Activity, Reading, activity_of
from autoglm_operator.reconcile.standby import PodState, StandbyPlan, plan_standby
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_router.answers import HOLD_RETRY_AFTER_SECONDS
from autoglm_router.demand import DemandBook
from testkit.paths import OUT_DIR
from testkit.plots import pyplot
from testkit.report import results_page
from testkit.stats import percentile

REPLICAS = 2
GPUS_PER_REPLICA = AutoGLMDeploymentSpec().gpus_per_replica  # the default: 2
ROUTER_REPLICAS = 2  # the spec's default router.replicas: each holds up to hold.queueSize
DAYS = 7
DAY = 86400.0
EPOCH = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC: the planner reads wall-clock seconds
OPERATOR_PERIOD = 1.0  # the operator reads each router's report and plans every second

# GPU-scale constants: extrapolations, named with their sources on the page.
# Cold start, request at zero to a ready replica: scheduling and the container start with the
# image on the node (a few s), the engine's start (~10-15 s), ~19 GB of 16-bit weights onto
# 2 GPUs from node-local disk (~20-30 s), memory profiling and CUDA graph capture (~20-30 s with
# a warm compile cache), the first readiness probe (~5 s): 60-90 s, 75 s in the middle.
COLD_START_SECONDS = 75.0
# Level-1 wake: Phi-3-vision's 0.82-0.83 s on an A100 (blog.vllm.ai, 2025-10-26), scaled to the
# ~9-10 GB this model puts on each of its 2 GPUs (docs/runtime/sim.md).
WAKE_SECONDS = 0.85
# An agent step's answer on a replica: the screenshot's prefill (~0.5-0.8 s at light load,
# docs/benchmarks/policy_goodput.md) and ~100-200 tokens at 10-20 ms each on 2 GPUs.
SERVICE_SECONDS = (1.5, 4.0)
GET_MODELS_SECONDS = 0.005  # GET /v1/models through a proxy to a running vLLM: a few ms

# The alternatives' own constants (sources on the page).
HTTP_QUEUE_TICK_SECONDS = 0.5  # KEDA_HTTP_QUEUE_TICK_DURATION: the scaler reads the counts
HTTP_POLLING_SECONDS = 15.0  # pollingInterval of the ScaledObject the add-on creates
HTTP_TARGET_CONCURRENCY = 100  # scalingMetric concurrency targetValue (the docs' example)
PROM_SCRAPE_SECONDS = 30.0  # kube-prometheus-stack's default scrape interval
RATE_WINDOW_SECONDS = 60.0  # the keepalive's rate(...[1m])
KEDA_POLLING_DEFAULT = 30.0  # ScaledObject pollingInterval default
KEDA_COOLDOWN_DEFAULT = 300  # ScaledObject cooldownPeriod default; the add-on's scaledownPeriod
# The openai client (openai/_constants.py, _base_client.py).
CLIENT_MAX_RETRIES = 2
CLIENT_RETRY_DELAY = 0.5
CLIENT_MAX_RETRY_DELAY = 8.0
CLIENT_MAX_RETRY_AFTER = 120.0

# The week: agent tasks per hour (Poisson starts), steps per task, seconds between steps.
PEAK_TASKS_PER_HOUR = 40.0
NIGHT_TASKS_PER_HOUR = 0.25  # a task every 4 h on average at night: sparse night requests
WEEKEND_SHARE = 0.25
NIGHT_JOB_PROBABILITY = 0.3  # a nightly job (one long task) at a random hour, 01:00-05:00
NIGHT_JOB_STEPS = 30
MEAN_STEPS = 5.0
MAX_STEPS = 25
STEP_GAP = (3.0, 8.0)  # after the previous step's answer
# The other traffic: a UI that polls the model list, and clients that send a chat and leave.
POLL_EVERY_SECONDS = 5.0
LEAVE_AFTER_SECONDS = 0.3
LEAVERS_PER_HOUR = 1.0

TUNE_SEED = 0
SEEDS = (1, 2, 3, 4)
IDLE_GRID = (300, 600, 900, 1800, 3600)  # ours: idleSeconds; the add-on and keda: cooldown
SLEEP_GRID = (60, 300, 600)
READINESS_GRID: tuple[float | None, ...] = (1.5, 20.0, None)  # the add-on's defaults by release
KEDA_POLLING_GRID = (15.0, 30.0)
RETRIES_GRID = (5, 10, 20, 40)
TIE_GPU = 0.01  # relative: GPU-hours this close are a tie
TIE_WAIT = 0.1  # seconds: waits this close are a tie
SLO_LONG_WAIT = 1.0  # seconds: a wait over this is a cold start's, not a wake's
SLO_LONG_SHARE = 0.01  # at most 1% of requests wait over SLO_LONG_WAIT
SLO_ANY_SHARE = 0.05  # tuning: at most 5% of requests wait at all
TUNING_RULE = (f"among configurations where no request fails, <= {SLO_LONG_SHARE:.0%} of "
               f"requests wait > {SLO_LONG_WAIT:g} s and <= {SLO_ANY_SHARE:.0%} wait at all: the "
               f"fewest GPU-hours, then the fewest awake GPU-hours (within {TIE_GPU:.0%} counts as "
               "equal; equal goes to the longer window); if none qualifies, the fewest failed "
               "requests, then the fewest long waits, then the same")  # fmt: skip

ALWAYS_ON, ALWAYS_ONE = "always-on", "always-on x1"
S2Z, S2Z_SLEEP, WARM = "scale-to-zero", "s2z + sleep", "warm standby"
HTTP_ADDON, KEDA, KEDA_RETRY = "keda http add-on", "keda", "keda + retries"
POLICY_NAMES = (ALWAYS_ON, ALWAYS_ONE, S2Z, S2Z_SLEEP, WARM, HTTP_ADDON, KEDA, KEDA_RETRY)
OURS = (S2Z, S2Z_SLEEP, WARM)
ALWAYS, MINE, HTTP, PLAIN = "always", "ours", "http", "keda"  # Policy.kind


# --- the traffic ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    start: float  # seconds from Monday 00:00
    gaps: tuple[float, ...]  # seconds after each answer before the next step
    services: tuple[float, ...]  # each step's time on a replica; one per step


def business_day(hour: np.ndarray) -> np.ndarray:
    """Share of the peak task rate by hour of day: 09:00-18:00 with a lunch dip, a small
    evening bump; ~0 at night."""
    def rise(x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x))

    day = rise((hour - 8.5) / 0.5) * rise((18.5 - hour) / 0.7)
    lunch = 1.0 - 0.4 * np.exp(-(((hour - 12.75) / 0.5) ** 2))
    return day * lunch + 0.12 * np.exp(-(((hour - 21.0) / 1.2) ** 2))


@lru_cache(maxsize=8)
def week(seed: int, days: int = DAYS) -> tuple[Task, ...]:
    """One week of agent tasks for a seed (the same for every policy)."""
    rng = np.random.default_rng(seed)
    minutes = np.arange(1440)
    tasks: list[Task] = []

    def task(start: float, steps: int) -> Task:
        return Task(float(start), tuple(float(g) for g in rng.uniform(*STEP_GAP, steps - 1)),
                    tuple(float(s) for s in rng.uniform(*SERVICE_SECONDS, steps)))

    for d in range(days):
        volume = rng.lognormal(0.0, 0.25) * (WEEKEND_SHARE if d % 7 >= 5 else 1.0)
        shift = rng.normal(0.0, 0.5)  # hours: the day starts earlier or later
        per_hour = NIGHT_TASKS_PER_HOUR + PEAK_TASKS_PER_HOUR * volume * business_day(
            minutes / 60.0 - shift)
        counts = rng.poisson(per_hour / 60.0)
        for m in np.flatnonzero(counts):
            for offset in rng.uniform(0.0, 60.0, counts[m]):
                steps = min(MAX_STEPS, int(rng.geometric(1.0 / MEAN_STEPS)))
                tasks.append(task(d * DAY + m * 60.0 + offset, steps))
        if rng.random() < NIGHT_JOB_PROBABILITY:
            tasks.append(task(d * DAY + rng.uniform(1.0, 5.0) * 3600.0, NIGHT_JOB_STEPS))
    return tuple(sorted(tasks, key=lambda t: t.start))


@lru_cache(maxsize=8)
def leavers(seed: int, days: int, per_hour: float) -> tuple[float, ...]:
    """When the clients that send a chat and leave arrive: Poisson, all week."""
    rng = np.random.default_rng(seed + 5000)
    return tuple(sorted(float(t) for t in rng.uniform(0.0, days * DAY,
                                                      rng.poisson(per_hour * days * 24))))


@dataclass(frozen=True)
class Traffic:
    label: str
    poll_every: float | None = None  # a UI polls GET /v1/models this often, all week
    leavers_per_hour: float = 0.0  # chats whose client leaves after LEAVE_AFTER_SECONDS


AGENTS = Traffic("agents")
POLLER = Traffic(f"+ /v1/models every {POLL_EVERY_SECONDS:g} s", poll_every=POLL_EVERY_SECONDS)
LEAVING = Traffic(f"+ {LEAVERS_PER_HOUR:g}/h chat, gone at {LEAVE_AFTER_SECONDS:g} s",
                  leavers_per_hour=LEAVERS_PER_HOUR)


# --- policies and timing -------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    name: str
    kind: str  # ALWAYS, MINE, HTTP or PLAIN
    idle: int = 900  # ours: idleSeconds; the add-on: scaledownPeriod; keda: cooldownPeriod
    floor: int = 0
    sleep: int | None = None  # scaleToZero.sleep.idleSeconds; None: sleep off
    replicas: int = REPLICAS  # always-on: how many run
    readiness: float | None = None  # the add-on's readiness timeout; None: none (v0.14+)
    polling: float = KEDA_POLLING_DEFAULT  # keda: pollingInterval
    retries: int = CLIENT_MAX_RETRIES  # the client's max_retries

    def spec(self) -> AutoGLMDeploymentSpec:
        sleep: dict[str, Any] = {"enabled": self.sleep is not None}
        if self.sleep is not None:
            sleep["idleSeconds"] = self.sleep
        return AutoGLMDeploymentSpec.model_validate({
            "replicas": REPLICAS,
            "router": {"enabled": True},
            "scaleToZero": {"enabled": True, "idleSeconds": self.idle, "floor": self.floor,
                            "sleep": sleep},
        })  # fmt: skip

    def windows(self) -> str:
        if self.kind == ALWAYS:
            return f"{self.replicas} replica{'s' if self.replicas > 1 else ''}"
        if self.kind == HTTP:
            wait = "none" if self.readiness is None else f"{self.readiness:g}s"
            return f"scaledown {self.idle}s, ready {wait}"
        if self.kind == PLAIN:
            retries = f", retries {self.retries}" if self.retries != CLIENT_MAX_RETRIES else ""
            return f"cooldown {self.idle}s, poll {self.polling:g}s{retries}"
        return f"idle {self.idle}s" + (f", sleep {self.sleep}s" if self.sleep else "")


@dataclass(frozen=True)
class Timing:
    label: str = "calibrated"
    cold_start: float = COLD_START_SECONDS
    wake: float = WAKE_SECONDS
    policies: tuple[str, ...] = POLICY_NAMES  # those the change can move


CALIBRATED = Timing()
# What each variant can move: a cold start moves what goes to zero (warm standby's floor
# replica never cold-starts), the wake what sleeps.
_ZERO = (S2Z, HTTP_ADDON, KEDA, KEDA_RETRY)
SENSITIVITY = (
    Timing("cold start 40 s", cold_start=40.0, policies=_ZERO),
    Timing("cold start 240 s", cold_start=240.0, policies=_ZERO),
    Timing("wake 2.6 s", wake=2.6, policies=(S2Z_SLEEP, WARM)),
)
DEFAULTS = Timing("defaults", policies=(S2Z, S2Z_SLEEP, WARM, HTTP_ADDON, KEDA))
VARIANT_POLICIES = _ZERO  # under pollers and leavers


# --- the simulation ------------------------------------------------------------------------

CHAT, POLL, LEAVE = "chat", "poll", "leave"  # Request.kind


@dataclass(eq=False)
class Pod:
    name: str
    created: float
    ready_at: float
    asleep: bool = False  # the sleeping annotation: the operator slept it and has not woken it
    awake_at: float | None = 0.0  # the engine is awake from then; None: asleep
    awake_since: float | None = 0.0  # for awake GPU-seconds: the engine up (or loading) since
    inflight: set[Request] = field(default_factory=set)

    def ready(self, t: float) -> bool:
        return self.ready_at <= t


@dataclass(eq=False)
class Request:
    kind: str  # CHAT, POLL or LEAVE
    task: int  # CHAT: the task's index
    step: int
    first_attempt: float
    at: str = ""  # what the first attempt found: "awake", "asleep" or "zero"
    retries: int = 0  # the client's retries so far
    attempt: int = 0  # bumped on each attempt: a timeout or an answer names its attempt
    since: float = 0.0  # this attempt's arrival
    held: bool = False
    pod: Pod | None = None
    relayed: float = 0.0  # when this attempt went to a replica
    gone: bool = False  # answered, failed or its client left


ATTEMPT, DONE, READY, TIMEOUT, AGED, LEFT, POLLED, CONTROL = range(8)


@dataclass
class Result:
    policy: str
    seed: int
    timing: str
    traffic: str
    windows: str
    days: float
    gpu_hours: float = 0.0
    awake_gpu_hours: float = 0.0
    requests: int = 0  # agent requests sent (a retry is not another)
    tasks: int = 0
    refused: int = 0  # 503/504 answers to agent requests (each retry's counted)
    failed: int = 0  # agent requests whose client gave up: each fails its task
    cut: int = 0  # agent requests in flight on a replica that was deleted
    pods_started: int = 0
    wakes: int = 0  # engines woken (by a request or by the operator)
    planner_calls: int = 0
    polls: int = 0
    leavers: int = 0
    peak_inflight: int = 0
    waits: list[float] = field(default_factory=list)  # every served agent request's wait
    first_arrivals: int = 0  # agent requests whose first attempt found no awake replica
    zero_arrivals: int = 0  # of which: no ready one (at zero, or starting)
    first_waits: list[float] = field(default_factory=list)  # their waits, when served
    zero_waits: list[float] = field(default_factory=list)  # of which: no ready replica
    asleep_waits: list[float] = field(default_factory=list)  # of which: only sleeping ones
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, pods, awake)


class Deployment:
    """The pods, the front door (the router, the add-on's interceptor, or a router that refuses
    at zero) and the clients: one policy over one week."""

    def __init__(self, policy: Policy, traffic: Traffic, tasks: Sequence[Task], timing: Timing,
                 end: float, seed: int, timeline: bool = False) -> None:  # fmt: skip
        self.policy, self.traffic, self.tasks, self.timing, self.end = (policy, traffic, tasks,
                                                                        timing, end)
        self.seed = seed
        self.spec = policy.spec()
        self.gpus = self.spec.gpus_per_replica
        hold = self.spec.router.hold
        self.hold_capacity = hold.queue_size * ROUTER_REPLICAS
        self.hold_seconds = float(hold.wait_seconds)
        self.stale_after = hold.wait_seconds + OPERATOR_PERIOD  # as the operator ages reports
        self.rng = np.random.default_rng(seed + 7919)  # the clients' jitter, the phases
        self.result = Result(policy.name, seed, timing.label, traffic.label, policy.windows(),
                             end / DAY)
        self.record_timeline = timeline
        self.events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.pods: list[Pod] = []
        self._names = 0
        self.held: list[Request] = []
        self.clock = 0.0  # what the router's DemandBook reads as its clock
        self.book = DemandBook(lambda: self.clock)
        self.inflight = 0  # inference requests relayed now
        self.version = 0  # bumped whenever the operator's inputs change: the report, the pods
        self.phase = 0.0
        self.controller = Controller()
        for _ in range(policy.replicas if policy.kind == ALWAYS else REPLICAS):
            self.pods.append(Pod(self._name(), -COLD_START_SECONDS, 0.0))  # serving at 00:00
        self._trace()

    # -- bookkeeping -------------------------------------------------------------------------

    def _name(self) -> str:
        self._names += 1
        return f"pod-{self._names}"

    def push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, payload))

    def _trace(self, t: float = 0.0) -> None:
        if self.record_timeline:
            awake = sum(1 for p in self.pods if p.awake_since is not None)
            self.result.timeline.append((t, len(self.pods), awake))

    def _delete(self, pod: Pod, t: float) -> None:
        for req in list(pod.inflight):  # a replica deleted under a request cuts it
            self._end_relay(req, t)
            req.attempt += 1  # its answer never comes
            if req.kind == CHAT:
                self.result.cut += 1
            if req.kind != POLL:
                self.retry(req, t, None)  # the client sees its connection drop
        self._sleep_engine(pod, t)
        self.result.gpu_hours += (t - max(pod.created, 0.0)) * self.gpus / 3600
        self.pods.remove(pod)

    def _sleep_engine(self, pod: Pod, t: float) -> None:
        if pod.awake_since is not None:
            self.result.awake_gpu_hours += (t - max(pod.awake_since, 0.0)) * self.gpus / 3600
        pod.awake_since = None
        pod.awake_at = None

    def _wake_engine(self, pod: Pod, t: float) -> None:
        if pod.awake_at is None:
            pod.awake_at = t + self.timing.wake
            pod.awake_since = t
            self.result.wakes += 1

    def scale_to(self, replicas: int, t: float) -> bool:
        changed = False
        while len(self.pods) < replicas:
            pod = Pod(self._name(), t, t + self.timing.cold_start)
            pod.awake_since = t
            self.pods.append(pod)
            self.result.pods_started += 1
            self.push(pod.ready_at, READY, pod)
            changed = True
        while len(self.pods) > replicas:
            # A ReplicaSet deletes a not-ready pod first, then the newest.
            victim = max(self.pods, key=lambda p: (not p.ready(t), p.created))
            self._delete(victim, t)
            changed = True
        if changed:
            self.version += 1
            self._trace(t)
        return changed

    # -- the front door ----------------------------------------------------------------------

    def attempt(self, req: Request, t: float) -> None:
        if req.gone:
            return
        req.attempt += 1
        req.since = t
        ready = [p for p in self.pods if p.ready(t)]
        awake = [p for p in ready if p.awake_at is not None and p.awake_at <= t]
        if req.kind == CHAT and req.retries == 0:
            self.result.requests += 1
            req.at = "awake" if awake else ("asleep" if ready else "zero")
            self.result.first_arrivals += req.at != "awake"
            self.result.zero_arrivals += req.at == "zero"
        self.controller.seen(self, req, t)
        if req.kind == POLL:  # only the add-on's interceptor gets here: it proxies the list
            if ready:
                self.relay(req, t, ready[0], t)
            else:
                self.hold(req, t)
        elif awake:
            self.relay(req, t, awake[0], t)
        elif ready:  # sleeping (or waking) replicas only: the soonest awake one takes it
            waking = [p for p in ready if p.awake_at is not None]
            pod = min(waking, key=lambda p: p.awake_at or 0.0) if waking else ready[0]
            if not waking:
                self._wake_engine(pod, t)  # the middleware wakes the engine before it serves
                self._trace(t)
            self.relay(req, t, pod, pod.awake_at or t)
        elif self.policy.kind in (MINE, HTTP):
            self.hold(req, t)
        else:  # a router with nothing to hold at zero
            self.retry(req, t, None, refused=True)

    def hold(self, req: Request, t: float) -> None:
        if self.policy.kind == MINE and len(self.held) >= self.hold_capacity:
            self.retry(req, t, HOLD_RETRY_AFTER_SECONDS, refused=True)
            return
        req.held = True
        self.held.append(req)
        bound = self.hold_seconds if self.policy.kind == MINE else self.policy.readiness
        if bound is not None:
            self.push(t + bound, TIMEOUT, (req, req.attempt))
        if self.policy.kind == MINE:  # the report counts it once it waited this long
            self.push(t + WAKE_AFTER_SECONDS + 1e-6, AGED, (req, req.attempt))

    def unhold(self, req: Request, t: float) -> None:
        self.held.remove(req)
        req.held = False
        if t - req.since >= WAKE_AFTER_SECONDS:
            self.version += 1  # the report counted it

    def relay(self, req: Request, t: float, pod: Pod, serve_at: float) -> None:
        """To `pod` at t; its answer starts at serve_at (after a wake) and then takes its time."""
        if req.held:
            self.unhold(req, t)
        req.pod, req.relayed = pod, t
        pod.inflight.add(req)
        if req.kind == POLL:
            self.push(serve_at + GET_MODELS_SECONDS, DONE, (req, req.attempt))
            return
        self.clock = t
        self.book.started()
        self.inflight += 1
        self.result.peak_inflight = max(self.result.peak_inflight, self.inflight)
        self.version += 1
        if req.kind == CHAT:
            wait = serve_at - req.first_attempt
            self.result.waits.append(wait)
            if req.at != "awake":
                self.result.first_waits.append(wait)
                (self.result.zero_waits if req.at == "zero" else
                 self.result.asleep_waits).append(wait)  # fmt: skip
            service = self.tasks[req.task].services[req.step]
            self.push(serve_at + service, DONE, (req, req.attempt))
        # A LEAVE request's client goes before its answer: LEFT ends it.

    def _end_relay(self, req: Request, t: float) -> None:
        assert req.pod is not None
        req.pod.inflight.discard(req)
        req.pod = None
        if req.kind != POLL:
            self.clock = t
            held = req.relayed - req.since
            self.book.finished(held if held > 0 else None)
            self.inflight -= 1
            self.version += 1
        self.controller.ended(self, req, t)

    def done(self, req: Request, attempt: int, t: float) -> None:
        if req.gone or req.attempt != attempt or req.pod is None:
            return
        self._end_relay(req, t)
        req.gone = True
        if req.kind == CHAT:
            gaps = self.tasks[req.task].gaps
            if req.step < len(gaps):
                nxt = t + gaps[req.step]
                self.push(nxt, ATTEMPT, Request(CHAT, req.task, req.step + 1, nxt))

    def timeout(self, req: Request, attempt: int, t: float) -> None:
        if not req.held or req.attempt != attempt:
            return
        self.unhold(req, t)
        self.controller.ended(self, req, t)
        # The router: 503 with Retry-After; the add-on's interceptor: 504.
        self.retry(req, t, HOLD_RETRY_AFTER_SECONDS if self.policy.kind == MINE else None,
                   refused=True)

    def left(self, req: Request, t: float) -> None:
        """A client that leaves: its held ticket or its relayed request ends."""
        if req.gone:
            return
        if req.held:
            self.unhold(req, t)
            self.controller.ended(self, req, t)
        elif req.pod is not None:
            self._end_relay(req, t)
        req.gone = True

    def retry(self, req: Request, t: float, retry_after: float | None,
              refused: bool = False) -> None:  # fmt: skip
        """The openai client after a refusal or a dropped connection: again, or give up."""
        if req.kind == CHAT and refused:
            self.result.refused += 1
        if req.kind == POLL:  # the UI polls again on its own clock
            req.gone = True
            return
        if req.retries >= self.policy.retries:
            req.gone = True
            if req.kind == CHAT:
                self.result.failed += 1
            return
        if retry_after is not None and 0 < retry_after <= CLIENT_MAX_RETRY_AFTER:
            delay = retry_after
        else:
            delay = min(CLIENT_RETRY_DELAY * 2.0**req.retries, CLIENT_MAX_RETRY_DELAY)
            delay *= 1 - 0.25 * float(self.rng.random())
        req.retries += 1
        self.push(t + delay, ATTEMPT, req)

    def ready(self, pod: Pod, t: float) -> None:
        """A replica is ready: whatever is held goes to it."""
        if pod not in self.pods:
            return
        self.version += 1
        self._trace(t)
        for req in list(self.held):
            self.relay(req, t, pod, t)

    # -- the run -----------------------------------------------------------------------------

    def handle(self, t: float, kind: int, payload: Any) -> None:
        if kind == ATTEMPT:
            self.attempt(payload, t)
        elif kind == DONE:
            self.done(payload[0], payload[1], t)
        elif kind == READY:
            self.ready(payload, t)
        elif kind == TIMEOUT:
            self.timeout(payload[0], payload[1], t)
        elif kind == AGED:
            req, attempt = payload
            if req.held and req.attempt == attempt:
                self.version += 1
        elif kind == LEFT:
            self.left(payload, t)
        elif kind == POLLED:
            self.result.polls += 1
            assert self.traffic.poll_every is not None
            self.push(t + self.traffic.poll_every, POLLED, None)
            if self.policy.kind == HTTP:  # else the router answers the list: nothing counts
                self.attempt(Request(POLL, -1, 0, t), t)
        else:
            self.controller.control(self, t, payload)

    def run(self, controller: Controller, phase: float) -> Result:
        """Every event in time order; the operator acts on ticks (phase + n * its period) and
        says which tick it acts on next; KEDA acts on events of its own."""
        self.controller = controller
        for i, task in enumerate(self.tasks):
            if task.start < self.end:
                self.result.tasks += 1
                self.push(task.start, ATTEMPT, Request(CHAT, i, 0, task.start))
        if self.traffic.leavers_per_hour:
            days = max(1, math.ceil(self.end / DAY))
            for t in leavers(self.seed, days, self.traffic.leavers_per_hour):
                if t >= self.end:
                    break
                req = Request(LEAVE, -1, 0, t)
                self.result.leavers += 1
                self.push(t, ATTEMPT, req)
                self.push(t + LEAVE_AFTER_SECONDS, LEFT, req)
        if self.traffic.poll_every:
            self.push(float(self.rng.uniform(0.0, self.traffic.poll_every)), POLLED, None)
        controller.start(self)
        self.phase = phase
        n = 0
        while (now := self.time(n)) < self.end:
            while self.events and self.events[0][0] <= now:
                t, _, kind, payload = heapq.heappop(self.events)
                self.handle(t, kind, payload)
            next_event = min(self.events[0][0] if self.events else math.inf, self.end)
            n = controller.tick(self, n, self.tick_at(next_event, n))
        for pod in list(self.pods):
            self._delete(pod, self.end)
        return self.result

    def time(self, n: int) -> float:
        return self.phase + n * OPERATOR_PERIOD

    def tick_at(self, t: float, after: int) -> int:
        """The first tick at or after `t`, and after tick `after`."""
        return max(after + 1, math.ceil((t - self.phase) / OPERATOR_PERIOD))

    def report_at(self, t: float) -> Activity:
        """The operator's Activity at t, from the router's report as the router writes it."""
        saved, self.clock = self.clock, t
        report = self.book.report(r.since for r in self.held)
        self.clock = saved
        return activity_of([Reading(report, EPOCH + t)], EPOCH + t, self.stale_after)


class Controller:
    """What decides the replicas: nothing (always-on), the operator's planner, or KEDA."""

    def start(self, dep: Deployment) -> None:
        """Before the first event."""

    def tick(self, dep: Deployment, n: int, horizon: int) -> int:
        """Act at tick n; return the next tick to act on. Nothing but the clock changes before
        tick `horizon` (the first at or after the next event)."""
        return horizon

    def seen(self, dep: Deployment, req: Request, t: float) -> None:
        """An attempt reached the front door."""

    def ended(self, dep: Deployment, req: Request, t: float) -> None:
        """An attempt the front door held or relayed ended (answered, timed out, left, cut)."""

    def control(self, dep: Deployment, t: float, payload: Any) -> None:
        """An event of its own."""


class Operator(Controller):
    """The operator's loop: the router's report read and plan_standby called every tick, the
    plan carried out at once.

    Its inputs (the report, the pods) change only on events, and with the same inputs the
    planner's answer stays the same until a window passes, then changes: so a tick whose
    inputs are those of the last call is skipped, and the first tick whose answer differs is
    found by galloping and bisection over later ticks with those inputs. The decisions are the
    ones a call every tick makes (tests/unit/bench/test_scale_to_zero.py checks it)."""

    def __init__(self, spec: AutoGLMDeploymentSpec) -> None:
        self.spec = spec
        self.status: dict[str, Any] | None = None
        self.version = -1  # dep.version at the last call
        self.pods: list[PodState] = []  # the pods as that call saw them
        self.called_at = 0  # its tick
        self.same: tuple[Any, ...] = ()  # its answer
        self.same_until = 0  # the answer holds through this tick
        self.change_at: int | None = None  # and changes at this one
        self.activity = Activity()  # the router's report as the last call read it

    def plan(self, dep: Deployment, n: int, pods: list[PodState]) -> StandbyPlan:
        dep.result.planner_calls += 1
        return plan_standby(self.spec, self.activity, self.status, pods, EPOCH + dep.time(n))

    def tick(self, dep: Deployment, n: int, horizon: int) -> int:
        if dep.version != self.version or (self.change_at is not None and n >= self.change_at):
            self.version = dep.version
            now = dep.time(n)
            self.pods = [PodState(p.name, p.ready(now), p.asleep) for p in dep.pods]
            # The report as read now holds until the next event: its times are absolute, and a
            # held request's count changes when it ages (an event).
            self.activity = dep.report_at(now)
            before = (self.status or {}).get("state")
            plan = self.plan(dep, n, self.pods)
            self.status = dict(plan.status) if plan.status is not None else None
            acted = self.apply(dep, plan, now)
            if acted or (self.status or {}).get("state") != before:
                self.version = -1  # what it did is the next tick's input
                return n + 1
            self.same, self.called_at, self.change_at = _signature(plan), n, None
            self.same_until = max(n, self.quiet_until(dep, n))
        if self.change_at is None and self.same_until < horizon:
            # Look ahead past the horizon (events that leave the inputs as they are then cost
            # no call), twice as far as the last time.
            ahead = max(horizon, self.same_until + max(32, self.same_until - self.called_at))
            if _signature(self.plan(dep, ahead, self.pods)) == self.same:
                self.same_until = ahead
            else:
                lo, hi = self.same_until, ahead  # the answer is the same at lo, not at hi
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if _signature(self.plan(dep, mid, self.pods)) == self.same:
                        lo = mid
                    else:
                        hi = mid
                self.same_until, self.change_at = lo, hi
        return horizon if self.change_at is None else min(self.change_at, horizon)

    def quiet_until(self, dep: Deployment, n: int) -> int:
        """The last tick before the clock alone can change the answer. With its inputs fixed
        the planner moves only when an idle window (idleSeconds, sleep.idleSeconds) passes,
        counted from the last request, and never while one is held or in flight
        (reconcile/standby.py's IDLE and QUIET triggers); the test holds this to a call every
        tick."""
        if self.activity.busy:
            return 2**62
        if self.activity.last_request_at is None:
            return n
        settings = self.spec.scale_to_zero
        window = min(settings.idle_seconds, settings.sleep.idle_seconds
                     if settings.sleep.enabled else settings.idle_seconds)
        return dep.tick_at(self.activity.last_request_at - EPOCH + window, n) - 1

    def apply(self, dep: Deployment, plan: StandbyPlan, now: float) -> bool:
        acted = dep.scale_to(plan.replicas, now)
        for pod in dep.pods:
            if pod.name in plan.sleep and not pod.asleep:
                dep._sleep_engine(pod, now)
                pod.asleep = acted = True
            elif pod.name in plan.wake and pod.asleep:
                dep._wake_engine(pod, now)
                pod.asleep, acted = False, True
        if acted:
            dep.version += 1
            dep._trace(now)
        return acted


def _signature(plan: StandbyPlan) -> tuple[Any, ...]:
    return (plan.replicas, plan.sleep, plan.wake, (plan.status or {}).get("state"))


def _next(t: float, phase: float, period: float) -> float:
    """The first of phase + k * period at or after t."""
    return phase + math.ceil((t - phase) / period - 1e-9) * period


def _last_before(t: float, phase: float, period: float) -> float:
    """The last of phase + k * period strictly before t."""
    return phase + (math.ceil((t - phase) / period - 1e-9) - 1) * period


class HttpAddOn(Controller):
    """The KEDA HTTP add-on's scaler and KEDA: activity is a request the interceptor holds or
    relays at one of the scaler's queue reads (every HTTP_QUEUE_TICK_SECONDS); at zero KEDA
    scales to one replica on it; it scales to zero once no read saw activity for
    scaledownPeriod, checked at each of its polls."""

    def __init__(self, dep: Deployment, scaledown: float) -> None:
        self.cooldown = scaledown
        self.tick_phase = float(dep.rng.uniform(0.0, HTTP_QUEUE_TICK_SECONDS))
        self.poll_phase = float(dep.rng.uniform(0.0, HTTP_POLLING_SECONDS))
        self.pending: dict[Request, float] = {}  # counted now: since when
        self.last_active = 0.0
        self.check_at: float | None = None

    def start(self, dep: Deployment) -> None:
        self.arm(dep)

    def seen(self, dep: Deployment, req: Request, t: float) -> None:
        self.pending[req] = t
        if not dep.pods:  # the next read sees it, if it is still there
            dep.push(_next(t, self.tick_phase, HTTP_QUEUE_TICK_SECONDS), CONTROL, "read")

    def ended(self, dep: Deployment, req: Request, t: float) -> None:
        since = self.pending.pop(req, None)
        if since is None:
            return
        read = _last_before(t, self.tick_phase, HTTP_QUEUE_TICK_SECONDS)
        if read >= since:  # a read saw it
            self.last_active = max(self.last_active, read)

    def control(self, dep: Deployment, t: float, payload: Any) -> None:
        if payload == "read":
            if self.pending:
                self.last_active = max(self.last_active, t)
                if not dep.pods:
                    dep.scale_to(1, t)
                    self.arm(dep)
            return
        self.check_at = None  # a poll
        if not dep.pods:
            return
        read = _last_before(t + 1e-9, self.tick_phase, HTTP_QUEUE_TICK_SECONDS)
        if any(since <= read for since in self.pending.values()):
            self.last_active = max(self.last_active, read)
        if t - self.last_active >= self.cooldown - 1e-6:
            dep.scale_to(0, t)
        else:
            self.arm(dep, t + HTTP_POLLING_SECONDS)

    def arm(self, dep: Deployment, after: float = 0.0) -> None:
        """The poll that may scale to zero: the first one a scaledownPeriod after the last
        activity, and not before `after`."""
        if self.check_at is None:
            due = _next(self.last_active + self.cooldown, self.poll_phase, HTTP_POLLING_SECONDS)
            self.check_at = max(due, after)
            dep.push(self.check_at, CONTROL, "poll")


class Keda(Controller):
    """A ScaledObject on Prometheus: a request the router counted (refused ones too) shows in
    the keepalive's rate once a scrape follows it, for RATE_WINDOW_SECONDS less a scrape
    interval; KEDA polls every pollingInterval, scales 0 -> 1 at a poll that sees it and back to
    zero at a poll cooldownPeriod after the last one that did."""

    def __init__(self, dep: Deployment, cooldown: float, polling: float) -> None:
        self.cooldown, self.polling = cooldown, polling
        self.scrape_phase = float(dep.rng.uniform(0.0, PROM_SCRAPE_SECONDS))
        self.poll_phase = float(dep.rng.uniform(0.0, polling))
        self.seen_by: deque[tuple[float, float]] = deque()  # (first, last) poll seeing one
        self.last_active = 0.0  # of the windows already past
        self.check_at: float | None = None

    def start(self, dep: Deployment) -> None:
        self.arm(dep)

    def seen(self, dep: Deployment, req: Request, t: float) -> None:
        if req.kind == POLL:
            return
        scrape = _next(t, self.scrape_phase, PROM_SCRAPE_SECONDS)
        until = scrape + RATE_WINDOW_SECONDS - PROM_SCRAPE_SECONDS
        first = _next(scrape, self.poll_phase, self.polling)
        if first >= until:
            return  # no poll falls while the rate shows it
        self.seen_by.append((first, _last_before(until, self.poll_phase, self.polling)))
        # The poll that first sees it scales from zero: the deployment may get there meanwhile
        # (a poll scales it down before the scrape shows this request).
        dep.push(first, CONTROL, "activate")

    def active_until(self, t: float) -> float:
        """The last poll at or before t that saw activity."""
        while self.seen_by and self.seen_by[0][1] <= t:
            self.last_active = max(self.last_active, self.seen_by.popleft()[1])
        best = self.last_active
        for first, last in self.seen_by:
            if first <= t:
                best = max(best, min(last, t))
        return best

    def control(self, dep: Deployment, t: float, payload: Any) -> None:
        if payload == "activate":
            if not dep.pods:
                dep.scale_to(1, t)
                self.arm(dep)
            return
        self.check_at = None
        if not dep.pods:
            return
        if t - self.active_until(t) >= self.cooldown - 1e-6:
            dep.scale_to(0, t)
        else:
            self.arm(dep, t + self.polling)

    def arm(self, dep: Deployment, after: float = 0.0) -> None:
        """The poll that may scale to zero: the first one a cooldownPeriod after the last
        activity known now, and not before `after`."""
        if self.check_at is None:
            latest = max([self.last_active, *(last for _, last in self.seen_by)])
            due = _next(latest + self.cooldown, self.poll_phase, self.polling)
            self.check_at = max(due, after)
            dep.push(self.check_at, CONTROL, "poll")


def controller_for(policy: Policy, dep: Deployment) -> Controller:
    if policy.kind == MINE:
        return Operator(dep.spec)
    if policy.kind == HTTP:
        return HttpAddOn(dep, policy.idle)
    if policy.kind == PLAIN:
        return Keda(dep, policy.idle, policy.polling)
    return Controller()


Job = tuple[Policy, int, Timing, Traffic, bool, int]  # + keep a timeline, days


def simulate(job: Job) -> Result:
    policy, seed, timing, traffic, timeline, days = job
    dep = Deployment(policy, traffic, week(seed, days), timing, days * DAY, seed, timeline)
    phase = float(np.random.default_rng(seed + 1000).uniform(0.0, OPERATOR_PERIOD))
    return dep.run(controller_for(policy, dep), phase)


def run_all(jobs: Sequence[Job], workers: int) -> list[Result]:
    if workers <= 1:
        return [simulate(j) for j in jobs]
    # The slow ones first: the operator's runs and the pollers' cost the most.
    order = sorted(range(len(jobs)), key=lambda i: -_cost(jobs[i]))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(simulate, [jobs[i] for i in order], chunksize=1))
    out: list[Result] = [done[0]] * len(jobs)
    for i, result in zip(order, done, strict=True):
        out[i] = result
    return out


def _cost(job: Job) -> float:
    policy, _, _, traffic, _, _ = job
    return (3.0 if policy.kind == MINE else 1.0) + (2.0 if traffic.poll_every else 0.0)


# --- figures -------------------------------------------------------------------------------


def share_over(waits: Sequence[float], bound: float, requests: int) -> float:
    """The share of the requests sent whose (served) wait was over `bound`."""
    return sum(1 for w in waits if w > bound) / requests if requests else 0.0


def summarize(runs: Sequence[Result]) -> dict[str, Any]:
    """One policy over several seeds: means per seed, waits pooled."""
    n, days = len(runs), runs[0].days
    requests = sum(r.requests for r in runs)
    waits = [w for r in runs for w in r.waits]

    def q(values: Sequence[float], p: float) -> float | None:
        return percentile(values, p)

    first = [w for r in runs for w in r.first_waits]
    zero = [w for r in runs for w in r.zero_waits]
    asleep = [w for r in runs for w in r.asleep_waits]
    return {
        "policy": runs[0].policy, "windows": runs[0].windows, "seeds": [r.seed for r in runs],
        "gpu_hours": sum(r.gpu_hours for r in runs) / n,
        "gpu_hours_per_seed": [round(r.gpu_hours, 2) for r in runs],
        "awake_gpu_hours": sum(r.awake_gpu_hours for r in runs) / n,
        "requests": requests / n, "tasks": sum(r.tasks for r in runs) / n,
        "refused": sum(r.refused for r in runs) / n,
        "refused_per_seed": [r.refused for r in runs],
        "failed": sum(r.failed for r in runs) / n,
        "failed_per_seed": [r.failed for r in runs],
        "cut": sum(r.cut for r in runs) / n,
        "pods_started": sum(r.pods_started for r in runs) / n,
        "pods_started_per_day": sum(r.pods_started for r in runs) / n / days,
        "wakes_per_day": sum(r.wakes for r in runs) / n / days,
        "peak_inflight": max(r.peak_inflight for r in runs),
        "first_requests": sum(r.first_arrivals for r in runs) / n,
        "first_wait_p50": q(first, 0.5), "first_wait_p95": q(first, 0.95),
        "first_wait_max": max(first, default=None),
        "zero_requests": sum(r.zero_arrivals for r in runs) / n,
        "zero_served": len(zero) / n,
        "zero_wait_p50": q(zero, 0.5), "zero_wait_p95": q(zero, 0.95),
        "zero_wait_max": max(zero, default=None),
        "asleep_requests": sum(r.first_arrivals - r.zero_arrivals for r in runs) / n,
        "asleep_wait_p50": q(asleep, 0.5), "asleep_wait_max": max(asleep, default=None),
        "long_wait_share_per_seed": [share_over(r.waits, SLO_LONG_WAIT, r.requests)
                                     for r in runs],
        # Over served requests; a failed request has no wait (it is in `failed`).
        "wait_p99": q(waits, 0.99),
        "long_wait_share": share_over(waits, SLO_LONG_WAIT, requests),
        "any_wait_share": share_over(waits, 0.0, requests),
        "planner_calls": sum(r.planner_calls for r in runs) / n,
    }  # fmt: skip


def by_policy(results: Sequence[Result], timing: str, traffic: str = AGENTS.label
              ) -> dict[str, dict[str, Any]]:  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    for name in POLICY_NAMES:
        runs = [r for r in results
                if r.policy == name and r.timing == timing and r.traffic == traffic]
        if runs:
            out[name] = summarize(runs)
    return out


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def compare(value: float, other: float, tol: float, relative: bool) -> str:
    """'lower', 'higher' or 'tie' (within tol: relative to the larger, or absolute)."""
    gap = tol * max(abs(value), abs(other)) if relative else tol
    if abs(value - other) <= gap:
        return "tie"
    return "lower" if value < other else "higher"


# --- tuning on seed 0 ----------------------------------------------------------------------


def grid() -> list[Policy]:
    """Every policy's own knobs, the same effort each: its window and one knob of its own."""
    out = [Policy(S2Z, MINE, idle) for idle in IDLE_GRID]
    out += [Policy(WARM, MINE, idle, floor=1, sleep=sleep)
            for idle in IDLE_GRID for sleep in SLEEP_GRID if sleep < idle]  # fmt: skip
    out += [Policy(HTTP_ADDON, HTTP, idle, readiness=ready)
            for idle in IDLE_GRID for ready in READINESS_GRID]  # fmt: skip
    out += [Policy(KEDA, PLAIN, idle, polling=poll)
            for idle in IDLE_GRID for poll in KEDA_POLLING_GRID]  # fmt: skip
    out += [Policy(KEDA_RETRY, PLAIN, idle, polling=KEDA_POLLING_GRID[0], retries=retries)
            for idle in IDLE_GRID for retries in RETRIES_GRID]  # fmt: skip
    return out


def sleep_grid(s2z: Policy) -> list[Policy]:
    """s2z + sleep: scale-to-zero's window (sleep moves no GPU-hour), the sleep window tuned."""
    return [Policy(S2Z_SLEEP, MINE, s2z.idle, sleep=sleep) for sleep in SLEEP_GRID
            if sleep < s2z.idle]


def meets_slo(s: dict[str, Any]) -> bool:
    return bool(s["failed"] == 0 and s["long_wait_share"] <= SLO_LONG_SHARE
                and s["any_wait_share"] <= SLO_ANY_SHARE)  # fmt: skip


def pick(rows: Sequence[tuple[Policy, dict[str, Any]]]) -> tuple[Policy, dict[str, Any], bool]:
    """TUNING_RULE over one policy's grid; (choice, its figures, whether any met the SLO)."""
    ok = [(p, s) for p, s in rows if meets_slo(s)]
    met = bool(ok)
    if not ok:  # none qualifies: the fewest failed, then the fewest long waits
        fewest = min(s["failed"] for _, s in rows)
        ok = [(p, s) for p, s in rows if s["failed"] <= fewest]
        fewest = min(s["long_wait_share"] for _, s in ok)
        ok = [(p, s) for p, s in ok if s["long_wait_share"] <= fewest]
    for key in ("gpu_hours", "awake_gpu_hours"):
        best = min(s[key] for _, s in ok)
        ok = [(p, s) for p, s in ok if compare(s[key], best, TIE_GPU, True) in ("tie", "lower")]
    policy, summary = max(ok, key=lambda ps: (ps[0].idle, ps[0].sleep or 0,
                                              ps[0].readiness or math.inf, -ps[0].polling,
                                              -ps[0].retries))  # fmt: skip
    return policy, summary, met


def _column(p: Policy) -> str:
    """The knob beside the window, as a grid's column."""
    if p.kind == HTTP:
        return "ready " + ("none" if p.readiness is None else f"{p.readiness:g}s")
    if p.name == KEDA_RETRY:
        return f"max_retries {p.retries}"
    if p.kind == PLAIN:
        return f"poll {p.polling:g}s"
    return "" if p.sleep is None else f"sleep {p.sleep}s"


def print_grid(name: str, rows: Sequence[tuple[Policy, dict[str, Any]]], choice: Policy,
               met: bool) -> list[dict[str, Any]]:  # fmt: skip
    columns = list(dict.fromkeys(_column(p) for p, _ in rows))
    width = 24
    window = {MINE: "idle", HTTP: "scaledown", PLAIN: "cooldown"}[rows[0][0].kind]
    print(f"{name:<17}{window:>9}" + "".join(f"{c:^{width}}" for c in columns))
    table = []
    for idle in sorted({p.idle for p, _ in rows}):
        cells = []
        for column in columns:
            hit = [(p, s) for p, s in rows if p.idle == idle and _column(p) == column]
            if not hit:
                cells.append(f"{'':^{width}}")
                continue
            p, s = hit[0]
            mark = ("*" if meets_slo(s) else " ") + ("<" if p == choice else " ")
            cells.append(f"{s['gpu_hours']:>5.0f} {100 * s['long_wait_share']:>5.2f}% "
                         f"{s['failed']:>4.0f}f{mark:<2}  ")  # fmt: skip
            table.append({"policy": name, "windows": p.windows(), "meets_slo": meets_slo(s),
                          "chosen": p == choice,
                          **{k: s[k] for k in ("gpu_hours", "awake_gpu_hours", "long_wait_share",
                                               "any_wait_share", "failed", "refused")}})
        print((f"{'':<17}{idle:>9}" + "".join(cells)).rstrip())
    note = "" if met else " (none qualified: the fewest failed, then the fewest long waits)"
    print(f"  chosen: {choice.windows()}{note}")
    return table


def tune(workers: int, days: int) -> tuple[dict[str, Policy], list[dict[str, Any]]]:
    print(textwrap.fill(f"tuning on seed {TUNE_SEED} only; rule: {TUNING_RULE}", width=96,
                        subsequent_indent="  "))  # fmt: skip
    print("cell: GPU-hours, % of requests waiting > 1 s, failed requests; '*' qualifies, "
          "'<' chosen")
    candidates = grid()
    results = run_all([(p, TUNE_SEED, CALIBRATED, AGENTS, False, days) for p in candidates],
                      workers)  # fmt: skip
    rows = [(p, summarize([r])) for p, r in zip(candidates, results, strict=True)]
    chosen: dict[str, Policy] = {}
    table: list[dict[str, Any]] = []
    for name in (S2Z, WARM, HTTP_ADDON, KEDA, KEDA_RETRY):
        mine = [(p, s) for p, s in rows if p.name == name]
        chosen[name], _, met = pick(mine)
        table += print_grid(name, mine, chosen[name], met)
    sleeps = sleep_grid(chosen[S2Z])
    results = run_all([(p, TUNE_SEED, CALIBRATED, AGENTS, False, days) for p in sleeps],
                      workers)  # fmt: skip
    mine = [(p, summarize([r])) for p, r in zip(sleeps, results, strict=True)]
    chosen[S2Z_SLEEP], _, met = pick(mine)
    table += print_grid(S2Z_SLEEP, mine, chosen[S2Z_SLEEP], met)
    return chosen, table


def the_policies(chosen: dict[str, Policy]) -> list[Policy]:
    return [Policy(ALWAYS_ON, ALWAYS), Policy(ALWAYS_ONE, ALWAYS, replicas=1),
            *(chosen[name] for name in (S2Z, S2Z_SLEEP, WARM, HTTP_ADDON, KEDA, KEDA_RETRY))]


def default_policies() -> list[Policy]:
    """Each as it comes: the CRD's windows; the add-on's scaledownPeriod and its current
    release's readiness timeout (none); KEDA's cooldownPeriod and pollingInterval."""
    settings = AutoGLMDeploymentSpec().scale_to_zero
    idle, sleep = settings.idle_seconds, settings.sleep.idle_seconds
    return [Policy(S2Z, MINE, idle), Policy(S2Z_SLEEP, MINE, idle, sleep=sleep),
            Policy(WARM, MINE, idle, floor=1, sleep=sleep),
            Policy(HTTP_ADDON, HTTP, KEDA_COOLDOWN_DEFAULT, readiness=None),
            Policy(KEDA, PLAIN, KEDA_COOLDOWN_DEFAULT, polling=KEDA_POLLING_DEFAULT)]


# --- report --------------------------------------------------------------------------------


def print_main(summary: dict[str, dict[str, Any]], seeds: Sequence[int], days: int) -> None:
    base = summary[ALWAYS_ON]["gpu_hours"]
    print(f"\nseeds {','.join(map(str, seeds))}, {days} days each, cold start "
          f"{COLD_START_SECONDS:g} s, wake {WAKE_SECONDS:g} s; per seed (mean), waits pooled")
    head = (f"{'policy':<17}{'knobs':<38}{'GPU-h':>6}{'saved':>6}{'awake':>6}{'reqs':>6}"
            f"{'refused':>8}{'failed':>7}{'cut':>4}{'starts/d':>9}{'p99':>6}{'>1s%':>6}"
            f"{'>0s%':>6}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for name, s in summary.items():
        saved = 1 - s["gpu_hours"] / base
        print(f"{name:<17}{s['windows']:<38}{s['gpu_hours']:>6.0f}{100 * saved:>5.0f}%"
              f"{s['awake_gpu_hours']:>6.0f}{s['requests']:>6.0f}{s['refused']:>8.1f}"
              f"{s['failed']:>7.1f}{s['cut']:>4.0f}{s['pods_started_per_day']:>9.1f}"
              f"{_s(s['wait_p99']):>6}{100 * s['long_wait_share']:>6.2f}"
              f"{100 * s['any_wait_share']:>6.2f}")  # fmt: skip
    print("GPU-h: pods x 2 GPUs x hours per week, a sleeping pod included; saved: against\n"
          "always-on (2 replicas); awake: GPU-hours of engines not asleep; reqs: agent requests\n"
          "sent; refused: 503/504 answers (each retry's); failed: requests the client gave up\n"
          "on (each fails its task); cut: in flight when their replica was deleted; starts/d:\n"
          "pods started (cold starts) a day; p99: added wait (s) over served requests;\n"
          ">1s%, >0s%: requests that waited over 1 s, and at all. Nearest-rank percentiles.")
    peak = max(s["peak_inflight"] for s in summary.values())
    print(f"peak agent requests in flight, any policy and seed: {peak} (the add-on's HPA asks for"
          f" a second replica above {HTTP_TARGET_CONCURRENCY} a replica, keda's above 5 waiting)")
    print(f"\nthe {SLO_LONG_SHARE:.0%} tail, per seed: % of requests waiting over "
          f"{SLO_LONG_WAIT:g} s | GPU-hours | failed")
    for name, s in summary.items():
        long = "".join(f"{100 * x:>6.2f}" for x in s["long_wait_share_per_seed"])
        gpu = "".join(f"{g:>6.0f}" for g in s["gpu_hours_per_seed"])
        failed = "".join(f"{f:>5d}" for f in s["failed_per_seed"])
        print(f"{name:<17}{long} |{gpu} |{failed}")
    print("\nwhat the first request pays: requests that found no awake replica, per seed, and\n"
          "the wait of those served (s, pooled over the seeds)")
    head = (f"{'policy':<17}{'at zero or starting':>20}{'p50':>6}{'p95':>6}{'max':>6}"
            f"{'unserved':>9}{'asleep':>8}{'p50':>6}{'max':>6}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for name, s in summary.items():
        unserved = s["zero_requests"] - s["zero_served"]
        print(f"{name:<17}{s['zero_requests']:>20.0f}{_s(s['zero_wait_p50']):>6}"
              f"{_s(s['zero_wait_p95']):>6}{_s(s['zero_wait_max']):>6}{unserved:>9.0f}"
              f"{s['asleep_requests']:>8.0f}{_s(s['asleep_wait_p50']):>6}"
              f"{_s(s['asleep_wait_max']):>6}")  # fmt: skip


def print_pairs(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours beside each alternative, ties as ties."""
    pairs = [(S2Z, HTTP_ADDON), (S2Z, KEDA), (S2Z, KEDA_RETRY), (S2Z, ALWAYS_ONE),
             (S2Z_SLEEP, S2Z), (WARM, S2Z), (WARM, ALWAYS_ONE)]
    print(f"\nside by side, ours first (tie: GPU-hours within {TIE_GPU:.0%}, waits within "
          f"{TIE_WAIT:g} s, counts equal; 'lower' is ours lower)")  # fmt: skip
    head = (f"{'ours':<15}{'vs':<17}{'GPU-hours':>16}{'':<8}{'failed':>12}{'':<8}"
            f"{'first p95 (s)':>14}")  # fmt: skip
    print(head)
    print("-" * (len(head) + 8))
    out = []
    for mine, other in pairs:
        a, b = summary[mine], summary[other]
        gpu = compare(a["gpu_hours"], b["gpu_hours"], TIE_GPU, True)
        wait = _cmp_opt(a["first_wait_p95"], b["first_wait_p95"])
        failed = compare(a["failed"], b["failed"], 0.0, False)
        print(f"{mine:<15}{other:<17}{a['gpu_hours']:>7.1f} /{b['gpu_hours']:>7.1f} "
              f"{_word(gpu):<7}{a['failed']:>5.1f} /{b['failed']:>5.1f} {_word(failed):<7}"
              f"{_s(a['first_wait_p95']):>6} /{_s(b['first_wait_p95']):>5} {_word(wait)}")
        out.append({"ours": mine, "other": other, "gpu_hours": gpu, "failed": failed,
                    "first_wait_p95": wait})  # fmt: skip
    return out


def _cmp_opt(a: float | None, b: float | None) -> str:
    """Waits compared; '-' where one side has none (always-on never waits)."""
    return "-" if a is None or b is None else compare(a, b, TIE_WAIT, False)


def _word(c: str) -> str:
    return {"tie": "TIE", "lower": "lower", "higher": "higher", "-": "n/a"}[c]


def print_traffic(rows: dict[str, dict[str, dict[str, Any]]],
                  base: dict[str, dict[str, Any]]) -> None:  # fmt: skip
    print("\nother traffic beside the agents, the same seeds and knobs: what it adds (GPU-hours\n"
          "and cold starts a week against the agents alone; tie: GPU-hours within 1%)")
    head = (f"{'traffic':<34}{'policy':<17}{'GPU-h':>6}{'added':>7}{'':<5}{'starts':>7}"
            f"{'added':>6}{'failed':>7}{'>1s%':>6}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for label, summary in rows.items():
        first = True
        for name, s in summary.items():
            b = base[name]
            mark = {"tie": "=", "lower": "-", "higher": "+"}[
                compare(s["gpu_hours"], b["gpu_hours"], TIE_GPU, True)]
            print(f"{label if first else '':<34}{name:<17}{s['gpu_hours']:>6.0f}"
                  f"{s['gpu_hours'] - b['gpu_hours']:>+7.0f} {mark:<4}{s['pods_started']:>7.0f}"
                  f"{s['pods_started'] - b['pods_started']:>+6.0f}{s['failed']:>7.1f}"
                  f"{100 * s['long_wait_share']:>6.2f}")  # fmt: skip
            first = False
    print("'=': within the tie band of the agents alone; '+' above it, '-' below")


def print_variants(rows: dict[str, dict[str, dict[str, Any]]], title: str) -> None:
    print(f"\n{title}")
    head = (f"{'timing':<28}{'policy':<17}{'GPU-h':>6}{'refused':>8}{'failed':>7}{'first':>6}"
            f"{'p50':>6}{'p95':>6}{'max':>6}{'p99':>6}{'>1s%':>6}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for label, summary in rows.items():
        first = True
        for name, s in summary.items():
            print(f"{label if first else '':<28}{name:<17}{s['gpu_hours']:>6.0f}"
                  f"{s['refused']:>8.1f}{s['failed']:>7.1f}{s['first_requests']:>6.0f}"
                  f"{_s(s['first_wait_p50']):>6}{_s(s['first_wait_p95']):>6}"
                  f"{_s(s['first_wait_max']):>6}{_s(s['wait_p99']):>6}"
                  f"{100 * s['long_wait_share']:>6.2f}")  # fmt: skip
            first = False


def check(summary: dict[str, dict[str, Any]], traffic: dict[str, dict[str, dict[str, Any]]],
          starts: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:  # fmt: skip
    """The targets, each one the model can miss. `starts`: the summaries by cold start."""
    out: list[dict[str, Any]] = []

    def record(target: str, verdict: str, detail: str, met: bool | None = None) -> None:
        ok = verdict == "PASS" if met is None else met
        out.append({"target": target, "verdict": verdict, "met": ok, "detail": detail})
        print(f"{verdict}: {target}: {detail}")

    def gpu(a: float, b: float) -> str:
        return compare(a, b, TIE_GPU, True)

    print()
    for name in OURS:
        shares = summary[name]["long_wait_share_per_seed"]
        misses = [f"seed {s} {100 * x:.2f}%" for s, x in zip(summary[name]["seeds"], shares,
                                                              strict=True) if x > SLO_LONG_SHARE]
        record(f"{name}: <= {SLO_LONG_SHARE:.0%} of requests wait over {SLO_LONG_WAIT:g} s, on "
               "every report seed", "FAIL" if misses else "PASS",
               ", ".join(misses) + " over" if misses else
               " ".join(f"{100 * x:.2f}%" for x in shares))  # fmt: skip
    for name in OURS:
        failed = {label: s[name]["failed"] for label, s in starts.items() if name in s}
        bad = {k: v for k, v in failed.items() if v > 0}
        record(f"{name}: no request fails at a cold start of {', '.join(failed)}",
               "FAIL" if bad else "PASS",
               "; ".join(f"{k}: {v:.1f} failed a week" for k, v in failed.items()))  # fmt: skip
    for label, s in starts.items():
        a, b = s[S2Z]["refused"], s[KEDA]["refused"]
        c = compare(a, b, 0.0, False)
        record(f"scale-to-zero refuses fewer requests than keda ({label})",
               {"lower": "PASS", "tie": "TIE", "higher": "FAIL"}[c],
               f"{a:.1f} vs {b:.1f} a week", met=c == "lower")  # fmt: skip
    s2z, one, addon = summary[S2Z], summary[ALWAYS_ONE], summary[HTTP_ADDON]
    c = gpu(s2z["gpu_hours"], one["gpu_hours"])
    record("scale-to-zero uses fewer GPU-hours than always-on with one replica",
           {"lower": "PASS", "tie": "TIE", "higher": "FAIL"}[c],
           f"{s2z['gpu_hours']:.1f} vs {one['gpu_hours']:.1f} "
           f"({100 * (1 - s2z['gpu_hours'] / summary[ALWAYS_ON]['gpu_hours']):.0f}% saved "
           "against always-on)", met=c == "lower")  # fmt: skip
    c = gpu(s2z["gpu_hours"], addon["gpu_hours"])
    record("scale-to-zero uses at most the tuned add-on's GPU-hours (a tie meets it)",
           {"lower": "PASS", "tie": "TIE", "higher": "FAIL"}[c],
           f"{s2z['gpu_hours']:.1f} vs {addon['gpu_hours']:.1f}", met=c != "higher")
    for label, rows in traffic.items():
        # A poll or a leaving client wakes nothing; one that reaches an awake replica is work
        # there, under every policy, and its GPU-hours are in the traffic table.
        a, b = rows[S2Z], summary[S2Z]
        ok = a["pods_started"] <= b["pods_started"]
        record(f"scale-to-zero ({label}): wakes nothing, no cold start added",
               "PASS" if ok else "FAIL",
               f"{a['pods_started']:.1f} vs {b['pods_started']:.1f} pods started a week "
               f"({a['gpu_hours']:.1f} vs {b['gpu_hours']:.1f} GPU-h)", met=ok)  # fmt: skip
    worst = summary[WARM]["first_wait_max"]
    record(f"warm standby: no first request waits more than one wake ({WAKE_SECONDS:g} s)",
           "PASS" if worst is None or worst <= WAKE_SECONDS + 1e-6 else "FAIL",
           f"max {_s(worst)} s")
    worst = summary[S2Z_SLEEP]["asleep_wait_max"]
    record(f"s2z + sleep: no request that found it asleep waits more than one wake "
           f"({WAKE_SECONDS:g} s)", "PASS" if worst is None or worst <= WAKE_SECONDS + 1e-6
           else "FAIL", f"max {_s(worst)} s")  # fmt: skip
    return out


PLOTTED = (ALWAYS_ON, S2Z, WARM, HTTP_ADDON, KEDA_RETRY)


def plot(results: Sequence[Result], summary: dict[str, dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig = plt.figure(figsize=(14, 6.5))
    grid_ = fig.add_gridspec(len(PLOTTED), 2, width_ratios=[2, 1], hspace=0.15)
    day = 1  # Tuesday
    lo, hi = day * DAY, (day + 1) * DAY
    seed = next((r.seed for r in results if r.timeline), SEEDS[0])
    starts = [(t.start - lo) / 3600 for t in week(seed) if lo <= t.start < hi]
    first = None
    for i, name in enumerate(PLOTTED):
        ax = fig.add_subplot(grid_[i, 0], sharex=first)
        first = first or ax
        run = next((r for r in results if r.policy == name and r.timeline), None)
        if run is not None:
            before = [(n, a) for t, n, a in run.timeline if t < lo] or [(REPLICAS, REPLICAS)]
            inside = [(t, n, a) for t, n, a in run.timeline if lo <= t < hi]
            xs = [0.0] + [(t - lo) / 3600 for t, _, _ in inside] + [24.0]
            held = [before[-1][0]] + [n for _, n, _ in inside]
            awake = [before[-1][1]] + [a for _, _, a in inside]
            gpus = GPUS_PER_REPLICA
            ax.fill_between(xs, [g * gpus for g in held + held[-1:]], step="post",
                            color="tab:blue", alpha=0.35, label="GPUs held")  # fmt: skip
            ax.fill_between(xs, [a * gpus for a in awake + awake[-1:]], step="post",
                            color="tab:blue", alpha=0.8, label="awake")  # fmt: skip
        ax.vlines(starts, 4.3, 5.0, color="grey", linewidth=0.4)
        ax.set_ylim(0, 5.0)
        ax.set_yticks([0, 2, 4])
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
        if i < len(PLOTTED) - 1:
            ax.tick_params(labelbottom=False)
        if i == 0:
            ax.set_title(f"GPUs held (light) and awake (dark) over a Tuesday, seed {seed}; "
                         "ticks: task starts", fontsize=9)  # fmt: skip
    if first is not None:
        first.set_xlim(0, 24)
    ax.set_xlabel("hour")
    right = fig.add_subplot(grid_[:, 1])
    spots: dict[tuple[float, float], list[str]] = {}
    for name, s in summary.items():
        spot = (round(s["gpu_hours"]), round(100 * s["long_wait_share"], 2))
        spots.setdefault(spot, []).append(name)
    for (x, y), names in spots.items():
        right.scatter(x, y)
        right.annotate(" = ".join(names), (x, y), fontsize=7, xytext=(4, 4),
                       textcoords="offset points")  # fmt: skip
    right.axhline(100 * SLO_LONG_SHARE, color="grey", linewidth=0.6, linestyle="--")
    right.set_xlabel("GPU-hours per week (mean over seeds)")
    right.set_ylabel("% of requests waiting over 1 s")
    right.set_title("What each policy pays", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--days", type=int, default=DAYS,
                        help="days per seed (a partial run: no page is written)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    if TUNE_SEED in seeds:
        parser.error(f"seed {TUNE_SEED} tunes the knobs; report on others")
    days = args.days
    partial = days != DAYS or seeds != list(SEEDS)
    started = time.monotonic()
    with results_page(None if partial else "scale_to_zero"):
        chosen, grid_rows = tune(args.jobs, days)
        policies = the_policies(chosen)
        by_name = {p.name: p for p in policies}
        jobs: list[Job] = [(p, s, CALIBRATED, AGENTS, s == seeds[0], days)
                           for p in policies for s in seeds]
        jobs += [(by_name[n], s, CALIBRATED, t, False, days) for t in (POLLER, LEAVING)
                 for n in VARIANT_POLICIES for s in seeds]  # fmt: skip
        jobs += [(p, s, t, AGENTS, False, days) for t in SENSITIVITY for p in policies
                 if p.name in t.policies for s in seeds]  # fmt: skip
        jobs += [(p, s, DEFAULTS, AGENTS, False, days) for p in default_policies() for s in seeds]
        results = run_all(jobs, args.jobs)
        summary = by_policy(results, CALIBRATED.label)
        print_main(summary, seeds, days)
        pairs = print_pairs(summary)
        traffic = {t.label: by_policy(results, CALIBRATED.label, t.label)
                   for t in (POLLER, LEAVING)}
        print_traffic(traffic, summary)
        sensitivity = {t.label: by_policy(results, t.label) for t in SENSITIVITY}
        print_variants(sensitivity, "sensitivity: the same seeds and knobs, one GPU-scale "
                       "constant changed (only the policies it\ncan move); first: requests "
                       "that found no awake replica; p50/p95/max: their wait (s)")
        defaults = {DEFAULTS.label: by_policy(results, DEFAULTS.label)}
        print_variants(defaults, "each as it comes, untuned: the CRD's windows (idle 900 s, "
                       "sleep 300 s); the add-on's\nscaledownPeriod 300 s, no readiness "
                       "timeout (v0.14+); KEDA's cooldown 300 s, poll 30 s")
        starts = {f"{COLD_START_SECONDS:g} s": summary}
        starts.update({t.label.removeprefix("cold start "): sensitivity[t.label]
                       for t in SENSITIVITY if t.label.startswith("cold start")})
        verdicts = check(summary, {t.label: traffic[t.label] for t in (POLLER, LEAVING)},
                         dict(sorted(starts.items(), key=lambda kv: float(kv[0][:-2]))))
        elapsed = time.monotonic() - started
        calls = sum(r.planner_calls for r in results)
        print(f"\n{len(results) + len(grid()) + len(SLEEP_GRID)} runs, {calls} planner calls, "
              f"{elapsed:.0f} s")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / "scale_to_zero.json"
    hold = AutoGLMDeploymentSpec().router.hold
    settings = {
        "replicas": REPLICAS, "days": days, "epoch": EPOCH, "cold_start_seconds":
        COLD_START_SECONDS, "wake_seconds": WAKE_SECONDS, "service_seconds": SERVICE_SECONDS,
        "operator_period": OPERATOR_PERIOD, "router_replicas": ROUTER_REPLICAS,
        "hold": {"queue_size": hold.queue_size, "wait_seconds": hold.wait_seconds,
                 "retry_after": HOLD_RETRY_AFTER_SECONDS, "wake_after": WAKE_AFTER_SECONDS},
        "http_add_on": {"queue_tick": HTTP_QUEUE_TICK_SECONDS, "polling":
                        HTTP_POLLING_SECONDS, "target_concurrency": HTTP_TARGET_CONCURRENCY},
        "keda": {"scrape": PROM_SCRAPE_SECONDS, "rate_window": RATE_WINDOW_SECONDS},
        "client": {"max_retries": CLIENT_MAX_RETRIES, "retry_delay": CLIENT_RETRY_DELAY,
                   "max_retry_delay": CLIENT_MAX_RETRY_DELAY},
        "traffic": {"peak_tasks_per_hour": PEAK_TASKS_PER_HOUR, "night_tasks_per_hour":
                    NIGHT_TASKS_PER_HOUR, "weekend_share": WEEKEND_SHARE,
                    "night_job_probability": NIGHT_JOB_PROBABILITY, "night_job_steps":
                    NIGHT_JOB_STEPS, "mean_steps": MEAN_STEPS, "step_gap": STEP_GAP,
                    "poll_every": POLL_EVERY_SECONDS, "leave_after": LEAVE_AFTER_SECONDS,
                    "leavers_per_hour": LEAVERS_PER_HOUR},
        "tuning": {"seed": TUNE_SEED, "rule": TUNING_RULE, "idle_grid": IDLE_GRID,
                   "sleep_grid": SLEEP_GRID, "readiness_grid": READINESS_GRID,
                   "keda_polling_grid": KEDA_POLLING_GRID, "retries_grid": RETRIES_GRID},
        "ties": {"gpu_relative": TIE_GPU, "wait_seconds": TIE_WAIT},
    }  # fmt: skip
    runs = [{k: v for k, v in asdict(r).items()
             if k not in ("waits", "first_waits", "zero_waits", "asleep_waits", "timeline")}
            for r in results]  # fmt: skip
    out.write_text(json.dumps({
        "settings": settings, "seeds": seeds,
        "chosen": {n: asdict(p) for n, p in chosen.items()},
        "tuning_grid": grid_rows, "summary": summary, "pairs": pairs, "traffic": traffic,
        "sensitivity": sensitivity, "defaults": defaults, "runs": runs, "targets": verdicts,
        "elapsed_seconds": round(time.monotonic() - started, 1),
    }, indent=1))  # fmt: skip
    plot(results, summary, OUT_DIR / "scale_to_zero.png")
    print(f"wrote {out} and .png")
    return 0 if all(v["met"] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
