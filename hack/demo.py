"""`make demo`: the whole system on this machine, live.

A real control plane with two fake 8-GPU nodes (kwok), the chart installed with helm, the
operator running under the chart's ServiceAccount, Debian's Prometheus, a `sim` runtime for
each serving pod and an `autoglm-router` for each router pod. Traffic goes to Service
`<name>`, as clients' would: through the router, which sends each request to a replica of the
right mode. The deployment is examples/autoglm-autoscaling.yaml (spec.autoscaling) with demo
timings. Streamed chats all along, with a peak of batch jobs (non-streamed requests) on top: the
adaptive pass sizes the fleet and its split by each class's demand, grows the fleet from one
replica for the peak and moves one to batching, then, after the peak, shrinks the fleet a
replica at a time (the batching one first) back to one; this script shows it as it happens.
Then scale to zero (`minReplicas: 0`): with the traffic over, the deployment goes idle after
`scaleToZero.idleSeconds` and its Deployment to zero; one streamed chat is held by the router
while a replica starts, and served. At the end it prints where the requests went and writes a
PNG of load, TTFT, the fleet, its modes and the replicas over time. Ctrl-C stops everything it
started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import yaml

from autoglm_operator.io.prom import demand_query
from autoglm_router.answers import HELD_SECONDS
from testkit.loadgen import LoadReport, run_load
from testkit.localcluster import LocalCluster, free_port, loopback_pod_cidr, running_cluster
from testkit.localprom import LocalPrometheus
from testkit.plots import pyplot
from testkit.podrunner import PodRunner
from testkit.servicelb import ServiceProxy
from testkit.stats import percentile

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "autoglm"
SYSTEM_NAMESPACE = "autoglm-system"
DEMO_NAMESPACE = "demo"
NAME = "phone-9b"
RELEASE = "autoglm"
# Above the quiet phase's 2 s between chats, so only the end of the traffic starts the idle
# window; short, so the demo reaches zero about half a minute after its last request.
IDLE_SECONDS = 30
LOAD_SECONDS = 5.0  # the sims' model load for the wake from zero, so the hold is long enough to see
# Demo windows for spec.autoscaling: the first step down 20 s after the peak's demand is gone,
# then one replica every 5 s (in production 300 s and 60 s: a replica takes a minute to start).
SCALE_DOWN_STABILIZATION_SECONDS = 20
SCALE_DOWN_PERIOD_SECONDS = 5
MAX_REPLICAS = 3  # the peak's fleet (traffic())
STANDBY_REASONS = ("ScaledToZero", "Waking", "Woke", "WakeAbandoned")
FLEET_REASONS = ("ScaledUp", "ScaledDown", "ReplicasIgnored", "AutoscalerConflict")


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


@dataclass
class Phase:
    until: float  # seconds from the start of the traffic
    qps: float
    ramp: bool = False  # linear from the previous phase's rate


@dataclass
class Sample:
    t: float
    offered_qps: float
    served_qps: float
    ttft_p95: float | None
    batching: int
    streaming: int
    running: int  # the Deployment's ready replicas
    desired: int  # the Deployment's spec.replicas
    standby: str  # status.standby.state
    held: int  # status.standby.heldRequests: what the routers hold now
    fleet_desired: int | None = None  # status.autoscaling.desiredReplicas
    fleet_running: int | None = None  # status.autoscaling.runningReplicas
    fleet_reason: str = "-"  # status.autoscaling.reason


@dataclass
class HeldChat:
    """The streamed chat sent at zero: when, how long the router held it, when it was done."""

    sent_at: float  # seconds from the start of the traffic
    model: str = ""
    held: float | None = None  # the router's x-autoglm-held-seconds header
    took: float | None = None  # until the whole answer was in
    answer: str = ""
    error: str | None = None

    @property
    def served(self) -> bool:
        return self.error is None and bool(self.answer) and bool(self.held)


@dataclass
class Timeline:
    samples: list[Sample] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    # status.autoscaling.desiredReplicas as it changed, and the serving pods that went (a step
    # down's victim, or every pod at zero), each with its mode.
    fleet_steps: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    zero_at: float | None = None  # when status.standby was Idle and the Deployment at zero
    # The operator's idle window: its last request (lastRequestTime) to ScaledToZero (since).
    idle_window: tuple[float, float] | None = None
    chat: HeldChat | None = None

    def at_zero(self) -> bool:
        last = self.samples[-1] if self.samples else None
        return last is not None and last.standby == "Idle" and last.desired == last.running == 0


def traffic(scale: float) -> tuple[list[Phase], list[Phase]]:
    """Streamed chats and batch jobs per second: quiet, a peak, quiet again, long enough for the
    loop's windows at demo settings. Quiet, 1 chat/s (+20% headroom) fits one streaming replica
    (the 4.1/s seed). At the peak, 6 chats/s and 8 jobs/s, +20%: 16.8 req/s; no fleet of 3 all
    streaming serves it (12.3 req/s), 2 streaming and 1 batching do (8.2 chats/s and 11.5 jobs/s
    of room), so the fleet grows to 3 and one replica moves to batching. maxReplicas is 3
    (MAX_REPLICAS): the streaming capacity the sims teach (2.4 to 3.6/s, with what else runs on
    the machine) puts the peak near the line between 3 and 4 replicas, and with the demo's 20 s
    window a fleet free to take 4 steps between them during the peak; 3 serve it (the sims serve
    more than the SLO capacity the model counts). The ramp takes 45 s: the fleet follows the
    measured rates (10 s windows, read every 5 s, so some 10 s behind) and the headroom covers
    that lag; a steeper ramp outruns one replica before the first step up. After the peak,
    0.5 chats/s: one replica again, the batching one leaves first."""
    schedule = [  # (phase end in s, chats/s, jobs/s, ramp from the previous phase)
        (30, 1.0, 0.0, False),
        (75, 6.0, 8.0, True),
        (120, 6.0, 8.0, False),
        (135, 0.5, 0.0, True),
        (270, 0.5, 0.0, False),
    ]
    chats = [Phase(end * scale, rate, ramp=ramp) for end, rate, _, ramp in schedule]
    jobs = [Phase(end * scale, rate, ramp=ramp) for end, _, rate, ramp in schedule]
    return chats, jobs


def qps_at(phases: list[Phase], t: float) -> float:
    previous = phases[0].qps
    start = 0.0
    for phase in phases:
        if t < phase.until:
            if phase.ramp:
                return previous + (phase.qps - previous) * (t - start) / (phase.until - start)
            return phase.qps
        previous, start = phase.qps, phase.until
    return phases[-1].qps


def demo_resource(prometheus_url: str, max_replicas: int) -> dict[str, Any]:
    """examples/autoglm-autoscaling.yaml with demo timings (seconds instead of minutes) and
    `minReplicas: 0`, which scales to zero when idle."""
    resource = yaml.safe_load((REPO / "examples" / "autoglm-autoscaling.yaml").read_text())
    resource["metadata"]["name"] = NAME
    resource["spec"]["adaptive"] = {
        "intervalSeconds": 5,
        "prometheus": {
            "url": prometheus_url,
            # Short rate windows so the demo reacts within seconds, not minutes.
            "queries": {
                kind: demand_query(traffic_class, "10s")
                for kind, traffic_class in (("chatRate", "streamed_chat"), ("otherRate", "other"))
            },
        },
        "toBatchingStabilizationSeconds": 10,
        "toStreamingStabilizationSeconds": 30,
        "cooldownSeconds": 20,
        "minStreamingReplicas": 1,
    }
    resource["spec"]["autoscaling"].update({
        "minReplicas": 0,
        "maxReplicas": max_replicas,
        "scaleDown": {"stabilizationSeconds": SCALE_DOWN_STABILIZATION_SECONDS,
                      "periodSeconds": SCALE_DOWN_PERIOD_SECONDS, "maxStep": 1},
    })  # fmt: skip
    # minReplicas 0 turns scale to zero on; this says after how long without a request.
    resource["spec"]["scaleToZero"] = {"idleSeconds": IDLE_SECONDS}
    return resource


def service_account_kubeconfig(cluster: LocalCluster, workdir: Path) -> Path:
    """A kubeconfig holding a token of the chart's ServiceAccount: the operator then runs with
    exactly the permissions the chart grants it."""
    accounts = cluster.get_json("serviceaccounts", "-n", SYSTEM_NAMESPACE)["items"]
    account = next(a["metadata"]["name"] for a in accounts if "autoglm" in a["metadata"]["name"])
    token = cluster.kubectl(
        "create", "token", account, "-n", SYSTEM_NAMESPACE, "--duration=2h"
    ).stdout.strip()
    config = json.loads(Path(cluster.kubeconfig).read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path = workdir / "operator.kubeconfig"
    path.write_text(json.dumps(config))
    return path


def chart_operator_args(cluster: LocalCluster) -> list[str]:
    """The arguments the chart gives the operator's container, made to run here: the pod's
    name filled in, the Lease namespace explicit, health on loopback."""
    deployments = cluster.get_json("deployments", "-n", SYSTEM_NAMESPACE)["items"]
    container = deployments[0]["spec"]["template"]["spec"]["containers"][0]
    args = []
    for arg in container["args"]:
        if arg.startswith("--liveness"):
            arg = f"--liveness=http://127.0.0.1:{free_port()}/healthz"
        args.append(arg.replace("$(POD_NAME)", "demo-operator"))
    # In a pod the Lease namespace comes from the ServiceAccount mount; here it is explicit.
    return [*args, f"--lease-namespace={SYSTEM_NAMESPACE}"]


def start_operator(
    cluster: LocalCluster, kubeconfig: Path, workdir: Path
) -> subprocess.Popen[bytes]:
    env = {
        **cluster.env,
        "KUBECONFIG": str(kubeconfig),
        "AUTOGLM_OPERATOR_METRICS_PORT": str(free_port()),
        "AUTOGLM_OPERATOR_METRICS_ADDR": "127.0.0.1",
    }
    log = open(workdir / "operator.log", "ab")  # noqa: SIM115 - owned by the child
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("autoglm-operator")), *chart_operator_args(cluster)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()
    return process


def stop_process(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_ready(cluster: LocalCluster, timeout: float = 120) -> int:
    """Until the fleet autoscaling starts with (one replica, no demand known yet) is ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = cluster.get_json("agd", NAME, "-n", DEMO_NAMESPACE).get("status", {})
        desired = (status.get("autoscaling") or {}).get("desiredReplicas")
        if desired and status.get("readyReplicas") == desired:
            return int(desired)
        time.sleep(1)
    raise TimeoutError(
        f"{NAME} not Ready after {timeout}s: kubectl describe agd -n {DEMO_NAMESPACE}"
    )


