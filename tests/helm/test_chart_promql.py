"""Every PromQL expression the chart ships, checked by real Prometheus tools.

- promtool checks the alert rules and the plain-Prometheus config, and runs unit tests of the
  alerts (they fire when they should, and only then);
- a real Prometheus (Debian's /usr/bin/prometheus) on 127.0.0.1 scrapes exporters serving the
  runtime's and the operator's own metric registries (the same code the pods run), loads the
  rendered rules, and answers every dashboard expression and the operator's default queries:
  a parse error or an empty answer fails the test.

Debian's Prometheus is built without Kubernetes service discovery, so the chart's
`kubernetes_sd_configs` are exercised through file_sd: the targets carry the same
__meta_kubernetes_* labels Kubernetes discovery gives a pod (built from the operator's own pod
template), and the chart's relabel_configs run unchanged in the real Prometheus.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from testkit.chart import CHART, one, render
from testkit.localcluster import free_port
from testkit.localprom import LocalPrometheus, serve_exposition

# Renders the chart when collected, and runs promtool and Prometheus.

FULLNAME = "agl-autoglm"
MONITORING_ON = {
    "monitoring.prometheusRule.enabled": True,
    "monitoring.plainPrometheusConfig.enabled": True,
    "monitoring.dashboard.enabled": True,
}
PROMTOOL = "/usr/bin/promtool"
# What the dashboard's variables are set to while its expressions run.
NAMESPACE, DEPLOYMENT = "team-a", "phone"
PODS = ("phone-7d9f-abcde", "phone-7d9f-fghij")
ROUTER_POD = "phone-router-5c8b-klmno"
STANDBY_STATE = "Waking"  # the operator's status.standby.state while the dashboard is queried
# status.autoscaling while the dashboard is queried: a fleet at its max, short of the demand.
FLEET_STATUS = {
    "desiredReplicas": 4, "runningReplicas": 4, "neededReplicas": 4, "reason": "AtMaxReplicas",
    "message": "short: maxReplicas is 4", "demand": "9.500", "expectedGoodput": "8.250",
}  # fmt: skip
GRAFANA_VARIABLES = {
    "$namespace": NAMESPACE,
    "$deployment": DEPLOYMENT,
    "$__rate_interval": "30s",
    "$__range": "5m",
}


def _tool(path: str) -> str:
    if not Path(path).exists():
        found = shutil.which(Path(path).name)
        if not found:
            pytest.fail(f"{path} not found: install Debian's prometheus package", pytrace=False)
        return found
    return path


def _rendered() -> list[dict[str, Any]]:
    return render(MONITORING_ON)


def _rule_groups(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    plain = yaml.safe_load(
        one(docs, "ConfigMap", f"{FULLNAME}-prometheus")["data"]["autoglm.rules.yaml"]
    )
    assert plain["groups"] == groups, "the PrometheusRule and the plain rules file differ"
    return groups  # type: ignore[no-any-return]


def _dashboard_expressions() -> list[str]:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    # Variables: label_values(<selector>, <label>) is Grafana's; Prometheus gets the selector.
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), *\w+\)", variable["query"]["query"])
            assert match, variable["query"]
            exprs.append(match.group(1))
    return exprs


def _substitute(expr: str) -> str:
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown Grafana variable left in {expr}"
    return expr


# -- promtool ------------------------------------------------------------------------------------


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(_rendered())}))
    out = subprocess.run(
        [_tool(PROMTOOL), "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 11 rules found" in out.stdout + out.stderr


def _plain_config(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    data = one(docs, "ConfigMap", f"{FULLNAME}-prometheus")["data"]
    return yaml.safe_load(data["scrape-configs.yaml"]), data["autoglm.rules.yaml"]


def _with_file_sd(job: dict[str, Any], path: Path) -> dict[str, Any]:
    """The job with Kubernetes discovery replaced by a file of targets (see the module doc)."""
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    converted = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
    converted["file_sd_configs"] = [{"files": [str(path)], "refresh_interval": "1s"}]
    return converted


def test_promtool_accepts_the_plain_prometheus_config(tmp_path: Path) -> None:
    jobs, rules = _plain_config(_rendered())
    assert [j["job_name"] for j in jobs] == [
        "autoglm-runtime", "autoglm-router", "autoglm-operator"]
    (tmp_path / "autoglm.rules.yaml").write_text(rules)
    (tmp_path / "targets.json").write_text("[]")
    config = {
        "global": {"scrape_interval": "15s"},
        "rule_files": ["autoglm.rules.yaml"],
        "scrape_configs": [_with_file_sd(j, tmp_path / "targets.json") for j in jobs],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [_tool(PROMTOOL), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def _alert_tests() -> list[dict[str, Any]]:
    ns = {"namespace": NAMESPACE}
    agd = {**ns, "name": DEPLOYMENT}
    pod = {**ns, "autoglm_deployment": DEPLOYMENT, "pod": PODS[0]}
    warn = {"severity": "warning"}

    def series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return {"series": f"{metric}{{{inner}}}", "values": values}

    def alert(name: str, at: str, *expected: dict[str, str]) -> dict[str, Any]:
        return {
            "eval_time": at,
            "alertname": name,
            "exp_alerts": [{"exp_labels": e} for e in expected],
        }

    return [
        {  # One of two replicas stays unready: alert after replicasNotReadyFor (10m), not before.
            "interval": "1m",
            "input_series": [
                series("autoglm_operator_replicas", agd, "2x20"),
                series("autoglm_operator_ready_replicas", agd, "2 2 1x18"),
            ],
            "alert_rule_test": [
                alert("AutoGLMReplicasNotReady", "10m"),
                alert("AutoGLMReplicasNotReady", "13m", {**warn, **agd}),
            ],
        },
        {  # All ready: silence.
            "interval": "1m",
            "input_series": [
                series("autoglm_operator_replicas", agd, "3x20"),
                series("autoglm_operator_ready_replicas", agd, "3x20"),
            ],
            "alert_rule_test": [alert("AutoGLMReplicasNotReady", "15m")],
        },
        {  # A pod's /metrics stops answering; the other keeps going.
            "interval": "1m",
            "input_series": [
                series("up", {**pod, "job": "runtime"}, "1 1 0x10"),
                series("up", {**pod, "pod": PODS[1], "job": "runtime"}, "1x12"),
                series("up", {"job": "unrelated", **ns, "pod": "x"}, "0x12"),
            ],
            "alert_rule_test": [
                alert("AutoGLMRuntimeMetricsDown", "5m"),
                alert("AutoGLMRuntimeMetricsDown", "8m", {**warn, **pod}),
            ],
        },
        {  # The operator cannot use Prometheus for this deployment.
            "interval": "1m",
            "input_series": [series("autoglm_operator_metrics_available", agd, "1 1 0x10")],
            "alert_rule_test": [
                alert("AutoGLMMetricsUnavailable", "4m"),
                alert("AutoGLMMetricsUnavailable", "8m", {**warn, **agd}),
            ],
        },
        {  # Flapping: 6 switches within 30 minutes fires; 2 per half hour does not.
            "interval": "5m",
            "input_series": [
                series("autoglm_mode_switches_total", pod, "0 2 4 6 6 6 6 6 6"),
                series("autoglm_mode_switches_total", {**pod, "pod": PODS[1]}, "0 0 1 1 2 2 3 3 4"),
            ],
            "alert_rule_test": [
                alert("AutoGLMModeFlapping", "10m"),
                alert("AutoGLMModeFlapping", "30m", {**warn, **pod}),
            ],
        },
        {  # Queue-full rejections for over 10 minutes; drain rejections alone never alert.
            "interval": "1m",
            "input_series": [
                series(
                    "autoglm_requests_rejected_total", {**pod, "reason": "queue_full"}, "0+30x20"
                ),
                series(
                    "autoglm_requests_rejected_total",
                    {**pod, "pod": PODS[1], "reason": "draining"},
                    "0+30x20",
                ),
            ],
            "alert_rule_test": [
                alert("AutoGLMRequestsRejected", "5m"),
                alert(
                    "AutoGLMRequestsRejected",
                    "17m",
                    {"severity": "info", **ns, "autoglm_deployment": DEPLOYMENT},
                ),
            ],
        },
        *_router_alert_tests(series, alert),
        *_fleet_alert_tests(series, alert),
    ]


def _router_alert_tests(series: Any, alert: Any) -> list[dict[str, Any]]:
    """The router's alerts: two router pods of one AutoGLMDeployment."""
    agd = {"namespace": NAMESPACE, "autoglm_deployment": DEPLOYMENT}
    routers = [{**agd, "pod": ROUTER_POD}, {**agd, "pod": ROUTER_POD + "x"}]

    def replicas(values: str) -> list[dict[str, str]]:
        return [series("autoglm_router_replicas", {**r, "mode": m}, values)
                for r in routers for m in ("streaming", "batching", "unknown")]

    def requests(outcome: str, values: str, mode: str = "streaming") -> dict[str, str]:
        labels = {**routers[0], "traffic_class": "streamed_chat", "mode": mode,
                  "outcome": outcome}
        return series("autoglm_router_requests_total", labels, values)

    def added(phase: str, buckets: dict[str, str]) -> list[dict[str, str]]:
        return [series("autoglm_router_added_latency_seconds_bucket",
                       {**routers[0], "phase": phase, "le": le}, values)
                for le, values in buckets.items()]

    slow = {"0.01": "0+50x20", "0.025": "0+50x20", "0.05": "0+100x20", "+Inf": "0+100x20"}
    fast = dict.fromkeys(("0.01", "0.025", "0.05", "+Inf"), "0+100x20")
    return [
        {  # Every replica gone from both routers while requests arrive: critical after 2m.
            "interval": "1m",
            "input_series": [*replicas("2 2 0x12"), requests("refused", "0+60x14", "none")],
            "alert_rule_test": [
                alert("AutoGLMRouterNoReplicas", "3m"),
                alert("AutoGLMRouterNoReplicas", "6m", {"severity": "critical", **agd}),
            ],
        },
        {  # No replica but no requests either (a deployment scaled to nothing): silence.
            "interval": "1m",
            "input_series": [*replicas("0x14"), requests("ok", "5x14")],
            "alert_rule_test": [alert("AutoGLMRouterNoReplicas", "10m")],
        },
        {  # A held request answered 503 (its wait ran out) fires at once; none held, none.
            "interval": "1m",
            "input_series": [
                series("autoglm_router_hold_overflows_total", {**routers[0], "reason": "timeout"},
                       "0 0 0 1 1 1 1 1 1 1 1 1"),
                series("autoglm_router_hold_overflows_total", {**routers[1], "reason": "full"},
                       "0x11"),
            ],
            "alert_rule_test": [
                alert("AutoGLMHoldQueueOverflow", "2m"),
                alert("AutoGLMHoldQueueOverflow", "4m", {"severity": "warning", **agd}),
                alert("AutoGLMHoldQueueOverflow", "11m"),
            ],
        },
        *_held_without_wake_tests(series, alert, routers),
        {  # 10% of requests fail at the replicas for over 5 minutes.
            "interval": "1m",
            "input_series": [requests("ok", "0+90x20"), requests("upstream_error", "0+6x20"),
                             requests("aborted", "0+4x20")],
            "alert_rule_test": [
                alert("AutoGLMRouterUpstreamErrors", "4m"),
                alert("AutoGLMRouterUpstreamErrors", "12m", {"severity": "warning", **agd}),
            ],
        },
        {  # 1% failing, or clients' own errors, is not the replicas' fault.
            "interval": "1m",
            "input_series": [requests("ok", "0+99x20"), requests("unreachable", "0+1x20"),
                             requests("client_error", "0+50x20")],
            "alert_rule_test": [alert("AutoGLMRouterUpstreamErrors", "15m")],
        },
        {  # Half the requests wait 25-50 ms in the router: p99 ~ 50 ms, for over 10 minutes.
            "interval": "1m",
            "input_series": added("request", slow),
            "alert_rule_test": [
                alert("AutoGLMRouterAddedLatencyHigh", "8m"),
                alert("AutoGLMRouterAddedLatencyHigh", "15m", {"severity": "warning", **agd}),
            ],
        },
        {  # Fast requests; a slow first_byte phase is the client's reading, not the router.
            "interval": "1m",
            "input_series": [*added("request", fast), *added("first_byte", slow)],
            "alert_rule_test": [alert("AutoGLMRouterAddedLatencyHigh", "15m")],
        },
    ]


