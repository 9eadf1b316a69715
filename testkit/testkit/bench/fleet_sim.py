"""The fleet model of bench/autoscaling.py: replicas that start, serve and stop in virtual time,
per second, under an autoscaler.

A full event simulation of every request (testkit.bench.policy_sim) costs seconds to minutes a
simulated day for one fleet of fixed size; the autoscaling benchmark runs weeks of traffic under
six policies, five seeds and the baselines' tuning grids. So the fleet is composed per second
from the event simulation's replicas measured once at steady loads:

- `ServiceTable`: one replica of each mode (`policy_sim.Pool`: the router's routing and shedding,
  the mode middleware's admission, the engine's continuous batching timed by the calibrated
  `testkit.sim.model.LatencyModel`) under Poisson streamed chats and grouped batch jobs at a
  grid of steady rates. Each cell keeps what became of each class (met its SLO, served late,
  refused), the chats' visible time to first token (quantiles), and the requests in flight and
  queued on the replica. A streaming replica's cells cross chat and batch rates (with no
  batching replica, or batch jobs spilled to it, it serves both); a batching replica's are
  batch rates (a streamed chat reaches one only past 64 in flight on every streaming replica).
  Batch jobs come in groups of 8, which the router spreads over a pool's replicas: cells are
  measured with whole groups, halves and quarters and looked up by the pool's size. Beyond the
  grid the served rates stay at the edge's and the rest is refused. Checked against a pool of
  several replicas (policy_sim.Pool with the router) at a few steady loads: within a point or
  two of attainment (docs/benchmarks/autoscaling.md).
- `Fleet`: the pods (each created, ready `cold_start` seconds later, in a mode; deleted at
  once), the front door while no replica is ready (the router's hold, a hold without bound, or
  a refusal), the clients' retries (the openai client's), and per second the requests of each
  class spread evenly over the ready replicas of their mode, judged by the table at the offered
  rate per replica: batch jobs the batching replicas shed go to the streaming replicas' room
  (the router's spill), what those shed is refused. The offered rate is the source's expected
  rate (what the trace draws its arrivals from) plus the retries and released holds; the counts
  judged are the drawn ones. What the autoscalers read (the routers' counters and gauges,
  Prometheus' scrapes of them) is kept per second.

Nothing here is a policy: bench/autoscaling.py's controllers read a `Fleet` and scale it.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from autoglm_api.profiles import Mode
from testkit.bench.policy_sim import BATCH, CHAT, Pool, Workload

QUANTILES = 20  # the chats' TTFT per cell: the (i + 0.5) / QUANTILES quantiles
CELL_WARMUP = 60.0  # seconds of each cell's run left out: the replica fills up
CELL_REQUESTS = 3000  # each cell runs until about this many requests (at least CELL_SECONDS)
CELL_SECONDS = 600.0
BATCH_GROUP = 8  # batch jobs arrive in groups (policy_traces.BATCH_GROUP)
# The router spreads a group over a pool's replicas, least loaded first: a replica of a pool of
# n gets about BATCH_GROUP / n of it at once. The cells are measured at these group sizes (one
# replica, two, four or more) and looked up between them by log2(n).
GROUPS = (8, 4, 2)

# The grids (requests/s on one replica). A streaming replica: chats x batch jobs; a batching
# replica: batch jobs.
STREAMING_CHATS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0,
                   8.0, 9.0, 10.0, 12.0, 16.0)  # fmt: skip
STREAMING_OTHERS = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 9.0)
BATCHING_OTHERS = (0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 9.0, 10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0,
                   14.0, 16.0, 20.0, 24.0)  # fmt: skip
QUICK_CHATS = (0.0, 1.0, 3.0, 5.0, 8.0, 12.0)
QUICK_OTHERS = (0.0, 2.0, 6.0)
QUICK_BATCHING = (0.0, 4.0, 8.0, 11.0, 13.0, 18.0)


# --- one replica at steady load -----------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One replica under one steady load: shares of each class's requests (met the SLO, served
    late, refused), its served chats' visible TTFT quantiles, batch jobs' median time to
    completion, and the mean requests the router has open on it and of those queued (the
    middleware's queue and the engine's waiting ones)."""

    chat: tuple[float, float, float]
    other: tuple[float, float, float]
    ttft: tuple[float, ...]
    other_e2e: float
    inflight: float
    waiting: float


def workload_for(ttft: float, tpot: float, batch: float) -> Workload:
    """The calibration workload (a 224x896 screenshot and ~60 text tokens a request, 64 tokens
    out per chat, 40 per batch job) judged by these SLOs."""
    return Workload(chat_ttft_slo=ttft, chat_tpot_slo=tpot, batch_e2e_slo=batch)


