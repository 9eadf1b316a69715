"""How fast does the adaptive pass react? Load step to flip, decision to runtime confirmation.

    .venv/bin/python bench/adaptive_reaction.py [--flips 20] [--rolling-flips 4] [--keep-files]

Everything real but the GPUs: the local control plane (etcd, kube-apiserver, controllers, kwok
GPU nodes), Debian's Prometheus scraping a `sim` runtime per pod (testkit.podrunner), the
operator as a subprocess, open-loop load from the official `openai` client (testkit.loadgen).
Two replicas and minStreamingReplicas 1, so each load step moves exactly one replica: load
alternates high (twice the high QPS threshold) and low (under the low one), each step coming
once the previous flip is seen plus a random 1-6 s pause (so steps fall anywhere in the loop's
interval), for --flips flips, half each way.

Measured per flip, on the one clock this machine's processes share:
- step: when the load generator switches rate;
- decision: the time the operator records with the flip (status.decisionHistory[].time, in
  milliseconds: the start of the pass that read Prometheus, decided and flipped);
- InPlace confirmation: when the runtime switched, the `since` its admin endpoint reports (to
  the microsecond; the operator's verifying GET follows within milliseconds). The bench polls
  every runtime's admin endpoint every 0.25 s to read it. The operator's own share (label
  patch, PUT, GET) comes from its ModeFlipped Events;
- Rolling confirmation: when the replacement pod serves in the new mode, its /health first
  answering 200 (polled every 0.25 s), with the sim loading its model for a realistic 60 s.

Targets (InPlace, from the settings below): decision to confirmation p95 under 1 s; step to flip
applied p95 under 2 x intervalSeconds + that direction's stabilization window; every flip
decided and confirmed, none extra; no request failed. Rolling (switchStrategy: Rolling) runs
--rolling-flips flips, since each costs a model load, and is compared, not judged. kwok marks a
pod Ready at once (no readiness probe runs), so under Rolling the operator retires the old pod
before the new one has loaded; the serving time is measured on the runtime itself, as a real
readiness probe would see it.

Writes out/bench/adaptive_reaction.json and .png. Takes about 13 minutes here (2 shared cores).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config

from autoglm_api.profiles import MODE_PATH
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource import spec
from testkit.bench.reaction_timing import (
    BATCHING,
    STREAMING,
    Confirmation,
    Decision,
    FlipTiming,
    Settings,
    Step,
    flip_decisions,
    match_flips,
    spread,
    summarize,
    verdicts,
)
from testkit.loadgen import LoadReport, run_load
from testkit.localcluster import LocalCluster
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import KUBECTL_FAILED
from testkit.paths import OUT_DIR
from testkit.plots import pyplot
from testkit.podrunner import PodRunner
from testkit.report import results_page
from testkit.stack import Poller, delete_and_wait, live_stack, progress
from testkit.waiting import eventually

REPLICAS = 2
SETTINGS = Settings(interval=5, to_batching_window=5, to_streaming_window=10)
COOLDOWN = 5
QPS_HIGH_MILLI, QPS_LOW_MILLI = 1500, 600  # per replica
RATE_WINDOW = "3s"  # the QPS query's: short, so the metric follows a step within seconds
HIGH_LOAD, LOW_LOAD = 6.0, 0.5  # req/s over both replicas: 2x the high threshold, under the low
MAX_TOKENS = 16  # short answers: QPS counts requests when they finish
MODEL_LOAD_SECONDS = 60
POLL_SECONDS = 0.25
STRATEGIES = ("InPlace", "Rolling")


def resource(name: str, prometheus_url: str, strategy: str) -> dict[str, Any]:
    return {
        "apiVersion": spec.API_VERSION,
        "kind": spec.KIND,
        "metadata": {"name": name},
        "spec": {
            "replicas": REPLICAS,
            "switchStrategy": strategy,
            "adaptive": {
                "intervalSeconds": SETTINGS.interval,
                "prometheus": {
                    "url": prometheus_url,
                    "timeoutSeconds": 2,
                    "queries": {
                        "qps": f"sum(rate(vllm:request_success_total{{$selector}}[{RATE_WINDOW}]))"
                    },
                },
                "qpsPerReplicaMilli": {"high": QPS_HIGH_MILLI, "low": QPS_LOW_MILLI},
                "toBatchingStabilizationSeconds": SETTINGS.to_batching_window,
                "toStreamingStabilizationSeconds": SETTINGS.to_streaming_window,
                "cooldownSeconds": COOLDOWN,
                "minStreamingReplicas": 1,
                "maxFlipsPerStep": 1,
            },
        },
    }


# -- what the bench watches ------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeView:
    serving: bool
    mode: str
    switches: int


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as error:
        return error.code, b""
    except OSError:  # not listening yet, or gone
        return 0, b""


class Recorder(Poller):
    """Polls what the bench times, in a thread: every runtime's mode, switch count and switch
    time (admin endpoint) and whether it serves (/health), every POLL_SECONDS; the deployment's
    decision records (status) every second."""

    def __init__(
        self, cluster: LocalCluster, namespace: str, name: str, runner: PodRunner, rolling: bool
    ) -> None:
        api = config.new_client_from_config(config_file=cluster.kubeconfig)
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.namespace, self.name, self.runner = namespace, name, runner
        self.rolling = rolling
        self.decisions: set[Decision] = set()
        self.records: dict[str, dict[str, Any]] = {}  # as status holds them, for the JSON
        self.confirmations: list[Confirmation] = []
        self.status: dict[str, Any] = {}
        self._runtimes: dict[str, RuntimeView] = {}
        self._urls: dict[str, str] = {}
        self._served: set[str] = set()
        self._tokens: dict[str, str] = {}  # pod template digest -> admin token
        self._lock = threading.Lock()
        self._last_status = 0.0
        super().__init__("recorder", POLL_SECONDS)

    def serving(self) -> dict[str, int]:
        """How many runtimes serve in each mode now."""
        with self._lock:
            views = list(self._runtimes.values())
        modes = (BATCHING, STREAMING)
        return {m: sum(1 for v in views if v.serving and v.mode == m) for m in modes}

    def serving_urls(self) -> list[str]:
        """The OpenAI base URLs a Service would send to: runtimes whose /health answers."""
        with self._lock:
            return [f"{self._urls[p]}/v1" for p, v in sorted(self._runtimes.items()) if v.serving]

    def metrics_available(self) -> bool:
        conditions = self.status.get("conditions") or []
        return any(c["type"] == "MetricsAvailable" and c["status"] == "True" for c in conditions)

    def poll(self) -> None:
        urls = self.runner.runtime_urls(self.namespace)
        admin_urls = self.runner.admin_urls(self.namespace)
        for pod, url in urls.items():
            if pod in admin_urls:
                self._poll_runtime(pod, url, admin_urls[pod])
        with self._lock:
            self._urls = urls
            self._runtimes = {p: v for p, v in self._runtimes.items() if p in urls}
        if time.monotonic() - self._last_status >= 1.0:
            self._last_status = time.monotonic()
            self.refresh_status()

    def _admin_token(self, pod: str) -> str | None:
        """The token of the pod's template (a rollout's pods have a new one): the Secret is
        read again only for a template not seen yet."""
        running = self.runner.running(pod)
        template = running.template if running is not None else None
        if template is not None and template not in self._tokens:
            secret = builders.admin_secret_name(self.name)
            with contextlib.suppress(client.ApiException):
                data = self.core.read_namespaced_secret(secret, self.namespace).data or {}
                self._tokens = {t: base64.b64decode(v).decode() for k, v in data.items()
                                if (t := builders.template_of_token_key(k))}  # fmt: skip
        return self._tokens.get(template) if template is not None else None

    def _poll_runtime(self, pod: str, url: str, admin_url: str) -> None:
        healthy = _get(url + "/health")[0] == 200
        code, body = _get(admin_url + MODE_PATH, self._admin_token(pod))
        if code != 200:
            return
        state = json.loads(body)
        view = RuntimeView(healthy, str(state["mode"]), int(state["switches"]))
        with self._lock:
            before = self._runtimes.get(pod)
            self._runtimes[pod] = view
            if healthy and pod not in self._served:
                self._served.add(pod)
                self.confirmations.append(Confirmation(pod, time.time(), view.mode, "serving"))
            if before is not None and view.switches > before.switches:
                since = datetime.fromisoformat(str(state["since"]).replace("Z", "+00:00"))
                self.confirmations.append(
                    Confirmation(pod, since.timestamp(), view.mode, "switched")
                )

    def operator_flip_seconds(self) -> list[float]:
        """The operator's own time per InPlace flip, label patch to verified runtime mode, from
        its ModeFlipped Events (their message says it in milliseconds)."""
        events = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={self.name},reason=ModeFlipped"
        ).items
        found = (re.search(r"runtime confirmed in (\d+) ms", e.message or "") for e in events)
        return [int(m.group(1)) / 1000 for m in found if m]

    def refresh_status(self) -> None:
        obj = self.custom.get_namespaced_custom_object(
            spec.GROUP, spec.VERSION, self.namespace, spec.PLURAL, self.name
        )
        self.status = obj.get("status") or {}
        records = [*(self.status.get("decisionHistory") or []), self.status.get("lastDecision")]
        for record in records:
            if record:
                self.decisions.add(Decision.from_status(record))
                self.records[f"{record['time']} {record.get('applied')}"] = record


# -- one phase: a strategy, its flips ----------------------------------------------------------


@dataclass
class PhaseResult:
    strategy: str
    steps: list[Step]
    records: list[dict[str, Any]]  # status.decisionHistory as written, every record seen
    confirmations: list[Confirmation]
    timings: list[FlipTiming]
    extra: list[Decision]
    requests: int
    errors: list[str]  # of the requests that failed
    operator_flip_seconds: list[float]
    seconds: float

    @property
    def failed(self) -> int:
        return len(self.errors)


async def until(probe: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return True
        await asyncio.sleep(0.1)
    return False


def serving_as(recorder: Recorder, batching: int) -> Callable[[], bool]:
    """A probe: every replica serves, `batching` of them in batching mode."""
    wanted = {BATCHING: batching, STREAMING: REPLICAS - batching}
    return lambda: recorder.serving() == wanted


def timing_of(recorder: Recorder, step: Step) -> FlipTiming:
    """The step's flip as far as seen now (for progress lines; the report matches all steps)."""
    decisions = flip_decisions(list(recorder.decisions), recorder.rolling)
    return match_flips([step], decisions, list(recorder.confirmations))[0][0]


