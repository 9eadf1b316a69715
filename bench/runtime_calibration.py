"""Calibration: the sim at time factor 1 against the reference's published figures.

Runs one sim (with the mode middleware, as deployed), drives the streaming workload in streaming
mode and the batching workload in batching mode (see testkit/testkit/sim/model.py for both), and
prints measured (medians for latencies: the machine may be shared) vs published side by
side. Exit status 1 if any figure is off by more than 15%.
Writes out/bench/runtime_calibration.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request

from autoglm_api.profiles import MODE_PATH
from testkit.bench.runtime_workload import closed_loop, within
from testkit.paths import OUT_DIR
from testkit.plots import pyplot
from testkit.processes import SimProcess
from testkit.report import results_page

TOKEN = "calibration-token"
PUBLISHED = {
    "streaming": {"ttft_s": 0.32, "e2e_s": 2.1, "req_per_s": 4.1, "peak_vram_gb": 38.0},
    "batching": {"e2e_s": 1.8, "req_per_s": 7.2, "peak_vram_gb": 36.0},
}
# The workload (assumed; the reference publishes none): see the sim model's docstring.
WORKLOAD = {
    "streaming": {"clients": 8, "stream": True, "max_tokens": 64},
    "batching": {"clients": 13, "stream": False, "max_tokens": 40},
}


def call(base: str, method: str, path: str, body: dict[str, object] | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method, headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def run(seconds: float, warmup: float, tolerance: float) -> int:
    results: dict[str, dict[str, float]] = {}
    with SimProcess("--time-factor", "1", env={"AUTOGLM_ADMIN_TOKEN": TOKEN,
                                               "AUTOGLM_CONFIG_FILE": "/nonexistent"}) as sim:
        for mode, load in WORKLOAD.items():
            call(sim.admin_url, "PUT", MODE_PATH, {"mode": mode})
            call(sim.base_url, "POST", "/sim/v1/stats/reset")
            phase = asyncio.run(closed_loop(sim.base_url, int(load["clients"]), seconds, warmup,
                                            bool(load["stream"]), int(load["max_tokens"]),
                                            stagger=PUBLISHED[mode]["e2e_s"] / load["clients"]))
            stats = call(sim.base_url, "GET", "/sim/v1/stats")
            assert isinstance(stats, dict)
            measured = {
                "e2e_s": phase.median_e2e(),
                "e2e_mean_s": phase.mean_e2e(),
                "req_per_s": phase.throughput(),
                "peak_vram_gb": stats["peakGpuMemoryUsedBytes"] / 1e9,
                "requests": float(len(phase.in_window())),
                "errors": float(phase.errors()),
            }
            if load["stream"]:
                measured["ttft_s"] = phase.median_ttft()
                measured["ttft_mean_s"] = phase.mean_ttft()
            results[mode] = measured

    failures = 0
    rows = []
    for mode, published in PUBLISHED.items():
        for metric, target in published.items():
            value = results[mode][metric]
            ok = within(value, target, tolerance)
            failures += 0 if ok else 1
            rows.append((mode, metric, target, value, (value - target) / target, ok))
        if results[mode]["errors"]:
            failures += 1
    with results_page("runtime_calibration"):
        print(f"{'mode':<10} {'metric':<13} {'published':>9} {'sim':>9} {'delta':>7}  within")
        for mode, metric, target, value, delta, ok in rows:
            print(f"{mode:<10} {metric:<13} {target:>9.3f} {value:>9.3f} {delta:>+7.1%}  "
                  f"{'yes' if ok else 'NO'}")
        for mode in results:
            print(f"{mode}: {results[mode]['requests']:.0f} requests measured, "
                  f"{results[mode]['errors']:.0f} errors")

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "runtime_calibration.json").write_text(json.dumps({
        "published": PUBLISHED, "workload": WORKLOAD, "measured": results,
        "tolerance": tolerance, "seconds": seconds, "warmup": warmup,
    }, indent=2))
    plot(rows)
    return 1 if failures else 0


def plot(rows: list[tuple[str, str, float, float, float, bool]]) -> None:
    plt = pyplot()

    labels = [f"{mode}\n{metric}" for mode, metric, *_ in rows]
    ratios = [value / target for _, _, target, value, _, _ in rows]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(labels, ratios, color=["tab:green" if r[5] else "tab:red" for r in rows])
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhspan(0.85, 1.15, color="grey", alpha=0.2, label="±15%")
    ax.set_ylabel("sim / published")
    ax.set_title("Sim calibration against the reference figures (time factor 1)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT_DIR / "runtime_calibration.png", dpi=120)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args()
    sys.exit(run(args.seconds, args.warmup, args.tolerance))
