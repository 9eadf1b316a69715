"""Adaptive vs every static answer: policy goodput on simulated traffic.

    .venv/bin/python bench/policy_goodput.py [--traces diurnal,noise] [--seeds 2,3,4,5,6]
                                             [--jobs 2] [--quick]

Replays each trace (bench/traces/policy_traces.py, its docstring has their parameters) with
seeds 2-6 against a pool of 4 replicas (2 GPUs each) simulated in fast-forwarded time by
testkit.bench.policy_sim: the mode middleware's own admission code
(`autoglm_runtime.admission.AdmissionQueue` and `BatchWindow`, at the defaults of
StreamingProfile and BatchingProfile) in front of the sim's step planning and step model
(`testkit.sim.model.LatencyModel`, calibrated to the published streaming TTFT ~0.32 s /
4.1 req/s and batching 1.8 s / 7.2 req/s per replica). Nothing is tuned on these traces: the
operator's policy runs with the CRD defaults (`AdaptiveSettings()`, the chat TTFT target
excepted: below).

Routing: every policy runs twice on the same arrivals. `router`: the router's own
`autoglm_router.routing.decide` on the pool's state (what `router.enabled: true` gives);
`random`: each request to a uniformly random replica (the plain Service with the router off).

Policies:

- fixed-k: k replicas batching, 4 - k streaming, all the time. minStreamingReplicas (default 1)
  allows k = 0..3; fixed-0 is all-streaming. fixed-4, all-batching, is allowed only with
  minStreamingReplicas 0: it is run and shown as a baseline (and the oracle counts it), but the
  "best fixed split" a policy is measured against is the best of the allowed k = 0..3.
- naive: every interval, load high by the same signals and high thresholds as adaptive -> every
  replica but minStreamingReplicas batching at once, else all streaming; no hysteresis band,
  no stabilization window, no cooldown.
- adaptive: `autoglm_operator.adaptive.policy.decide`, the operator's own code, every
  intervalSeconds on the metrics the default PromQL would return from this pool (Pool.scrape, and
  DemandMeter for each class's demand and each mode's completions and busy requests, so it sizes the
  split by demand and learns capacity from the CRD's seeds); flips apply at once (an in-place flip
  takes milliseconds). The spec's SLO defaults are the sim's Workload targets (checked at start).
- greedy: a look-ahead in hindsight. Every `GREEDY_INTERVAL` s (the policy's cooldown) it tries
  one replica fewer batching, the same, and one more (one flip per cooldown, the operator's own
  pace; also what keeps it affordable on 2 cores) on copies of the pool over the next interval
  plus `GREEDY_LOOKAHEAD` s of the real arrivals, and keeps the count whose requests (judged by
  then) score best (met minus missed). Router on only.

The oracle, per trace and seed (router on): the best goodput of every fixed split (0..4, the
disallowed all-batching included), the naive switch and the greedy look-ahead; each is a mode
schedule chosen with hindsight, so the oracle is at least as good as every baseline by
construction, which the benchmark checks and prints. It is a reference, not a proven optimum: no
search over piecewise-fixed schedules with flip costs beyond the greedy one.

The chats are AutoGLM-Phone-9B's own agent steps (policy_traces.AgentPrompt: the system prompt,
the task and earlier steps as text, this step's 1080x2400 screenshot at the default pixel
budget; a conversation's steps at least 3 s apart), sent with no session id as the official
client sends them (`--session-ids sent`: with one, written to policy_goodput-sent.json and a
section of its own on the page); the replicas' prefix caches hold the shared system prompt and
each task's history where it ran, and the router's prefix-cache hit ratio beside random
routing's is printed. Batch jobs are the calibration workload (and the long jobs of batch-dump).

Goodput per DistServe: every request counts the same, goodput = requests that met their SLO per
second of trace. A chat meets it when its first visible token (after SSE coalescing) comes
within 0.8 s of arrival (the TTFT the agent waits through each step: policy_run's
AGENT_CHAT_TTFT_SLO, the agent step's light-load TTFT in this sim, 0.52 s, plus the headroom the
spec's 500 ms default leaves the 316-token calibration chat over its 0.26 s, a busy replica but
not a queue; set through the spec, as a user would, and checked against the calibration at start)
and its later tokens average at most 0.1 s each (TPOT: 10 tokens/s, faster than anyone
reads, DistServe's chatbot setting). A batch job meets it when it completes within 30 s (a
pipeline's per-item deadline; a batching replica finishes one in ~1.85 s, so 30 s absorbs a
burst's queue but not an overload). Rejected (429/503) and unfinished requests are misses.

Targets (router on, seeds given, PASS/FAIL/TIE; a tie never passes a "beats" target):

- regret: adaptive >= 95% of the per-trace-seed best allowed fixed split on average, >= 90% on
  the worst trace-seed; >= 90% of the oracle on average.
- no static answer: every fixed split k = 0..3, all-batching and naive has a worst case (lowest
  ratio to the per-trace-seed best allowed fixed split) at least 10 points below adaptive's.
- router on >= router off, per trace (mean over seeds), for adaptive, naive and every fixed split.
- the oracle >= every baseline on every trace-seed.

Beside the verdicts it prints the bound the traces put on "no static answer": no policy serves
more than every request in time, so none has a worst case above the lowest (requests per second
/ best fixed split's goodput) over the trace-seeds; a baseline whose worst case is within 10
points of that bound cannot be beaten by 10 points by any policy.

Writes out/bench/policy_goodput.json and .png; prints the tables and the verdicts. Exit status 1
when a target is not met.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.resource.spec import AdaptiveSettings, ModePolicy, ServiceLevelObjectives
from testkit.bench import policy_traces as traces
from testkit.bench.policy_run import (
    AGENT_CHAT_TTFT_SLO,
    REPLICAS,
    WORKLOAD,
    summarize,
)
from testkit.bench.policy_sim import BATCH, CHAT, ROUTINGS, Outcome, Pool
from testkit.paths import OUT_DIR
from testkit.plots import pyplot
from testkit.report import results_page
from testkit.stats import percentile
from testkit.verdicts import Verdicts

FIXED = tuple(f"fixed-{k}" for k in range(REPLICAS + 1))
POLICIES = (*FIXED, "naive", "adaptive", "greedy")
LABELS = {"fixed-0": "all-streaming", f"fixed-{REPLICAS}": "all-batching"}
SEEDS = "2,3,4,5,6"
GREEDY_INTERVAL = 120.0  # the policy's default cooldown
GREEDY_LOOKAHEAD = 30.0  # a batch job's SLO: every request routed in the interval is judged
QUICK_HOURS = 0.25
DEFAULT_OUT = "policy_goodput"
DRAIN_SECONDS = 120.0
RATE_WINDOW = 60.0  # the [1m] of the default rate queries
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the policy's clock is wall time


def settings_for(trace: str) -> AdaptiveSettings:
    """The AdaptiveSettings used: the CRD defaults on every trace (no per-trace tuning), with
    the chat TTFT target a phone-agent step can meet (policy_run.AGENT_CHAT_TTFT_SLO)."""
    slo = ServiceLevelObjectives(
        chat_time_to_first_token_millis=round(AGENT_CHAT_TTFT_SLO * 1000))
    return AdaptiveSettings(slo=slo)


def _slo_is_the_workloads(cal: dict[str, float]) -> None:
    """The policy sizes for the spec's SLOs; the sim judges by the Workload's: one and the same,
    and the agent's target is still the one its calibration derives."""
    derived = cal["agent_streaming_ttft_p50_light_s"] + _headroom(cal)
    assert AGENT_CHAT_TTFT_SLO - 0.05 < derived <= AGENT_CHAT_TTFT_SLO + 1e-9, derived
    slo = settings_for("").slo
    assert slo.chat_time_to_first_token_millis / 1000 == WORKLOAD.chat_ttft_slo
    assert slo.chat_time_per_output_token_millis / 1000 == WORKLOAD.chat_tpot_slo
    assert slo.batch_completion_seconds == WORKLOAD.batch_e2e_slo


