"""How far does the operator scale? 1000 fake GPU nodes, 200 AutoGLMDeployments at once.

    .venv/bin/python bench/operator_scale.py [--nodes 1000] [--deployments 200] [--quiet-minutes 4]

Starts its own local control plane (testkit.localcluster: etcd, kube-apiserver, controller
manager, scheduler, kwok), creates `--nodes` fake nodes of 8 GPUs each, Debian's Prometheus
(no scrape targets, so every query answers empty and the adaptive pass reports NoData) and the
real operator as a subprocess watching 4 namespaces (testkit.operator_kit: every API
request it sends is logged). Then one server-side apply per namespace, all at once, creates
the AutoGLMDeployments, 2 to 4 replicas each, every one with spec.adaptive.prometheus.url on
that Prometheus and a 10 s interval. A watch on AutoGLMDeployments times what they say.

Pods get loopback IPs, so the operator's runtime admin calls are refused at once (no runtime
runs); the endpoint controllers are off, as Endpoints reject loopback addresses and they would
retry for every Service all run long (a local artifact, not a cost a real cluster pays).

Phases: rollout (the apply until every object is Ready), settle (30 s), quiet (nothing changes,
`--quiet-minutes` whole minutes), changes (`--changes` spec edits at 2 per second). Measured:

- time until all are Ready: status condition Ready=True and readyReplicas == replicas == spec;
- reconcile latency: the operator exports no reconcile histogram, so it is measured by the watch
  as the time from an object's new metadata.generation to status.observedGeneration reaching
  it; during the rollout (creation, all at once) and for the trickled spec edits;
- the operator's API requests per minute in the quiet phase (the counting wrapper; watches
  apart), and apiserver_request_total of its resource kinds from every client as a cross-check;
- the operator's RSS (VmRSS of its process tree, sampled every second) over the whole run;
- the adaptive pass in the quiet phase: Prometheus queries (its query log attributes each query
  to a deployment by its selector; prometheus_http_requests_total counts them all) against
  the operator's adaptive rounds (autoglm_operator_adaptive_decisions per deployment);
- CPU seconds of each process per phase, and of the whole machine (it is shared).

Targets: all Ready within 5 minutes; quiet API requests per minute flat (least-squares trend at
most max(1, 5% of the mean) per minute); RSS below 300 MB; Prometheus queries per adaptive
round equal to one round's queries (coverage + each signal) for every replica count, so they
do not scale with pods; 0.8 to 1.05 rounds per interval per deployment (a round every
intervalSeconds, plus the pass itself).

Writes out/bench/operator_scale.json and .png; prints a table and PASS/FAIL per target.
Exit status 1 when a target fails.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import HTTPError

from autoglm_operator.io import prom
from autoglm_operator.resource.spec import GROUP, PLURAL, VERSION
from testkit.bench import scale_stats as stats
from testkit.localcluster import LocalCluster, ensure_binaries, http_ok, log, loopback_pod_cidr
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import Operator, agd_object, apiserver_requests
from testkit.paths import CRD_FILE, OUT_DIR
from testkit.plots import pyplot
from testkit.report import results_page

NAMESPACES = 4
INTERVAL_SECONDS = 10
SETTLE_SECONDS = 30
CHANGES_PER_SECOND = 2.0
# Pods get loopback IPs (so the operator's runtime calls are refused at once); Endpoints and
# EndpointSlices reject those, and these controllers would retry 600 Services all run long.
ENDPOINT_CONTROLLERS = (
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
)
# One adaptive round: the coverage query, then one query per signal.
QUERIES_PER_ROUND = 1 + len(prom.SIGNALS)
READY_TARGET_SECONDS = 300
RSS_TARGET_BYTES = 300 * 1024 * 1024
ROUNDS_PER_INTERVAL = (0.8, 1.05)
ROLLOUT_TIMEOUT_SECONDS = 480
CATCH_UP_TIMEOUT_SECONDS = 120


def replicas_of(index: int) -> int:
    return 2 + index % 3


# -- measuring -------------------------------------------------------------------------------


class AgdWatch(threading.Thread):
    """Every AutoGLMDeployment event, timed on arrival: generations, observedGenerations,
    readiness. One cluster-wide watch; reconnects from the last resourceVersion."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(daemon=True, name="agd-watch")
        self.api = client.CustomObjectsApi(api)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        # Per object, (value, first time seen) each time the value grew.
        self.generation_seen: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self.observed_seen: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self.ready: set[tuple[str, str]] = set()
        self.ready_timeline: list[tuple[float, int]] = []

    def run(self) -> None:
        version = ""
        while not self.stopping.is_set():
            stream = watch.Watch().stream(
                self.api.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                resource_version=version, timeout_seconds=60, allow_watch_bookmarks=True,
            )  # fmt: skip
            try:
                for event in stream:
                    if event["type"] == "ERROR":  # the watch expired: start from a new list
                        version = ""
                        break
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._see(obj, time.time())
            except ApiException as error:
                if error.status == 410:
                    version = ""  # expired: start over from a fresh list
                else:
                    log(f"AutoGLMDeployment watch: {error}; reconnecting")
                    time.sleep(1)
            except (OSError, HTTPError) as error:  # a dropped connection
                log(f"AutoGLMDeployment watch: {error!r}; reconnecting")
                time.sleep(1)

    def _see(self, obj: dict[str, Any], now: float) -> None:
        meta, st = obj["metadata"], obj.get("status") or {}
        key = (meta["namespace"], meta["name"])
        wanted = int(obj["spec"].get("replicas", 1))
        ready = (
            any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])
            and st.get("readyReplicas") == wanted
            and st.get("replicas") == wanted
        )
        with self.lock:
            for seen, value in (
                (self.generation_seen, int(meta["generation"])),
                (self.observed_seen, int(st.get("observedGeneration") or 0)),
            ):
                history = seen.setdefault(key, [])
                if value and (not history or value > history[-1][0]):
                    history.append((value, now))
            if ready != (key in self.ready):
                (self.ready.add if ready else self.ready.discard)(key)
                self.ready_timeline.append((now, len(self.ready)))

    def ready_count(self) -> int:
        with self.lock:
            return len(self.ready)

    def latency(self, key: tuple[str, str], generation: int) -> float:
        """From the watch first showing `generation` (or later) to status.observedGeneration
        reaching it; inf while it has not."""

        def first(history: list[tuple[int, float]]) -> float | None:
            return next((t for value, t in history if value >= generation), None)

        with self.lock:
            seen = first(self.generation_seen.get(key, []))
            caught = first(self.observed_seen.get(key, []))
        return caught - seen if seen is not None and caught is not None else float("inf")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def process_tree(root: int) -> list[int]:
    """root and every descendant, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def tree_usage(root: int) -> tuple[int, float]:
    """(RSS bytes, CPU seconds) of a process and its descendants; vanished ones count 0."""
    rss, cpu = 0, 0.0
    for pid in process_tree(root):
        with contextlib.suppress(OSError, IndexError, ValueError):
            rss += _rss_bytes(pid)
            cpu += _cpu_seconds(pid)
    return rss, cpu


def host_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot, all cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class Sampler(threading.Thread):
    """The operator's RSS and CPU every second."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.pid = pid
        self.samples: list[tuple[float, int, float]] = []  # (time, rss bytes, cpu seconds)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            rss, cpu = tree_usage(self.pid)
            if rss:
                self.samples.append((time.time(), rss, cpu))


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample a /metrics endpoint serves."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Scale:
    cluster: LocalCluster
    prometheus: LocalPrometheus
    operator: Operator
    deployments: dict[tuple[str, str], int]  # (namespace, name) -> replicas
    api: client.ApiClient
    watch: AgdWatch
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)

    # CPU accounting per phase: which process spent the machine's time.
    def _cpu_now(self) -> dict[str, float]:
        pids = {name: proc.pid for name, proc in self.cluster.processes.items()}
        assert self.prometheus.process is not None and self.operator.proc is not None
        pids["prometheus"] = self.prometheus.process.pid
        pids["operator"] = self.operator.proc.pid
        now = {name: tree_usage(pid)[1] for name, pid in pids.items()}
        now["bench (watch, sampler)"] = _cpu_seconds(os.getpid())
        now["machine, all processes"] = host_busy_seconds()
        return now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        log(f"phase {name}")
        before, start = self._cpu_now(), time.time()
        try:
            yield
        finally:
            after, end = self._cpu_now(), time.time()
            self.phases[name] = (start, end)
            self.cpu[name] = {k: round(after[k] - before.get(k, 0.0), 1) for k in after}
            self.cpu[name]["wall seconds"] = round(end - start, 1)

    def rollout(self) -> None:
        by_namespace: dict[str, list[dict[str, Any]]] = {}
        for (namespace, name), replicas in self.deployments.items():
            obj = agd_object(
                replicas=replicas,
                adaptive={
                    "intervalSeconds": INTERVAL_SECONDS,
                    "prometheus": {"url": self.prometheus.url},
                },
            )
            obj["metadata"] = {"name": name, "namespace": namespace}
            by_namespace.setdefault(namespace, []).append(obj)

        def apply(items: list[dict[str, Any]]) -> None:
            listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
            self.cluster.kubectl("apply", "--server-side", "-f", "-", input=listed, timeout=300)

        # One server-side apply per namespace, all at once.
        start = time.time()
        with ThreadPoolExecutor(max_workers=len(by_namespace)) as pool:
            list(pool.map(apply, by_namespace.values()))
        applied = time.time()
        items = [obj for objs in by_namespace.values() for obj in objs]
        log(f"applied {len(items)} AutoGLMDeployments in {applied - start:.1f}s")
        deadline = time.monotonic() + ROLLOUT_TIMEOUT_SECONDS
        last = -1
        while self.watch.ready_count() < len(items) and time.monotonic() < deadline:
            if self.watch.ready_count() != last:
                last = self.watch.ready_count()
                log(f"{last}/{len(items)} Ready after {time.time() - start:.0f}s")
            time.sleep(2)
        ready = self.watch.ready_count()
        all_ready_at = next((t for t, n in self.watch.ready_timeline if n == len(items)), None)
        self.result["rollout"] = {
            "deployments": len(items),
            "pods": sum(self.deployments.values()),
            "apply_seconds": round(applied - start, 1),
            "ready": ready,
            "all_ready_seconds": round(all_ready_at - start, 1) if all_ready_at else None,
            "timeline": [(round(t - start, 2), n) for t, n in self.watch.ready_timeline],
        }

    def quiet(self, minutes: int) -> None:
        metrics = f"http://127.0.0.1:{self.operator.metrics_port}/metrics"
        prom_metrics = f"{self.prometheus.url}/metrics"
        query_log = self.prometheus.workdir / "queries.jsonl"
        start = time.time()
        apiserver = [apiserver_requests(self.cluster)]
        operator_before, prom_before = scrape(metrics), scrape(prom_metrics)
        log_offset = query_log.stat().st_size if query_log.exists() else 0
        for minute in range(minutes):
            time.sleep(max(0.0, start + 60 * (minute + 1) - time.time()))
            apiserver.append(apiserver_requests(self.cluster))
        end = time.time()
        operator_after, prom_after = scrape(metrics), scrape(prom_metrics)
        with query_log.open() as file:
            file.seek(log_offset)
            logged = stats.parse_query_log(file.read().splitlines())

        calls = self.operator.calls(start, end)
        requests = [c for c in calls if not stats.is_watch(str(c["url"]))]
        watches = [c for c in calls if stats.is_watch(str(c["url"]))]
        per_minute = stats.per_interval((c["t"] for c in requests), start, 60, minutes)
        kinds = Counter(stats.request_kind(c) for c in requests)
        all_clients = [
            sum(later.values()) - sum(earlier.values())
            for earlier, later in itertools.pairwise(apiserver)
        ]
        busiest = Counter(
            {f"{verb} {kind}": n - apiserver[0].get((kind, verb), 0.0)
             for (kind, verb), n in apiserver[-1].items()}
        ).most_common(6)  # fmt: skip
        kinds_per_minute = {
            kind: stats.per_interval(
                (c["t"] for c in requests if stats.request_kind(c) == kind), start, 60, minutes
            )
            for kind in kinds
        }
        self.result["quiet"] = {
            "minutes": minutes,
            "requests_per_minute": per_minute,
            "trend_per_minute": round(stats.slope(per_minute), 2),
            "flat": stats.flat(per_minute),
            "request_kinds": dict(kinds.most_common()),
            "watch_requests": len(watches),
            "kinds_per_minute": kinds_per_minute,
            "apiserver_all_clients_per_minute": [round(v) for v in all_clients],
            "apiserver_all_clients_busiest": {k: round(v) for k, v in busiest},
        }
        self.result["adaptive"] = self._adaptive(
            end - start, logged, operator_before, operator_after, prom_before, prom_after
        )

    def _adaptive(
        self,
        seconds: float,
        logged: list[stats.LoggedQuery],
        operator_before: list[tuple[str, dict[str, str], float]],
        operator_after: list[tuple[str, dict[str, str], float]],
        prom_before: list[tuple[str, dict[str, str], float]],
        prom_after: list[tuple[str, dict[str, str], float]],
    ) -> dict[str, Any]:
        def rounds(samples: list[tuple[str, dict[str, str], float]]) -> Counter[tuple[str, str]]:
            found: Counter[tuple[str, str]] = Counter()
            for name, labels, value in samples:
                if name == "autoglm_operator_adaptive_decisions_total":
                    found[labels["namespace"], labels["name"]] += value
            return found

        def total(
            samples: list[tuple[str, dict[str, str], float]], name: str, **match: str
        ) -> float:
            return sum(
                v for n, labels, v in samples
                if n == name and all(labels.get(k) == m for k, m in match.items())
            )  # fmt: skip

        before, after = rounds(operator_before), rounds(operator_after)
        per_deployment = {key: after[key] - before[key] for key in self.deployments}
        received = total(
            prom_after, "prometheus_http_requests_total", handler="/api/v1/query"
        ) - total(prom_before, "prometheus_http_requests_total", handler="/api/v1/query")
        sent = total(operator_after, "autoglm_operator_prometheus_query_seconds_count") - total(
            operator_before, "autoglm_operator_prometheus_query_seconds_count"
        )
        by_replicas = stats.queries_per_round(logged, per_deployment, self.deployments)
        nominal = seconds / INTERVAL_SECONDS
        total_rounds = sum(per_deployment.values())
        return {
            "interval_seconds": INTERVAL_SECONDS,
            "window_seconds": round(seconds, 1),
            "queries_per_round_expected": QUERIES_PER_ROUND,
            "queries_received_by_prometheus": received,
            "queries_sent_by_operator": sent,
            "queries_logged": len(logged),
            "rounds": total_rounds,
            "one_round_per_interval": round(nominal * len(self.deployments) * QUERIES_PER_ROUND),
            "one_round_per_pod": round(
                nominal * sum(self.deployments.values()) * QUERIES_PER_ROUND
            ),
            "rounds_per_interval_per_deployment": round(
                total_rounds / (nominal * len(self.deployments)), 3
            ),
            "by_replicas": {str(k): v for k, v in by_replicas.items()},
        }

    def changes(self, count: int) -> list[float]:
        """Spec edits at CHANGES_PER_SECOND; the reconcile latency of each."""
        api = client.CustomObjectsApi(self.api)
        keys = list(self.deployments)
        edited: list[tuple[tuple[str, str], int]] = []
        start = time.time()
        for index in range(count):
            time.sleep(max(0.0, start + index / CHANGES_PER_SECOND - time.time()))
            key = keys[index % len(keys)]
            patch = {"spec": {"adaptive": {"cooldownSeconds": 121 + index}}}
            obj = api.patch_namespaced_custom_object(
                GROUP, VERSION, key[0], PLURAL, key[1], patch
            )
            edited.append((key, int(obj["metadata"]["generation"])))
        wait(
            "status.observedGeneration of every edit",
            lambda: all(self.watch.latency(k, g) < float("inf") for k, g in edited),
            CATCH_UP_TIMEOUT_SECONDS,
            fail=False,
        )
        return [self.watch.latency(k, g) for k, g in edited]


