"""Does the split follow a changing mix, live, and does following it pay? Demand sizing on the
local control plane, against a pinned split.

    .venv/bin/python bench/adaptive_mix.py [--phase-seconds 75] [--seed 1] [--keep-files]
    .venv/bin/python bench/adaptive_mix.py --fixed 2      # the same trace, the split pinned
    .venv/bin/python bench/adaptive_mix.py --compare      # adaptive, then fixed 2, side by side

Everything real but the GPUs, as in bench/adaptive_reaction.py (whose helpers this imports): the
local control plane, Debian's Prometheus scraping a `sim` per serving pod, the operator as a
subprocess, the router pods `<name>-router` run by testkit.podrunner. Load comes from the
official `openai` client (testkit.loadgen, client retries off) through Service `<name>`, that
is the router, in two classes: streamed chats (64 tokens) and non-streamed requests (batch jobs,
40 tokens: the calibration's workloads, testkit/testkit/sim/model.py).

4 replicas, minStreamingReplicas 1. The sims run TIME_FACTOR times slower than the calibrated
model, so a replica serves 1/TIME_FACTOR of the capacity seeds' figures, and the seeds in
spec.adaptive.capacity (and the SLOs' times) are scaled the same way: the rates below are the
seeds' meaning at a scale 2 shared cores carry through the router (7.8 requests/s at the peak).
The demand queries are the operator's own (autoglm_requests_received_total by traffic_class)
over rate[10s] instead of [1m], so a phase's demand shows within seconds.

Phases: quiet, chat-heavy, batch-heavy, chat-heavy again. For each, the split the policy's own
demand sizing (autoglm_operator.adaptive.demand.best_split, the pure code the operator runs) chooses
for that phase's offered demand from the split in force when the phase starts, with the capacity the
operator holds then (status.adaptiveState.capacity, else the seeds). Measured: the batching
replicas over time (the pods' mode labels, polled every 0.5 s), the time from the phase change
to the split reaching the chosen one, requests sent and failed, and the streamed chats' time
to first token p95 (shown beside the scaled SLO, not judged: the sizing is what is judged).

Goodput per DistServe, per phase (bench/policy_goodput.py's rule, at the scaled SLOs the run
gives the operator): a streamed chat counts when its time to first token and its time per
output token after the first (the server's own token count, stream_options.include_usage) both
meet the SLO, a batch job when it completes within the batch SLO; failed, refused and
unfinished requests are misses. A request belongs to the phase in which it was sent; goodput is
the phase's requests that met their SLO per second of phase.

--fixed K pins K replicas batching for the whole trace with what the operator offers for that:
adaptive.paused (hold every replica in its mode, query nothing) and the pods' mode labels set
before the load starts, which the operator's repair carries to each runtime (a label and runtime
that disagree: it finishes the flip the label says). --compare runs adaptive and then fixed 2
(bench/policy_goodput.py's strongest static choice for 4 replicas), each on a fresh control
plane, with the same phases and seed, and prints both per phase and in total; equal goodput is
printed as a tie (policy_goodput.is_tie), never as a win.

Targets: adaptive: every phase's split reached within its bound: the demand window, then per
step of maxFlipsPerStep replicas the direction's stabilization window plus two intervals (the
pass that sees it, the pass that flips); fixed: the split held all along. 0 failed requests
(exit status 1 otherwise, or when a target is missed; the comparison itself is a measurement).
Writes out/bench/adaptive_mix.json (adaptive_mix_fixed<K>.json; adaptive_mix_compare.json)
and .png. Takes about 6-7 minutes a run here (2 shared cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from autoglm_api.profiles import MODE_LABEL, Mode, ModeProfiles
from autoglm_operator.adaptive import demand as dm
from autoglm_operator.adaptive.policy import Capacity
from autoglm_operator.io import prom
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    AdaptiveSettings,
    CapacitySeeds,
    ServiceLevelObjectives,
)
from autoglm_operator.resource.status import LearnedCapacity
from testkit.loadgen import LoadReport, RequestResult, run_load
from testkit.localcluster import LocalCluster
from testkit.operator_kit import KUBECTL_FAILED
from testkit.paths import OUT_DIR
from testkit.plots import pyplot
from testkit.podrunner import PodRunner
from testkit.report import results_page
from testkit.servicelb import ServiceProxy
from testkit.stack import Poller, delete_and_wait, live_stack, progress
from testkit.stats import percentile
from testkit.verdicts import is_tie
from testkit.waiting import eventually

NAME, NAMESPACE = "mix", "adaptive-mix"
REPLICAS = 4
MIN_STREAMING = 1
TIME_FACTOR = 4
_SEEDS = CapacitySeeds()
_SLO = ServiceLevelObjectives()
# The SLOs the run gives the operator, in seconds: the spec's defaults, scaled like the sims.
CHAT_TTFT_SLO = _SLO.chat_time_to_first_token_millis * TIME_FACTOR / 1000
CHAT_TPOT_SLO = _SLO.chat_time_per_output_token_millis * TIME_FACTOR / 1000
BATCH_SLO = float(_SLO.batch_completion_seconds * TIME_FACTOR)
INTERVAL, TO_BATCHING, TO_STREAMING, COOLDOWN, MAX_FLIPS = 5, 5, 10, 5, 2
DEMAND_WINDOW_SECONDS = 10
CHAT_TOKENS, BATCH_TOKENS = 64, 40
POLL_SECONDS = 0.5
# bench/policy_goodput.py's strongest static choice for 4 replicas: 2 batching.
FIXED_BASELINE = 2


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


def adaptive_spec(prometheus_url: str, fixed: int | None = None) -> dict[str, Any]:
    """The loop's settings; with `fixed`, paused: it holds the modes the bench pins."""
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
        "minStreamingReplicas": MIN_STREAMING,
        "maxFlipsPerStep": MAX_FLIPS,
        "paused": fixed is not None,
    }


