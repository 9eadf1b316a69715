"""`make demo`: the whole system on this machine, live.

A real control plane with two fake 8-GPU nodes (kwok), the chart installed with helm, the
operator running under the chart's ServiceAccount, Debian's Prometheus, a `sim` runtime for
each serving pod and an `autoglm-router` for each router pod. Traffic goes to Service
`<name>`, as clients' would: through the router, which sends each request to a replica of the
right mode. Streamed chats all along, with a peak of batch jobs (non-streamed requests) on top:
the adaptive pass sizes the split by each class's demand, moves a replica to batching for the
peak and back to streaming after it, and this script shows it as it happens. At the end it prints
where the requests went and writes a PNG of load, TTFT and modes over time. Ctrl-C stops
everything it started.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autoglm_operator.io.prom import demand_query
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


@dataclass
class Timeline:
    samples: list[Sample] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)


def traffic(scale: float) -> tuple[list[Phase], list[Phase]]:
    """Streamed chats and batch jobs per second: quiet, a peak, quiet again, long enough for the
    loop's windows at demo settings. At the peak, 6 chats/s and 8 jobs/s on 3 replicas: all
    streaming serves 12.3 req/s (3 x the 4.1/s seed), so demand sizing moves one replica to
    batching (8.2 chats/s and 11.5 jobs/s of room); chats alone would fit the streaming ones."""
    schedule = [  # (phase end in s, chats/s, jobs/s, ramp from the previous phase)
        (30, 1.0, 0.0, False),
        (45, 6.0, 8.0, True),
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


def demo_resource(prometheus_url: str, replicas: int) -> dict[str, Any]:
    """examples/autoglm.yaml with demo timings: seconds instead of minutes."""
    resource = yaml.safe_load((REPO / "examples" / "autoglm.yaml").read_text())
    resource["metadata"]["name"] = NAME
    resource["spec"]["replicas"] = replicas
    resource["spec"]["adaptive"] = {
        "intervalSeconds": 5,
        "prometheus": {
            "url": prometheus_url,
            # Short rate windows so the demo reacts within seconds, not minutes.
            "queries": {
                kind: demand_query(traffic_class, "15s")
                for kind, traffic_class in (("chatRate", "streamed_chat"), ("otherRate", "other"))
            },
        },
        "toBatchingStabilizationSeconds": 10,
        "toStreamingStabilizationSeconds": 30,
        "cooldownSeconds": 20,
        "minStreamingReplicas": 1,
    }
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


def wait_ready(cluster: LocalCluster, replicas: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = cluster.get_json("agd", NAME, "-n", DEMO_NAMESPACE).get("status", {})
        if status.get("readyReplicas") == replicas:
            return
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


def pod_modes(cluster: LocalCluster) -> dict[str, str]:
    serving = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name=autoglm"
    pods = cluster.get_json("pods", "-n", DEMO_NAMESPACE, "-l", serving)
    return {
        p["metadata"]["name"]: p["metadata"].get("labels", {}).get("autoglm.io/mode", "?")
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
    }


async def watch_and_show(
    cluster: LocalCluster, runner: PodRunner, offered: Callable[[float], float],
    report: LoadReport,
    timeline: Timeline, started: float, duration: float,
) -> None:  # fmt: skip
    seen_decision = None
    while (t := time.monotonic() - started) < duration + 5:
        agd = await asyncio.to_thread(cluster.get_json, "agd", NAME, "-n", DEMO_NAMESPACE)
        modes = await asyncio.to_thread(pod_modes, cluster)
        status = agd.get("status", {})
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
        )
        timeline.samples.append(sample)
        badges = " ".join("B" if m == "batching" else "S" for _, m in sorted(modes.items()))
        ttft = f"{sample.ttft_p95 * 1000:4.0f}ms" if sample.ttft_p95 is not None else "   -  "
        print(
            f"t={t:5.0f}s  load {sample.offered_qps:5.1f} req/s  served {sample.served_qps:5.1f}"
            f" req/s  TTFT p95 {ttft}  modes [{badges}]  ready {status.get('ready', '-')}"
            f"  failed {len(report.failures)}",
            flush=True,
        )
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
        await asyncio.sleep(2)


def write_chart(timeline: Timeline, path: Path) -> None:
    plt = pyplot()

    t = [s.t for s in timeline.samples]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    axes[0].plot(t, [s.offered_qps for s in timeline.samples], label="offered")
    axes[0].plot(t, [s.served_qps for s in timeline.samples], label="served")
    axes[0].set_ylabel("requests/s")
    axes[0].legend(loc="upper right")
    axes[1].plot(t, [(s.ttft_p95 or 0) * 1000 for s in timeline.samples], color="tab:red")
    axes[1].set_ylabel("TTFT p95 (ms)")
    axes[2].step(t, [s.batching for s in timeline.samples], where="post", label="batching")
    axes[2].step(t, [s.streaming for s in timeline.samples], where="post", label="streaming")
    axes[2].set_ylabel("replicas")
    axes[2].set_xlabel("seconds since traffic started")
    axes[2].legend(loc="upper right")
    for decision in timeline.decisions:
        for ax in axes:
            ax.axvline(decision["t"], color="grey", linestyle=":", linewidth=1)
    fig.suptitle("AutoGLM adaptive modes: load, time to first token, replicas per mode")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


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

        step(f"kubectl apply -f examples/autoglm.yaml ({args.replicas} replicas, demo timings)")
        cluster.kubectl("create", "namespace", DEMO_NAMESPACE)
        cluster.apply(demo_resource(prom.url, args.replicas), DEMO_NAMESPACE)
        wait_ready(cluster, args.replicas)
        print(cluster.kubectl("get", "agd", "-n", DEMO_NAMESPACE).stdout)

        proxy = stack.enter_context(ServiceProxy(cluster, DEMO_NAMESPACE, NAME, kubelet=runner))
        wait_for_routers(proxy)
        step(f"Driving traffic for {duration:.0f}s through Service {NAME} (the router): quiet, "
             "a peak of 6 streamed chats/s and 8 batch jobs/s, quiet again")  # fmt: skip
        targets = [proxy.url + "/v1"]

        report = LoadReport()
        timeline = Timeline()

        def offered(t: float) -> float:
            return qps_at(chats, t) + qps_at(jobs, t)

        async def drive() -> None:
            started = time.monotonic()
            await asyncio.gather(
                run_load(targets, lambda t: qps_at(chats, t), duration, report=report),
                run_load(targets, lambda t: qps_at(jobs, t), duration, report=report, stream=False),
                watch_and_show(cluster, runner, offered, report, timeline, started, duration),
            )

        asyncio.run(drive())

        step("Result")
        print(cluster.kubectl("get", "agd", "-n", DEMO_NAMESPACE).stdout)
        up = sum(1 for d in timeline.decisions if d["toBatching"] > d["fromBatching"])
        down = sum(1 for d in timeline.decisions if d["toBatching"] < d["fromBatching"])
        chart = REPO / "out" / "demo" / "autoglm-demo.png"
        write_chart(timeline, chart)
        summary = {
            "samples": [s.__dict__ for s in timeline.samples],
            "decisions": timeline.decisions,
            "requests": len(report.results),
            "failed": len(report.failures),
        }
        chart.with_suffix(".json").write_text(json.dumps(summary, indent=1))
        print(
            f"flips to batching: {up}, back to streaming: {down}, "
            f"requests: {len(report.results)}, failed: {len(report.failures)}"
        )
        print(f"chart: {chart}")
        show_where_requests_went(runner, proxy)
        selector = f"involvedObject.kind=AutoGLMDeployment,involvedObject.name={NAME}"
        events = cluster.kubectl(
            "get", "events", "-n", DEMO_NAMESPACE, "--field-selector", selector,
            "--sort-by=.lastTimestamp",
        ).stdout  # fmt: skip
        print(events)
        return 0 if up and down and not report.failures else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=3)
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
