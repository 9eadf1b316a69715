"""Does adaptive beat a fixed mode? Policy goodput on simulated traffic (issue 7, part 1).

    .venv/bin/python bench/policy_goodput.py [--traces diurnal,noise] [--jobs 2] [--quick]

Replays each trace (bench/traces/policy_traces.py) against a pool of 4 replicas (2 GPUs each)
simulated in fast-forwarded time by bench/policy_sim.py: the mode middleware's admission from
`autoglm_runtime.profiles` (the defaults of StreamingProfile and BatchingProfile) in front of the
sim's engine step model (`autoglm_runtime.sim.model.LatencyModel`, calibrated to the published
streaming TTFT ~0.32 s / 4.1 req/s and batching 1.8 s / 7.2 req/s per replica). Policies, on the
same arrivals:

- all-streaming, all-batching: modes pinned.
- naive: every interval, load high by the same signals and high thresholds as adaptive -> every
  replica but minStreamingReplicas batching at once, else all streaming; no hysteresis band,
  no stabilization window, no cooldown.
- adaptive: `autoglm_operator.policy.decide`, the operator's own code, every intervalSeconds on
  the metrics the default PromQL would return from this pool (see Pool.scrape); flips apply at
  once (an in-place flip takes milliseconds).
- oracle: at every interval, with hindsight, tries every count of batching replicas (0..4) on a
  copy of the pool over that interval plus a 15 s look-ahead of the real arrivals, and keeps the
  count whose requests (judged by then) score best (met SLO minus missed). Greedy per interval,
  free flips: an upper reference, not a proven optimum.

Routing assumption: clients of each class use the operator's mode Services behind an L7 gateway
with least-outstanding-requests balancing: chats go to `<name>-streaming` replicas, and spill to
the least loaded replica of all only when every streaming replica is at its concurrency cap;
batch jobs go to `<name>-batching` replicas (no spill); a class whose Service has no endpoint
uses `<name>` (all replicas).

SLOs: chat met when its first visible token (after SSE coalescing) comes within 0.5 s of arrival;
batch job met when it finishes within 30 s. Rejected (429/503) or unfinished requests miss.
Goodput = met requests per second of trace.

Writes out/bench/policy_goodput.json and .png; prints a table and PASS/FAIL per target.
Exit status 1 when a target fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "traces")]

import policy_traces as traces  # noqa: E402
from policy_sim import BATCH, CHAT, Outcome, Pool  # noqa: E402

from autoglm_operator import policy as pol  # noqa: E402
from autoglm_operator.spec import AdaptiveSettings, ModePolicy  # noqa: E402
from autoglm_runtime.profiles import Mode  # noqa: E402

OUT_DIR = HERE.parent / "out" / "bench"
REPLICAS = 4
POLICIES = ("all-streaming", "all-batching", "naive", "adaptive", "oracle")
ORACLE_LOOKAHEAD = 15.0
DRAIN_SECONDS = 120.0
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the policy's clock is wall time


def settings_for(trace: str) -> AdaptiveSettings:
    """The AdaptiveSettings used: the CRD defaults on every trace (no per-trace tuning)."""
    return AdaptiveSettings()


def _high(s: dict[str, float | None], cfg: AdaptiveSettings, n: int) -> bool:
    qps = (s["qps"] or 0.0) / n * 1000
    queue = (s["queue_depth"] or 0.0) / n
    gpu = s["gpu_memory_percent"]
    return (
        qps >= cfg.qps_per_replica_milli.high
        or queue >= cfg.queue_depth_per_replica.high
        or (gpu is not None and gpu >= cfg.gpu_memory_percent.high)
    )


def _samples(s: dict[str, float | None], n: int) -> pol.Samples:
    return pol.Samples(
        qps=s["qps"],
        gpu_memory_percent=s["gpu_memory_percent"],
        queue_depth=s["queue_depth"],
        kv_cache_percent=s["kv_cache_percent"],
        ttft_p95_seconds=s["ttft_p95_seconds"],
        reporting_replicas=n,
    )


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


def simulate(trace_name: str, policy: str, seed: int = 1, hours: float | None = None) -> dict:
    trace = traces.TRACES[trace_name]
    duration = trace.seconds if hours is None else min(trace.seconds, int(hours * 3600))
    arrivals = [a for a in traces.arrivals(trace, REPLICAS, seed) if a[0] < duration]
    cfg = settings_for(trace_name)
    interval = cfg.interval_seconds
    start_mode = Mode.BATCHING if policy == "all-batching" else Mode.STREAMING
    pool = Pool([start_mode] * REPLICAS, arrivals, track_metrics=policy in ("naive", "adaptive"))
    state = pol.LoopState()
    flips: list[tuple[float, int]] = []
    timeline: list[tuple[float, int, float | None]] = []  # (t, batching replicas, qps observed)
    outcomes: list[Outcome] = []
    reasons: dict[str, int] = {}
    wall = time.monotonic()
    t = 0.0
    while t < duration:
        end = min(duration, t + interval)
        if policy == "oracle" and t > 0:
            best: tuple[int, int, int, Pool] | None = None
            current = sum(r.mode is Mode.BATCHING for r in pool.replicas)
            for k in range(REPLICAS + 1):
                cand = pool.clone()
                _apply(cand, _choose(cand, k), t, [])
                cand.run_until(end)
                snap = cand.clone()
                cand.run_until(end + ORACLE_LOOKAHEAD)
                score = _score(cand.outcomes, end)
                key = (score, k == current, -k)
                if best is None or key > best[:3]:
                    best = (*key, snap)
            assert best is not None
            before = [r.mode for r in pool.replicas]
            pool = best[3]
            for r, m in zip(pool.replicas, before, strict=True):
                if r.mode is not m:
                    flips.append((t, r.index))
        else:
            pool.run_until(end)
        outcomes.extend(pool.outcomes)
        pool.outcomes = []
        t = end
        if t >= duration:
            break
        if policy in ("naive", "adaptive"):
            s = pool.scrape()
            if policy == "naive":
                want = REPLICAS - cfg.min_streaming_replicas if _high(s, cfg, REPLICAS) else 0
                _apply(pool, _choose(pool, want), t, flips)
            else:
                replicas = [pol.ReplicaState(r.name, r.mode) for r in pool.replicas]
                decision = pol.decide(
                    _samples(s, REPLICAS), replicas, state, cfg, ModePolicy.ADAPTIVE, EPOCH + t
                )
                state = decision.state
                reasons[decision.reason] = reasons.get(decision.reason, 0) + 1
                target = {r.name: r.mode for r in pool.replicas}
                for f in decision.flips:
                    target[f.pod] = f.to_mode
                _apply(pool, [target[r.name] for r in pool.replicas], t, flips)
            timeline.append((t, sum(r.mode is Mode.BATCHING for r in pool.replicas), s["qps"]))
        else:
            timeline.append((t, sum(r.mode is Mode.BATCHING for r in pool.replicas), math.nan))
    pool.drain(DRAIN_SECONDS)
    outcomes.extend(pool.outcomes)
    unfinished = pool.pending()
    outcomes.extend(Outcome(r.kind, r.arrival, -1.0, -1.0, False) for r in unfinished)
    result = summarize(outcomes, duration, len(arrivals))
    result.update(
        trace=trace_name,
        policy=policy,
        flips=len(flips),
        max_flips_per_replica_per_cooldown=_max_per_window(flips, cfg.cooldown_seconds),
        flips_per_replica_per_cooldown=len(flips) / REPLICAS / (duration / cfg.cooldown_seconds),
        unfinished=len(unfinished),
        wall_seconds=round(time.monotonic() - wall, 1),
        reasons=reasons,
        timeline=timeline[:: max(1, len(timeline) // 2000)],
    )
    return result


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


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def summarize(outcomes: Sequence[Outcome], duration: float, arrivals: int) -> dict[str, Any]:
    assert len(outcomes) == arrivals, (len(outcomes), arrivals)  # every request judged once
    met = sum(o.met for o in outcomes)
    done = [o for o in outcomes if o.e2e >= 0]
    chat = [o for o in outcomes if o.kind == CHAT]
    batch = [o for o in outcomes if o.kind == BATCH]
    ttfts = [o.ttft for o in chat if o.ttft >= 0]
    return {
        "requests": arrivals,
        "goodput": met / duration,
        "slo_attainment": met / arrivals if arrivals else 1.0,
        "chat_attainment": sum(o.met for o in chat) / len(chat) if chat else 1.0,
        "batch_attainment": sum(o.met for o in batch) / len(batch) if batch else 1.0,
        "throughput": len(done) / duration,
        "rejected": sum(1 for o in outcomes if o.e2e < 0 and o.ttft < 0),
        "ttft_p50": _pct(ttfts, 0.5),
        "ttft_p95": _pct(ttfts, 0.95),
        "batch_e2e_p95": _pct([o.e2e for o in batch if o.e2e >= 0], 0.95),
    }


def calibration() -> dict[str, float]:
    """One replica of the simulated pool against the published per-replica figures."""
    import random

    def poisson(rate: float, seconds: float, kind: int) -> list[tuple[float, int]]:
        rng, t, out = random.Random(11), 0.0, []
        while (t := t + rng.expovariate(rate)) < seconds:
            out.append((t, kind))
        return out

    def saturated(mode: Mode, kind: int) -> float:
        pool = Pool([mode], poisson(20.0, 120, kind))
        pool.run_until(120)
        return sum(1 for o in pool.outcomes if o.e2e >= 0 and o.arrival + o.e2e >= 20) / 100

    def light_ttft(mode: Mode) -> float:
        pool = Pool([mode], poisson(1.0, 300, CHAT))
        pool.run_until(300)
        pool.drain(60)
        return _pct([o.ttft for o in pool.outcomes if o.ttft >= 0], 0.5) or math.nan

    return {
        "streaming_ttft_p50_light_s": light_ttft(Mode.STREAMING),
        "batching_ttft_p50_light_s": light_ttft(Mode.BATCHING),
        "streaming_chat_capacity_req_s": saturated(Mode.STREAMING, CHAT),
        "batching_batch_capacity_req_s": saturated(Mode.BATCHING, BATCH),
    }


def _job(args: tuple[str, str, int, float | None]) -> dict:
    return simulate(*args)


def _fmt(v: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(traces.TRACES))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=None, help="cut every trace to this")
    args = parser.parse_args(argv)
    names = [n for n in args.traces.split(",") if n]
    policies = [p for p in args.policies.split(",") if p]
    for n in names:
        cfg = settings_for(n)
        print(
            f"{n}: {traces.TRACES[n].description}; AdaptiveSettings "
            f"{cfg.model_dump(by_alias=True, exclude={'prometheus'})}",
            flush=True,
        )
    cal = calibration()
    print(
        "calibration, one replica (published: streaming TTFT ~0.32 s, 4.1 req/s; batching "
        "7.2 req/s at 13 clients): " + ", ".join(f"{k} {v:.2f}" for k, v in cal.items()),
        flush=True,
    )
    # The oracle jobs are the slow ones: start them first.
    jobs = sorted(
        ((n, p, args.seed, args.hours) for n in names for p in policies),
        key=lambda j: (j[1] != "oracle", j[0] != "diurnal"),
    )
    wall = time.monotonic()
    results: list[dict] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for future in as_completed([pool.submit(_job, job) for job in jobs]):
            res = future.result()
            results.append(res)
            print(
                f"  [{time.monotonic() - wall:6.1f}s] {res['trace']:<16} {res['policy']:<14} "
                f"goodput {res['goodput']:.2f} req/s ({res['wall_seconds']}s)",
                flush=True,
            )
    elapsed = time.monotonic() - wall
    results.sort(key=lambda r: (names.index(r["trace"]), policies.index(r["policy"])))
    print_table(results)
    verdicts = check(results, names, policies)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    payload = {
        "replicas": REPLICAS,
        "settings": {n: settings_for(n).model_dump(by_alias=True) for n in names},
        "elapsed_seconds": round(elapsed, 1),
        "calibration": cal,
        "results": results,
        "targets": verdicts,
    }
    (OUT_DIR / "policy_goodput.json").write_text(json.dumps(payload, indent=1))
    plot(results, names, policies)
    print(f"wrote {OUT_DIR / 'policy_goodput.json'} and .png; benchmark took {elapsed:.0f}s")
    return 0 if all(v["pass"] for v in verdicts) else 1


def print_table(results: Sequence[dict]) -> None:
    head = (
        f"{'trace':<16}{'policy':<14}{'goodput':>9}{'SLO%':>7}{'chat%':>7}{'batch%':>7}"
        f"{'TTFT p50':>9}{'TTFT p95':>9}{'thru':>7}{'rej':>7}{'flips':>6}{'f/r/cd':>7}"
        f"{'max/cd':>7}"
    )
    print()
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['trace']:<16}{r['policy']:<14}{r['goodput']:>9.2f}"
            f"{100 * r['slo_attainment']:>7.1f}{100 * r['chat_attainment']:>7.1f}"
            f"{100 * r['batch_attainment']:>7.1f}{_fmt(r['ttft_p50'], 's'):>9}"
            f"{_fmt(r['ttft_p95'], 's'):>9}{r['throughput']:>7.2f}{r['rejected']:>7}"
            f"{r['flips']:>6}{r['flips_per_replica_per_cooldown']:>7.2f}"
            f"{r['max_flips_per_replica_per_cooldown']:>7}"
        )
    print(
        "goodput/thru in req/s; TTFT of chats (client-visible); f/r/cd: flips per replica per "
        "cooldown (mean); max/cd: most flips of one replica within any cooldown window"
    )


def check(results: Sequence[dict], names: Sequence[str], policies: Sequence[str]) -> list[dict]:
    by = {(r["trace"], r["policy"]): r for r in results}
    verdicts: list[dict] = []

    def verdict(target: str, ok: bool, detail: str) -> None:
        verdicts.append({"target": target, "pass": ok, "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'}: {target}: {detail}")

    print()
    if "adaptive" not in policies:
        return verdicts
    for n in names:
        ad = by[(n, "adaptive")]["goodput"]
        others = {p: by[(n, p)]["goodput"] for p in policies if p not in ("adaptive", "oracle")}
        if others:
            best_p = max(others, key=lambda p: others[p])
            verdict(
                f"{n}: adaptive has the highest non-oracle goodput",
                ad >= others[best_p],
                f"adaptive {ad:.3f} vs best other {best_p} {others[best_p]:.3f} req/s"
                + (" (a tie: the same moves)" if ad == others[best_p] else ""),
            )
        if "oracle" in policies and traces.TRACES[n].judged_within_oracle:
            orc = by[(n, "oracle")]["goodput"]
            verdict(
                f"{n}: adaptive within 10% of the oracle",
                ad >= 0.9 * orc,
                f"adaptive {ad:.3f} = {100 * ad / orc:.1f}% of oracle {orc:.3f} req/s",
            )
    if "noise" in names:
        r = by[("noise", "adaptive")]
        verdict(
            "noise: at most one flip per replica per cooldown",
            r["max_flips_per_replica_per_cooldown"] <= 1,
            f"max {r['max_flips_per_replica_per_cooldown']} flips of one replica within "
            f"{settings_for('noise').cooldown_seconds}s; mean "
            f"{r['flips_per_replica_per_cooldown']:.2f} per replica per cooldown",
        )
    return verdicts


def plot(results: Sequence[dict], names: Sequence[str], policies: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["trace"], r["policy"]): r for r in results}
    fig, axes = plt.subplots(2, 1, figsize=(11, 8))
    ax = axes[0]
    width = 0.8 / len(policies)
    for i, p in enumerate(policies):
        xs = [j + i * width for j in range(len(names))]
        ax.bar(xs, [by[(n, p)]["slo_attainment"] * 100 for n in names], width, label=p)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
    ax.set_ylabel("SLO attainment %")
    ax.set_title(f"Policy goodput, {REPLICAS} replicas (sim latency model)")
    ax.set_ylim(0, 118)
    ax.legend(ncol=len(policies), fontsize=8, loc="upper center")
    ax = axes[1]
    if "diurnal" in names:
        for p in ("naive", "adaptive", "oracle"):
            if (("diurnal", p)) in by:
                tl = by[("diurnal", p)]["timeline"]
                ax.step([x[0] / 3600 for x in tl], [x[1] for x in tl], where="post", label=p)
        rate = traces.rates(traces.TRACES["diurnal"], REPLICAS)
        ax2 = ax.twinx()
        ax2.plot([i / 3600 for i in range(0, len(rate), 60)], rate[::60], color="grey", lw=0.8)
        ax2.set_ylabel("offered req/s (grey)")
        ax.set_xlabel("hour of the diurnal trace")
        ax.set_ylabel("replicas batching")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT_DIR / "policy_goodput.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