def measure_cell(mode: Mode, chats: float, others: float, workload: Workload,
                 group: int = BATCH_GROUP, seed: int = 1, requests: int = CELL_REQUESTS,
                 seconds: float = CELL_SECONDS) -> Cell:  # fmt: skip
    """One replica of `mode` under Poisson chats and batch jobs in Poisson groups of `group`
    (requests/s)."""
    rate = chats + others
    span = max(seconds, requests / rate) if rate > 0 else seconds
    end = CELL_WARMUP + span
    rng = np.random.default_rng(seed)
    arrivals: list[tuple[float, int]] = [
        (float(t), CHAT) for t in rng.uniform(0.0, end, rng.poisson(chats * end))]
    for t in rng.uniform(0.0, end, rng.poisson(others / group * end)):
        arrivals.extend((float(t), BATCH) for _ in range(group))
    arrivals.sort()
    pool = Pool([mode], arrivals, workload=workload, track_metrics=False, seed=seed)
    replica = pool.replicas[0]
    inflight = waiting = 0.0
    samples = 0
    t = CELL_WARMUP
    pool.run_until(t)
    while t < end:
        t += 1.0
        pool.run_until(t)
        inflight += replica.open
        waiting += replica.queued + len(replica.waiting)
        samples += 1
    pool.drain(300.0)
    counted = [o for o in pool.outcomes if o.arrival >= CELL_WARMUP]
    sent = [a for a in arrivals if a[0] >= CELL_WARMUP]

    def shares(kind: int) -> tuple[float, float, float]:
        mine = [o for o in counted if o.kind == kind]
        total = sum(1 for a in sent if a[1] == kind)
        if not total:
            return (1.0, 0.0, 0.0)
        met = sum(1 for o in mine if o.met) / total
        refused = sum(1 for o in mine if o.e2e < 0) / total
        return (met, max(0.0, 1.0 - met - refused), refused)  # unfinished: late

    ttfts = sorted(o.ttft for o in counted if o.kind == CHAT and o.ttft >= 0)
    e2es = sorted(o.e2e for o in counted if o.kind == BATCH and o.e2e >= 0)
    quantiles = tuple(float(np.quantile(ttfts, (i + 0.5) / QUANTILES)) if ttfts else 0.0
                      for i in range(QUANTILES))  # fmt: skip
    return Cell(shares(CHAT), shares(BATCH), quantiles,
                float(np.median(e2es)) if e2es else 0.0,
                inflight / max(1, samples), waiting / max(1, samples))


CellJob = tuple[Mode, float, float, Workload, int, int, int, float]


def _measure(job: CellJob) -> Cell:
    return measure_cell(*job)