def _headroom(cal: dict[str, float]) -> float:
    """What the spec's default chat TTFT target leaves the calibration chat at light load."""
    default = ServiceLevelObjectives().chat_time_to_first_token_millis / 1000
    return default - cal["streaming_ttft_p50_light_s"]


def _high(s: dict[str, float | None], cfg: AdaptiveSettings, n: int) -> bool:
    qps = (s["qps"] or 0.0) / n * 1000
    queue = (s["queue_depth"] or 0.0) / n
    gpu = s["gpu_memory_percent"]
    return (
        qps >= cfg.qps_per_replica_milli.high
        or queue >= cfg.queue_depth_per_replica.high
        or (gpu is not None and gpu >= cfg.gpu_memory_percent.high)
    )


def _samples(s: dict[str, float | None], n: int, demand: dict[str, float | None]) -> pol.Samples:
    return pol.Samples(
        qps=s["qps"],
        gpu_memory_percent=s["gpu_memory_percent"],
        queue_depth=s["queue_depth"],
        kv_cache_percent=s["kv_cache_percent"],
        ttft_p95_seconds=s["ttft_p95_seconds"],
        reporting_replicas=n,
        chat_rate=demand["chat_rate"],
        other_rate=demand["other_rate"],
        streaming_completions=demand["streaming_completions"],
        batching_completions=demand["batching_completions"],
        streaming_busy=demand["streaming_busy"],
        batching_busy=demand["batching_busy"],
        streaming_own_share=demand["streaming_own_share"],
        batching_own_share=demand["batching_own_share"],
    )