def _fleet_alert_tests(series: Any, alert: Any) -> list[dict[str, Any]]:
    """AutoGLMFleetAtMaxReplicas: at maxReplicas and short of the demand for 15m fires (its value
    the replicas); a shorter spell, a fleet that fits, or one still growing does not."""
    from autoglm_operator.io.metrics import AUTOSCALING_REASONS

    agd = {"namespace": NAMESPACE, "name": DEPLOYMENT}
    fired = {"severity": "warning", **agd}

    def fleet(desired: str, reasons: dict[str, str]) -> list[dict[str, str]]:
        """The reason gauges as observe_fleet sets them: `reasons` gives a reason's values, the
        others read 0 throughout."""
        steps = len(desired.split()) if "x" not in desired else 25
        return [series("autoglm_operator_autoscaling_desired_replicas", agd, desired),
                *(series("autoglm_operator_autoscaling_reason", {**agd, "reason": r},
                         reasons.get(r, f"0x{steps}")) for r in AUTOSCALING_REASONS)]

    return [
        {  # Grows to its max of 4 (needing more), and stays short: fires 15m after it got there.
            "interval": "1m",
            "input_series": fleet("2 3 4x22", {"ScaledUp": "1 1 0x22",
                                               "AtMaxReplicas": "0 0 1x22"}),
            "alert_rule_test": [
                alert("AutoGLMFleetAtMaxReplicas", "10m"),
                alert("AutoGLMFleetAtMaxReplicas", "16m"),
                alert("AutoGLMFleetAtMaxReplicas", "18m", {**fired}),
            ],
        },
        {  # At its max for 10 minutes, then the demand fits again: never 15m, silence.
            "interval": "1m",
            "input_series": fleet("4x24", {"AtMaxReplicas": "1x9 0x14",
                                           "FleetFitsDemand": "0x9 1x14"}),
            "alert_rule_test": [alert("AutoGLMFleetAtMaxReplicas", "20m")],
        },
        {  # Short but still growing (a step up waits for its window): not at the max, silence.
            "interval": "1m",
            "input_series": fleet("2x24", {"ScaleUpStabilizing": "1x24"}),
            "alert_rule_test": [alert("AutoGLMFleetAtMaxReplicas", "20m")],
        },
        {  # Autoscaling turned off mid-spell: the series go (observe_fleet drops them).
            "interval": "1m",
            "input_series": [
                series("autoglm_operator_autoscaling_desired_replicas", agd, "4x9 _x14"),
                series("autoglm_operator_autoscaling_reason",
                       {**agd, "reason": "AtMaxReplicas"}, "1x9 _x14"),
            ],
            "alert_rule_test": [alert("AutoGLMFleetAtMaxReplicas", "20m")],
        },
    ]