async def drive(
    recorder: Recorder, strategy: str, flips: int, flip_timeout: float, report: LoadReport,
    started: float,
) -> list[Step]:  # fmt: skip
    """Low load until two passes have read metrics, then `flips` alternating steps, each held
    until every runtime serves in the modes the flip leads to (or flip_timeout). A random pause
    before each step puts it anywhere in the loop's interval, as real traffic would."""
    rate = LOW_LOAD
    pauses = random.Random(7)
    load = asyncio.create_task(
        run_load(recorder.serving_urls, lambda _: rate, duration=24 * 3600,
                 max_tokens=MAX_TOKENS, max_requests=10**6, report=report)
    )  # fmt: skip
    steps: list[Step] = []
    try:
        if not await until(recorder.metrics_available, 90):
            raise TimeoutError(f"{strategy}: MetricsAvailable not True after 90s")
        await asyncio.sleep(2 * SETTINGS.interval)
        for index in range(flips):
            to_mode = BATCHING if index % 2 == 0 else STREAMING
            await asyncio.sleep(pauses.uniform(1, 1 + SETTINGS.interval))
            rate = HIGH_LOAD if to_mode == BATCHING else LOW_LOAD
            steps.append(Step(time.time(), to_mode))
            batching = int(to_mode == BATCHING)
            seen = await until(serving_as(recorder, batching), flip_timeout)
            # The flip record reaches status just after the runtime switched.
            await until(lambda: timing_of(recorder, steps[-1]).decision is not None, 5)
            timing = timing_of(recorder, steps[-1])
            progress(f"{strategy} flip {index + 1}/{flips} to {to_mode}: " + (
                f"step->decision {_s(timing.step_to_decision)}, decision->confirmation "
                f"{_s(timing.decision_to_confirmation)}" if seen else
                f"not seen within {flip_timeout:.0f}s (serving {recorder.serving()})"
            ), started)  # fmt: skip
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    return steps


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{1000 * value:.0f} ms" if value < 1 else f"{value:.1f} s"