class DemandMeter:
    """The demand-sized policy's PromQL (autoglm_operator.io.prom) on the simulated pool: demand is
    the router's `rate(autoglm_router_requests_total{traffic_class}[1m])`, every arrival of each
    class in the last minute whatever became of it (the router counts each request once, shed
    or served); per mode, `rate(vllm:request_success_total[1m])` per pod summed under the mode
    each pod runs now, in flight plus queued (`autoglm_requests_inflight +
    autoglm_requests_queued`), and of `rate(autoglm_requests_received_total[1m])` per pod the
    share of the mode's own class (None while its replicas received nothing: Prometheus' NaN)."""

    def __init__(self, arrivals: Sequence[tuple[float, int] | traces.Arrival]) -> None:
        self.times = [a[0] for a in arrivals]
        self.chats = list(itertools.accumulate(1 if a[1] == CHAT else 0 for a in arrivals))
        # (time, completed per replica, received [chats, others] per replica)
        self.history: deque[tuple[float, list[int], list[list[int]]]] = deque()

    def _chats_before(self, i: int) -> int:
        return self.chats[i - 1] if i > 0 else 0

    def read(self, pool: Pool, now: float) -> dict[str, float | None]:
        if not self.history:
            self.history.append((0.0, [0] * len(pool.replicas), [[0, 0] for _ in pool.replicas]))
        span = min(RATE_WINDOW, now) or 1.0
        lo = bisect.bisect_right(self.times, now - RATE_WINDOW)
        hi = bisect.bisect_right(self.times, now)
        chats = self._chats_before(hi) - self._chats_before(lo)
        done = [r.completed for r in pool.replicas]
        received = [list(r.received) for r in pool.replicas]
        self.history.append((now, done, received))
        while self.history[0][0] < now - RATE_WINDOW:
            self.history.popleft()
        since, before, received_before = self.history[0]
        done_span = (now - since) or 1.0
        out: dict[str, float | None] = {
            "chat_rate": chats / span,
            "other_rate": (hi - lo - chats) / span,
        }
        for mode in Mode:
            mine = [i for i, r in enumerate(pool.replicas) if r.mode is mode]
            out[f"{mode.value}_completions"] = sum(done[i] - before[i] for i in mine) / done_span
            out[f"{mode.value}_busy"] = float(
                sum(pool.replicas[i].inflight + pool.replicas[i].queued for i in mine)
            )
            own = 0 if mode is Mode.STREAMING else 1  # streamed chats, or the rest
            got = [[after - was for after, was in zip(received[i], received_before[i], strict=True)]
                   for i in mine]  # fmt: skip
            total = sum(sum(g) for g in got)
            out[f"{mode.value}_own_share"] = sum(g[own] for g in got) / total if total else None
        return out


def _choose(pool: Pool, batching: int) -> list[Mode]:
    """Modes with `batching` replicas batching, keeping current batching replicas first."""
    order = sorted(pool.replicas, key=lambda r: (r.mode is not Mode.BATCHING, r.index))
    chosen = {r.index for r in order[:batching]}
    return [Mode.BATCHING if r.index in chosen else Mode.STREAMING for r in pool.replicas]


def _apply(pool: Pool, modes: Sequence[Mode], now: float, flips: list[tuple[float, int]]) -> None:
    for replica, mode in zip(pool.replicas, modes, strict=True):
        if replica.mode is not mode:
            pool.set_mode(replica, mode)
            flips.append((now, replica.index))


def _score(outcomes: Sequence[Outcome], before: float) -> int:
    return sum(1 if o.met else -1 for o in outcomes if o.arrival < before)


