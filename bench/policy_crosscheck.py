"""Cross-check of policy_goodput.py with an engine this project did not write: llm-d-inference-sim.

    .venv/bin/python bench/policy_crosscheck.py [--sim-binary PATH] [--minutes 6]

Takes 2 x --minutes of wall time plus start-up; skips (exit 0) when no binary is found.

Runs the diurnal trace compressed into a few minutes, in real time, against 4 replicas, each
the runtime's ModeMiddleware (the real class, in-process, its own metrics registry) in front of
a small reverse proxy to its own llm-d-inference-sim (--force-dummy-tokenizer), twice: pinned
all-streaming, and adaptive (autoglm_operator.adaptive.policy.decide every intervalSeconds, flips
applied with ModeMiddleware.switch, the method the admin endpoint calls). Its routing (chats to the
streaming replicas, batch jobs to the batching ones, least outstanding first) and its SLOs (a
chat's first token within 0.5 s, a batch job done in 30 s) are the ones policy_goodput.py used
before it routed with the router's own `routing.decide` and added a time-per-token target; this
cross-check has not been moved to those yet. Prints both rows and whether the ranking
(adaptive > all-streaming) holds.

llm-d-inference-sim's latency: TTFT and inter-token latency scale linearly from 1x (idle) to
--time-factor-under-load at --max-num-seqs running; the flags below make one replica's streaming
capacity (cap 8) ~1.5 req/s, so the trace and the QPS thresholds are scaled to that (a user sets
thresholds for their engine's capacity; the time settings are scaled to the compression).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import httpx
import uvicorn
from prometheus_client import CollectorRegistry

from autoglm_api.profiles import Mode, ModeProfiles
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.resource.spec import AdaptiveSettings, ModePolicy
from autoglm_runtime.config import RuntimeConfig
from autoglm_runtime.middleware import ModeMiddleware
from autoglm_runtime.requests import STREAM_PRIORITY
from testkit.bench import policy_traces as traces
from testkit.paths import OUT_DIR as OUT
from testkit.report import results_page
from testkit.stats import percentile

REPLICAS = 4
MODEL = "autoglm-phone-9b"
SIM_FLAGS = [
    "--force-dummy-tokenizer",
    "--max-num-seqs",
    "64",
    "--max-model-len",
    "2048",
    "--time-to-first-token",
    "250ms",
    "--inter-token-latency",
    "120ms",
    "--time-factor-under-load",
    "3",
    "--mode",
    "random",
]
OUTPUT_TOKENS = 32
RATE_SCALE = 0.4  # of the diurnal per-replica rates
SETTINGS = AdaptiveSettings(
    interval_seconds=5,
    qps_per_replica_milli={"high": 1100, "low": 550},
    to_batching_stabilization_seconds=10,
    to_streaming_stabilization_seconds=30,
    cooldown_seconds=20,
)


class Proxy:
    """ASGI app forwarding every request to the upstream engine, streaming the answer back."""

    def __init__(self, base: str) -> None:
        self.client = httpx.AsyncClient(base_url=base, timeout=120)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = [
            (k.decode(), v.decode())
            for k, v in scope["headers"]
            if k.lower() not in (b"host", b"content-length")
        ]
        req = self.client.build_request(
            scope["method"], scope["path"], content=body, headers=headers
        )
        resp = await self.client.send(req, stream=True)
        await send(
            {
                "type": "http.response.start",
                "status": resp.status_code,
                "headers": [
                    (k.encode(), v.encode())
                    for k, v in resp.headers.items()
                    if k.lower() not in ("content-length", "transfer-encoding")
                ],
            }
        )
        async for chunk in resp.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await resp.aclose()
        await send({"type": "http.response.body", "body": b""})


def middleware(upstream: str) -> ModeMiddleware:
    config = RuntimeConfig(
        profiles=ModeProfiles(),
        served_model_name=MODEL,
        max_model_len=2048,
        default_max_tokens=512,
        initial_mode=Mode.STREAMING,
        engine=None,
        max_body_bytes=1 << 20,
        drain_grace_seconds=5,
        max_chars_per_token=8,
        gpu_metrics=False,
    )
    return ModeMiddleware(Proxy(upstream), config=config, registry=CollectorRegistry())


async def run(
    policy: str, arrivals: list[tuple[float, int]], seconds: float, base_port: int
) -> dict[str, Any]:
    mws = [middleware(f"http://127.0.0.1:{base_port + i}") for i in range(REPLICAS)]
    servers = []
    for i, mw in enumerate(mws):
        cfg = uvicorn.Config(
            mw, host="127.0.0.1", port=base_port + 100 + i, log_level="warning", lifespan="off"
        )
        srv = uvicorn.Server(cfg)
        servers.append(srv)
        asyncio.get_running_loop().create_task(srv.serve())
    await asyncio.sleep(1.0)
    inflight = [0] * REPLICAS
    outcomes: list[tuple[int, bool, float]] = []  # kind, met, ttft
    completions: list[float] = []
    client = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=2000))
    t0 = time.monotonic()

    def pick(kind: int) -> int:
        def load(i: int) -> float:
            return inflight[i] / mws[i].controller.profile.max_concurrency

        preferred = Mode.STREAMING if kind == traces.CHAT else Mode.BATCHING
        pool = [i for i in range(REPLICAS) if mws[i].mode is preferred]
        if not pool:
            return min(range(REPLICAS), key=load)
        best = min(pool, key=load)
        if kind == traces.BATCH or mws[best].controller.has_free_slot(STREAM_PRIORITY):
            return best
        return min(range(REPLICAS), key=lambda i: (load(i), mws[i].mode is not Mode.STREAMING))

    async def one(at: float, kind: int) -> None:
        i = pick(kind)
        inflight[i] += 1
        stream = kind == traces.CHAT
        body = {
            "model": MODEL,
            "stream": stream,
            "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "open settings and turn on dark mode"}],
        }
        start = time.monotonic()
        ttft, ok = -1.0, False
        try:
            async with client.stream(
                "POST", f"http://127.0.0.1:{base_port + 100 + i}/v1/chat/completions", json=body
            ) as resp:
                if resp.status_code == 200:
                    async for line in resp.aiter_lines():
                        if (
                            stream
                            and ttft < 0
                            and line.startswith("data: ")
                            and '"content"' in line
                        ):
                            ttft = time.monotonic() - start
                    ok = True
        except httpx.HTTPError:
            ok = False
        finally:
            inflight[i] -= 1
        e2e = time.monotonic() - start
        if ok:
            completions.append(time.monotonic())
        met = ok and (0 <= ttft <= 0.5 if stream else e2e <= 30)
        outcomes.append((kind, met, ttft))

    async def loop_policy() -> int:
        state, flips = pol.HysteresisState(), 0
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(SETTINGS.interval_seconds)
            now = time.monotonic()
            window = min(15.0, now - t0)
            qps = sum(1 for c in completions if c > now - window) / window
            # As the default PromQL reads it: the queue in front of streaming replicas.
            queue = float(
                sum(mw.controller.queued for mw in mws if mw.mode is Mode.STREAMING)
            )
            samples = pol.Samples(qps=qps, queue_depth=queue, reporting_replicas=REPLICAS)
            reps = [pol.ReplicaState(f"r{i}", mw.mode) for i, mw in enumerate(mws)]
            decision = pol.decide(samples, reps, state, SETTINGS, ModePolicy.ADAPTIVE, time.time())
            state = decision.state
            for f in decision.flips:
                mws[int(f.pod[1:])].switch(f.to_mode)
                flips += 1
            print(
                f"    t={now - t0:5.0f}s qps {qps:5.2f} queue {queue:4.0f} "
                f"batching {sum(mw.mode is Mode.BATCHING for mw in mws)} {decision.reason}",
                flush=True,
            )
        return flips

    policy_task = asyncio.create_task(loop_policy()) if policy == "adaptive" else None
    tasks = []
    for at, kind in arrivals:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(at, kind)))
    await asyncio.gather(*tasks)
    flips = await policy_task if policy_task else 0
    for srv in servers:
        srv.should_exit = True
    await asyncio.sleep(0.5)
    await client.aclose()
    met = sum(m for _, m, _ in outcomes)
    chats = sorted(t for k, _, t in outcomes if k == traces.CHAT and t >= 0)
    return {
        "policy": policy,
        "requests": len(outcomes),
        "goodput": met / seconds,
        "slo_attainment": met / len(outcomes),
        "chat_attainment": sum(m for k, m, _ in outcomes if k == traces.CHAT)
        / max(1, sum(1 for k, _, _ in outcomes if k == traces.CHAT)),
        "ttft_p50": percentile(chats, 0.5),
        "ttft_p95": percentile(chats, 0.95),
        "flips": flips,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--sim-binary",
        default=os.environ.get("LLMD_SIM_BINARY") or shutil.which("llm-d-inference-sim"),
        help="llm-d-inference-sim v0.10.2 (default: $LLMD_SIM_BINARY, then PATH)",
    )
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--base-port", type=int, default=19100)
    args = parser.parse_args()
    if not args.sim_binary:
        print(
            "SKIP: no llm-d-inference-sim (set LLMD_SIM_BINARY or --sim-binary); build it with "
            "GOSUMDB=off go install github.com/llm-d/llm-d-inference-sim/cmd/"
            "llm-d-inference-sim@v0.10.2"
        )
        return 0
    seconds = args.minutes * 60
    squeeze = 86400 / seconds
    diurnal = traces.TRACES["diurnal"]
    trace = traces.Trace(
        "diurnal-compressed",
        int(seconds),
        lambda t: RATE_SCALE * diurnal.per_replica(t * squeeze),
        "compressed",
    )
    arrivals = traces.arrivals(trace, REPLICAS, seed=1)
    print(
        f"{len(arrivals)} requests over {seconds:.0f}s (24 h / {squeeze:.0f}); settings "
        f"{SETTINGS.model_dump(by_alias=True, exclude={'prometheus'})}",
        flush=True,
    )
    procs = [
        subprocess.Popen(
            [
                args.sim_binary,
                "--port",
                str(args.base_port + i),
                "--model",
                MODEL,
                "--seed",
                str(i + 1),
                *SIM_FLAGS,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(REPLICAS)
    ]
    try:
        deadline = time.monotonic() + 30
        for i in range(REPLICAS):
            while True:
                try:
                    if (
                        httpx.get(f"http://127.0.0.1:{args.base_port + i}/health").status_code
                        == 200
                    ):
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"llm-d-inference-sim {i} did not become healthy")
                time.sleep(0.2)
        results = []
        for policy in ("all-streaming", "adaptive"):
            print(f"== {policy}", flush=True)
            res = asyncio.run(run(policy, arrivals, seconds, args.base_port))
            print(f"   {json.dumps(res)}", flush=True)
            results.append(res)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    holds = results[1]["goodput"] > results[0]["goodput"]
    with results_page("policy_crosscheck"):
        for res in results:
            print(json.dumps(res))
        print(
            f"{'PASS' if holds else 'FAIL'}: ranking holds on llm-d-inference-sim: adaptive "
            f"{results[1]['goodput']:.3f} vs all-streaming {results[0]['goodput']:.3f} req/s"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "policy_crosscheck.json").write_text(
        json.dumps(
            {
                "settings": SETTINGS.model_dump(by_alias=True),
                "sim_flags": SIM_FLAGS,
                "results": results,
                "ranking_holds": holds,
            },
            indent=1,
        )
    )
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