def run_phase(
    cluster: LocalCluster, prom: LocalPrometheus, namespace: str, strategy: str, flips: int,
    workdir: Path, started: float,
) -> PhaseResult:  # fmt: skip
    rolling = strategy == "Rolling"
    name = f"react-{strategy.lower()}"
    sim_args = ["--model-load-seconds", str(MODEL_LOAD_SECONDS)] if rolling else []
    load_seconds = MODEL_LOAD_SECONDS if rolling else 0
    phase_started = time.monotonic()
    with contextlib.ExitStack() as stack:
        runner = PodRunner(
            cluster, workdir / f"pods-{strategy}", sim_args=sim_args,
            targets_file=prom.targets_file,
        ).start()  # fmt: skip
        stack.callback(runner.stop)
        cluster.apply(resource(name, prom.url, strategy), namespace)
        stack.callback(delete_and_wait, cluster, namespace, name)
        recorder = stack.enter_context(Recorder(cluster, namespace, name, runner, rolling))
        progress(f"{strategy}: {REPLICAS} replicas applied; waiting for them to serve"
                 + (f" (the sim loads its model for {MODEL_LOAD_SECONDS}s)" if rolling else ""),
                 started)  # fmt: skip
        eventually(
            serving_as(recorder, 0), load_seconds + 120, every=0.5,
            what=f"{REPLICAS} {strategy} runtimes serving", ignoring=KUBECTL_FAILED,
        )
        report = LoadReport()
        # A flip is seen when its metrics crossed (seconds), the passes ran, and it applied.
        flip_timeout = 2 * (2 * SETTINGS.interval + SETTINGS.to_streaming_window) + load_seconds
        steps = asyncio.run(drive(recorder, strategy, flips, flip_timeout, report, started))
        time.sleep(2)  # the last status write
        recorder.refresh_status()
        decisions = flip_decisions(list(recorder.decisions), rolling)
        confirmations = sorted(recorder.confirmations, key=lambda c: c.t)
        timings, extra = match_flips(steps, decisions, confirmations)
        records = [recorder.records[k] for k in sorted(recorder.records)]
        operator_flips = recorder.operator_flip_seconds()
    return PhaseResult(
        strategy, steps, records, confirmations, timings, extra,
        requests=len(report.results), errors=[str(r.error) for r in report.failures],
        operator_flip_seconds=operator_flips,
        seconds=time.monotonic() - phase_started,
    )  # fmt: skip