def resource(prometheus_url: str, fixed: int | None = None) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": NAME},
        "spec": {"replicas": REPLICAS, "adaptive": adaptive_spec(prometheus_url, fixed)},
    }


def chosen_split(phase: Phase, current: int, capacity: Capacity, settings: AdaptiveSettings
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


def met_slo(result: RequestResult, streamed: bool) -> bool:
    """DistServe's goodput rule (testkit.bench.policy_sim's), at the run's scaled SLOs: a chat meets
    both its TTFT and its TPOT (the later tokens' mean), a batch job completes in time; a failed
    or unfinished request misses."""
    if result.error is not None or result.latency is None:
        return False
    if not streamed:
        return result.latency <= BATCH_SLO
    assert result.ttft is not None
    later = (result.output_tokens or CHAT_TOKENS) - 1
    tpot = (result.latency - result.ttft) / later if later > 0 else 0.0
    return result.ttft <= CHAT_TTFT_SLO and tpot <= CHAT_TPOT_SLO


class Watcher(Poller):
    """Polls, in a thread, the serving pods' mode labels and the deployment's status."""

    def __init__(self, kubeconfig: Path) -> None:
        api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.samples: list[tuple[float, int, int]] = []  # (time, batching, serving pods)
        self.status: dict[str, Any] = {}
        super().__init__("watcher", POLL_SECONDS)

    def poll(self) -> None:
        pods = self.core.list_namespaced_pod(NAMESPACE).items
        modes = [(p.metadata.labels or {}).get(MODE_LABEL) for p in pods
                 if p.metadata.deletion_timestamp is None]  # fmt: skip
        serving = [m for m in modes if m is not None]
        self.samples.append((time.time(), serving.count(Mode.BATCHING.value), len(serving)))
        obj = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, NAME
        )
        self.status = obj.get("status") or {}

    def batching(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def capacity(self, settings: AdaptiveSettings) -> Capacity:
        stored = (self.status.get("adaptiveState") or {}).get("capacity")
        learned = (
            Capacity.from_status(LearnedCapacity.model_validate(stored)) if stored else None
        )
        return learned or Capacity.seeded(settings)

    def metrics_available(self) -> bool:
        conditions = self.status.get("conditions") or []
        return any(c["type"] == "MetricsAvailable" and c["status"] == "True" for c in conditions)


def runtime_mode(url: str) -> str | None:
    """The mode a sim reports on its own /metrics (autoglm_mode), None while it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = re.search(r'^autoglm_mode\{mode="(\w+)"\} 1\.0$', text, re.MULTILINE)
    return found.group(1) if found else None


def pin_split(cluster: LocalCluster, runner: PodRunner, batching: int) -> None:
    """Label `batching` serving pods batching (the rest streaming) while the loop is paused,
    and wait until the operator's repair has moved their runtimes there too. First the operator
    labels each new pod with the initial mode: a label set before that would be overwritten."""
    core = client.CoreV1Api(config.new_client_from_config(config_file=cluster.kubeconfig))

    def labelled() -> dict[str, str | None]:
        found = core.list_namespaced_pod(
            NAMESPACE, label_selector=builders.serving_pod_selector(NAME)).items  # fmt: skip
        return {p.metadata.name: (p.metadata.labels or {}).get(MODE_LABEL) for p in found}

    eventually(lambda: len(labelled()) == REPLICAS and None not in labelled().values(), 60,
               every=0.5, what="the operator's initial mode labels",
               ignoring=KUBECTL_FAILED)  # fmt: skip
    pods = sorted(labelled())
    wanted = {pod: Mode.BATCHING if i < batching else Mode.STREAMING for i, pod in enumerate(pods)}
    for pod, mode in wanted.items():
        labels = {"metadata": {"labels": {MODE_LABEL: mode.value}}}
        core.patch_namespaced_pod(pod, NAMESPACE, labels)

    def runtimes_agree() -> bool:
        urls = runner.runtime_urls(NAMESPACE)
        return all(runtime_mode(urls.get(p, "http://0.0.0.0:1")) == m.value
                   for p, m in wanted.items())  # fmt: skip

    eventually(runtimes_agree, 60, every=0.5,
               what=f"{batching} runtimes batching, {len(pods) - batching} streaming",
               ignoring=KUBECTL_FAILED)  # fmt: skip


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
    chats_met: int = 0  # streamed chats sent in the phase that met both chat SLOs
    jobs_met: int = 0  # batch jobs sent in the phase that completed within the batch SLO

    @property
    def passed(self) -> bool:
        return self.reached_after is not None and self.reached_after <= self.bound

    @property
    def goodput(self) -> float:
        """Requests of the phase that met their SLO, per second of phase."""
        return (self.chats_met + self.jobs_met) / self.seconds


async def drive(watcher: Watcher, proxy_url: str, settings: AdaptiveSettings,
                phase_seconds: float, started: float, fixed: int | None) -> tuple[
                    list[PhaseResult], LoadReport, LoadReport]:  # fmt: skip
    """Once the loop reads metrics (the sims export theirs idle; a pinned split reads none),
    both classes' load for the phases' length, each phase's rates in turn; the load generators
    wait for what is in flight."""
    deadline = time.monotonic() + 90
    while fixed is None and not watcher.metrics_available():
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
                 max_requests=10**6, report=chats, usage=True),
        run_load(targets, lambda _: current.other, total, max_tokens=BATCH_TOKENS,
                 max_requests=10**6, report=jobs, stream=False),
    )  # fmt: skip
    results: list[PhaseResult] = []
    for phase in PHASES:
        current = phase
        k = watcher.batching()
        capacity = watcher.capacity(settings)
        target = fixed if fixed is not None else chosen_split(phase, k, capacity, settings)
        result = PhaseResult(phase.name, phase.chat, phase.other, time.time(), phase_seconds,
                             k, target, asdict(capacity), bound_seconds(k, target))  # fmt: skip
        results.append(result)
        choice = "pinned" if fixed is not None else "demand sizing chooses"
        progress(f"phase {phase.name}: {phase.chat}/s chats, {phase.other}/s other; "
                 f"{k} batching now, {choice} {target} (bound {result.bound:.0f}s)",
                 started)  # fmt: skip
        await asyncio.sleep(phase_seconds)
    await loads
    return results, chats, jobs


def score(results: list[PhaseResult], watcher: Watcher, chats: LoadReport, jobs: LoadReport,
          t0_monotonic: float, t0_wall: float) -> None:  # fmt: skip
    """Fill each phase's reach time, hold share, request counts and goodput from what was
    recorded."""
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
        phase_chats, phase_jobs = chats.window(lo, hi), jobs.window(lo, hi)
        result.sent = len(phase_chats) + len(phase_jobs)
        result.failed = sum(1 for r in phase_chats + phase_jobs if r.error is not None)
        result.chat_ttft_p95 = percentile([r.ttft for r in phase_chats if r.ttft], 0.95)
        result.chats_met = sum(met_slo(r, streamed=True) for r in phase_chats)
        result.jobs_met = sum(met_slo(r, streamed=False) for r in phase_jobs)


def plot(results: list[PhaseResult], watcher: Watcher, path: Path, split_label: str) -> None:
    plt = pyplot()

    t0 = results[0].started
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    samples = [(t - t0, b) for t, b, _ in watcher.samples if t >= t0]
    top.step([t for t, _ in samples], [b for _, b in samples], where="post",
             label="batching replicas (pod labels)")  # fmt: skip
    for r in results:
        start, end = r.started - t0, r.started - t0 + r.seconds
        top.hlines(r.target, start, end, colors="tab:red", linestyles="--",
                   label=split_label if r is results[0] else "_")  # fmt: skip
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


def policy_name(fixed: int | None) -> str:
    return "adaptive" if fixed is None else f"fixed {fixed}"


def report(results: list[PhaseResult], samples: list[tuple[float, int, int]], chats: LoadReport,
           jobs: LoadReport, fixed: int | None) -> list[dict[str, Any]]:  # fmt: skip
    print(f"\n{policy_name(fixed)}:")
    print(f"{'phase':<18}{'chats/s':>8}{'other/s':>8}{'from':>6}{'split':>7}{'reached':>9}"
          f"{'bound':>7}{'held':>6}{'sent':>6}{'failed':>7}{'chat TTFT p95':>15}"
          f"{'met':>6}{'goodput':>9}")  # fmt: skip
    for r in results:
        reached = f"{r.reached_after:.1f}s" if r.reached_after is not None else "never"
        held = f"{100 * r.held_share:.0f}%" if r.held_share is not None else "-"
        ttft = f"{r.chat_ttft_p95:.2f}s" if r.chat_ttft_p95 is not None else "-"
        print(f"{r.name:<18}{r.chat:>8}{r.other:>8}{r.from_batching:>6}{r.target:>7}{reached:>9}"
              f"{r.bound:>6.0f}s{held:>6}{r.sent:>6}{r.failed:>7}{ttft:>15}"
              f"{r.chats_met + r.jobs_met:>6}{r.goodput:>9.2f}")  # fmt: skip
    print(f"split: {'pinned' if fixed is not None else 'chosen by demand sizing'}; held: share "
          f"of the phase after reaching it spent on it; met: requests that met their SLO (chat "
          f"TTFT {CHAT_TTFT_SLO:g}s and TPOT {CHAT_TPOT_SLO:g}s, batch {BATCH_SLO:g}s); "
          f"goodput: met per second of phase")  # fmt: skip
    return checks(results, samples, chats, jobs, fixed)


def checks(results: list[PhaseResult], samples: list[tuple[float, int, int]],
           chats: LoadReport, jobs: LoadReport, fixed: int | None
           ) -> list[dict[str, Any]]:  # fmt: skip
    if fixed is None:
        found = [
            {"target": f"{r.name}: split {r.target} batching within {r.bound:.0f}s",
             "pass": r.passed, "detail": f"reached after {r.reached_after}"}
            for r in results
        ]  # fmt: skip
    else:
        start, end = results[0].started, results[-1].started + results[-1].seconds
        during = [b for t, b, _ in samples if start <= t < end]
        off = sum(b != fixed for b in during)
        found = [{"target": f"split pinned at {fixed} batching all along",
                  "pass": bool(during) and not off,
                  "detail": f"{off} of {len(during)} samples off it"}]  # fmt: skip
    failures = chats.failures + jobs.failures
    sent = len(chats.results) + len(jobs.results)
    found.append({"target": "0 failed requests", "pass": not failures,
                  "detail": f"{len(failures)} of {sent} failed"})  # fmt: skip
    print()
    for check in found:
        print(f"{'PASS' if check['pass'] else 'FAIL'}: {check['target']}: {check['detail']}")
    return found


@dataclass(frozen=True)
class Live:
    settings: AdaptiveSettings
    watcher: Watcher
    proxy_url: str
    runner: PodRunner


@contextlib.contextmanager
def environment(keep_files: bool, fixed: int | None, started: float) -> Iterator[Live]:
    """The control plane, Prometheus, the operator, the pods (`fixed`: that split pinned) and
    Service `<name>` on the router pods, all stopped on leaving."""
    workdir = Path(tempfile.mkdtemp(prefix="autoglm-mix-"))
    with contextlib.ExitStack() as stack:
        if keep_files:
            progress(f"logs of the operator, Prometheus, routers and sims stay in {workdir}")
        else:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        progress("starting the control plane, Prometheus and the operator", started)
        live = stack.enter_context(live_stack(workdir, [NAMESPACE]))
        cluster, prom = live.cluster, live.prometheus
        runner = PodRunner(cluster, workdir / "pods", time_factor=TIME_FACTOR,
                           targets_file=prom.targets_file).start()  # fmt: skip
        stack.callback(runner.stop)
        manifest = resource(prom.url, fixed)
        cluster.apply(manifest, NAMESPACE)
        stack.callback(delete_and_wait, cluster, NAMESPACE, NAME)
        watcher = stack.enter_context(Watcher(Path(cluster.kubeconfig)))
        eventually(lambda: len(runner.runtime_urls(NAMESPACE)) == REPLICAS, 120, every=0.5,
                   what=f"{REPLICAS} sims serving", ignoring=KUBECTL_FAILED)  # fmt: skip
        if fixed is not None:
            pin_split(cluster, runner, fixed)
        proxy = stack.enter_context(ServiceProxy(cluster, NAMESPACE, NAME, kubelet=runner))
        eventually(lambda: router_endpoints(proxy, runner), 120, every=0.5,
                   what=f"Service {NAME} on ready router pods only",
                   ignoring=KUBECTL_FAILED)  # fmt: skip
        progress(f"{REPLICAS} sims and {len(runner.router_urls(NAMESPACE))} routers up; load "
                 f"through Service {NAME} at {proxy.url}", started)  # fmt: skip
        settings = AdaptiveSettings.model_validate(manifest["spec"]["adaptive"])
        yield Live(settings, watcher, proxy.url, runner)


def router_endpoints(proxy: ServiceProxy, runner: PodRunner) -> bool:
    """Whether the Service's ready endpoints are router pods, all of them running."""
    endpoints = {e.pod for e in proxy.endpoints()}
    return bool(endpoints) and endpoints <= set(runner.router_urls(NAMESPACE))


def run_once(keep_files: bool, phase_seconds: float, seed: int, fixed: int | None
             ) -> dict[str, Any]:  # fmt: skip
    """One run of the trace, adaptive or pinned; writes its JSON and PNG, returns the JSON."""
    random.seed(seed)  # the prompts each request draws
    started, wall = time.monotonic(), time.time()
    progress(f"{policy_name(fixed)}, seed {seed}", started)
    with environment(keep_files, fixed, started) as live:
        results, chats, jobs = asyncio.run(
            drive(live.watcher, live.proxy_url, live.settings, phase_seconds, started, fixed)
        )
        routed = live.runner.router_requests(NAMESPACE)
    samples = live.watcher.samples
    score(results, live.watcher, chats, jobs, started, wall)
    stem = "adaptive_mix" if fixed is None else f"adaptive_mix_fixed{fixed}"
    with results_page("adaptive_mix", run=policy_name(fixed)):
        found = report(results, samples, chats, jobs, fixed)
        print(f"the routers counted {sum(routed.values()):.0f} of "
              f"{len(chats.results) + len(jobs.results)} requests")  # fmt: skip
    payload = {
        "policy": policy_name(fixed), "seed": seed,
        "settings": {"replicas": REPLICAS, "time_factor": TIME_FACTOR, "interval": INTERVAL,
                     "to_batching_window": TO_BATCHING, "to_streaming_window": TO_STREAMING,
                     "cooldown": COOLDOWN, "max_flips_per_step": MAX_FLIPS,
                     "demand_window_seconds": DEMAND_WINDOW_SECONDS,
                     "tokens": {"chat": CHAT_TOKENS, "batch": BATCH_TOKENS},
                     "slo_seconds": {"chat_ttft": CHAT_TTFT_SLO, "chat_tpot": CHAT_TPOT_SLO,
                                     "batch": BATCH_SLO},
                     "adaptive": adaptive_spec("<local prometheus>", fixed)},
        "phases": [{**asdict(r), "passed": r.passed, "goodput": r.goodput} for r in results],
        "batching_over_time": [{"t": round(t - results[0].started, 2), "batching": b,
                                "serving_pods": n} for t, b, n in samples],
        "router_requests": {" ".join(k): v for k, v in routed.items()},
        "errors": [r.error for r in chats.failures + jobs.failures][:20],
        "targets": found,
        "elapsed_seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    split_label = "demand sizing's split" if fixed is None else "the pinned split"
    plot(results, live.watcher, OUT_DIR / f"{stem}.png", split_label)
    print(f"wrote {OUT_DIR / stem}.json and .png; the run took {payload['elapsed_seconds']:.0f}s")
    return payload


def side_by_side(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Goodput per phase and in total for each run; the higher one named, equal ones a tie."""
    names = [run["policy"] for run in runs]
    rows = []
    for i, phase in enumerate(runs[0]["phases"]):
        cells = [run["phases"][i] for run in runs]
        rows.append(_row(phase["name"], names, [c["chats_met"] + c["jobs_met"] for c in cells],
                         [c["sent"] for c in cells], phase["seconds"]))  # fmt: skip
    met = [sum(p["chats_met"] + p["jobs_met"] for p in run["phases"]) for run in runs]
    sent = [sum(p["sent"] for p in run["phases"]) for run in runs]
    rows.append(_row("total", names, met, sent, sum(p["seconds"] for p in runs[0]["phases"])))
    return rows


def _row(phase: str, names: list[str], met: list[int], sent: list[int], seconds: float
         ) -> dict[str, Any]:  # fmt: skip
    goodput = [m / seconds for m in met]
    best = max(goodput)
    leaders = [n for n, g in zip(names, goodput, strict=True) if is_tie(g, best)]
    return {"phase": phase, "met": dict(zip(names, met, strict=True)),
            "sent": dict(zip(names, sent, strict=True)),
            "goodput": dict(zip(names, goodput, strict=True)),
            "higher": leaders[0] if len(leaders) == 1 else "tie"}  # fmt: skip


def print_side_by_side(rows: list[dict[str, Any]], names: list[str]) -> None:
    print("\ngoodput (requests that met their SLO per second; met/sent):")
    print(f"{'phase':<18}" + "".join(f"{n:>20}" for n in names) + f"{'higher':>12}")
    for row in rows:
        cells = "".join(f"{row['goodput'][n]:>8.2f} ({row['met'][n]:>4}/{row['sent'][n]:>4})"
                        for n in names)  # fmt: skip
        print(f"{row['phase']:<18}{cells}{row['higher']:>12}")


def compare(keep_files: bool, phase_seconds: float, seed: int) -> list[dict[str, Any]]:
    """Adaptive, then the best static choice, on the same trace and seed; the table and JSON."""
    runs = [run_once(keep_files, phase_seconds, seed, fixed) for fixed in (None, FIXED_BASELINE)]
    rows = side_by_side(runs)
    with results_page("adaptive_mix", run="side by side"):
        print_side_by_side(rows, [run["policy"] for run in runs])
    path = OUT_DIR / "adaptive_mix_compare.json"
    path.write_text(json.dumps({"seed": seed, "phase_seconds": phase_seconds, "table": rows,
                                "runs": runs}, indent=1))  # fmt: skip
    print(f"wrote {path}")
    return runs


def fixed_split(text: str) -> int:
    """--fixed: a split minStreamingReplicas allows."""
    k = int(text)
    if not 0 <= k <= REPLICAS - MIN_STREAMING:
        raise argparse.ArgumentTypeError(
            f"{k} batching of {REPLICAS}: between 0 and {REPLICAS - MIN_STREAMING} "
            f"(minStreamingReplicas {MIN_STREAMING})"
        )
    return k


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-seconds", type=float, default=75, help="how long each mix lasts")
    parser.add_argument("--seed", type=int, default=1, help="seeds the prompts requests draw")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--fixed",
        type=fixed_split,
        metavar="K",
        help="pin K replicas batching (adaptive.paused) instead of adapting",
    )
    which.add_argument(
        "--compare",
        action="store_true",
        help=f"adaptive, then fixed {FIXED_BASELINE}, side by side",
    )
    parser.add_argument("--keep-files", action="store_true",
                        help="keep the operator, Prometheus, router and sim logs")  # fmt: skip
    args = parser.parse_args(argv)
    if args.compare:
        runs = compare(args.keep_files, args.phase_seconds, args.seed)
    else:
        runs = [run_once(args.keep_files, args.phase_seconds, args.seed, args.fixed)]
    return 0 if all(t["pass"] for run in runs for t in run["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
