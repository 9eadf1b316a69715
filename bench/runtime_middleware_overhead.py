"""The mode middleware's own cost: the same sim with and without it, in one run.

Two sim processes at time factor 1, identical but for `--no-middleware`. The middleware runs a
profile that admits all 64 streams with no batch window and no coalescing, so what is measured
is its machinery (body parsing and rewrite, admission, the send wrapper), not a policy choice.
64 concurrent streaming users per phase; phases alternate A/B/A/B so drift on a shared machine
hits both sides. Targets: median latency added < 5%, no throughput loss (ratio >= 0.97 allows
for run-to-run noise). Writes out/bench/runtime_middleware_overhead.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from testkit.bench.runtime_workload import MODEL, PhaseResult, Sample
from testkit.paths import OUT_DIR
from testkit.plots import pyplot
from testkit.processes import SimProcess
from testkit.report import results_page

STREAMS = 64
PASS_THROUGH_PROFILE = {"maxConcurrency": STREAMS, "maxQueue": 64, "queueTimeoutSeconds": 60,
                        "batchWindowMillis": 0, "batchSize": 1, "streamCoalesceChunks": 1}


async def stream_request(http: httpx.AsyncClient, index: int, max_tokens: int) -> Sample:
    body = {"model": MODEL, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"[{index}] open settings, dark mode"}]}
    start = time.monotonic()
    ttft = None
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return Sample(start, time.monotonic(), None, False, str(response.status_code))
            async for line in response.aiter_lines():
                if ttft is None and line.startswith("data: ") and '"content":"' in line \
                        and '"content":""' not in line:
                    ttft = time.monotonic() - start
                if line == "data: [DONE]":
                    break
    except httpx.HTTPError as exc:
        return Sample(start, time.monotonic(), ttft, False, repr(exc))
    return Sample(start, time.monotonic(), ttft, True)


async def phase(base_url: str, seconds: float, warmup: float, max_tokens: int) -> PhaseResult:
    result = PhaseResult()
    t0 = time.monotonic()
    result.window = (t0 + warmup, t0 + warmup + seconds)
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=STREAMS * 2, max_keepalive_connections=STREAMS * 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as http:

        async def user(number: int) -> None:
            await asyncio.sleep(number * 1.5 / STREAMS)  # arrive spread out, as users do
            while time.monotonic() < result.window[1]:
                result.samples.append(await stream_request(http, next(counter), max_tokens))

        await asyncio.gather(*(user(n) for n in range(STREAMS)))
    return result


def summarize(phases: list[PhaseResult]) -> dict[str, float]:
    samples = [s for p in phases for s in p.in_window()]
    return {
        "requests": len(samples),
        "errors": sum(p.errors() for p in phases),
        "median_e2e_s": statistics.median(s.end - s.start for s in samples),
        "median_ttft_s": statistics.median(s.ttft for s in samples if s.ttft is not None),
        "req_per_s": statistics.fmean(p.throughput() for p in phases),
    }


def run(seconds: float, warmup: float, rounds: int, max_tokens: int) -> int:
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "config.json"
        config.write_text(json.dumps({"profiles": {"streaming": PASS_THROUGH_PROFILE}}))
        env = {"AUTOGLM_CONFIG_FILE": str(config), "AUTOGLM_LABELS_FILE": "/nonexistent"}
        with SimProcess("--time-factor", "1", env=env) as with_mw, \
                SimProcess("--time-factor", "1", "--no-middleware", env=env) as without_mw:
            runs: dict[str, list[PhaseResult]] = {"without": [], "with": []}
            for _ in range(rounds):
                for name, sim in (("without", without_mw), ("with", with_mw)):
                    runs[name].append(asyncio.run(phase(sim.base_url, seconds, warmup,
                                                        max_tokens)))
    without, with_ = summarize(runs["without"]), summarize(runs["with"])
    added = with_["median_e2e_s"] / without["median_e2e_s"] - 1
    ttft_added = with_["median_ttft_s"] - without["median_ttft_s"]
    ratio = with_["req_per_s"] / without["req_per_s"]
    ok = added < 0.05 and ratio >= 0.97 and not with_["errors"] and not without["errors"]

    with results_page("runtime_middleware_overhead"):
        print(f"{STREAMS} concurrent streams, {max_tokens} tokens each, {rounds} x {seconds:g} s "
              "per side")
        print(f"{'':<20} {'median e2e':>11} {'median ttft':>12} {'req/s':>8} {'requests':>9}")
        for name, row in (("without middleware", without), ("with middleware", with_)):
            print(f"{name:<20} {row['median_e2e_s']:>10.3f}s {row['median_ttft_s']:>11.3f}s "
                  f"{row['req_per_s']:>8.2f} {row['requests']:>9.0f}")
        print(f"added median latency {added:+.2%} (target < 5%), TTFT {ttft_added * 1000:+.1f} ms, "
              f"throughput ratio {ratio:.3f} (target >= 0.97): {'PASS' if ok else 'FAIL'}")

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "runtime_middleware_overhead.json").write_text(json.dumps({
        "streams": STREAMS, "max_tokens": max_tokens, "rounds": rounds, "seconds": seconds,
        "without": without, "with": with_, "added_median_latency": added,
        "throughput_ratio": ratio, "pass": ok,
    }, indent=2))
    plot(runs)
    return 0 if ok else 1


def plot(runs: dict[str, list[PhaseResult]]) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    data = [[s.end - s.start for p in runs[name] for s in p.in_window()] for name in runs]
    ax.boxplot(data, tick_labels=["without middleware", "with middleware"])
    ax.set_ylabel("end-to-end latency (s)")
    ax.set_title(f"{STREAMS} concurrent streams through the sim")
    fig.tight_layout()
    fig.savefig(OUT_DIR / "runtime_middleware_overhead.png", dpi=120)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    sys.exit(run(args.seconds, args.warmup, args.rounds, args.max_tokens))