# -- report ------------------------------------------------------------------------------------


def print_table(phases: Sequence[PhaseResult]) -> dict[str, Any]:
    columns = ("step_to_decision", "step_to_flip", "decision_to_confirmation")
    head = f"{'strategy / direction':<24}{'flips':>6}  " + "".join(
        f"{c.replace('_to_', '->').replace('_', ' '):>24}" for c in columns
    )
    print()
    print(head)
    print(f"{'':<30}" + "".join(f"{'p50':>12}{'p95':>12}" for _ in columns))
    print("-" * len(head))
    summary: dict[str, Any] = {}
    for phase in phases:
        for direction in (BATCHING, STREAMING, "all"):
            rows = [t for t in phase.timings if direction in ("all", t.to_mode)]
            stats = summarize(rows)
            summary[f"{phase.strategy}/{direction}"] = stats
            label = f"{phase.strategy} to {direction}" if direction != "all" else phase.strategy
            cells = "".join(f"{_s(stats[c]['p50']):>12}{_s(stats[c]['p95']):>12}" for c in columns)
            print(f"{label:<24}{stats['step_to_flip']['n']:>3}/{len(rows):<3}{cells}")
    print(
        "step->decision: load step to the operator's flip record; step->flip: to the runtime\n"
        "running the new mode (InPlace: its switch time; Rolling: the new pod serving);\n"
        "decision->confirmation: flip record to that moment. Nearest-rank percentiles."
    )
    return summary