def wait_for_routers(proxy: ServiceProxy, timeout: float = 60) -> None:
    """Service <name> has a router pod ready behind it (the local kube-proxy probes them)."""
    deadline = time.monotonic() + timeout
    while not proxy.endpoints():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Service {NAME} has no ready router pod after {timeout}s")
        time.sleep(0.5)


def show_where_requests_went(runner: PodRunner, proxy: ServiceProxy) -> None:
    """Connections per router pod, and the routers' own counts by class and replica mode."""
    print("Service connections per router pod:", dict(proxy.stats.connections))
    for (traffic_class, mode, outcome), count in sorted(runner.router_requests(DEMO_NAMESPACE)
                                                        .items()):  # fmt: skip
        print(f"  {traffic_class:>13} -> {mode:>9} replicas: {count:6.0f} {outcome}")


def deployment_replicas(cluster: LocalCluster) -> tuple[int, int]:
    """The serving Deployment's (ready, spec) replicas."""
    deployment = cluster.get_json("deployment", NAME, "-n", DEMO_NAMESPACE)
    ready = int(deployment.get("status", {}).get("readyReplicas") or 0)
    return ready, int(deployment["spec"]["replicas"])


def pod_modes(cluster: LocalCluster) -> dict[str, str]:
    serving = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name=autoglm"
    pods = cluster.get_json("pods", "-n", DEMO_NAMESPACE, "-l", serving)
    return {
        p["metadata"]["name"]: p["metadata"].get("labels", {}).get("autoglm.io/mode", "?")
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
    }