def simulate(
    trace_name: str,
    policy: str,
    routing: str = "router",
    seed: int = 2,
    hours: float | None = None,
    session_ids: bool = False,
) -> dict:
    """One policy on one trace and seed; returns the summary and the mode timeline."""
    trace = traces.TRACES[trace_name]
    duration = trace.seconds if hours is None else min(trace.seconds, int(hours * 3600))
    arrivals = [a for a in traces.shaped_arrivals(trace, REPLICAS, seed) if a[0] < duration]
    cfg = settings_for(trace_name)
    k = fixed_count(policy)
    modes = [Mode.BATCHING] * (k or 0) + [Mode.STREAMING] * (REPLICAS - (k or 0))
    pool = Pool(
        modes,
        arrivals,
        workload=WORKLOAD,
        routing=routing,
        session_ids=session_ids,
        seed=seed,
        track_metrics=policy in ("naive", "adaptive"),
    )
    run = _Run(pool, cfg, DemandMeter(arrivals))
    wall = time.monotonic()
    step = GREEDY_INTERVAL if policy == "greedy" else cfg.interval_seconds
    t = 0.0
    while t < duration:
        end = min(duration, t + step)
        if policy == "greedy" and t > 0:
            run.greedy_step(t, end)
        else:
            run.pool.run_until(end)
        run.collect()
        t = end
        if t < duration:
            run.decide(policy, t)
    pool = run.pool
    pool.drain(DRAIN_SECONDS)
    run.collect()
    unfinished = pool.pending()
    run.outcomes.extend(Outcome(r.kind, r.arrival, -1.0, -1.0, False) for r in unfinished)
    result = summarize(run.outcomes, duration, len(arrivals))
    result.update(
        trace=trace_name,
        policy=policy,
        routing=routing,
        seed=seed,
        session_ids=session_ids,
        prefix_cache_hit_ratio=pool.prefix_cache_hit_ratio(),
        flips=len(run.flips),
        max_flips_per_replica_per_cooldown=_max_per_window(run.flips, cfg.cooldown_seconds),
        flips_per_replica_per_cooldown=len(run.flips)
        / REPLICAS
        / (duration / cfg.cooldown_seconds),
        unfinished=len(unfinished),
        wall_seconds=round(time.monotonic() - wall, 1),
        reasons=run.reasons,
        timeline=run.timeline[:: max(1, len(run.timeline) // 2000)],
    )
    return result


def fixed_count(policy: str) -> int | None:
    """k for `fixed-k`, None for a policy that changes modes."""
    if policy.startswith("fixed-"):
        return int(policy.removeprefix("fixed-"))
    return None


class _Run:
    """A pool under one policy: its decisions, flips and the outcomes collected so far."""

    def __init__(self, pool: Pool, cfg: AdaptiveSettings, meter: DemandMeter) -> None:
        self.pool = pool
        self.cfg = cfg
        self.meter = meter
        self.state = pol.HysteresisState()
        self.flips: list[tuple[float, int]] = []
        self.timeline: list[tuple[float, int, float | None]] = []  # (t, batching, qps seen)
        self.outcomes: list[Outcome] = []
        self.reasons: dict[str, int] = {}

    def collect(self) -> None:
        self.outcomes.extend(self.pool.outcomes)
        self.pool.outcomes = []

    def batching(self) -> int:
        return sum(r.mode is Mode.BATCHING for r in self.pool.replicas)

    def decide(self, policy: str, t: float) -> None:
        pool, cfg = self.pool, self.cfg
        if policy not in ("naive", "adaptive"):
            self.timeline.append((t, self.batching(), None))
            return
        s = pool.scrape()
        if policy == "naive":
            want = REPLICAS - cfg.min_streaming_replicas if _high(s, cfg, REPLICAS) else 0
            _apply(pool, _choose(pool, want), t, self.flips)
        else:
            replicas = [pol.ReplicaState(r.name, r.mode) for r in pool.replicas]
            decision = pol.decide(
                _samples(s, REPLICAS, self.meter.read(pool, t)),
                replicas,
                self.state,
                cfg,
                ModePolicy.ADAPTIVE,
                EPOCH + t,
                pool.profiles,
            )
            self.state = decision.state
            self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
            target = {r.name: r.mode for r in pool.replicas}
            for f in decision.flips:
                target[f.pod] = f.to_mode
            _apply(pool, [target[r.name] for r in pool.replicas], t, self.flips)
        self.timeline.append((t, self.batching(), s["qps"]))

    def greedy_step(self, t: float, end: float) -> None:
        """Try every count of batching replicas on copies; keep the best (see the docstring)."""
        best: tuple[int, bool, int, Pool] | None = None
        current = self.batching()
        for k in range(max(0, current - 1), min(REPLICAS, current + 1) + 1):
            cand = self.pool.clone()
            _apply(cand, _choose(cand, k), t, [])
            cand.run_until(end)
            snap = cand.clone()
            cand.run_until(end + GREEDY_LOOKAHEAD)
            key = (_score(cand.outcomes, end), k == current, -k)
            if best is None or key > best[:3]:
                best = (*key, snap)
        assert best is not None
        before = [r.mode for r in self.pool.replicas]
        self.pool = best[3]
        for r, m in zip(self.pool.replicas, before, strict=True):
            if r.mode is not m:
                self.flips.append((t, r.index))


def _max_per_window(flips: Sequence[tuple[float, int]], window: float) -> int:
    """The most flips one replica made within any `window` seconds (a sliding window)."""
    worst = 0
    for index in {i for _, i in flips}:
        times = sorted(t for t, i in flips if i == index)
        lo = 0
        for hi, t in enumerate(times):
            while t - times[lo] >= window:
                lo += 1
            worst = max(worst, hi - lo + 1)
    return worst


def calibration() -> dict[str, float]:
    """One replica of the simulated pool against the published per-replica figures."""
    import random

    def poisson(rate: float, seconds: float, kind: int, shape: int) -> list[traces.Arrival]:
        rng, t, out = random.Random(11), 0.0, []
        while (t := t + rng.expovariate(rate)) < seconds:
            out.append(traces.Arrival(t, kind, shape))
        return traces.agent_steps(out, np.random.default_rng(11))

    def saturated(mode: Mode, kind: int, shape: int = traces.SCREENSHOT) -> float:
        pool = Pool([mode], poisson(20.0, 120, kind, shape), workload=WORKLOAD)
        pool.run_until(120)
        return sum(1 for o in pool.outcomes if o.e2e >= 0 and o.arrival + o.e2e >= 20) / 100

    def light_ttft(mode: Mode, shape: int = traces.SCREENSHOT) -> float:
        pool = Pool([mode], poisson(1.0, 300, CHAT, shape), workload=WORKLOAD)
        pool.run_until(300)
        pool.drain(60)
        return percentile([o.ttft for o in pool.outcomes if o.ttft >= 0], 0.5) or math.nan

    return {
        "streaming_ttft_p50_light_s": light_ttft(Mode.STREAMING),
        "batching_ttft_p50_light_s": light_ttft(Mode.BATCHING),
        "streaming_chat_capacity_req_s": saturated(Mode.STREAMING, CHAT),
        "batching_batch_capacity_req_s": saturated(Mode.BATCHING, BATCH),
        "agent_streaming_ttft_p50_light_s": light_ttft(Mode.STREAMING, traces.AGENT),
        "agent_streaming_chat_capacity_req_s": saturated(Mode.STREAMING, CHAT, traces.AGENT),
    }


Job = tuple[str, str, str, int, float | None, bool]


def _job(args: Job) -> dict:
    return simulate(*args)


def _fmt(v: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def label(policy: str) -> str:
    return LABELS.get(policy, policy)


def jobs_for(
    names: Sequence[str],
    seeds: Sequence[int],
    hours: float | None,
    policies: Sequence[str] = POLICIES,
    session_ids: bool = False,
) -> list[Job]:
    """Every policy with and without the router; the greedy look-ahead (router on) first."""
    jobs = [
        (n, p, r, s, hours, session_ids)
        for n in names
        for s in seeds
        for p in policies
        for r in ROUTINGS
        if not (p == "greedy" and r != "router")
    ]
    return sorted(jobs, key=lambda j: (j[1] != "greedy", j[0] != "diurnal"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(traces.TRACES))
    parser.add_argument("--seeds", default=SEEDS, help=f"comma-separated (default {SEEDS})")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--hours", type=float, default=None, help="cut every trace to this")
    parser.add_argument(
        "--quick", action="store_true", help=f"seed 2 only, traces cut to {QUICK_HOURS} h"
    )
    parser.add_argument(
        "--session-ids", choices=("none", "sent"), default="none",
        help="agent steps carry no session id, as the official client sends them (default), "
        "or one (session_id)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="name of the JSON and PNG (the docs page: only for the default)")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="judge the results of earlier runs together (say, of trace groups run apart)",
    )
    parser.add_argument(
        "--rerun",
        default="",
        help="with --merge: simulate these policies (comma-separated, say adaptive) again on "
        "the merged runs' traces and seeds, and judge them in place of the stored ones",
    )
    args = parser.parse_args(argv)
    rerun = [p for p in args.rerun.split(",") if p]
    if rerun and (not args.merge or set(rerun) - set(POLICIES)):
        parser.error(f"--rerun needs --merge and policies among {', '.join(POLICIES)}")
    session_ids = args.session_ids == "sent"
    if args.merge:
        results, names, seeds, elapsed = _merged(args.merge)
        hours, cal = None, None
        sent = {r["session_ids"] for r in results}
        if len(sent) > 1:
            parser.error("the merged runs differ in --session-ids")
        session_ids = sent.pop()
        if rerun:
            cal = _preamble(names)
            ran = {(r["trace"], r["seed"]) for r in results}
            jobs = [j for j in jobs_for(names, seeds, None, rerun, session_ids)
                    if (j[0], j[3]) in ran]
            fresh = _simulate_all(jobs, args.jobs)
            results = _replaced(results, fresh)
    else:
        names = [n for n in args.traces.split(",") if n]
        unknown = [n for n in names if n not in traces.TRACES]
        if unknown:
            parser.error(f"unknown traces {unknown}; known: {', '.join(traces.TRACES)}")
        seeds = [2] if args.quick else [int(x) for x in args.seeds.split(",") if x]
        hours = QUICK_HOURS if args.quick and args.hours is None else args.hours
        cal = _preamble(names)
        wall = time.monotonic()
        results = _simulate_all(jobs_for(names, seeds, hours, session_ids=session_ids),
                                args.jobs)
        elapsed = time.monotonic() - wall
    table = aggregate(results, names)
    # Runs under another --out name (a part, a rerun) leave the page as it is; the session-id
    # variant has a section of its own.
    name = f"{args.out}-sent" if session_ids else args.out
    with results_page("policy_goodput" if args.out == DEFAULT_OUT else None,
                      run="session ids sent" if session_ids else ""):
        print_table(table, names)
        print_prefix_cache(results, names, session_ids)
        print_summary(table, names)
        verdicts = check(table, names)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    payload = {
        "replicas": REPLICAS,
        "traces": names,
        "seeds": seeds,
        "hours": hours,
        "session_ids": session_ids,
        "settings": settings_for("").model_dump(by_alias=True),
        "elapsed_seconds": round(elapsed, 1),
        "calibration": cal,
        "summary": table,
        "results": results,
        "targets": verdicts,
    }
    out = OUT_DIR / f"{name}.json"
    out.write_text(json.dumps(payload, indent=1, default=str))
    plot(results, table, names, OUT_DIR / f"{name}.png")
    print(f"wrote {out} and .png; simulating took {elapsed:.0f}s")
    return 0 if all(v["met"] for v in verdicts) else 1


def _preamble(names: Sequence[str]) -> dict[str, float]:
    for n in names:
        print(f"{n}: {traces.TRACES[n].description}", flush=True)
    print(f"AdaptiveSettings {settings_for('').model_dump(by_alias=True, exclude={'prometheus'})}")
    cal = calibration()
    print(
        "calibration, one replica (published: streaming TTFT ~0.32 s, 4.1 req/s; batching "
        "7.2 req/s at 13 clients; agent_*: phone-agent steps): "
        + ", ".join(f"{k} {v:.2f}" for k, v in cal.items()),
        flush=True,
    )
    _slo_is_the_workloads(cal)
    print(f"chat TTFT target {AGENT_CHAT_TTFT_SLO:.2f} s: the agent's light-load TTFT "
          f"{cal['agent_streaming_ttft_p50_light_s']:.2f} s + {_headroom(cal):.2f} s of "
          "headroom (the default target's over the calibration chat), rounded up to 50 ms",
          flush=True)
    return cal


def _simulate_all(jobs: Sequence[Job], workers: int) -> list:
    wall = time.monotonic()
    results: list[dict] = []
    with ProcessPoolExecutor(max_workers=workers) as executor:
        for future in as_completed([executor.submit(_job, job) for job in jobs]):
            res = future.result()
            if res["trace"] != "diurnal":
                del res["timeline"]  # only the diurnal one is plotted
            results.append(res)
            print(
                f"  [{time.monotonic() - wall:6.1f}s] {res['trace']:<20} s{res['seed']} "
                f"{label(res['policy']):<14} {res['routing']:<7} "
                f"goodput {res['goodput']:.2f} req/s ({res['wall_seconds']}s)",
                flush=True,
            )
    return results


def _merged(paths: Sequence[str]) -> tuple[list[dict], list[str], list[int], float]:
    """Results, traces and seeds of earlier runs' JSON (each trace keeps the seeds it ran)."""
    results: list[dict] = []
    names: list[str] = []
    seeds: list[int] | None = None
    elapsed = 0.0
    for path in paths:
        data = json.loads(Path(path).read_text())
        if data.get("hours") is not None:
            raise SystemExit(f"{path}: its traces were cut to {data['hours']} h")
        seeds = sorted({*(seeds or []), *data["seeds"]})
        names += [n for n in data["traces"] if n not in names]
        results = _replaced(results, data["results"])  # a later file's run wins
        elapsed += data["elapsed_seconds"]
        print(f"{path}: {', '.join(data['traces'])}; seeds {data['seeds']}")
    return results, names, seeds or [], elapsed


def _key(result: dict) -> tuple[str, int, str, str]:
    return result["trace"], result["seed"], result["policy"], result["routing"]


def _replaced(results: Sequence[dict], fresh: Sequence[dict]) -> list[dict]:
    """`results` with every run `fresh` has again replaced by the fresh one."""
    newer = {_key(r): r for r in fresh}
    kept = [r for r in results if _key(r) not in newer]
    return kept + list(newer.values())


def allowed_fixed(cfg: AdaptiveSettings | None = None) -> list[str]:
    """The fixed splits minStreamingReplicas allows."""
    cfg = cfg or AdaptiveSettings()
    return [f"fixed-{k}" for k in range(REPLICAS - cfg.min_streaming_replicas + 1)]


def aggregate(results: Sequence[dict], names: Sequence[str]) -> dict:
    """Per trace and seed run: goodputs, the best allowed fixed split, the oracle."""
    by = {(r["trace"], r["seed"], r["policy"], r["routing"]): r["goodput"] for r in results}
    flips = {
        (r["trace"], r["seed"]): r["max_flips_per_replica_per_cooldown"]
        for r in results
        if r["policy"] == "adaptive" and r["routing"] == "router"
    }
    allowed = allowed_fixed()
    cells: list[dict] = []
    for n in names:
        for s in sorted({r["seed"] for r in results if r["trace"] == n}):
            on = {p: by[(n, s, p, "router")] for p in POLICIES if (n, s, p, "router") in by}
            off = {p: by[(n, s, p, "random")] for p in POLICIES if (n, s, p, "random") in by}
            best_fixed = max(allowed, key=lambda p: on[p])
            # Every policy saw the same arrivals: goodput / attainment is their rate.
            served = [
                r["goodput"] / r["slo_attainment"]
                for r in results
                if r["trace"] == n and r["seed"] == s and r["slo_attainment"] > 0
            ]
            oracle_from = max(
                (p for p in (*FIXED, "naive", "greedy") if p in on), key=lambda p: on[p]
            )
            cells.append(
                {
                    "trace": n,
                    "seed": s,
                    "router": on,
                    "random": off,
                    "best_fixed": best_fixed,
                    "best_fixed_goodput": on[best_fixed],
                    "oracle": on[oracle_from],
                    "oracle_from": oracle_from,
                    "perfect": served[0] if served else None,
                    "adaptive_max_flips_per_cooldown": flips.get((n, s)),
                }
            )
    return {"cells": cells, "allowed_fixed": allowed}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a >= b else 0.0)


def ratios(table: dict, policy: str) -> list[float]:
    """The policy's goodput / best allowed fixed split, per trace-seed (router on)."""
    return [_ratio(c["router"][policy], c["best_fixed_goodput"]) for c in table["cells"]]


def print_prefix_cache(results: Sequence[dict], names: Sequence[str], session_ids: bool) -> None:
    """Adaptive's prefix-cache hit ratio with the router and with random routing: the agent
    steps' shared system prompt hits on every replica, their own history only at home."""
    hits = {(r["trace"], r["routing"]): [] for r in results}
    for r in results:
        if r["policy"] == "adaptive" and r["prefix_cache_hit_ratio"] is not None:
            hits[r["trace"], r["routing"]].append(r["prefix_cache_hit_ratio"])
    print(f"\nprefix-cache hit ratio (prompt tokens), adaptive, mean over seeds; session ids "
          f"{'sent' if session_ids else 'none'}")
    print(f"{'trace':<21}{'router':>8}{'random':>8}")
    for n in names:
        on, off = hits.get((n, "router"), []), hits.get((n, "random"), [])
        print(f"{n:<21}{_fmt(statistics.fmean(on) if on else None, digits=3):>8}"
              f"{_fmt(statistics.fmean(off) if off else None, digits=3):>8}")


def print_table(table: dict, names: Sequence[str]) -> None:
    cells = table["cells"]
    head = (
        f"{'trace':<21}{'policy':<14}{'router':>8}{'worst':>8}{'random':>8}{'on-off':>8}"
        f"{'%best':>7}{'%worst':>7}"
    )
    print(
        "\ngoodput in req/s, mean over seeds (worst seed); %best: mean goodput / the best "
        "allowed fixed split of the same trace-seed; %worst: its lowest"
    )
    print(head)
    print("-" * len(head))
    for n in names:
        mine = [c for c in cells if c["trace"] == n]
        for p in POLICIES:
            on = [c["router"][p] for c in mine if p in c["router"]]
            if not on:
                continue
            off = [c["random"][p] for c in mine if p in c["random"]]
            rs = [_ratio(c["router"][p], c["best_fixed_goodput"]) for c in mine]
            off_txt = f"{_mean(off):>8.2f}{_mean(on) - _mean(off):>+8.2f}" if off else " " * 16
            print(
                f"{n:<21}{label(p):<14}{_mean(on):>8.2f}{min(on):>8.2f}{off_txt}"
                f"{100 * _mean(rs):>7.1f}{100 * min(rs):>7.1f}"
            )
        bests = ", ".join(f"s{c['seed']} {label(c['best_fixed'])}" for c in mine)
        oracles = ", ".join(
            f"s{c['seed']} {c['oracle']:.2f} ({label(c['oracle_from'])})" for c in mine
        )
        print(f"{'':<21}best allowed fixed split: {bests}")
        print(f"{'':<21}oracle: {oracles}")


def print_summary(table: dict, names: Sequence[str]) -> None:
    """Per trace, router on: adaptive, the best allowed fixed split (which, per seed), the
    oracle, and adaptive's ratio to the best fixed split on average and on its worst seed."""
    print(
        "\nper trace, router on, mean over seeds: goodput req/s; adaptive's % of the best "
        "allowed fixed split (mean, worst seed) and of the oracle"
    )
    head = (
        f"{'trace':<21}{'adaptive':>9}{'best fixed':>11}  {'which (per seed)':<26}"
        f"{'oracle':>8}{'%best':>7}{'worst':>7}{' seed':<6}{'%oracle':>8}"
    )
    print(head)
    print("-" * len(head))
    for n in names:
        mine = [c for c in table["cells"] if c["trace"] == n]
        if not mine:
            continue
        rs = [_ratio(c["router"]["adaptive"], c["best_fixed_goodput"]) for c in mine]
        worst = mine[rs.index(min(rs))]
        which = ",".join(c["best_fixed"].removeprefix("fixed-") for c in mine)
        vs_oracle = [_ratio(c["router"]["adaptive"], c["oracle"]) for c in mine]
        print(
            f"{n:<21}{_mean([c['router']['adaptive'] for c in mine]):>9.2f}"
            f"{_mean([c['best_fixed_goodput'] for c in mine]):>11.2f}  "
            f"{which + ' batching':<26}{_mean([c['oracle'] for c in mine]):>8.2f}"
            f"{100 * _mean(rs):>7.1f}{100 * min(rs):>7.1f} s{worst['seed']:<4}"
            f"{100 * _mean(vs_oracle):>8.1f}"
        )


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def check(table: dict, names: Sequence[str]) -> list[dict]:
    """The module docstring's targets, each PASS, FAIL or TIE."""
    cells = table["cells"]
    verdicts = Verdicts()
    print()
    ad = ratios(table, "adaptive")
    worst_cell = cells[ad.index(min(ad))]
    vs_oracle = [_ratio(c["router"]["adaptive"], c["oracle"]) for c in cells]
    verdicts.add(
        "regret: adaptive >= 95% of the best allowed fixed split on average",
        _mean(ad),
        0.95,
        f"{100 * _mean(ad):.1f}%",
    )
    verdicts.add(
        "regret: adaptive >= 90% of the best allowed fixed split on the worst trace-seed",
        min(ad),
        0.90,
        f"{100 * min(ad):.1f}% on {worst_cell['trace']} seed {worst_cell['seed']}",
    )
    verdicts.add(
        "regret: adaptive >= 90% of the oracle on average",
        _mean(vs_oracle),
        0.90,
        f"{100 * _mean(vs_oracle):.1f}%",
    )
    for p in (*FIXED, "naive"):
        worst = min(ratios(table, p))
        verdicts.add(
            f"no static answer: adaptive's worst case beats {label(p)}'s by >= 10 points",
            min(ad) - worst,
            0.10,
            f"{label(p)} worst {100 * worst:.1f}% vs adaptive worst {100 * min(ad):.1f}%",
            beats=True,
        )
    _check_router_and_oracle(verdicts, cells, names)
    _reachable(table, min(ad))
    return verdicts


def _reachable(table: dict, adaptive_worst: float) -> None:
    """What the "no static answer" target asks against what the traces allow: no policy serves
    more than every request in time, so on each trace-seed no policy's ratio to the best fixed
    split exceeds (requests per second) / (best fixed split's goodput); the lowest of those
    bounds every policy's worst case. A static baseline whose own worst case is less than 10
    points below that bound cannot be beaten by 10 points by any policy."""
    cells = table["cells"]
    bounds = [_ratio(c["perfect"], c["best_fixed_goodput"]) for c in cells if c.get("perfect")]
    if not bounds:
        return
    bound = min(bounds)
    at = cells[bounds.index(bound)]
    print(
        f"\nbound: no policy's worst case can exceed {100 * bound:.1f}% of the best fixed split "
        f"(on {at['trace']} seed {at['seed']} serving every request in time is "
        f"{at['perfect']:.2f} req/s, the best fixed split {at['best_fixed_goodput']:.2f}); "
        f"adaptive's worst is {100 * adaptive_worst:.1f}%"
    )
    closest = max(_ratio(c["oracle"], c["best_fixed_goodput"]) for c in cells)
    print(f"the oracle is at most {100 * (closest - 1):.1f}% above the best fixed split")
    for p in (*FIXED, "naive"):
        worst = min(ratios(table, p))
        if worst > bound - 0.10:
            print(
                f"  {label(p)}: worst {100 * worst:.1f}%, within 10 points of the bound: "
                "no policy can be 10 points ahead of it"
            )


def _check_router_and_oracle(
    verdicts: Verdicts, cells: Sequence[dict], names: Sequence[str]
) -> None:
    for n in names:
        mine = [c for c in cells if c["trace"] == n]
        for p in (*FIXED, "naive", "adaptive"):
            on = _mean([c["router"][p] for c in mine])
            off = _mean([c["random"][p] for c in mine])
            verdicts.add(
                f"{n}: router on >= off for {label(p)}",
                on,
                off,
                f"{on:.3f} vs {off:.3f} req/s (router on, random)",
            )
    noise = [c["adaptive_max_flips_per_cooldown"] for c in cells if c["trace"] == "noise"]
    if noise:
        verdicts.add(
            "noise: adaptive flips each replica at most once per cooldown",
            -max(noise),
            -1.5,  # a count: at most 1 passes
            f"at most {max(noise)} flips of one replica within any cooldown window",
        )
    short = [
        f"{c['trace']} s{c['seed']} {label(p)}"
        for c in cells
        for p in (*FIXED, "naive")
        if c["router"][p] > c["oracle"]
    ]
    verdicts.add(
        "the oracle >= every baseline on every trace-seed",
        -len(short),
        -0.5,  # a count: none short passes, any fails
        ", ".join(short) or f"{len(cells)} trace-seeds checked",
    )


def plot(results: Sequence[dict], table: dict, names: Sequence[str], path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(2, 1, figsize=(13, 8))
    ax = axes[0]
    shown = (*FIXED, "naive", "adaptive", "greedy")
    width = 0.8 / len(shown)
    for i, p in enumerate(shown):
        xs = [j + i * width for j in range(len(names))]
        ys = [
            100
            * _mean(
                [
                    _ratio(c["router"][p], c["best_fixed_goodput"])
                    for c in table["cells"]
                    if c["trace"] == n
                ]
            )
            for n in names
        ]
        ax.bar(xs, ys, width, label=label(p))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, fontsize=7)
    ax.set_ylabel("% of the best allowed fixed split")
    ax.set_title(f"Policy goodput, {REPLICAS} replicas, router on (sim latency model)")
    ax.legend(ncol=len(shown), fontsize=7, loc="upper center")
    ax = axes[1]
    seed = table["cells"][0]["seed"] if table["cells"] else 0
    for r in results:
        if (
            r["trace"] == "diurnal"
            and r["routing"] == "router"
            and r["seed"] == seed
            and r["policy"] in ("naive", "adaptive", "greedy")
        ):
            tl = r["timeline"]
            ax.step([x[0] / 3600 for x in tl], [x[1] for x in tl], where="post", label=r["policy"])
    ax.set_xlabel("hour of the diurnal trace")
    ax.set_ylabel("replicas batching")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