def _held_without_wake_tests(
    series: Any, alert: Any, routers: list[dict[str, str]]
) -> list[dict[str, Any]]:
    """AutoGLMHeldWithoutWake: held for 2m with no wake under way fires; a wake, a start or a
    short hold does not."""
    agd = {"namespace": NAMESPACE, "name": DEPLOYMENT}
    fired = {"severity": "critical", "namespace": NAMESPACE, "autoglm_deployment": DEPLOYMENT}

    def held(first: str, second: str = "0x12") -> list[dict[str, str]]:
        return [series("autoglm_router_held_requests", routers[0], first),
                series("autoglm_router_held_requests", routers[1], second)]

    def standby(current: str) -> list[dict[str, str]]:
        return [series("autoglm_operator_standby_state", {**agd, "state": state},
                       "1x12" if state == current else "0x12")
                for state in ("Serving", "Asleep", "Idle", "Waking", "AutoscalerConflict")]

    def replicas(wanted: str, ready: str) -> list[dict[str, str]]:
        return [series("autoglm_operator_replicas", agd, wanted),
                series("autoglm_operator_ready_replicas", agd, ready)]

    return [
        {  # Idle at zero, a router holds, the operator starts nothing: fires after 2m.
            "interval": "1m",
            "input_series": [*held("0 2x11", "0 0 1x10"), *standby("Idle"),
                             *replicas("0x12", "0x12")],
            "alert_rule_test": [
                alert("AutoGLMHeldWithoutWake", "2m"),
                alert("AutoGLMHeldWithoutWake", "4m", fired),
            ],
        },
        {  # Held while every replica is ready (routers that do not see them): fires too.
            "interval": "1m",
            "input_series": [*held("1x12"), *standby("Serving"), *replicas("2x12", "2x12")],
            "alert_rule_test": [alert("AutoGLMHeldWithoutWake", "5m", fired)],
        },
        {  # Waking: the wake is under way, however long the hold (the state alone says so).
            "interval": "1m",
            "input_series": [*held("3x12"), *standby("Waking")],
            "alert_rule_test": [alert("AutoGLMHeldWithoutWake", "10m")],
        },
        {  # No scaleToZero (KEDA woke it): a replica asked for and not ready yet is a start.
            "interval": "1m",
            "input_series": [*held("1x12"), *replicas("0 1x11", "0x12")],
            "alert_rule_test": [alert("AutoGLMHeldWithoutWake", "10m")],
        },
        {  # Held for a minute at zero, then released: shorter than the 2m.
            "interval": "1m",
            "input_series": [*held("0 1 1 0x9"), *standby("Idle"), *replicas("0x12", "0x12")],
            "alert_rule_test": [alert("AutoGLMHeldWithoutWake", "2m"),
                                alert("AutoGLMHeldWithoutWake", "10m")],
        },
    ]