async def watch_and_show(
    cluster: LocalCluster, offered: Callable[[float], float], report: LoadReport,
    timeline: Timeline, started: float, stop: asyncio.Event,
) -> None:  # fmt: skip
    seen_decision = None
    seen_desired: int | None = None
    seen_modes: dict[str, str] = {}
    while not stop.is_set():
        t = time.monotonic() - started
        agd, modes, (running, desired) = await asyncio.gather(
            asyncio.to_thread(cluster.get_json, "agd", NAME, "-n", DEMO_NAMESPACE),
            asyncio.to_thread(pod_modes, cluster),
            asyncio.to_thread(deployment_replicas, cluster),
        )
        status = agd.get("status", {})
        standby = status.get("standby") or {}
        fleet = status.get("autoscaling") or {}
        now = time.monotonic()
        # Requests that started 2-12 s ago: nearly all have finished, so none is missed.
        recent = report.window(now - 12, now - 2)
        served = [r for r in recent if r.error is None]
        ttfts = [r.ttft for r in served if r.ttft is not None]
        sample = Sample(
            t=t,
            offered_qps=offered(t),
            served_qps=len(served) / 10.0,
            ttft_p95=percentile(ttfts, 0.95),
            batching=sum(1 for m in modes.values() if m == "batching"),
            streaming=sum(1 for m in modes.values() if m == "streaming"),
            running=running,
            desired=desired,
            standby=standby.get("state", "-"),
            held=int(standby.get("heldRequests") or 0),
            fleet_desired=fleet.get("desiredReplicas"),
            fleet_running=fleet.get("runningReplicas"),
            fleet_reason=fleet.get("reason") or "-",
        )
        timeline.samples.append(sample)
        if timeline.zero_at is None and timeline.at_zero():
            timeline.zero_at = t
        badges = " ".join("B" if m == "batching" else "S" for _, m in sorted(modes.items()))
        ttft = f"{sample.ttft_p95 * 1000:4.0f}ms" if sample.ttft_p95 is not None else "   -  "
        chat = timeline.chat
        waiting = (
            f"  chat waiting {t - chat.sent_at:.0f}s"
            if chat is not None and chat.took is None and chat.error is None
            else ""
        )
        sized = f"{_count(sample.fleet_desired)}/{_count(sample.fleet_running)}"
        print(
            f"t={t:5.0f}s  load {sample.offered_qps:5.1f} req/s  served {sample.served_qps:5.1f}"
            f" req/s  TTFT p95 {ttft}  modes [{badges:<7}]  fleet {sized:>3}"
            f" {sample.fleet_reason:<20}  deploy {running}/{desired}  {sample.standby:<7}"
            f"  held {sample.held}  failed {len(report.failures)}{waiting}",
            flush=True,
        )
        desired_now = sample.fleet_desired
        if desired_now is not None and seen_desired is not None and desired_now != seen_desired:
            step_ = {"t": t, "from": seen_desired, "to": desired_now,
                     "reason": sample.fleet_reason,
                     "message": fleet.get("message", "")}  # fmt: skip
            timeline.fleet_steps.append(step_)
            print(f"    >>> fleet: {seen_desired} -> {desired_now} replicas "
                  f"({sample.fleet_reason}): {step_['message']}", flush=True)  # fmt: skip
        seen_desired = desired_now if desired_now is not None else seen_desired
        for pod in sorted(seen_modes.keys() - modes.keys()):
            timeline.removed.append({"t": t, "pod": pod, "mode": seen_modes[pod]})
            print(f"    >>> pod {pod} ({seen_modes[pod]}) leaves; its preStop drains what it "
                  "serves", flush=True)  # fmt: skip
        seen_modes = modes
        decision = status.get("lastDecision")
        if decision and decision.get("time") != seen_decision:
            seen_decision = decision.get("time")
            if decision.get("fromBatching") != decision.get("toBatching"):
                timeline.decisions.append({**decision, "t": t})
                print(
                    f"    >>> flip: batching replicas {decision['fromBatching']} -> "
                    f"{decision['toBatching']} ({decision['reason']}): "
                    f"{decision.get('message', '')}",
                    flush=True,
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2)


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def streamed_chat(base_url: str, chat: HeldChat) -> None:
    """One streamed chat through the official client, as a user's: the router's header says how
    long it was held; `took` is until the whole answer was in."""
    client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=240)
    started = time.monotonic()
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=chat.model, stream=True, max_tokens=16,
            messages=[{"role": "user", "content": "Open the settings app."}],
        )  # fmt: skip
        held = float(raw.headers.get(HELD_SECONDS) or 0.0)
        chat.answer = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        chat.held, chat.took = held, time.monotonic() - started
    except openai.OpenAIError as exc:
        chat.error = f"{type(exc).__name__}: {exc}"
    finally:
        client.close()