def start_prometheus(workdir: Path) -> LocalPrometheus:
    """Prometheus with nothing to scrape and a query log: which deployment asked what."""
    server = LocalPrometheus(workdir)
    server.custom_config = {
        "global": {
            "scrape_interval": "15s",
            "evaluation_interval": "15s",
            "query_log_file": str(workdir / "queries.jsonl"),
        },
        "scrape_configs": [],
    }
    return server.start()


def install_crd(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    jsonpath = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    name = f"{PLURAL}.{GROUP}"

    def established() -> bool:
        # check=False: the jsonpath errors while the new CRD has no conditions at all.
        return cluster.kubectl("get", "crd", name, "-o", jsonpath, check=False).stdout == "True"

    wait("CRD Established", established, 60)
    # The apiserver's watch cache for a new resource starts a moment later (until then lists
    # and watches answer 429): let the operator start after it.
    cached = f"/apis/{GROUP}/{VERSION}/{PLURAL}?resourceVersion=0&limit=1"
    wait(
        "AutoGLMDeployment watch cache",
        lambda: cluster.kubectl("get", "--raw", cached, check=False).returncode == 0,
        60,
    )


def wait(what: str, probe: Callable[[], bool], timeout: float, fail: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            if fail:
                raise TimeoutError(f"{what} after {timeout}s")
            log(f"gave up waiting for {what} after {timeout}s")
            return
        time.sleep(0.5)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        started = time.time()
        prometheus = start_prometheus(workdir / "prometheus")
        stack.callback(prometheus.stop)
        cluster = LocalCluster(
            workdir / "cluster",
            ensure_binaries(),
            loopback_pod_cidr(),
            disabled_controllers=ENDPOINT_CONTROLLERS,
        )
        stack.callback(cluster.stop)
        cluster.start()
        nodes_start = time.time()
        cluster.add_gpu_nodes([f"gpu-{i:04d}" for i in range(args.nodes)], gpus=8)
        nodes_ready = time.time() - nodes_start
        log(f"{args.nodes} nodes Ready in {nodes_ready:.1f}s")
        install_crd(cluster)
        namespaces = [f"scale-{i}" for i in range(NAMESPACES)]
        for namespace in namespaces:
            cluster.kubectl("create", "namespace", namespace)
            cluster.kubectl(
                "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
            )
        deployments = {
            (namespaces[i % NAMESPACES], f"agd-{i:03d}"): replicas_of(i)
            for i in range(args.deployments)
        }
        extra = [flag for ns in namespaces[1:] for flag in ("--namespace", ns)]
        operator = Operator(cluster, namespaces[0], workdir / "operator", args=extra)
        operator.workdir.mkdir()
        operator.start()
        stack.callback(operator.stop)
        metrics = f"http://127.0.0.1:{operator.metrics_port}/metrics"
        wait("operator /metrics", lambda: http_ok(metrics), 60)
        assert operator.proc is not None

        api = config.new_client_from_config(config_file=cluster.kubeconfig)
        agd_watch = AgdWatch(api)
        agd_watch.start()
        sampler = Sampler(operator.proc.pid)
        sampler.start()
        scale = Scale(cluster, prometheus, operator, deployments, api, agd_watch)
        scale.result["setup"] = {
            "nodes": args.nodes,
            "nodes_ready_seconds": round(nodes_ready, 1),
            "setup_seconds": round(time.time() - started, 1),
        }
        with scale.phase("rollout"):
            scale.rollout()
        with scale.phase("settle"):
            time.sleep(SETTLE_SECONDS)
        with scale.phase("quiet"):
            scale.quiet(args.quiet_minutes)
        with scale.phase("changes"):
            steady = scale.changes(args.changes)
        sampler.stopping.set()

        burst = [agd_watch.latency(key, 1) for key in deployments]
        scale.result["reconcile_latency"] = {
            "method": "watch: new metadata.generation -> status.observedGeneration",
            "rollout": stats.summary(burst),
            "changes": stats.summary(steady),
            "changes_per_second": CHANGES_PER_SECOND,
            "rollout_values": sorted(round(x, 3) for x in burst),
            "changes_values": sorted(round(x, 3) for x in steady),
        }
        scale.result["rss"] = {
            "max_bytes": max(s[1] for s in sampler.samples),
            "by_phase_max_bytes": {
                name: max((s[1] for s in sampler.samples if lo <= s[0] < hi), default=0)
                for name, (lo, hi) in scale.phases.items()
            },
            "samples": [
                (round(t - started, 1), rss, round(cpu, 2)) for t, rss, cpu in sampler.samples
            ],
        }
        scale.result["phases"] = {
            name: (round(lo - started, 1), round(hi - started, 1))
            for name, (lo, hi) in scale.phases.items()
        }
        scale.result["cpu_seconds"] = scale.cpu
        scale.result["operator_log_errors"] = [
            line for line in operator.logs().splitlines() if " ERROR " in line
        ][:20]
        agd_watch.stopping.set()
        return scale.result


# -- report ----------------------------------------------------------------------------------


def _s(value: float | None, unit: str = "s", digits: int = 2) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "never"
    return f"{value:.{digits}f} {unit}".strip()


def print_report(r: dict[str, Any]) -> None:
    ro, q, ad, lat = r["rollout"], r["quiet"], r["adaptive"], r["reconcile_latency"]
    print()
    print(f"setup: {r['setup']['nodes']} kwok nodes Ready in {r['setup']['nodes_ready_seconds']}s")
    print(
        f"rollout: {ro['deployments']} AutoGLMDeployments, {ro['pods']} pods; applied in "
        f"{ro['apply_seconds']}s; all Ready after {_s(ro['all_ready_seconds'])} "
        f"({ro['ready']}/{ro['deployments']} Ready)"
    )
    print()
    print(
        f"{'reconcile latency (' + lat['method'] + ')':<72}{'n':>5}{'p50':>9}{'p99':>9}{'max':>9}"
    )
    for name, label in (("rollout", "creation, all at once"), ("changes", "spec edits, 2/s")):
        row = lat[name]
        print(
            f"  {label:<70}{row['n']:>5}{_s(row['p50']):>9}{_s(row['p99']):>9}{_s(row['max']):>9}"
        )
    print()
    print(f"quiet state, {q['minutes']} minutes: operator API requests per minute (watches apart)")
    print("  " + "  ".join(str(n) for n in q["requests_per_minute"]) + f"   trend "
          f"{q['trend_per_minute']:+.2f}/min; kinds {q['request_kinds'] or 'none'}; "
          f"{q['watch_requests']} watch requests")  # fmt: skip
    print(
        "  apiserver, every client, the operator's resource kinds: "
        + "  ".join(str(n) for n in q["apiserver_all_clients_per_minute"])
        + f"; most: {q['apiserver_all_clients_busiest']}"
    )
    print()
    print(
        f"adaptive pass, {ad['window_seconds']}s at {ad['interval_seconds']}s interval: "
        f"Prometheus received {ad['queries_received_by_prometheus']:.0f} queries (operator sent "
        f"{ad['queries_sent_by_operator']:.0f}, query log {ad['queries_logged']}); one round per "
        f"interval per deployment would be {ad['one_round_per_interval']}, per pod "
        f"{ad['one_round_per_pod']}; {ad['rounds_per_interval_per_deployment']} rounds per "
        "interval per deployment"
    )
    print(f"  {'replicas':>8}{'deployments':>13}{'rounds':>8}{'queries':>9}{'q/round':>9}"
          f"{'pods/query':>12}")  # fmt: skip
    for size, row in ad["by_replicas"].items():
        print(
            f"  {size:>8}{row['deployments']:>13}{row['rounds']:>8.0f}{row['queries']:>9}"
            f"{row['queries_per_round']:>9.2f}{row['pods_per_query']:>12.2f}"
        )
    print()
    rss = r["rss"]
    print(
        f"operator RSS: max {rss['max_bytes'] / 2**20:.0f} MB; by phase "
        + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in rss["by_phase_max_bytes"].items())
    )
    print()
    names = list(next(iter(r["cpu_seconds"].values())))
    print(f"{'CPU seconds':<26}" + "".join(f"{p:>10}" for p in r["cpu_seconds"]))
    for name in names:
        print(
            f"  {name:<24}" + "".join(f"{r['cpu_seconds'][p][name]:>10}" for p in r["cpu_seconds"])
        )
    if r["operator_log_errors"]:
        print("\noperator log ERROR lines (first 20):\n  " + "\n  ".join(r["operator_log_errors"]))


def check(r: dict[str, Any]) -> list[dict[str, Any]]:
    verdicts: list[dict[str, Any]] = []

    def verdict(target: str, ok: bool, detail: str) -> None:
        verdicts.append({"target": target, "pass": ok, "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'}: {target}: {detail}")

    print()
    ro = r["rollout"]
    seconds = ro["all_ready_seconds"]
    verdict(
        f"all {ro['deployments']} Ready within {READY_TARGET_SECONDS}s",
        seconds is not None and seconds < READY_TARGET_SECONDS,
        f"{ro['ready']}/{ro['deployments']} Ready after {_s(seconds)}",
    )
    q = r["quiet"]
    verdict(
        "quiet-state API requests per minute flat",
        q["flat"],
        f"{q['requests_per_minute']} per minute, trend {q['trend_per_minute']:+.2f}/min",
    )
    rss = r["rss"]["max_bytes"]
    verdict(
        f"operator RSS below {RSS_TARGET_BYTES // 2**20} MB",
        rss < RSS_TARGET_BYTES,
        f"max {rss / 2**20:.0f} MB over the run",
    )
    ad = r["adaptive"]
    per_round = {k: v["queries_per_round"] for k, v in ad["by_replicas"].items()}
    verdict(
        f"{QUERIES_PER_ROUND} Prometheus queries per round whatever the replicas (not per pod)",
        all(abs(v - QUERIES_PER_ROUND) <= 0.1 * QUERIES_PER_ROUND for v in per_round.values()),
        ", ".join(f"{k} replicas: {v:.2f}" for k, v in per_round.items()),
    )
    low, high = ROUNDS_PER_INTERVAL
    rate = ad["rounds_per_interval_per_deployment"]
    verdict(
        "one adaptive round per interval per deployment",
        low <= rate <= high,
        f"{rate} rounds per {ad['interval_seconds']}s interval (accepted {low}..{high}); "
        f"Prometheus received {ad['queries_received_by_prometheus']:.0f} queries, one round per "
        f"interval would be {ad['one_round_per_interval']}, one per pod "
        f"{ad['one_round_per_pod']}",
    )
    return verdicts


def plot(r: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    ro = r["rollout"]
    ax = axes[0][0]
    timeline = [(0.0, 0), *ro["timeline"]]
    ax.step([t for t, _ in timeline], [n for _, n in timeline], where="post")
    ax.axvline(READY_TARGET_SECONDS, color="red", ls="--", lw=0.8, label="target")
    ax.set(title=f"AutoGLMDeployments Ready ({ro['pods']} pods)", xlabel="s since apply",
           ylabel="Ready")  # fmt: skip
    ax.legend()

    ax = axes[0][1]
    rss = r["rss"]
    ax.plot([s[0] for s in rss["samples"]], [s[1] / 2**20 for s in rss["samples"]])
    ax.axhline(RSS_TARGET_BYTES / 2**20, color="red", ls="--", lw=0.8, label="target")
    for index, (name, (lo, hi)) in enumerate(r["phases"].items()):
        ax.axvspan(lo, hi, alpha=0.12, color=f"C{index + 1}")
        ax.text((lo + hi) / 2, 10, name, ha="center", fontsize=8)
    ax.set(title="operator RSS (process tree)", xlabel="s since start", ylabel="MB",
           ylim=(0, None))  # fmt: skip
    ax.legend()

    ax = axes[0][2]
    lat = r["reconcile_latency"]
    for name in ("rollout", "changes"):
        values = lat[f"{name}_values"]
        finite = [v for v in values if v != float("inf")]
        if finite:
            ax.plot(finite, [(i + 1) / len(values) for i in range(len(finite))], label=name)
    ax.set(title="reconcile latency (generation -> observedGeneration)", xlabel="s",
           ylabel="fraction", xscale="log")  # fmt: skip
    ax.legend()

    ax = axes[1][0]
    q = r["quiet"]
    minutes = list(range(1, q["minutes"] + 1))
    bottom = [0] * len(minutes)
    for kind, counts in q["kinds_per_minute"].items():
        ax.bar(minutes, counts, bottom=bottom, label=kind)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set(title="operator API requests per minute, quiet (watches apart)", xlabel="minute",
           ylabel="requests", xticks=minutes)  # fmt: skip
    if q["kinds_per_minute"]:
        ax.legend(fontsize=8)

    ax = axes[1][1]
    ad = r["adaptive"]
    sizes = list(ad["by_replicas"])
    ax.bar(sizes, [ad["by_replicas"][s]["queries_per_round"] for s in sizes], label="measured")
    ax.plot(sizes, [QUERIES_PER_ROUND * int(s) for s in sizes], "x--", color="grey",
            label="if one round per pod")  # fmt: skip
    ax.axhline(QUERIES_PER_ROUND, color="red", ls="--", lw=0.8, label="one round")
    ax.set(title="Prometheus queries per adaptive round", xlabel="replicas of the deployment",
           ylabel="queries")  # fmt: skip
    ax.legend()

    ax = axes[1][2]
    cpu = r["cpu_seconds"]
    phases = list(cpu)
    names = [n for n in next(iter(cpu.values())) if n not in ("wall seconds",)]
    bottom = [0.0] * len(phases)
    for name in names:
        if name == "machine, all processes":
            continue
        values = [cpu[p][name] / max(cpu[p]["wall seconds"], 1e-9) for p in phases]
        ax.bar(phases, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    machine = [cpu[p]["machine, all processes"] / max(cpu[p]["wall seconds"], 1e-9) for p in phases]
    ax.plot(phases, machine, "k_", ms=30, mew=2, label="whole machine")
    ax.set(title="CPU cores busy, by process", ylabel="cores")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _json_safe(value: Any) -> Any:
    """inf (a latency that never caught up) as "never": JSON has no infinity."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return "never" if value == float("inf") else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--deployments", type=int, default=200)
    parser.add_argument("--quiet-minutes", type=int, default=4)
    parser.add_argument("--changes", type=int, default=100, help="spec edits at 2 per second")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="autoglm-scale-"))
    try:
        result = run(args, workdir)
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_seconds"] = round(time.monotonic() - began, 1)
    with results_page("operator_scale"):
        print_report(result)
        result["targets"] = check(result)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "operator_scale.json").write_text(json.dumps(_json_safe(result), indent=1))
    plot(result, OUT_DIR / "operator_scale.png")
    print(f"wrote {OUT_DIR / 'operator_scale.json'} and .png; benchmark took "
          f"{result['elapsed_seconds']:.0f}s")  # fmt: skip
    return 0 if all(v["pass"] for v in result["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