# --- the table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """What one replica of a mode gets at an offered rate: shares per class, in flight and
    queued per replica, and the table cells behind it with their weights (for the TTFTs)."""

    chat: tuple[float, float, float]
    other: tuple[float, float, float]
    inflight: float
    waiting: float
    other_e2e: float
    cells: tuple[tuple[int, float], ...]  # (flat streaming cell index, weight)
    ttft_p50: float = 0.0  # the chats' median TTFT (the cells' medians, weighted)


IDLE_LOAD = Load((1.0, 0.0, 0.0), (1.0, 0.0, 0.0), 0.0, 0.0, 0.0, ())


class ServiceTable:
    """Cells on a grid, looked up by interpolation (the module docstring): streaming cells by
    group size, chats and batch jobs; batching cells by group size and batch jobs."""

    def __init__(self, chats: Sequence[float], others: Sequence[float],
                 streaming: Sequence[Cell], batching_others: Sequence[float],
                 batching: Sequence[Cell], groups: Sequence[int] = GROUPS) -> None:  # fmt: skip
        self.chats, self.others = tuple(chats), tuple(others)
        self.batching_others = tuple(batching_others)
        self.groups = tuple(groups)
        self.streaming = tuple(streaming)  # row-major: groups x chats x others
        self.batching = tuple(batching)  # groups x others
        assert len(self.streaming) == len(self.groups) * len(self.chats) * len(self.others)
        assert len(self.batching) == len(self.groups) * len(self.batching_others)
        self._memo: dict[tuple[Any, ...], Load] = {}

    @classmethod
    def build(cls, workload: Workload, quick: bool = False,
              mapper: Callable[..., Any] | None = None) -> ServiceTable:  # fmt: skip
        """Measure every cell (`mapper`: a pool's map, for several processes). A cell without
        batch jobs is the same at every group size: measured once."""
        chats = QUICK_CHATS if quick else STREAMING_CHATS
        others = QUICK_OTHERS if quick else STREAMING_OTHERS
        batching = QUICK_BATCHING if quick else BATCHING_OTHERS
        requests, seconds = (600, 150.0) if quick else (CELL_REQUESTS, CELL_SECONDS)
        jobs: list[CellJob] = []
        where: list[int] = []  # each cell's job
        for g in GROUPS:
            for c in chats:
                for b in others:
                    job = (Mode.STREAMING, c, b, workload, g if b else GROUPS[0], 1, requests,
                           seconds)
                    where.append(_index(jobs, job))
        split = len(where)
        for g in GROUPS:
            for b in batching:
                job = (Mode.BATCHING, 0.0, b, workload, g if b else GROUPS[0], 1, requests,
                       seconds)
                where.append(_index(jobs, job))
        measured = list((mapper or map)(_measure, jobs))
        cells = [measured[i] for i in where]
        return cls(chats, others, cells[:split], batching, cells[split:])

    def to_json(self) -> dict[str, Any]:
        def cell(c: Cell) -> dict[str, Any]:
            return {"chat": c.chat, "other": c.other, "ttft": c.ttft, "other_e2e": c.other_e2e,
                    "inflight": c.inflight, "waiting": c.waiting}

        return {"groups": self.groups, "chats": self.chats, "others": self.others,
                "streaming": [cell(c) for c in self.streaming],
                "batching_others": self.batching_others,
                "batching": [cell(c) for c in self.batching]}  # fmt: skip

    # -- lookups ---------------------------------------------------------------------------

    def _group(self, replicas: int) -> tuple[int, int, float]:
        """The group sizes around what a pool of `replicas` gives each (log2 of the count)."""
        x = math.log2(max(1, replicas))  # 0: whole groups, 1: halves, 2: quarters
        last = len(self.groups) - 1
        if x >= last:
            return last, last, 0.0
        lo = int(x)
        return lo, lo + 1, x - lo

    def streaming_load(self, chats: float, others: float, replicas: int = 1) -> Load:
        """One streaming replica of a pool of `replicas` offered `chats` and `others` req/s (to
        a thousandth: the lookups are remembered, and a run's figures depend on nothing else)."""
        chats, others, replicas = round(chats, 3), round(others, 3), min(replicas, 4)
        key = ("s", chats, others, replicas)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) > 200_000:
                self._memo.clear()
            hit = self._memo[key] = self._streaming(chats, others, replicas)
        return hit

    def batching_load(self, others: float, replicas: int = 1) -> Load:
        others, replicas = round(others, 3), min(replicas, 4)
        key = ("b", others, replicas)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) > 200_000:
                self._memo.clear()
            hit = self._memo[key] = self._batching(others, replicas)
        return hit

    def _streaming(self, chats: float, others: float, replicas: int) -> Load:
        (i0, i1, wi), c_scale = _bracket(self.chats, chats)
        (j0, j1, wj), b_scale = _bracket(self.others, others)
        g0, g1, wg = self._group(replicas)
        nc, nb = len(self.chats), len(self.others)
        weights: dict[int, float] = {}
        for g, a in ((g0, 1 - wg), (g1, wg)):
            for i, b in ((i0, 1 - wi), (i1, wi)):
                for j, c in ((j0, 1 - wj), (j1, wj)):
                    w = a * b * c
                    if w > 0:
                        k = (g * nc + i) * nb + j
                        weights[k] = weights.get(k, 0.0) + w
        cells = [(self.streaming[k], w) for k, w in weights.items()]
        ws = [w for _, w in cells]
        return Load(_saturated(_mix([c.chat for c, _ in cells], ws), c_scale),
                    _saturated(_mix([c.other for c, _ in cells], ws), b_scale),
                    sum(c.inflight * w for c, w in cells), sum(c.waiting * w for c, w in cells),
                    sum(c.other_e2e * w for c, w in cells), tuple(weights.items()),
                    sum(c.ttft[QUANTILES // 2] * w for c, w in cells))  # fmt: skip

    def _batching(self, others: float, replicas: int) -> Load:
        (j0, j1, wj), scale = _bracket(self.batching_others, others)
        g0, g1, wg = self._group(replicas)
        nb = len(self.batching_others)
        cells = [(self.batching[g * nb + j], a * c) for g, a in ((g0, 1 - wg), (g1, wg))
                 for j, c in ((j0, 1 - wj), (j1, wj)) if a * c > 0]  # fmt: skip
        ws = [w for _, w in cells]
        return Load((0.0, 0.0, 1.0), _saturated(_mix([c.other for c, _ in cells], ws), scale),
                    sum(c.inflight * w for c, w in cells), sum(c.waiting * w for c, w in cells),
                    sum(c.other_e2e * w for c, w in cells), ())

    def ttft_values(self, index: int) -> tuple[float, ...]:
        return self.streaming[index].ttft


def _index(jobs: list[CellJob], job: CellJob) -> int:
    """The job's place in `jobs`, added if new."""
    try:
        return jobs.index(job)
    except ValueError:
        jobs.append(job)
        return len(jobs) - 1


def _bracket(grid: Sequence[float], x: float) -> tuple[tuple[int, int, float], float]:
    """The grid points around x and x's weight toward the upper one; past the last point, the
    last one and the share of x it serves (the edge's rate)."""
    if x >= grid[-1]:
        last = len(grid) - 1
        return (last, last, 0.0), (grid[-1] / x if x > 0 else 1.0)
    if x <= grid[0]:
        return (0, 0, 0.0), 1.0
    j = bisect.bisect_right(grid, x)
    lo, hi = grid[j - 1], grid[j]
    return (j - 1, j, (x - lo) / (hi - lo)), 1.0


def _mix(values: Sequence[tuple[float, float, float]], weights: Sequence[float]
         ) -> tuple[float, float, float]:  # fmt: skip
    met = sum(v[0] * w for v, w in zip(values, weights, strict=True))
    late = sum(v[1] * w for v, w in zip(values, weights, strict=True))
    return (met, late, max(0.0, 1.0 - met - late))


def _saturated(shares: tuple[float, float, float], scale: float) -> tuple[float, float, float]:
    """Past the grid: the edge's served rates, the rest refused."""
    if scale >= 1.0:
        return shares
    met, late = shares[0] * scale, shares[1] * scale
    return (met, late, max(0.0, 1.0 - met - late))


# --- traffic ------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Cohort:
    """Requests of one class that reach the front door together: `n` of them (fractional for an
    open-loop source), first sent at `first`; `attempt` 1 is the first try. A closed-loop
    source's request is a cohort of one with its `tag`."""

    kind: int  # CHAT or BATCH
    n: float
    first: float
    attempt: int = 1
    tag: Any = None
    since: float = 0.0  # this attempt's arrival (a held request's hold counts from it)


class Source(Protocol):
    """Where requests come from."""

    closed: bool  # closed loop: a request's answer sends the next (tagged cohorts)

    def due(self, t: int) -> list[Cohort]:
        """The requests first sent in [t, t + 1)."""

    def rate(self, t: int) -> tuple[float, float]:
        """The expected chats/s and others/s at second t (what the arrivals are drawn from)."""

    def served(self, tag: Any, at: float) -> float:
        """A closed-loop request began at `at`: when its answer ends."""

    def failed(self, tag: Any) -> None:
        """A closed-loop request's client gave up."""

    def next_due(self) -> float:
        """When the next request is first sent, as far as is known now (closed loop)."""


class OpenSource:
    """Open-loop traffic drawn per second: chats Poisson, batch jobs in Poisson groups of
    BATCH_GROUP (as policy_traces.shaped_arrivals draws them). Before second 0 the rates of
    second 0 hold (the warm-up)."""

    closed = False

    def __init__(self, chat_rates: np.ndarray, other_rates: np.ndarray, seed: int,
                 warmup: int) -> None:  # fmt: skip
        rng = np.random.default_rng(seed)
        self.warmup = warmup
        chats = np.concatenate([np.full(warmup, chat_rates[0]), chat_rates])
        others = np.concatenate([np.full(warmup, other_rates[0]), other_rates])
        self.chat_rates, self.other_rates = chats.tolist(), others.tolist()
        self.chats = rng.poisson(chats).tolist()
        self.others = (rng.poisson(others / BATCH_GROUP) * BATCH_GROUP).tolist()

    def due(self, t: int) -> list[Cohort]:
        i = t + self.warmup
        out = []
        if self.chats[i]:
            out.append(Cohort(CHAT, float(self.chats[i]), t + 0.5, since=t + 0.5))
        if self.others[i]:
            out.append(Cohort(BATCH, float(self.others[i]), t + 0.5, since=t + 0.5))
        return out

    def rate(self, t: int) -> tuple[float, float]:
        i = t + self.warmup
        return self.chat_rates[i], self.other_rates[i]

    def served(self, tag: Any, at: float) -> float:
        return at

    def failed(self, tag: Any) -> None:
        return None

    def next_due(self) -> float:
        return -math.inf  # open loop: never quiet


class AgentSource:
    """Closed-loop phone-agent tasks (bench/scale_to_zero.py's `Task`: a start, the gaps after
    each answer, each step's time on a replica): a step is sent its gap after the previous
    answer; a step whose client gives up ends its task. Its expected rate is the arrivals'
    exponential average over RATE_SECONDS."""

    closed = True
    RATE_SECONDS = 60.0

    def __init__(self, tasks: Sequence[Any]) -> None:
        self.tasks = tasks
        self.pending: list[tuple[float, int, int]] = [(t.start, i, 0) for i, t in
                                                      enumerate(tasks)]  # fmt: skip
        self.pending.sort()
        self.heap_ready = False
        self.average = 0.0
        self.average_at = 0
        self.decay = math.exp(-1.0 / self.RATE_SECONDS)

    def due(self, t: int) -> list[Cohort]:
        import heapq

        if not self.heap_ready:
            heapq.heapify(self.pending)
            self.heap_ready = True
        out = []
        while self.pending and self.pending[0][0] < t + 1:
            at, task, step = heapq.heappop(self.pending)
            out.append(Cohort(CHAT, 1.0, at, tag=(task, step), since=at))
        self._age(t)
        self.average += len(out) * (1 - self.decay)
        return out

    def _age(self, t: int) -> None:
        if t > self.average_at:
            self.average *= self.decay ** (t - self.average_at)
            self.average_at = t

    def rate(self, t: int) -> tuple[float, float]:
        self._age(t)
        return self.average, 0.0

    def served(self, tag: Any, at: float) -> float:
        import heapq

        task, step = tag
        spec = self.tasks[task]
        done = at + spec.services[step]
        if step < len(spec.gaps):
            heapq.heappush(self.pending, (done + spec.gaps[step], task, step + 1))
        return done

    def failed(self, tag: Any) -> None:
        return None

    def next_due(self) -> float:
        return self.pending[0][0] if self.pending else math.inf


# --- the fleet ----------------------------------------------------------------------------

HOLD_BOUNDED, HOLD, REFUSE = "router hold", "hold", "refuse"  # the front door at zero


@dataclass(frozen=True)
class FrontDoor:
    """What happens to a request while no replica is ready: `kind` HOLD_BOUNDED (our router:
    up to `capacity` held, each up to `bound` s, then 503 with Retry-After `retry_after`), HOLD
    (held until a replica is ready), REFUSE (503 at once, no Retry-After)."""

    kind: str
    capacity: float = math.inf
    bound: float = math.inf
    retry_after: float = 0.0


@dataclass(frozen=True)
class Client:
    """The openai client: `max_retries` retries, after the answer's Retry-After or after its
    backoff (0.5 s x 2^n, less up to 25% jitter: within the next second for the first two)."""

    max_retries: int = 2


@dataclass(eq=False, slots=True)
class Pod:
    name: str
    created: int
    ready_at: int
    mode: Mode = Mode.STREAMING
    ready: bool = False


@dataclass(frozen=True, slots=True)
class Scrape:
    """What Prometheus holds of the fleet at one scrape: counters (cumulative) and gauges."""

    at: int
    arrivals: tuple[float, float]  # requests the routers received: chats, others
    completions: tuple[float, float]  # by mode: streaming, batching
    received: tuple[float, float]  # by mode, all classes
    own: tuple[float, float]  # by mode: of its own class (streaming: chats)
    busy: tuple[float, float]  # gauges by mode: in flight + queued
    waiting: float  # gauge: queued (the middleware's queue and the engine's waiting)


@dataclass(frozen=True)
class Reading:
    """Prometheus' answer at a moment: rates over RATE_WINDOW of the last scrape, its gauges."""

    chat_rate: float
    other_rate: float
    completions: tuple[float, float]
    busy: tuple[float, float]
    own_share: tuple[float | None, float | None]
    waiting: float

    @property
    def total_rate(self) -> float:
        return self.chat_rate + self.other_rate


@dataclass
class Books:
    """What one run counted from second 0 (the warm-up apart)."""

    requests: list[float] = field(default_factory=lambda: [0.0, 0.0])  # by class
    met: list[float] = field(default_factory=lambda: [0.0, 0.0])
    late: list[float] = field(default_factory=lambda: [0.0, 0.0])
    failed: list[float] = field(default_factory=lambda: [0.0, 0.0])
    refused: float = 0.0  # 429/503 answers (each attempt's)
    gpu_seconds: float = 0.0
    replica_seconds: float = 0.0
    scale_events: int = 0  # changes of the replica count
    starts: int = 0  # pods created
    flips: int = 0
    zero_arrivals: float = 0.0  # requests that found no ready replica (first attempt)
    zero_waits: dict[float, float] = field(default_factory=dict)  # wait (0.1 s) -> requests
    ttft_cells: dict[int, float] = field(default_factory=dict)  # streaming cell -> chats
    ttft_extra: dict[float, float] = field(default_factory=dict)  # TTFT (0.05 s) -> chats
    peak_replicas: int = 0
    timeline: list[tuple[int, int, int, int]] = field(default_factory=list)


SCRAPE_SECONDS = 15  # the chart's PodMonitor interval (charts/autoglm/values.yaml)
RATE_WINDOW = 60  # the [1m] of the rate queries
EXTRA_SECONDS = 5.0  # retries and released holds: their rate's exponential average


class Controller(Protocol):
    def tick(self, fleet: Fleet, t: int) -> None:
        """Act at second t (the fleet's state is that of the end of second t - 1)."""

    def quiet_until(self, fleet: Fleet, t: int) -> int:
        """The last second through which its ticks change nothing while nothing reaches the
        fleet (t or less: it may act at once)."""


class Fleet:
    """One policy over one trace (the module docstring)."""

    def __init__(self, source: Source, table: ServiceTable, front: FrontDoor, client: Client,
                 *, gpus: int, cold_start: int, replicas: int, end: int, warmup: int,
                 slo: tuple[float, float, float], seed: int, timeline_every: int = 0,
                 skip: bool = True) -> None:  # fmt: skip
        self.source, self.table, self.front, self.client = source, table, front, client
        self.gpus, self.cold_start, self.end, self.warmup = gpus, cold_start, end, warmup
        self.ttft_slo, self.tpot_slo, self.batch_slo = slo
        self.rng = np.random.default_rng(seed + 7919)
        self.books = Books()
        self.timeline_every = timeline_every
        self.skip = skip  # jump over quiet seconds (False: run every second)
        self.now = -warmup
        self.pods: list[Pod] = []
        self.starting = 0  # pods not ready yet
        self._names = 0
        for _ in range(replicas):
            pod = self._pod(-warmup - cold_start)
            pod.ready = True
            self.starting -= 1
        self.held: deque[Cohort] = deque()
        self.held_n = 0.0
        self.retries: dict[int, list[Cohort]] = {}
        self.extra = [0.0, 0.0]
        self._extra_decay = math.exp(-1.0 / EXTRA_SECONDS)
        self.inflight = (0.0, 0.0)  # by mode, the routers' open requests (relayed)
        self.waiting = 0.0
        self.exact_ends: list[float] = []  # a closed-loop source's requests in flight
        self.last_request: float | None = None
        # cumulative counters, for the scrapes
        self._arrivals = [0.0, 0.0]
        self._completions = [0.0, 0.0]
        self._received = [0.0, 0.0]
        self._own = [0.0, 0.0]
        self.scrapes: deque[Scrape] = deque(maxlen=RATE_WINDOW // SCRAPE_SECONDS + 2)
        self.scrape_phase = int(self.rng.integers(0, SCRAPE_SECONDS))
        self.load_s = IDLE_LOAD
        self.load_b = IDLE_LOAD
        self._reading: Reading | None = None
        self._reading_at = -1
        self._reading_of: Scrape | None = None

    # -- pods --------------------------------------------------------------------------------

    def _pod(self, t: int) -> Pod:
        self._names += 1
        pod = Pod(f"replica-{self._names}", t, t + self.cold_start)
        self.pods.append(pod)
        self.starting += 1
        return pod

    @property
    def ready(self) -> list[Pod]:
        return [p for p in self.pods if p.ready]

    def ready_in(self, mode: Mode) -> int:
        return sum(1 for p in self.pods if p.ready and p.mode is mode)

    def scale_to(self, replicas: int, t: int, victims: Sequence[str] = ()) -> None:
        """Run `replicas` pods from second t: new ones start (ready cold_start later); the
        ones removed go first by `victims` (names), then as a ReplicaSet picks (not ready
        first, then the newest)."""
        have = len(self.pods)
        if replicas == have:
            return
        counted = t >= 0
        if counted:
            self.books.scale_events += 1
        while len(self.pods) < replicas:
            self._pod(t)
            if counted:
                self.books.starts += 1
        order = {name: i for i, name in enumerate(victims)}
        while len(self.pods) > replicas:
            victim = min(self.pods, key=lambda p: (order.get(p.name, len(order)), p.ready,
                                                   -p.created))  # fmt: skip
            self._gpu_time(victim, t)
            self.pods.remove(victim)
            if not victim.ready:
                self.starting -= 1
        self.books.peak_replicas = max(self.books.peak_replicas,
                                       len(self.pods) if counted else 0)

    def flip(self, name: str, mode: Mode, t: int) -> None:
        for pod in self.pods:
            if pod.name == name and pod.mode is not mode:
                pod.mode = mode
                if t >= 0:
                    self.books.flips += 1

    def _gpu_time(self, pod: Pod, t: int) -> None:
        start = max(pod.created, 0)
        if t > start:
            self.books.gpu_seconds += (t - start) * self.gpus
            self.books.replica_seconds += t - start

    # -- what the autoscalers read -------------------------------------------------------------

    def reading(self) -> Reading | None:
        """Prometheus at the last scrape (None: not a minute of scrapes yet)."""
        if self._reading_at == len(self.scrapes) and self.scrapes and \
                self._reading_of is self.scrapes[-1]:
            return self._reading
        self._reading_at, self._reading_of = len(self.scrapes), (self.scrapes[-1] if
                                                                  self.scrapes else None)
        self._reading = self._read()
        return self._reading

    def _read(self) -> Reading | None:
        if len(self.scrapes) < 2:
            return None
        last = self.scrapes[-1]
        past = next((s for s in self.scrapes if s.at >= last.at - RATE_WINDOW), self.scrapes[0])
        span = float(last.at - past.at)
        if span <= 0:
            return None

        def rate(a: float, b: float) -> float:
            return max(0.0, (a - b) / span)

        received = [rate(last.received[m], past.received[m]) for m in range(2)]
        own = [rate(last.own[m], past.own[m]) for m in range(2)]
        return Reading(
            rate(last.arrivals[0], past.arrivals[0]), rate(last.arrivals[1], past.arrivals[1]),
            (rate(last.completions[0], past.completions[0]),
             rate(last.completions[1], past.completions[1])),
            last.busy,
            (own[0] / received[0] if received[0] > 0 else None,
             own[1] / received[1] if received[1] > 0 else None),
            last.waiting)  # fmt: skip

    def silent(self) -> bool:
        """What Prometheus answers stays as it is while nothing arrives: the last scrape's rates
        and gauges read zero and no counter moved since it."""
        reading = self.reading()
        if reading is None or reading.total_rate or reading.waiting or any(reading.busy) \
                or any(reading.completions):
            return False
        last = self.scrapes[-1]
        return (last.arrivals == tuple(self._arrivals) and last.completions ==
                tuple(self._completions) and last.received == tuple(self._received)
                and not self.relayed and not self.waiting)  # fmt: skip

    @property
    def relayed(self) -> float:
        """Requests the routers relay now (in flight on the replicas)."""
        return self.inflight[0] + self.inflight[1]

    def holding(self, aged: float = 0.0) -> float:
        """Requests held now, those held at least `aged` seconds."""
        if not aged:
            return self.held_n
        return sum(c.n for c in self.held if self.now - c.since >= aged)

    def held_since(self) -> float | None:
        return self.held[0].since if self.held else None

    # -- the run -------------------------------------------------------------------------------

    def run(self, controllers: Sequence[Controller]) -> Books:
        t = -self.warmup
        while t < self.end:
            self.second(t)
            self.now = t + 1
            if (t + 1 - self.scrape_phase) % SCRAPE_SECONDS == 0:
                self._scrape(t + 1)
            for controller in controllers:
                controller.tick(self, t + 1)
            self._sample(t)
            t += 1
            t = self._skip(t, controllers)
        for pod in self.pods:
            self._gpu_time(pod, self.end)
        return self.books

    def _sample(self, t: int) -> None:
        if self.timeline_every and t >= 0 and t % self.timeline_every == 0:
            self.books.timeline.append((t, len(self.pods), len(self.ready),
                                        self.ready_in(Mode.BATCHING)))

    def quiet_through(self) -> int | None:
        """The last second from now through which nothing reaches the fleet and nothing in it
        changes by itself (a closed-loop source between its requests, none in flight, held,
        retried or starting); None: not quiet now."""
        if not self.source.closed or self.held or self.retries or self.starting \
                or self.exact_ends:
            return None
        due = self.source.next_due()
        return self.end if due == math.inf else math.floor(due) - 1

    def _skip(self, t: int, controllers: Sequence[Controller]) -> int:
        """Seconds t.. in which nothing arrives and no controller acts are jumped over: their
        scrapes (the counters as they are, the gauges at zero) and samples are written as
        each second would write them. Returns the next second to run."""
        quiet = self.quiet_through() if self.skip else None
        if quiet is None or quiet < t:
            return t
        until = min(quiet + 1, self.end)
        for controller in controllers:
            until = min(until, controller.quiet_until(self, t))
            if until <= t:
                return t
        first = t + 1 + (self.scrape_phase - t - 1) % SCRAPE_SECONDS
        times = range(first, until + 1, SCRAPE_SECONDS)
        for at in times[-(self.scrapes.maxlen or 1):]:
            self._scrape(at)
        if self.timeline_every:
            for at in range(t, until):
                self._sample(at)
        self.extra = [x * self._extra_decay ** (until - t) for x in self.extra]
        self.inflight, self.waiting, self.now = (0.0, 0.0), 0.0, until
        return until

    def _scrape(self, t: int) -> None:
        s, b = self.inflight
        self.scrapes.append(Scrape(t, (self._arrivals[0], self._arrivals[1]),
                                   (self._completions[0], self._completions[1]),
                                   (self._received[0], self._received[1]),
                                   (self._own[0], self._own[1]),
                                   (s, b), self.waiting))  # fmt: skip

    def second(self, t: int) -> None:
        """Requests of [t, t + 1): pods that are ready by t, the front door, the replicas."""
        self.now = t
        if self.starting:
            for pod in self.pods:
                if not pod.ready and pod.ready_at <= t:
                    pod.ready = True
                    self.starting -= 1
        cohorts = self.retries.pop(t, []) if self.retries else []
        new = self.source.due(t)
        counted = t >= 0
        for c in new:
            if counted:
                self.books.requests[c.kind] += c.n
        cohorts.extend(new)
        for c in cohorts:
            self._arrivals[c.kind] += c.n
        if self.exact_ends:
            ended = [e for e in self.exact_ends if e <= t]
            if ended:
                self.exact_ends = [e for e in self.exact_ends if e > t]
                self.last_request = max(self.last_request or 0.0, max(ended))
        ready = any(p.ready for p in self.pods)
        if not ready:
            self._at_zero(cohorts, t)
            self.inflight = (float(len(self.exact_ends)), 0.0) if self.source.closed else (0.0,
                                                                                            0.0)
            self.waiting = 0.0
            return
        released = list(self.held)
        if released:
            self.held.clear()
            self.held_n = 0.0
        if not cohorts and not released and self.source.closed:
            self.extra = [x * self._extra_decay for x in self.extra]
            self.inflight = (float(len(self.exact_ends)), 0.0)
            self.waiting = 0.0
            return
        self._serve(released, cohorts, t)

    def _at_zero(self, cohorts: list[Cohort], t: int) -> None:
        front = self.front
        if front.kind == HOLD_BOUNDED and self.held:
            while self.held and self.held[0].since + front.bound <= t:
                c = self.held.popleft()
                self.held_n -= c.n
                self._refused(c, t, front.retry_after)
        for c in cohorts:
            if c.attempt == 1 and t >= 0:
                self.books.zero_arrivals += c.n
            if front.kind == REFUSE or (front.kind == HOLD_BOUNDED
                                        and self.held_n + c.n > front.capacity):
                self._refused(c, t, front.retry_after if front.kind == HOLD_BOUNDED else 0.0)
                continue
            self.held.append(c)
            self.held_n += c.n

    def _refused(self, c: Cohort, t: int, retry_after: float) -> None:
        if t >= 0:
            self.books.refused += c.n
        if c.attempt > self.client.max_retries:
            if t >= 0:
                self.books.failed[c.kind] += c.n
            if c.tag is not None:
                self.source.failed(c.tag)
            return
        due = t + max(1, math.ceil(retry_after))
        waiting = self.retries.setdefault(due, [])
        if c.tag is None:  # an open-loop cohort joins its like: the count, the mean first try
            for other in waiting:
                if other.tag is None and other.kind == c.kind and other.attempt == c.attempt + 1:
                    other.first = (other.first * other.n + c.first * c.n) / (other.n + c.n)
                    other.n += c.n
                    return
        waiting.append(Cohort(c.kind, c.n, c.first, c.attempt + 1, c.tag, float(due)))

    def _serve(self, released: list[Cohort], cohorts: list[Cohort], t: int) -> None:
        streaming = batching = 0
        for p in self.pods:
            if p.ready:
                if p.mode is Mode.STREAMING:
                    streaming += 1
                else:
                    batching += 1
        # the offered rates: the source's, and the retries and released holds (averaged)
        extra = [0.0, 0.0]
        for c in released:
            extra[c.kind] += c.n
        for c in cohorts:
            if c.attempt > 1:
                extra[c.kind] += c.n
        d = self._extra_decay
        self.extra = [self.extra[k] * d + extra[k] * (1 - d) for k in (0, 1)]
        base_c, base_b = self.source.rate(t)
        rate_c, rate_b = base_c + self.extra[0], base_b + self.extra[1]
        table = self.table
        if batching:
            load_b = table.batching_load(rate_b / batching, batching)
            spill = rate_b * load_b.other[2]  # shed by the batching replicas: to streaming room
        else:
            load_b, spill = IDLE_LOAD, rate_b
        if streaming:
            load_s = table.streaming_load(rate_c / streaming, spill / streaming, streaming)
        else:
            load_s = IDLE_LOAD
        self.load_s, self.load_b = load_s, load_b
        # no streaming replica yet: chats share the batching ones and miss
        chat = load_s.chat if streaming else (0.0, 1.0, 0.0)
        if batching and streaming:
            m_b, l_b, r_b = load_b.other
            m_s, l_s, r_s = load_s.other
            other = (m_b + r_b * m_s, l_b + r_b * l_s, r_b * r_s)
            other_e2e = load_b.other_e2e
        elif batching:
            other, other_e2e = load_b.other, load_b.other_e2e
        else:
            other, other_e2e = load_s.other, load_s.other_e2e
        books, counted = self.books, t >= 0
        served_any = False
        served_mode = [0.0, 0.0]  # completions this second by mode (the fluid's steady state)
        received = [0.0, 0.0]
        own = [0.0, 0.0]
        for c in released:
            wait = t - c.first
            if counted:
                key = round(wait, 1)
                books.zero_waits[key] = books.zero_waits.get(key, 0.0) + c.n
        for group, delayed in ((released, True), (cohorts, False)):
            for c in group:
                shares = chat if c.kind == CHAT else other
                late_by = (t + 0.5 - c.first) if (delayed or c.attempt > 1) else 0.0
                if c.tag is not None:  # one request: its outcome drawn
                    u = float(self.rng.random())
                    m, late_share = shares[0], shares[1]
                    outcome = (1.0, 0.0, 0.0) if u < m else (
                        (0.0, 1.0, 0.0) if u < m + late_share else (0.0, 0.0, 1.0))
                else:
                    outcome = shares
                n = c.n
                met, late, refused = n * outcome[0], n * outcome[1], n * outcome[2]
                if c.kind == CHAT:
                    mode = 0 if streaming else 1
                    if late_by > 0:  # a retry or a hold: its first token is late
                        late, met = late + met, 0.0
                    if counted and met + late > 0:
                        if late_by > 0 or not streaming:
                            key = round((late_by + load_s.ttft_p50 if streaming else late_by)
                                        * 20) / 20
                            books.ttft_extra[key] = books.ttft_extra.get(key, 0.0) + met + late
                        else:
                            for index, w in load_s.cells:
                                books.ttft_cells[index] = (books.ttft_cells.get(index, 0.0)
                                                           + (met + late) * w)
                else:
                    mode = 1 if batching else 0
                    if late_by > 0 and late_by + other_e2e > self.batch_slo:
                        late, met = late + met, 0.0
                if counted:
                    books.met[c.kind] += met
                    books.late[c.kind] += late
                received[mode] += n
                own[mode] += n if (c.kind == CHAT) == (mode == 0) else 0.0
                served_mode[mode] += met + late
                if met + late > 0:
                    served_any = True
                    if c.tag is not None:
                        self.exact_ends.append(self.source.served(c.tag, max(c.since, t)))
                if refused > 1e-9:
                    self._refused(Cohort(c.kind, refused, c.first, c.attempt, c.tag), t, 1.0)
        for m in (0, 1):
            self._completions[m] += served_mode[m]
            self._received[m] += received[m]
            self._own[m] += own[m]
        if served_any:
            self.last_request = t + 1.0
        if self.source.closed:
            self.inflight = (float(len(self.exact_ends)), 0.0)
            self.waiting = 0.0
        else:
            self.inflight = (streaming * load_s.inflight, batching * load_b.inflight)
            self.waiting = streaming * load_s.waiting + batching * load_b.waiting