def model_list(base_url: str) -> list[str]:
    with openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=30) as client:
        return [m.id for m in client.models.list().data]


async def until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)
    return True


async def scale_to_zero_episode(
    cluster: LocalCluster, runner: PodRunner, base_url: str, timeline: Timeline, started: float
) -> None:
    """With the traffic over: the live table runs on until the deployment is idle and its
    Deployment at zero, then one streamed chat is held while a replica starts, and served."""
    step(f"Traffic over: idle window of {IDLE_SECONDS}s (scaleToZero.idleSeconds), then zero")
    if not await until(timeline.at_zero, IDLE_SECONDS + 90):
        print(
            f"    !!! not at zero {IDLE_SECONDS + 90}s after the traffic: kubectl get agd "
            f"{NAME} -n {DEMO_NAMESPACE} -o yaml (status.standby)",
            flush=True,
        )
        return
    standby = cluster.get_json("agd", NAME, "-n", DEMO_NAMESPACE)["status"]["standby"]
    print(f"    >>> at zero: {standby.get('reason')}: {standby.get('message')}", flush=True)
    if standby.get("lastRequestTime") and standby.get("since"):
        # Wall-clock times in status, on the traffic's clock.
        wall_started = time.time() - (time.monotonic() - started)
        timeline.idle_window = (
            datetime.fromisoformat(standby["lastRequestTime"]).timestamp() - wall_started,
            datetime.fromisoformat(standby["since"]).timestamp() - wall_started,
        )
    # kwok gives a new pod a deleted pod's address at once, so the pod runner starts it only when
    # the old one has drained (its preStop): the chat then waits for the cold start alone.
    await until(lambda: not runner.serving_processes(DEMO_NAMESPACE), 60)
    # The flips' replicas started at once; the one that wakes loads its model first, as vLLM's.
    runner.sim_args = ["--model-load-seconds", str(LOAD_SECONDS)]
    models = await asyncio.to_thread(model_list, base_url)
    print(f"    >>> GET /v1/models at zero: {models}, answered by the router: it wakes nothing",
          flush=True)  # fmt: skip
    step(f"One streamed chat through Service {NAME} at zero: held by the router while a replica "
         f"starts (its sim loads for {LOAD_SECONDS:.0f}s; kwok reports the pod Ready at once, the "
         "router waits for the sim's /health)")  # fmt: skip
    timeline.chat = chat = HeldChat(sent_at=time.monotonic() - started, model=models[0])
    await asyncio.to_thread(streamed_chat, base_url, chat)
    if chat.error is not None:
        print(f"    !!! the held chat failed: {chat.error}", flush=True)
        return
    print(
        f"    >>> held chat served: held {chat.held:.1f}s ({HELD_SECONDS}), whole answer "
        f"after {chat.took:.1f}s: {chat.answer!r}",
        flush=True,
    )
    # A few more rows: the routers' queue empty, the deployment Serving on the replica that woke.
    await until(lambda: timeline.samples[-1].standby == "Serving", 20)
    await asyncio.sleep(3)