def test_alerts_fire_when_they_should_and_only_then(tmp_path: Path) -> None:
    groups = _rule_groups(_rendered())
    # The logic under test is expr/for/labels; annotation templates are promtool check's job.
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": _alert_tests()}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    out = subprocess.run(
        [_tool(PROMTOOL), "test", "rules", "tests.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    assert tested == {r["alert"] for g in groups for r in g["rules"]}, "an alert has no test"


# -- a real Prometheus -----------------------------------------------------------------------------


def _exporter(registries: list[CollectorRegistry]) -> ThreadingHTTPServer:
    return serve_exposition(lambda: b"".join(generate_latest(r) for r in registries))


def _runtime_registries(pod_index: int) -> list[CollectorRegistry]:
    """One serving pod's /metrics: the sim's vllm:* registry and the runtime's autoglm_* one."""
    from autoglm_api.profiles import Mode
    from autoglm_runtime.metrics import runtime_metrics
    from testkit.sim.metrics import SimMetrics

    vllm = SimMetrics.create("autoglm-phone-9b", 2048)
    labels = vllm.labels
    vllm.success.labels(*labels, "stop").inc(10 + pod_index)
    vllm.waiting.labels(*labels).set(3)
    vllm.running.labels(*labels).set(8)
    vllm.kv_usage.labels(*labels).set(0.4)
    vllm.ttft.labels(*labels).observe(0.32)
    vllm.e2e.labels(*labels).observe(2.1)
    own = CollectorRegistry()
    metrics = runtime_metrics(own)
    mode = Mode.BATCHING if pod_index else Mode.STREAMING
    for m in Mode:
        metrics.mode.labels(m.value).set(1 if m is mode else 0)
    metrics.switches.inc(pod_index)
    metrics.rejected.labels("queue_full").inc()
    metrics.queued.set(2)
    metrics.inflight.set(5)
    gib = 1024**3
    metrics.gpu.source = lambda: [(0, 19 * gib, 24 * gib), (1, 18 * gib, 24 * gib)]
    return [vllm.registry, own]


def _router_registry() -> CollectorRegistry:
    """A router pod's /metrics: the router's own registry, after some traffic."""
    from autoglm_router.metrics import router_metrics

    metrics = router_metrics()
    metrics.requests.labels("streamed_chat", "streaming", "ok").inc(20)
    metrics.requests.labels("other", "batching", "upstream_error").inc()
    metrics.retries.labels("draining").inc()
    metrics.placements.labels("hit").inc(12)
    metrics.ttft.labels("streamed_chat").observe(0.3)
    metrics.added_latency.labels("request").observe(0.0004)
    metrics.added_latency.labels("first_byte").observe(0.0001)
    for replica, count in (("http://10.0.0.7:8000", 3), ("http://10.0.0.8:8000", 2)):
        metrics.inflight.labels(replica).set(count)
    for mode, count in (("streaming", 1), ("batching", 1), ("unknown", 0)):
        metrics.replicas.labels(mode).set(count)
    metrics.held.set(2)
    metrics.hold_seconds.observe(42.0)
    metrics.hold_overflows.labels("client_full").inc()
    return metrics.registry


def _router_pod() -> dict[str, Any]:
    """A router pod as the operator builds it (router_builders.pod_template), serving /metrics
    on its http port: the chart's router scrape must select what the operator creates."""
    from autoglm_operator.reconcile.children import router as router_builders
    from autoglm_operator.reconcile.children import serving as builders
    from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

    owner = builders.Owner(DEPLOYMENT, NAMESPACE, "uid")
    template = router_builders.pod_template(owner, AutoGLMDeploymentSpec())
    chart_labels = yaml.safe_load(_helper_labels("autoglm.routerPodLabels"))
    assert chart_labels.items() <= template["metadata"]["labels"].items()
    return {"metadata": {"name": ROUTER_POD, "namespace": NAMESPACE,
                         "labels": template["metadata"]["labels"]},
            "spec": {"containers": template["spec"]["containers"]}}


def _helper_labels(name: str) -> str:
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(r'define "' + re.escape(name) + r'" -}}\n(.*?)\n{{- end', text, re.S)
    assert match, name
    return match.group(1)


def _operator_registry() -> CollectorRegistry:
    from autoglm_operator.io.metrics import OperatorMetrics

    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    metrics.decisions.labels(NAMESPACE, DEPLOYMENT, "LoadHigh").inc()
    metrics.flips.labels(NAMESPACE, DEPLOYMENT, "batching", "applied").inc()
    metrics.metrics_available.labels(NAMESPACE, DEPLOYMENT).set(1)
    metrics.replicas.labels(NAMESPACE, DEPLOYMENT).set(2)
    metrics.ready_replicas.labels(NAMESPACE, DEPLOYMENT).set(2)
    metrics.query_seconds.labels("qps").observe(0.01)
    metrics.query_errors.labels("qps", "NoData").inc()
    metrics.observe_standby(NAMESPACE, DEPLOYMENT, {"state": STANDBY_STATE, "heldRequests": 2})
    metrics.observe_fleet(NAMESPACE, DEPLOYMENT, FLEET_STATUS, ["ScaledUp", "ScaledDown"])
    return registry


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _kubernetes_sd_targets(
    pod: dict[str, Any], local_port: int, port_name: str = "http"
) -> list[dict[str, Any]]:
    """What Prometheus' Kubernetes discovery (role: pod) yields for each container port of `pod`,
    with the address pointed at a local exporter. Only the port named `port_name` is reachable;
    the others stay as targets the relabeling must drop."""
    meta = pod["metadata"]
    common = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
        "__meta_kubernetes_pod_ip": "127.0.0.1",
    }
    for key, value in meta.get("labels", {}).items():
        common[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
        common[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
    targets = []
    for container in pod["spec"]["containers"]:
        for port in container.get("ports", []):
            reachable = port.get("name") == port_name
            labels = {
                **common,
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
            }
            address = f"127.0.0.1:{local_port if reachable else free_port()}"
            targets.append({"targets": [address], "labels": labels})
    return targets


def _runtime_pod(name: str) -> dict[str, Any]:
    """A serving pod as the operator builds it (its Deployment's pod template, with a name)."""
    from autoglm_operator.reconcile.children import serving as builders
    from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

    template = builders.pod_template(DEPLOYMENT, AutoGLMDeploymentSpec())
    labels = {**template["metadata"]["labels"], "autoglm.io/mode": "streaming"}
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": template["spec"],
    }


def _chart_operator_pod() -> dict[str, Any]:
    deployment = one(_rendered(), "Deployment", FULLNAME)
    template = deployment["spec"]["template"]
    return {
        "metadata": {
            "name": f"{FULLNAME}-0",
            "namespace": "autoglm-system",
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus scraping two serving pods and the operator every second."""
    workdir = tmp_path_factory.mktemp("prometheus")
    servers = [_exporter(_runtime_registries(i)) for i in range(len(PODS))]
    operator = _exporter([_operator_registry()])
    router = _exporter([_router_registry()])
    groups = _rule_groups(_rendered())
    (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    jobs, _ = _plain_config(_rendered())
    runtime_job, router_job, operator_job = (
        _with_file_sd(j, workdir / f"{j['job_name']}.json") for j in jobs)
    runtime_targets = []
    for pod, server in zip(PODS, servers, strict=True):
        manifest = _runtime_pod(pod)
        runtime_targets += _kubernetes_sd_targets(manifest, server.server_address[1])
    (workdir / "autoglm-runtime.json").write_text(json.dumps(runtime_targets))
    (workdir / "autoglm-router.json").write_text(
        json.dumps(_kubernetes_sd_targets(_router_pod(), router.server_address[1],
                                          port_name="metrics")))
    operator_pod = _chart_operator_pod()
    (workdir / "autoglm-operator.json").write_text(
        json.dumps(
            _kubernetes_sd_targets(operator_pod, operator.server_address[1], port_name="metrics")
        )
    )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [runtime_job, router_job, operator_job],
    }
    prom = LocalPrometheus(workdir, custom_config=config).start()
    url = prom.url
    try:
        # rate() over 30s needs two samples of every target, and every rule evaluated once.
        deadline = time.monotonic() + 30
        while _count("count(up == 1)", url) < 4 or _count("count_over_time(up[30s])", url) < 4 * 3:
            assert time.monotonic() < deadline, "targets not scraped three times in 30s"
            time.sleep(0.5)
        yield url
    finally:
        prom.stop()
        for server in [*servers, operator, router]:
            server.shutdown()
            server.server_close()


def _query(expr: str, url: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as err:
        return json.loads(err.read())  # type: ignore[no-any-return]


def _count(expr: str, url: str) -> int:
    body = _query(expr, url)
    result = body.get("data", {}).get("result", [])
    return int(float(result[0]["value"][1])) if result else 0


@pytest.mark.parametrize("expr", _dashboard_expressions())
def test_dashboard_expression_answers(prometheus: str, expr: str) -> None:
    body = _query(_substitute(expr), prometheus)
    assert body["status"] == "success", f"{expr}: {body.get('errorType')}: {body.get('error')}"
    assert body["data"]["result"], f"no data for {expr}"


def test_alert_rules_load_and_evaluate_without_errors(prometheus: str) -> None:
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10) as response:
        groups = json.loads(response.read())["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == 11
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
        body = _query(rule["query"], prometheus)
        assert body["status"] == "success", f"{rule['name']}: {body.get('error')}"


def test_operator_default_queries_find_the_scraped_pods(prometheus: str) -> None:
    """The labels the chart's scrape configs produce are the ones the adaptive pass selects on."""
    from autoglm_operator.io.prom import DEFAULT_QUERIES
    from autoglm_operator.io.prom import render as render_query

    for name, template in DEFAULT_QUERIES.items():
        body = _query(render_query(template, NAMESPACE, PODS, DEPLOYMENT), prometheus)
        assert body["status"] == "success", f"{name}: {body.get('error')}"
        assert body["data"]["result"], f"{name}: no data for {template}"
    # Demand comes from the router pod the chart's router scrape labels, not the fallback.
    routers = DEFAULT_QUERIES["chat_rate"].split(" or ")[0]
    assert "autoglm_router_requests_total" in routers
    body = _query(render_query(routers, NAMESPACE, PODS, DEPLOYMENT), prometheus)
    assert body["data"]["result"], "the router selector misses the scraped router pod"


def test_mode_per_replica_shows_each_pods_mode(prometheus: str) -> None:
    panel_expr = next(e for e in _dashboard_expressions() if 'mode="batching"' in e)
    result = _query(_substitute(panel_expr), prometheus)["data"]["result"]
    assert {r["metric"]["pod"]: r["value"][1] for r in result} == {PODS[0]: "0", PODS[1]: "1"}


def test_standby_panel_names_each_deployments_current_state(prometheus: str) -> None:
    from autoglm_operator.io.metrics import STANDBY_STATES

    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    panel = next(p for p in dashboard["panels"] if p["title"] == "Standby state")
    (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
    names = {code: m["text"] for code, m in mapping["options"].items()}
    assert sorted(names.values()) == sorted(STANDBY_STATES), "a state the panel cannot name"
    (target,) = panel["targets"]
    result = _query(_substitute(target["expr"]), prometheus)["data"]["result"]
    assert [(r["metric"]["name"], names.get(r["value"][1])) for r in result] == [
        (DEPLOYMENT, STANDBY_STATE)]


def test_fleet_reason_panel_names_each_deployments_current_reason(prometheus: str) -> None:
    from autoglm_operator.io.metrics import AUTOSCALING_REASONS

    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    panel = next(p for p in dashboard["panels"] if p["title"] == "Fleet sizing reason")
    (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
    names = {code: m["text"] for code, m in mapping["options"].items()}
    assert sorted(names.values()) == sorted(AUTOSCALING_REASONS), "a reason the panel cannot name"
    (target,) = panel["targets"]
    result = _query(_substitute(target["expr"]), prometheus)["data"]["result"]
    assert [(r["metric"]["name"], names.get(r["value"][1])) for r in result] == [
        (DEPLOYMENT, FLEET_STATUS["reason"])]


def test_fleet_panels_show_the_status_figures(prometheus: str) -> None:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    panel = next(p for p in dashboard["panels"] if p["title"] == "Demand and expected goodput")
    demand, goodput = (_query(_substitute(t["expr"]), prometheus)["data"]["result"]
                       for t in panel["targets"])  # fmt: skip
    assert [(r["metric"]["name"], r["value"][1]) for r in demand] == [(DEPLOYMENT, "9.5")]
    assert [(r["metric"]["name"], r["value"][1]) for r in goodput] == [(DEPLOYMENT, "8.25")]
    panel = next(p for p in dashboard["panels"] if p["title"] == "Scale events")
    (target,) = panel["targets"]
    result = _query(_substitute(target["expr"]), prometheus)["data"]["result"]
    assert sorted(r["metric"]["direction"] for r in result) == ["down", "up"]


def test_held_requests_panel_shows_the_routers_and_the_operators_count(prometheus: str) -> None:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    panel = next(p for p in dashboard["panels"] if p["title"] == "Held requests")
    routers, operator = (_query(_substitute(t["expr"]), prometheus)["data"]["result"]
                         for t in panel["targets"])  # fmt: skip
    assert [(r["metric"]["pod"], r["value"][1]) for r in routers] == [(ROUTER_POD, "2")]
    assert [(r["metric"]["name"], r["value"][1]) for r in operator] == [(DEPLOYMENT, "2")]


def test_gpu_memory_panel_is_a_fraction_per_pod(prometheus: str) -> None:
    panel_expr = next(e for e in _dashboard_expressions() if "autoglm_gpu_memory_used_bytes" in e)
    result = _query(_substitute(panel_expr), prometheus)["data"]["result"]
    assert {r["metric"]["pod"] for r in result} == set(PODS)
    for r in result:
        assert float(r["value"][1]) == pytest.approx(37 / 48)


def test_scrape_config_relabels_pods_as_the_queries_expect(prometheus: str) -> None:
    with urllib.request.urlopen(
        f"{prometheus}/api/v1/targets?state=active", timeout=10
    ) as response:
        active = json.loads(response.read())["data"]["activeTargets"]
    runtime = [t for t in active if t["labels"]["job"] == "autoglm-runtime"]
    # One target per serving pod: the http port only.
    assert sorted(t["labels"]["pod"] for t in runtime) == sorted(PODS)
    for target in runtime:
        assert {k: v for k, v in target["labels"].items() if k not in ("instance", "pod")} == {
            "job": "autoglm-runtime", "namespace": NAMESPACE, "autoglm_deployment": DEPLOYMENT,
        }  # fmt: skip
        assert target["health"] == "up", target.get("lastError")
    (router,) = [t for t in active if t["labels"]["job"] == "autoglm-router"]
    assert router["health"] == "up", router.get("lastError")
    assert {k: v for k, v in router["labels"].items() if k != "instance"} == {
        "job": "autoglm-router", "namespace": NAMESPACE, "autoglm_deployment": DEPLOYMENT,
        "pod": ROUTER_POD}  # fmt: skip
    (operator,) = [t for t in active if t["labels"]["job"] == "autoglm-operator"]
    assert operator["health"] == "up", operator.get("lastError")
    # honor_labels: the operator's own namespace/name labels survive on its series.
    body = _query("autoglm_operator_metrics_available", prometheus)
    assert [r["metric"]["namespace"] for r in body["data"]["result"]] == [NAMESPACE]


# -- every metric the chart queries is one the code exports ---------------------------------------


def _exported_names() -> set[str]:
    registries = [*_runtime_registries(0), _operator_registry(), _router_registry()]
    names = {"up"}
    for registry in registries:
        for family in registry.collect():
            names.update(sample.name for sample in family.samples)
    return names


def _referenced_names() -> set[str]:
    rules = [r["expr"] for g in _rule_groups(_rendered()) for r in g["rules"]]
    pattern = re.compile(r"(?<![\w:])((?:vllm:|autoglm_)[A-Za-z0-9_:]*)")
    found = {m for expr in [*_dashboard_expressions(), *rules] for m in pattern.findall(expr)}
    return found - {"autoglm_deployment"}  # the label the scrape configs add, not a metric


@pytest.mark.parametrize("name", sorted(_referenced_names()))
def test_referenced_metric_is_exported_by_the_code(name: str) -> None:
    assert name in _exported_names(), f"{name} is queried by the chart but no registry exports it"
