"""Does the split follow a changing mix, live? Demand sizing on the local control plane.

    .venv/bin/python bench/adaptive_mix.py [--phase-seconds 75] [--keep-files]

Everything real but the GPUs, as in bench/adaptive_reaction.py (whose helpers this imports): the
local control plane, Debian's Prometheus scraping a `sim` per serving pod, the operator as a
subprocess, the router pods `<name>-router` run by hack/podrunner.py. Load comes from the
official `openai` client (hack/loadgen.py, client retries off) through Service `<name>`, that
is the router, in two classes: streamed chats (64 tokens) and non-streamed requests (batch jobs,
40 tokens: the calibration's workloads, runtime/autoglm_runtime/sim/model.py).

4 replicas, minStreamingReplicas 1. The sims run TIME_FACTOR times slower than the calibrated
model, so a replica serves 1/TIME_FACTOR of the capacity seeds' figures, and the seeds in
spec.adaptive.capacity (and the SLOs' times) are scaled the same way: the rates below are the
seeds' meaning at a scale 2 shared cores carry through the router (7.8 requests/s at the peak).
The demand queries are the operator's own (autoglm_requests_received_total by traffic_class)
over rate[10s] instead of [1m], so a phase's demand shows within seconds.

Phases: quiet, chat-heavy, batch-heavy, chat-heavy again. For each, the split the policy's own
demand sizing (autoglm_operator.demand.best_split, the pure code the operator runs) chooses for
that phase's offered demand from the split in force when the phase starts, with the capacity the
operator holds then (status.adaptiveState.capacity, else the seeds). Measured: the batching
replicas over time (the pods' mode labels, polled every 0.5 s), the time from the phase change
to the split reaching the chosen one, requests sent and failed, and the streamed chats' time
to first token p95 (shown beside the scaled SLO, not judged: the sizing is what is judged).

Targets: every phase's split reached within its bound: the demand window, then per step of
maxFlipsPerStep replicas the direction's stabilization window plus two intervals (the pass that
sees it, the pass that flips); 0 failed requests. Writes out/bench/adaptive_mix.json and .png.
Takes about 6-7 minutes here (2 shared cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adaptive_reaction import (
    OUT_DIR,
    create_namespace,
    delete_and_wait,
    install_crd,
    progress,
)
from kubernetes import client, config
from operator_kit import Operator, wait_for

from autoglm_operator import demand as dm
from autoglm_operator import prom
from autoglm_operator import spec as crd
from autoglm_operator.policy import Capacity
from autoglm_runtime.profiles import MODE_LABEL, Mode, ModeProfiles
from loadgen import LoadReport, percentile, run_load
from localcluster import loopback_pod_cidr, running_cluster
from localprom import LocalPrometheus
from podrunner import PodRunner
from servicelb import ServiceProxy

NAME, NAMESPACE = "mix", "adaptive-mix"
REPLICAS = 4
TIME_FACTOR = 4
_SEEDS = crd.CapacitySeeds()
_SLO = crd.ServiceLevelObjectives()
INTERVAL, TO_BATCHING, TO_STREAMING, COOLDOWN, MAX_FLIPS = 5, 5, 10, 5, 2
DEMAND_WINDOW_SECONDS = 10
CHAT_TOKENS, BATCH_TOKENS = 64, 40
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Phase:
    name: str
    chat: float  # streamed chats/s offered
    other: float  # non-streamed requests/s offered


# Against the scaled seeds (streaming 1.03/s, batching 2.88/s per replica): chats need two or
# three streaming replicas in chat hours, batch jobs need three batching replicas at night.
PHASES = (
    Phase("quiet", 0.4, 0.2),
    Phase("chat-heavy", 2.6, 1.0),
    Phase("batch-heavy", 0.8, 7.0),
    Phase("chat-heavy again", 2.6, 1.0),
)


def adaptive_spec(prometheus_url: str) -> dict[str, Any]:
    window = f"{DEMAND_WINDOW_SECONDS}s"
    return {
        "intervalSeconds": INTERVAL,
        "prometheus": {
            "url": prometheus_url,
            "timeoutSeconds": 2,
            "queries": {
                "chatRate": prom.demand_query("streamed_chat", window),
                "otherRate": prom.demand_query("other", window),
            },
        },
        "capacity": {
            "streamingPerReplicaMilli": _SEEDS.streaming_per_replica_milli // TIME_FACTOR,
            "batchingPerReplicaMilli": _SEEDS.batching_per_replica_milli // TIME_FACTOR,
        },
        "slo": {
            "chatTimeToFirstTokenMillis": _SLO.chat_time_to_first_token_millis * TIME_FACTOR,
            "chatTimePerOutputTokenMillis": _SLO.chat_time_per_output_token_millis * TIME_FACTOR,
            "batchCompletionSeconds": _SLO.batch_completion_seconds * TIME_FACTOR,
        },
        "toBatchingStabilizationSeconds": TO_BATCHING,
        "toStreamingStabilizationSeconds": TO_STREAMING,
        "cooldownSeconds": COOLDOWN,
        "minStreamingReplicas": 1,
        "maxFlipsPerStep": MAX_FLIPS,
    }


def resource(prometheus_url: str) -> dict[str, Any]:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": NAME},
        "spec": {"replicas": REPLICAS, "adaptive": adaptive_spec(prometheus_url)},
    }


def chosen_split(phase: Phase, current: int, capacity: Capacity, settings: crd.AdaptiveSettings
                 ) -> int:  # fmt: skip
    """The split the operator's demand sizing picks for the phase's offered demand."""
    _, best = dm.best_split(
        current, REPLICAS, REPLICAS - settings.min_streaming_replicas,
        dm.Demand(phase.chat, phase.other),
        {Mode.STREAMING: capacity.streaming, Mode.BATCHING: capacity.batching},
        settings.slo, ModeProfiles().for_mode(Mode.BATCHING).max_concurrency,
    )  # fmt: skip
    return best.batching


def bound_seconds(current: int, target: int) -> float:
    """How long the split may take to get there (the module docstring)."""
    steps = math.ceil(abs(target - current) / MAX_FLIPS)
    window = TO_BATCHING if target > current else TO_STREAMING
    return DEMAND_WINDOW_SECONDS + steps * (window + 2 * INTERVAL)


class Watcher:
    """Polls, in a thread, the serving pods' mode labels and the deployment's status."""

    def __init__(self, kubeconfig: Path) -> None:
        api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.samples: list[tuple[float, int, int]] = []  # (time, batching, serving pods)
        self.status: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                pods = self.core.list_namespaced_pod(NAMESPACE).items
                modes = [(p.metadata.labels or {}).get(MODE_LABEL) for p in pods
                         if p.metadata.deletion_timestamp is None]  # fmt: skip
                serving = [m for m in modes if m is not None]
                self.samples.append((time.time(), serving.count(Mode.BATCHING.value), len(serving)))
                obj = self.custom.get_namespaced_custom_object(
                    crd.GROUP, crd.VERSION, NAMESPACE, crd.PLURAL, NAME
                )
                self.status = obj.get("status") or {}
            except Exception as error:  # the next poll tries again; say why meanwhile
                progress(f"watcher: {type(error).__name__}: {error}")

    def batching(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def capacity(self, settings: crd.AdaptiveSettings) -> Capacity:
        stored = (self.status.get("adaptiveState") or {}).get("capacity")
        learned = (
            Capacity.from_status(crd.LearnedCapacity.model_validate(stored)) if stored else None
        )
        return learned or Capacity.seeded(settings)

    def metrics_available(self) -> bool:
        conditions = self.status.get("conditions") or []
        return any(c["type"] == "MetricsAvailable" and c["status"] == "True" for c in conditions)


@dataclass
class PhaseResult:
    name: str
    chat: float
    other: float
    started: float
    seconds: float
    from_batching: int
    target: int
    capacity: dict[str, float]
    bound: float
    reached_after: float | None = None  # seconds from the phase change to the split
    held_share: float | None = None  # of the time after reaching it, on it
    sent: int = 0
    failed: int = 0
    chat_ttft_p95: float | None = None  # seconds, the phase's streamed chats

    @property
    def passed(self) -> bool:
        return self.reached_after is not None and self.reached_after <= self.bound


async def drive(watcher: Watcher, proxy_url: str, settings: crd.AdaptiveSettings,
                phase_seconds: float, started: float) -> tuple[list[PhaseResult], LoadReport,
                                                               LoadReport]:  # fmt: skip
    """Once the loop reads metrics (the sims export theirs idle), both classes' load for the
    phases' length, each phase's rates in turn; the load generators wait for what is in flight."""
    deadline = time.monotonic() + 90
    while not watcher.metrics_available():
        if time.monotonic() > deadline:
            raise TimeoutError("MetricsAvailable not True after 90s")
        await asyncio.sleep(0.5)
    await asyncio.sleep(2 * INTERVAL)
    current = PHASES[0]
    total = phase_seconds * len(PHASES)
    chats, jobs = LoadReport(), LoadReport()
    targets = [proxy_url + "/v1"]
    loads = asyncio.gather(
        run_load(targets, lambda _: current.chat, total, max_tokens=CHAT_TOKENS,
                 max_requests=10**6, report=chats),
        run_load(targets, lambda _: current.other, total, max_tokens=BATCH_TOKENS,
                 max_requests=10**6, report=jobs, stream=False),
    )  # fmt: skip
    results: list[PhaseResult] = []
    for phase in PHASES:
        current = phase
        k = watcher.batching()
        capacity = watcher.capacity(settings)
        target = chosen_split(phase, k, capacity, settings)
        result = PhaseResult(phase.name, phase.chat, phase.other, time.time(), phase_seconds,
                             k, target, asdict(capacity), bound_seconds(k, target))  # fmt: skip
        results.append(result)
        progress(f"phase {phase.name}: {phase.chat}/s chats, {phase.other}/s other; "
                 f"{k} batching now, demand sizing chooses {target} "
                 f"(bound {result.bound:.0f}s)", started)  # fmt: skip
        await asyncio.sleep(phase_seconds)
    await loads
    return results, chats, jobs


def score(results: list[PhaseResult], watcher: Watcher, chats: LoadReport, jobs: LoadReport,
          t0_monotonic: float, t0_wall: float) -> None:  # fmt: skip
    """Fill each phase's reach time, hold share and request counts from what was recorded."""
    for result in results:
        end = result.started + result.seconds
        window = [(t, b) for t, b, _ in watcher.samples if result.started <= t < end]
        reached = next((t for t, b in window if b == result.target), None)
        if reached is not None:
            result.reached_after = reached - result.started
            after = [b for t, b in window if t >= reached]
            result.held_share = sum(b == result.target for b in after) / len(after)
        # The load generator stamps requests on the monotonic clock.
        lo, hi = result.started - t0_wall + t0_monotonic, end - t0_wall + t0_monotonic
        sent = chats.window(lo, hi) + jobs.window(lo, hi)
        result.sent = len(sent)
        result.failed = sum(1 for r in sent if r.error is not None)
        result.chat_ttft_p95 = percentile([r.ttft for r in chats.window(lo, hi) if r.ttft], 0.95)