def write_chart(timeline: Timeline, path: Path) -> None:
    """Three panels over the whole run, and a fourth that zooms on the scale-to-zero episode."""
    plt = pyplot()

    samples = timeline.samples
    t = [s.t for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), gridspec_kw={"height_ratios": [1, 1, 1, 1.3]})
    for ax in axes[1:3]:
        ax.sharex(axes[0])
    for ax in axes[:2]:
        ax.tick_params(labelbottom=False)
    axes[0].plot(t, [s.offered_qps for s in samples], label="offered")
    axes[0].plot(t, [s.served_qps for s in samples], label="served")
    axes[0].set_ylabel("requests/s")
    axes[0].legend(loc="upper right")
    axes[1].plot(t, [(s.ttft_p95 or 0) * 1000 for s in samples], color="tab:red")
    axes[1].set_ylabel("TTFT p95 (ms)")
    axes[2].step(t, [s.batching for s in samples], where="post", label="batching")
    axes[2].step(t, [s.streaming for s in samples], where="post", label="streaming")
    # While Idle, desiredReplicas is what a wake would start: left out, the Deployment is at 0.
    axes[2].step(t, [s.fleet_desired if s.fleet_desired is not None and s.standby != "Idle"
                     else float("nan") for s in samples], where="post", color="black",
                 linestyle="--", label="fleet (status.autoscaling.desiredReplicas)")  # fmt: skip
    most = max([s.fleet_desired or 0 for s in samples] + [s.running for s in samples] + [1])
    axes[2].set_ylim(-0.2, most + 1.2)  # room for the legend
    axes[2].set_ylabel("replicas")
    axes[2].set_xlabel("seconds since traffic started (dotted: flips, green: fleet steps)")
    axes[2].legend(loc="upper left", fontsize=8, ncol=3)
    for decision in timeline.decisions:
        for ax in axes[:3]:
            ax.axvline(decision["t"], color="grey", linestyle=":", linewidth=1)
    for fleet_step in timeline.fleet_steps:
        for ax in axes[:3]:
            ax.axvline(fleet_step["t"], color="tab:green", linestyle=":", linewidth=1)
    # Idle at zero: shaded on every panel, from the first such sample to the next that is not.
    for n, (start, end) in enumerate(idle_spans(samples)):
        for ax in axes:
            label = "status.standby Idle" if ax is axes[3] and not n else None
            ax.axvspan(start, end, color="tab:blue", alpha=0.12, linewidth=0, label=label)
    chat = timeline.chat
    if chat is not None:
        for ax in axes:
            ax.axvline(chat.sent_at, color="tab:purple", linestyle="--", linewidth=1)
    scale_to_zero_panel(axes[3], timeline)
    fig.suptitle("AutoGLM: load, time to first token, the fleet and its modes, scale to zero")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def scale_to_zero_panel(ax: Any, timeline: Timeline) -> None:
    """From the idle window on: the Deployment's replicas, the held requests and the chat."""
    samples, chat, window = timeline.samples, timeline.chat, timeline.idle_window
    t = [s.t for s in samples]
    ax.step(t, [s.running for s in samples], where="post", color="black",
            label="Deployment ready replicas")  # fmt: skip
    ax.step(t, [s.held for s in samples], where="post", color="tab:purple", linestyle="--",
            label="held requests (status.standby)")  # fmt: skip
    top = max([s.desired for s in samples] + [1])
    ax.set_ylim(-0.2, top + 1.8)  # room for the legend
    start = window[0] if window is not None else (timeline.zero_at or t[-1]) - IDLE_SECONDS
    ax.set_xlim(start - 10, t[-1] + 2)
    ax.set_ylabel("scale to zero")
    ax.set_xlabel("seconds since traffic started (zoom on the end)")
    if window is not None:
        ax.annotate("", (window[0], top + 0.4), (window[1], top + 0.4),
                    arrowprops={"arrowstyle": "<->", "color": "tab:blue"})  # fmt: skip
        ax.text((window[0] + window[1]) / 2, top + 0.5,
                f"idle window: {window[1] - window[0]:.0f}s without a request", ha="center",
                fontsize=8, color="tab:blue")  # fmt: skip
    if chat is not None and chat.held is not None and chat.took is not None:
        ax.axvspan(chat.sent_at, chat.sent_at + chat.held, color="tab:purple", alpha=0.25,
                   linewidth=0, label="the chat's hold")  # fmt: skip
        ax.annotate(f"chat held {chat.held:.1f}s,\nanswered after {chat.took:.1f}s",
                    (chat.sent_at + chat.held, 1), xytext=(-8, 40), textcoords="offset points",
                    ha="right", fontsize=8, color="tab:purple",
                    arrowprops={"arrowstyle": "->", "color": "tab:purple"})  # fmt: skip
    elif chat is not None:
        ax.text(chat.sent_at, 1, f" chat failed: {chat.error}", fontsize=8, color="tab:red")
    ax.legend(loc="upper left", fontsize=8, ncol=3)