def print_comparison(summary: dict[str, Any], phases: Sequence[PhaseResult]) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    for column in ("step_to_flip", "decision_to_confirmation"):
        in_place = summary.get("InPlace/all", {}).get(column, {}).get("p50")
        rolling = summary.get("Rolling/all", {}).get(column, {}).get("p50")
        ratios[column] = rolling / in_place if in_place and rolling else None
    rolling_phase = next((p for p in phases if p.strategy == "Rolling"), None)
    if rolling_phase is not None:
        print(
            f"Rolling ({len(rolling_phase.steps)} flips, each a {MODEL_LOAD_SECONDS}s model load) "
            f"over InPlace, p50: decision->confirmation "
            f"x{_x(ratios['decision_to_confirmation'])}, step->flip x{_x(ratios['step_to_flip'])}"
        )
    for phase in phases:
        if phase.operator_flip_seconds:
            own = spread(phase.operator_flip_seconds)
            print(
                f"{phase.strategy}: the operator's flip itself (label patch, PUT, verifying "
                f"GET; its ModeFlipped Events, {own['n']} flips) took p50 {_s(own['p50'])}, "
                f"p95 {_s(own['p95'])}; before it, the pass read Prometheus and decided"
            )
        print(
            f"{phase.strategy}: {phase.requests} requests, {phase.failed} failed; "
            f"{len(phase.extra)} flip decisions no step explains; phase took {phase.seconds:.0f}s"
        )
    return ratios


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def plot(phases: Sequence[PhaseResult], path: Path) -> None:
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    in_place = next((p for p in phases if p.strategy == "InPlace"), None)
    if in_place is not None:
        for to_mode, color in ((BATCHING, "tab:orange"), (STREAMING, "tab:blue")):
            points = [(i + 1, t) for i, t in enumerate(in_place.timings) if t.to_mode == to_mode]
            left.bar([i for i, _ in points], [t.step_to_decision or 0 for _, t in points],
                     color=color, label=f"to {to_mode}: step -> decision")  # fmt: skip
            left.bar([i for i, _ in points], [t.decision_to_confirmation or 0 for _, t in points],
                     bottom=[t.step_to_decision or 0 for _, t in points], color="black",
                     label="_" if to_mode == STREAMING else "decision -> runtime")  # fmt: skip
            left.axhline(SETTINGS.step_to_flip_target(to_mode), color=color, linestyle="--",
                         label=f"target to {to_mode}")  # fmt: skip
    left.set_xlabel("InPlace flip")
    left.set_ylabel("seconds after the load step")
    left.set_title("Load step to flip applied (InPlace)")
    if in_place is not None:
        left.legend(fontsize=8)
    for phase, marker in zip(phases, ("o", "s"), strict=False):
        values = [t.decision_to_confirmation for t in phase.timings]
        right.scatter(range(1, len(values) + 1), [v if v is not None else float("nan")
                      for v in values], marker=marker, label=phase.strategy)  # fmt: skip
    right.axhline(SETTINGS.confirmation_target, color="tab:red", linestyle="--",
                  label="InPlace target p95")  # fmt: skip
    right.set_yscale("log")
    right.set_xlabel("flip")
    right.set_ylabel("seconds")
    right.set_title(f"Decision to runtime confirmation (Rolling: {MODEL_LOAD_SECONDS}s load)")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(
    phases: list[PhaseResult], args: argparse.Namespace
) -> tuple[list[dict[str, Any]], Any, Any]:
    """The tables and the verdicts, printed; returns the verdicts, the summary and the ratios."""
    summary = print_table(phases)
    ratios = print_comparison(summary, phases)
    in_place = next((p for p in phases if p.strategy == "InPlace"), None)
    checks = []
    if in_place is not None:
        checks = verdicts(in_place.timings, in_place.extra, args.flips, in_place.failed, SETTINGS)
    rolling = next((p for p in phases if p.strategy == "Rolling"), None)
    if rolling is not None:
        confirmed = [t for t in rolling.timings if t.decision_to_confirmation is not None]
        checks.append({
            "target": f"all {args.rolling_flips} Rolling flips decided and serving (compared only)",
            "pass": len(confirmed) == args.rolling_flips,
            "detail": f"{len(confirmed)} of {args.rolling_flips}",
        })  # fmt: skip
    print()
    for check in checks:
        print(f"{'PASS' if check['pass'] else 'FAIL'}: {check['target']}: {check['detail']}")
    return checks, summary, ratios


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="autoglm-reaction-"))
    phases: list[PhaseResult] = []
    with contextlib.ExitStack() as stack:
        if args.keep_files:
            progress(f"logs of the operator, Prometheus and each runtime stay in {workdir}")
        else:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        progress("starting the control plane, Prometheus and the operator", started)
        namespaces = {s: f"react-{s.lower()}" for s in STRATEGIES}
        live = stack.enter_context(live_stack(workdir, list(namespaces.values())))
        cluster, prom = live.cluster, live.prometheus
        for strategy, flips in (("InPlace", args.flips), ("Rolling", args.rolling_flips)):
            if flips:
                phases.append(run_phase(
                    cluster, prom, namespaces[strategy], strategy, flips, workdir, started
                ))  # fmt: skip
    elapsed = time.monotonic() - started
    with results_page("adaptive_reaction"):
        checks, summary, ratios = report(phases, args)

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    payload = {
        "settings": {
            **asdict(SETTINGS), "cooldown": COOLDOWN, "replicas": REPLICAS,
            "qps_per_replica_milli": {"high": QPS_HIGH_MILLI, "low": QPS_LOW_MILLI},
            "qps_rate_window": RATE_WINDOW, "load_req_per_s": {"high": HIGH_LOAD, "low": LOW_LOAD},
            "max_tokens": MAX_TOKENS, "rolling_model_load_seconds": MODEL_LOAD_SECONDS,
            "poll_seconds": POLL_SECONDS,
        },
        "phases": [
            {
                "strategy": p.strategy, "seconds": round(p.seconds, 1), "requests": p.requests,
                "failed": p.failed, "errors": p.errors[:20],
                "operator_flip_seconds": p.operator_flip_seconds,
                "flips": [{**asdict(t), "step_to_decision": t.step_to_decision,
                           "step_to_flip": t.step_to_flip,
                           "decision_to_confirmation": t.decision_to_confirmation}
                          for t in p.timings],
                "extra_decisions": [asdict(d) for d in p.extra],
                "decision_records": p.records,
                "confirmations": [asdict(c) for c in p.confirmations],
            }
            for p in phases
        ],
        "summary": summary,
        "rolling_over_in_place_p50": ratios,
        "targets": checks,
        "elapsed_seconds": round(elapsed, 1),
    }  # fmt: skip
    (OUT_DIR / "adaptive_reaction.json").write_text(json.dumps(payload, indent=1))
    plot(phases, OUT_DIR / "adaptive_reaction.png")
    print(f"wrote {OUT_DIR / 'adaptive_reaction.json'} and .png; benchmark took {elapsed:.0f}s")
    return 0 if checks and all(c["pass"] for c in checks) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flips", type=int, default=20, help="InPlace flips, half each way")
    parser.add_argument(
        "--rolling-flips", type=int, default=4,
        help=f"Rolling flips (each waits for a {MODEL_LOAD_SECONDS}s model load)",
    )  # fmt: skip
    parser.add_argument(
        "--keep-files", action="store_true",
        help="keep the operator, Prometheus and runtime logs (the folder is printed)",
    )  # fmt: skip
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