def plot(results: list[PhaseResult], watcher: Watcher, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = results[0].started
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    samples = [(t - t0, b) for t, b, _ in watcher.samples if t >= t0]
    top.step([t for t, _ in samples], [b for _, b in samples], where="post",
             label="batching replicas (pod labels)")  # fmt: skip
    for r in results:
        start, end = r.started - t0, r.started - t0 + r.seconds
        top.hlines(r.target, start, end, colors="tab:red", linestyles="--",
                   label="demand sizing's split" if r is results[0] else "_")  # fmt: skip
        top.axvspan(start, start + r.bound, color="tab:red", alpha=0.07)
        bottom.hlines([r.chat, r.other], start, end, colors=["tab:blue", "tab:orange"])
        top.text(start + 1, REPLICAS - 0.6, r.name, fontsize=8)
    bottom.plot([], [], color="tab:blue", label="streamed chats/s offered")
    bottom.plot([], [], color="tab:orange", label="batch jobs/s offered")
    top.set_ylim(-0.2, REPLICAS)
    top.set_ylabel("replicas batching")
    top.set_title(f"The split following a changing mix ({REPLICAS} replicas; shaded: the bound)")
    top.legend(fontsize=8, loc="lower right")
    bottom.set_ylabel("requests/s")
    bottom.set_xlabel("seconds since the first phase")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(results: list[PhaseResult], chats: LoadReport, jobs: LoadReport) -> list[dict[str, Any]]:
    print(f"\n{'phase':<18}{'chats/s':>8}{'other/s':>8}{'from':>6}{'chosen':>8}{'reached':>9}"
          f"{'bound':>7}{'held':>6}{'sent':>6}{'failed':>7}{'chat TTFT p95':>15}")  # fmt: skip
    for r in results:
        reached = f"{r.reached_after:.1f}s" if r.reached_after is not None else "never"
        held = f"{100 * r.held_share:.0f}%" if r.held_share is not None else "-"
        ttft = f"{r.chat_ttft_p95:.2f}s" if r.chat_ttft_p95 is not None else "-"
        print(f"{r.name:<18}{r.chat:>8}{r.other:>8}{r.from_batching:>6}{r.target:>8}{reached:>9}"
              f"{r.bound:>6.0f}s{held:>6}{r.sent:>6}{r.failed:>7}{ttft:>15}")  # fmt: skip
    slo = _SLO.chat_time_to_first_token_millis * TIME_FACTOR / 1000
    print(f"held: share of the phase after reaching the split spent on it; chat TTFT SLO {slo:g}s")
    failures = chats.failures + jobs.failures
    sent = len(chats.results) + len(jobs.results)
    checks = [
        {"target": f"{r.name}: split {r.target} batching within {r.bound:.0f}s",
         "pass": r.passed, "detail": f"reached after {r.reached_after}"}
        for r in results
    ]  # fmt: skip
    checks.append({"target": "0 failed requests", "pass": not failures,
                   "detail": f"{len(failures)} of {sent} failed"})  # fmt: skip
    print()
    for check in checks:
        print(f"{'PASS' if check['pass'] else 'FAIL'}: {check['target']}: {check['detail']}")
    return checks


def run(args: argparse.Namespace) -> int:
    started, wall = time.monotonic(), time.time()
    workdir = Path(tempfile.mkdtemp(prefix="autoglm-mix-"))
    manifest = resource("http://127.0.0.1:9090")
    settings = crd.AdaptiveSettings.model_validate(manifest["spec"]["adaptive"])
    with contextlib.ExitStack() as stack:
        if args.keep_files:
            progress(f"logs of the operator, Prometheus, routers and sims stay in {workdir}")
        else:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        progress("starting the control plane, Prometheus and the operator", started)
        cluster = stack.enter_context(running_cluster(
            gpu_nodes=2, pod_cidr=loopback_pod_cidr(), workdir=workdir / "cluster"
        ))  # fmt: skip
        install_crd(cluster)
        create_namespace(cluster, NAMESPACE)
        prom = LocalPrometheus(workdir / "prometheus").start()
        stack.callback(prom.stop)
        operator = Operator(cluster, NAMESPACE, workdir).start()
        stack.callback(operator.stop)
        runner = PodRunner(cluster, workdir / "pods", time_factor=TIME_FACTOR,
                           targets_file=prom.targets_file).start()  # fmt: skip
        stack.callback(runner.stop)
        cluster.apply(resource(prom.url), NAMESPACE)
        stack.callback(delete_and_wait, cluster, NAMESPACE, NAME)
        watcher = stack.enter_context(Watcher(Path(cluster.kubeconfig)))
        wait_for(f"{REPLICAS} sims serving",
                 lambda: len(runner.runtime_urls(NAMESPACE)) == REPLICAS, timeout=120)  # fmt: skip
        proxy = stack.enter_context(ServiceProxy(cluster, NAMESPACE, NAME))
        wait_for(f"Service {NAME} with a ready router pod", lambda: bool(proxy.endpoints()),
                 timeout=120)  # fmt: skip
        progress(f"{REPLICAS} sims and {len(runner.router_urls(NAMESPACE))} routers up; load "
                 f"through Service {NAME} at {proxy.url}", started)  # fmt: skip
        results, chats, jobs = asyncio.run(
            drive(watcher, proxy.url, settings, args.phase_seconds, started)
        )
    score(results, watcher, chats, jobs, started, wall)
    checks = report(results, chats, jobs)
    elapsed = time.monotonic() - started
    payload = {
        "settings": {"replicas": REPLICAS, "time_factor": TIME_FACTOR, "interval": INTERVAL,
                     "to_batching_window": TO_BATCHING, "to_streaming_window": TO_STREAMING,
                     "cooldown": COOLDOWN, "max_flips_per_step": MAX_FLIPS,
                     "demand_window_seconds": DEMAND_WINDOW_SECONDS,
                     "tokens": {"chat": CHAT_TOKENS, "batch": BATCH_TOKENS},
                     "adaptive": manifest["spec"]["adaptive"]},
        "phases": [{**asdict(r), "passed": r.passed} for r in results],
        "batching_over_time": [{"t": round(t - results[0].started, 2), "batching": b,
                                "serving_pods": n} for t, b, n in watcher.samples],
        "errors": [r.error for r in chats.failures + jobs.failures][:20],
        "targets": checks,
        "elapsed_seconds": round(elapsed, 1),
    }  # fmt: skip
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "adaptive_mix.json").write_text(json.dumps(payload, indent=1))
    plot(results, watcher, OUT_DIR / "adaptive_mix.png")
    print(f"wrote {OUT_DIR / 'adaptive_mix.json'} and .png; benchmark took {elapsed:.0f}s")
    return 0 if all(c["pass"] for c in checks) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-seconds", type=float, default=75, help="how long each mix lasts")
    parser.add_argument("--keep-files", action="store_true",
                        help="keep the operator, Prometheus, router and sim logs")  # fmt: skip
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