def idle_spans(samples: list[Sample]) -> list[tuple[float, float]]:
    spans: list[tuple[float, float]] = []
    start: float | None = None
    for s in samples:
        if s.standby == "Idle" and start is None:
            start = s.t
        elif s.standby != "Idle" and start is not None:
            spans.append((start, s.t))
            start = None
    if start is not None:
        spans.append((start, samples[-1].t))
    return spans


@dataclass(frozen=True)
class FleetStory:
    """What spec.autoscaling did with the traffic, from the samples (status.autoscaling)."""

    start: int  # desiredReplicas at the first sample
    peak: int  # the most desired while serving
    peak_at: float  # when the fleet first reached it
    after: int  # the fewest desired after the peak, before the deployment went idle
    after_at: float  # when it first reached that

    @property
    def grew(self) -> bool:
        return self.peak > self.start

    @property
    def shrank(self) -> bool:
        return self.after < self.peak


def fleet_story(samples: list[Sample]) -> FleetStory | None:
    """The fleet's size while it served, up to the first Idle (what a wake from zero starts is
    the scale-to-zero episode's, not demand sizing's); None without status.autoscaling."""
    serving: list[tuple[float, int]] = []
    for s in samples:
        if s.standby in ("Idle", "Waking"):
            break
        if s.fleet_desired is not None:
            serving.append((s.t, s.fleet_desired))
    if not serving:
        return None
    peak = max(n for _, n in serving)
    peak_at = next(t for t, n in serving if n == peak)
    later = [(t, n) for t, n in serving if t >= peak_at]
    after = min(n for _, n in later)
    after_at = next(t for t, n in later if n == after)
    return FleetStory(serving[0][1], peak, peak_at, after, after_at)


def back_to_streaming(samples: list[Sample]) -> bool:
    """Every replica streaming again after the last batching one, while replicas run: a flip
    back, or a step down that removed the batching replica."""
    last = max((s.t for s in samples if s.batching), default=None)
    return last is not None and any(s.t > last and s.streaming and not s.batching for s in samples)


def describe_fleet(story: FleetStory | None) -> str:
    if story is None:
        return "no status.autoscaling seen"
    grew = f"grew to {story.peak}" if story.grew else f"never grew (most {story.peak})"
    shrank = f"shrank to {story.after}" if story.shrank else "never shrank"
    if story.grew:
        grew += f" at t={story.peak_at:.0f}s"
    if story.shrank:
        shrank += f" at t={story.after_at:.0f}s"
    return f"{story.start} at the start, {grew}, {shrank}"


def agd_events(cluster: LocalCluster, reasons: tuple[str, ...]) -> list[str]:
    """The AutoGLMDeployment's Events of these reasons, oldest first."""
    selector = f"involvedObject.kind=AutoGLMDeployment,involvedObject.name={NAME}"
    items = cluster.get_json("events", "-n", DEMO_NAMESPACE, "--field-selector", selector)
    found = [e for e in items["items"] if e.get("reason") in reasons]
    found.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [
        f"{e.get('lastTimestamp') or e.get('eventTime')}  {e['reason']:<13} {e['message']}"
        for e in found
    ]


def helm(cluster: LocalCluster, *args: str) -> None:
    result = subprocess.run(
        [str(cluster.bin_dir / "helm"), *args], env=cluster.env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed:\n{result.stderr}")


def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="autoglm-demo-"))
    chats, jobs = traffic(args.time_scale)
    duration = chats[-1].until
    print(f"workdir (the operator's log, pods/ with each pod's log): {workdir}")
    with contextlib.ExitStack() as stack:
        step("Starting the control plane (etcd, kube-apiserver, controllers, kwok GPU nodes)")
        cluster = stack.enter_context(
            running_cluster(gpu_nodes=2, pod_cidr=loopback_pod_cidr(), workdir=workdir / "cluster")
        )
        print(cluster.kubectl("get", "nodes", "-L", "nvidia.com/gpu.count").stdout)

        step("Starting Prometheus and the pod runner (a sim per serving pod, a router per router "
             "pod)")  # fmt: skip
        prom = LocalPrometheus(workdir / "prometheus").start()
        stack.callback(prom.stop)
        runner = PodRunner(cluster, workdir / "pods", targets_file=prom.targets_file).start()
        stack.callback(runner.stop)

        step(f"Installing the chart: helm install {RELEASE} charts/autoglm -n {SYSTEM_NAMESPACE}")
        helm(cluster, "install", RELEASE, str(CHART), "-n", SYSTEM_NAMESPACE, "--create-namespace",
             "--set", "operator.replicas=0")  # fmt: skip
        step("Starting the operator with the chart's ServiceAccount and RBAC")
        operator = start_operator(cluster, service_account_kubeconfig(cluster, workdir), workdir)
        stack.callback(stop_process, operator)

        step(f"kubectl apply -f examples/autoglm-autoscaling.yaml (autoscaling 0.."
             f"{args.max_replicas} replicas, scale-down window {SCALE_DOWN_STABILIZATION_SECONDS}s,"
             f" then one every {SCALE_DOWN_PERIOD_SECONDS}s; idle after {IDLE_SECONDS}s without a "
             "request)")  # fmt: skip
        cluster.kubectl("create", "namespace", DEMO_NAMESPACE)
        cluster.apply(demo_resource(prom.url, args.max_replicas), DEMO_NAMESPACE)
        first = wait_ready(cluster)
        print(f"    >>> the fleet starts at {first} replica(s): no demand measured yet", flush=True)
        print(cluster.kubectl("get", "agd", "-n", DEMO_NAMESPACE).stdout)

        proxy = stack.enter_context(ServiceProxy(cluster, DEMO_NAMESPACE, NAME, kubelet=runner))
        wait_for_routers(proxy)
        step(f"Driving traffic for {duration:.0f}s through Service {NAME} (the router): quiet, "
             "a peak of 6 streamed chats/s and 8 batch jobs/s, quiet again. Columns: fleet = "
             "status.autoscaling desiredReplicas/runningReplicas and its reason; deploy = the "
             "Deployment's ready/spec.replicas; status.standby's state")  # fmt: skip
        targets = [proxy.url + "/v1"]

        report = LoadReport()
        timeline = Timeline()

        def offered(t: float) -> float:
            return qps_at(chats, t) + qps_at(jobs, t) if t < duration else 0.0

        async def drive() -> None:
            started = time.monotonic()
            stop = asyncio.Event()

            async def traffic_then_zero() -> None:
                try:
                    await asyncio.gather(
                        run_load(targets, lambda t: qps_at(chats, t), duration, report=report),
                        run_load(targets, lambda t: qps_at(jobs, t), duration, report=report,
                                 stream=False),
                    )  # fmt: skip
                    await scale_to_zero_episode(cluster, runner, targets[0], timeline, started)
                finally:
                    stop.set()  # the live table stops with the episode

            await asyncio.gather(
                traffic_then_zero(),
                watch_and_show(cluster, offered, report, timeline, started, stop),
            )

        asyncio.run(drive())

        step("Result")
        print(cluster.kubectl("get", "agd", "-n", DEMO_NAMESPACE).stdout)
        up = sum(1 for d in timeline.decisions if d["toBatching"] > d["fromBatching"])
        down = sum(1 for d in timeline.decisions if d["toBatching"] < d["fromBatching"])
        story = fleet_story(timeline.samples)
        streaming_again = back_to_streaming(timeline.samples)
        chart = REPO / "out" / "demo" / "autoglm-demo.png"
        write_chart(timeline, chart)
        summary = {
            "samples": [s.__dict__ for s in timeline.samples],
            "decisions": timeline.decisions,
            "zeroAt": timeline.zero_at,
            "idleWindow": timeline.idle_window,
            "heldChat": timeline.chat.__dict__ if timeline.chat else None,
            "fleet": story.__dict__ if story else None,
            "fleetSteps": timeline.fleet_steps,
            "removedPods": timeline.removed,
            "requests": len(report.results),
            "failed": len(report.failures),
        }
        chart.with_suffix(".json").write_text(json.dumps(summary, indent=1))
        print(
            f"flips to batching: {up}, back to streaming: {down}, "
            f"requests: {len(report.results)}, failed: {len(report.failures)}"
        )
        print(f"fleet (status.autoscaling.desiredReplicas): {describe_fleet(story)}")
        for fleet_step in timeline.fleet_steps:
            way = "up" if fleet_step["to"] > fleet_step["from"] else "down"
            print(f"  t={fleet_step['t']:5.0f}s  {fleet_step['from']} -> {fleet_step['to']}"
                  f" ({way})")  # fmt: skip
        for gone in timeline.removed:
            if gone["t"] < duration:
                print(f"  t={gone['t']:5.0f}s  removed {gone['pod']} ({gone['mode']})")
        how = ""
        if streaming_again and not down:
            how = " (a step down removed the batching replica; no flip was needed)"
        print(f"  every replica streaming again after the peak: "
              f"{'yes' if streaming_again else 'no'}{how}")  # fmt: skip
        for line in agd_events(cluster, FLEET_REASONS):
            print(f"  {line}")
        for error, count in Counter(r.error for r in report.failures).most_common(5):
            print(f"  failed {count}x: {error[:160]}")
        print(f"chart: {chart}")
        show_where_requests_went(runner, proxy)
        selector = f"involvedObject.kind=AutoGLMDeployment,involvedObject.name={NAME}"
        events = cluster.kubectl(
            "get", "events", "-n", DEMO_NAMESPACE, "--field-selector", selector,
            "--sort-by=.lastTimestamp",
        ).stdout  # fmt: skip
        print(events)
        early = went_idle_during(timeline, duration)
        print("scale to zero:")
        print(f"  idle during the traffic: {'never' if early is None else f'at t={early:.0f}s'}")
        at_zero = (
            "never"
            if timeline.zero_at is None
            else (
                f"t={timeline.zero_at:.0f}s, {timeline.zero_at - duration:.0f}s after the traffic"
            )
        )
        print(f"  at zero (Idle, Deployment 0/0): {at_zero}")
        print(f"  held chat: {describe(timeline.chat)}")
        for line in agd_events(cluster, STANDBY_REASONS):
            print(f"  {line}")
        flips_ok = bool(up and streaming_again and not report.failures)
        fleet_ok = story is not None and story.grew and story.shrank
        zero_ok = (early is None and timeline.zero_at is not None
                   and timeline.chat is not None and timeline.chat.served)  # fmt: skip
        return 0 if flips_ok and fleet_ok and zero_ok else 1


def went_idle_during(timeline: Timeline, duration: float) -> float | None:
    """When the idle window ended while the traffic ran, if it did: it must not, since the
    quiet phase's chats come every 2 s and the window is IDLE_SECONDS."""
    return next((s.t for s in timeline.samples
                 if s.t < duration and s.standby in ("Idle", "Waking")), None)  # fmt: skip


def describe(chat: HeldChat | None) -> str:
    if chat is None:
        return "not sent"
    if chat.served:
        return f"held {chat.held:.1f}s, whole answer after {chat.took:.1f}s"
    return f"not served ({chat.error or f'held {chat.held}s, answer {chat.answer!r}'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-replicas", type=int, default=MAX_REPLICAS,
                        help="spec.autoscaling.maxReplicas (2 nodes of 8 GPUs hold 8)")  # fmt: skip
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="stretch (>1) or shrink (<1) the traffic phases")  # fmt: skip
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every process started above is stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return run(args)
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started has been stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
