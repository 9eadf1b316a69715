"""Bad values fail at install with a message that names the value; the chart's CRD copy is current;
the `helm test` script passes and fails when it should, run for real against a local server."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from testkit.chart import CHART, CHART_CRD, CRD_SOURCE, REPO, one, render, run_helm, template_args

_APPS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
_PROMETHEUS = {"prometheus": {"url": "http://prometheus.monitoring:9090"}}
# (the key a case is about, the values, text the error must contain)
BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("networkPolicy.enabled", {"networkPolicy.enabled": "yes"}, "at '/networkPolicy/enabled'"),
    ("networkPolicy.clients", {"networkPolicy.enabled": True},
     "networkPolicy.enabled needs networkPolicy.clients"),
    ("networkPolicy.clients", {"networkPolicy.clients": [{}]},
     "at '/networkPolicy/clients/0': minProperties"),
    ("networkPolicy.clients", {"networkPolicy.clients": [{"podSelectors": {}}]},
     "at '/networkPolicy/clients/0': additional properties 'podSelectors' not allowed"),
    ("networkPolicy.namespaces",
     {"networkPolicy.enabled": True, "networkPolicy.clients": [_APPS],
      "networkPolicy.namespaces": ["Bad_NS"]}, "at '/networkPolicy/namespaces/0'"),
    ("networkPolicy.prometheus", {"networkPolicy.prometheus": [{"ipBlock": {}}]},
     "at '/networkPolicy/prometheus/0/ipBlock': missing property 'cidr'"),
    ("networkPolicy.prometheus",
     {"networkPolicy.enabled": True, "networkPolicy.clients": [_APPS],
      "networkPolicy.prometheus": [{"namespaceSelector": {},
                                    "podSelector": {"matchLabels": {"app": "prometheus"}}}]},
     "networkPolicy.prometheus: each peer names its namespace"),
    ("networkPolicy.gateway", {"networkPolicy.gateway": [{"podSelectors": {}}]},
     "at '/networkPolicy/gateway/0': additional properties 'podSelectors' not allowed"),
    ("networkPolicy.gateway",
     {"networkPolicy.enabled": True, "networkPolicy.clients": [_APPS],
      "networkPolicy.gateway": [{"podSelector": {"matchLabels": {"istio": "ingressgateway"}}}]},
     "networkPolicy.gateway: each peer names its namespace"),
    ("networkPolicy.egress.deniedCidrs", {"networkPolicy.egress.deniedCidrs": ["metadata"]},
     "at '/networkPolicy/egress/deniedCidrs/0'"),
    ("networkPolicy.egress.enabled", {"networkPolicy.egress.enabled": "no"},
     "at '/networkPolicy/egress/enabled'"),
    ("networkPolicy.egress.dns", {"networkPolicy.egress.dns": [{"ipBlock": {}}]},
     "at '/networkPolicy/egress/dns/0/ipBlock': missing property 'cidr'"),
    ("networkPolicy.egress.allowed", {"networkPolicy.egress.allowed": [{}]},
     "at '/networkPolicy/egress/allowed/0': minProperties"),
    ("nameOverride", {"nameOverride": "AutoGLM_Operator"}, "at '/nameOverride'"),
    ("fullnameOverride", {"fullnameOverride": "x" * 64}, "at '/fullnameOverride'"),
    ("image.registry", {"image.registry": "ghcr.io/Team/"}, "at '/image/registry'"),
    ("image.repository", {"image.repository": "ghcr.io/AutoGLM/operator"},
     "at '/image/repository'"),
    ("image.tag", {"image.tag": "0.1.0 latest"}, "at '/image/tag'"),
    ("image.digest", {"image.digest": "latest"}, "at '/image/digest'"),
    ("image.pullPolicy", {"image.pullPolicy": "Sometimes"}, "at '/image/pullPolicy'"),
    ("imagePullSecrets", {"imagePullSecrets": [{"name": "Registry Key"}]},
     "at '/imagePullSecrets/0/name'"),
    ("imagePullSecrets", {"imagePullSecrets": ["regcred"]},
     "at '/imagePullSecrets/0': got string, want object"),
    ("operator.replicas", {"operator.replicas": -1}, "at '/operator/replicas'"),
    ("operator.replicas", {"operator.replicas": 6}, "at '/operator/replicas'"),
    ("operator.replicas", {"operator.replicas": "2"},
     "at '/operator/replicas': got string, want integer"),
    ("operator.scope", {"operator.scope": "Clusterwide"},
     "at '/operator/scope': value must be one of 'Cluster', 'Namespace'"),
    ("operator.watchNamespaces", {"operator.watchNamespaces": ["Bad_NS"]},
     "at '/operator/watchNamespaces/0'"),
    ("operator.watchNamespaces",
     {"operator.scope": "Namespace", "operator.watchNamespaces": ["a", "a"]},
     "at '/operator/watchNamespaces'"),
    ("operator.healthPort", {"operator.healthPort": 70000}, "at '/operator/healthPort'"),
    ("operator.metricsPort", {"operator.metricsPort": 0}, "at '/operator/metricsPort'"),
    ("operator.logLevel", {"operator.logLevel": "trace"}, "at '/operator/logLevel'"),
    ("operator.extraArgs", {"operator.extraArgs": "--verbose"},
     "at '/operator/extraArgs': got string, want array"),
    ("operator.extraEnv", {"operator.extraEnv": [{"value": "1"}]},
     "at '/operator/extraEnv/0': missing property 'name'"),
    ("operator.resources", {"operator.resources": {"limits": {"memory": True}}},
     "at '/operator/resources/limits/memory'"),
    ("operator.podAnnotations", {"operator.podAnnotations": {"team": 7}},
     "at '/operator/podAnnotations/team': got number, want string"),
    ("operator.podLabels", {"operator.podLabels": {"tier": True}},
     "at '/operator/podLabels/tier': got boolean, want string"),
    ("operator.nodeSelector", {"operator.nodeSelector": ["linux"]},
     "at '/operator/nodeSelector': got array, want object"),
    ("operator.tolerations", {"operator.tolerations": ["gpu"]},
     "at '/operator/tolerations/0': got string, want object"),
    ("operator.affinity", {"operator.affinity": "zone-a"},
     "at '/operator/affinity': got string, want object"),
    ("operator.priorityClassName", {"operator.priorityClassName": "High Priority"},
     "at '/operator/priorityClassName'"),
    ("operator.podDisruptionBudget.enabled", {"operator.podDisruptionBudget.enabled": "yes"},
     "at '/operator/podDisruptionBudget/enabled': got string, want boolean"),
    ("operatr", {"operatr": {"replicas": 2}}, "additional properties 'operatr' not allowed"),
    ("serviceAccount.create", {"serviceAccount.create": "false"},
     "at '/serviceAccount/create': got string, want boolean"),
    ("serviceAccount.name", {"serviceAccount.name": "Operator SA"}, "at '/serviceAccount/name'"),
    ("serviceAccount.annotations", {"serviceAccount.annotations": {"role-arn": 12}},
     "at '/serviceAccount/annotations/role-arn': got number, want string"),
    ("rbac.create", {"rbac.create": "yes"}, "at '/rbac/create': got string, want boolean"),
    ("rbac.userRoles", {"rbac.userRoles": 1}, "at '/rbac/userRoles': got number, want boolean"),
    ("monitoring.scrapeAnnotations", {"monitoring.scrapeAnnotations": "true"},
     "at '/monitoring/scrapeAnnotations': got string, want boolean"),
    ("monitoring.deploymentLabel", {"monitoring.deploymentLabel": "app instance"},
     "at '/monitoring/deploymentLabel'"),
    ("monitoring.podMonitor.enabled", {"monitoring.podMonitor.enabled": "on"},
     "at '/monitoring/podMonitor/enabled': got string, want boolean"),
    ("monitoring.podMonitor.interval", {"monitoring.podMonitor.interval": 15},
     "at '/monitoring/podMonitor/interval': got number, want string"),
    ("monitoring.podMonitor.scrapeTimeout", {"monitoring.podMonitor.scrapeTimeout": "10 s"},
     "at '/monitoring/podMonitor/scrapeTimeout'"),
    ("monitoring.podMonitor.labels", {"monitoring.podMonitor.labels": {"release": 1}},
     "at '/monitoring/podMonitor/labels/release': got number, want string"),
    ("monitoring.serviceMonitor.enabled", {"monitoring.serviceMonitor.enabled": 1},
     "at '/monitoring/serviceMonitor/enabled': got number, want boolean"),
    ("monitoring.serviceMonitor.interval", {"monitoring.serviceMonitor.interval": "half a minute"},
     "at '/monitoring/serviceMonitor/interval'"),
    ("monitoring.serviceMonitor.scrapeTimeout", {"monitoring.serviceMonitor.scrapeTimeout": "-5s"},
     "at '/monitoring/serviceMonitor/scrapeTimeout'"),
    ("monitoring.serviceMonitor.labels", {"monitoring.serviceMonitor.labels": "release=prom"},
     "at '/monitoring/serviceMonitor/labels': got string, want object"),
    ("monitoring.prometheusRule.enabled", {"monitoring.prometheusRule.enabled": "no"},
     "at '/monitoring/prometheusRule/enabled': got string, want boolean"),
    ("monitoring.prometheusRule.labels", {"monitoring.prometheusRule.labels": {"team": False}},
     "at '/monitoring/prometheusRule/labels/team': got boolean, want string"),
    ("monitoring.prometheusRule.replicasNotReadyFor",
     {"monitoring.prometheusRule.replicasNotReadyFor": "10 minutes"},
     "at '/monitoring/prometheusRule/replicasNotReadyFor'"),
    ("monitoring.prometheusRule.metricsUnavailableFor",
     {"monitoring.prometheusRule.metricsUnavailableFor": 300},
     "at '/monitoring/prometheusRule/metricsUnavailableFor': got number, want string"),
    ("monitoring.prometheusRule.flappingWindow",
     {"monitoring.prometheusRule.flappingWindow": "half an hour"},
     "at '/monitoring/prometheusRule/flappingWindow'"),
    ("monitoring.prometheusRule.maxModeSwitches", {"monitoring.prometheusRule.maxModeSwitches": 0},
     "at '/monitoring/prometheusRule/maxModeSwitches'"),
    ("monitoring.prometheusRule.heldWithoutWakeFor",
     {"monitoring.prometheusRule.heldWithoutWakeFor": "2 minutes"},
     "at '/monitoring/prometheusRule/heldWithoutWakeFor'"),
    ("monitoring.prometheusRule.fleetAtMaxReplicasFor",
     {"monitoring.prometheusRule.fleetAtMaxReplicasFor": "a quarter hour"},
     "at '/monitoring/prometheusRule/fleetAtMaxReplicasFor'"),
    ("monitoring.plainPrometheusConfig.enabled",
     {"monitoring.plainPrometheusConfig.enabled": "true"},
     "at '/monitoring/plainPrometheusConfig/enabled': got string, want boolean"),
    ("monitoring.dashboard.enabled", {"monitoring.dashboard.enabled": "yes"},
     "at '/monitoring/dashboard/enabled': got string, want boolean"),
    ("monitoring.dashboard.namespace", {"monitoring.dashboard.namespace": "Grafana"},
     "at '/monitoring/dashboard/namespace'"),
    ("monitoring.dashboard.labels", {"monitoring.dashboard.labels": {"grafana_dashboard": 1}},
     "at '/monitoring/dashboard/labels/grafana_dashboard': got number, want string"),
    ("monitoring.dashboard.annotations", {"monitoring.dashboard.annotations": ["folder"]},
     "at '/monitoring/dashboard/annotations': got array, want object"),
    ("deployment.create", {"deployment.create": "true"},
     "at '/deployment/create': got string, want boolean"),
    ("deployment.name", {"deployment.name": "Phone_9B"}, "at '/deployment/name'"),
    ("deployment.name", {"deployment.name": "p" * 54}, "at '/deployment/name'"),
    ("deployment.spec", {"deployment.spec": "replicas: 2"},
     "at '/deployment/spec': got string, want object"),
    # deployment.spec.autoscaling: the CRD's types and bounds, and no misspelt key.
    ("deployment.spec.autoscaling", {"deployment.spec": {"autoscaling": {"enabled": "true"}}},
     "at '/deployment/spec/autoscaling/enabled': got string, want boolean"),
    ("deployment.spec.autoscaling", {"deployment.spec": {"autoscaling": {"maxReplicas": 0}}},
     "at '/deployment/spec/autoscaling/maxReplicas'"),
    ("deployment.spec.autoscaling", {"deployment.spec": {"autoscaling": {"minReplicas": -1}}},
     "at '/deployment/spec/autoscaling/minReplicas'"),
    ("deployment.spec.autoscaling",
     {"deployment.spec": {"autoscaling": {"headroomPercent": 250}}},
     "at '/deployment/spec/autoscaling/headroomPercent'"),
    ("deployment.spec.autoscaling",
     {"deployment.spec": {"autoscaling": {"scaleDown": {"maxStep": 0}}}},
     "at '/deployment/spec/autoscaling/scaleDown/maxStep'"),
    ("deployment.spec.autoscaling",
     {"deployment.spec": {"autoscaling": {"scaleUp": {"stabilisationSeconds": 30}}}},
     "at '/deployment/spec/autoscaling/scaleUp': additional properties 'stabilisationSeconds'"),
    ("deployment.spec.autoscaling", {"deployment.spec": {"autoscaling": {"maxReplica": 8}}},
     "at '/deployment/spec/autoscaling': additional properties 'maxReplica' not allowed"),
    ("tests.image.repository", {"tests.image.repository": ""}, "at '/tests/image/repository'"),
    ("tests.image.tag", {"tests.image.tag": ""}, "at '/tests/image/tag'"),
    ("tests.image.pullPolicy", {"tests.image.pullPolicy": "always"},
     "at '/tests/image/pullPolicy'"),
    ("tests.deploymentName", {"tests.deploymentName": "phone.9b"}, "at '/tests/deploymentName'"),
    ("tests.namespace", {"tests.namespace": "-serving"}, "at '/tests/namespace'"),
    ("tests.endpoint", {"tests.endpoint": "http://phone:8000"}, "at '/tests/endpoint'"),
    ("tests.expectModel", {"tests.expectModel": "autoglm phone"}, "at '/tests/expectModel'"),
    ("tests.apiKeySecret.name", {"tests.apiKeySecret.name": "API_KEY"},
     "at '/tests/apiKeySecret/name'"),
    ("tests.apiKeySecret.key", {"tests.apiKeySecret.key": "api key"},
     "at '/tests/apiKeySecret/key'"),
    ("tests.timeoutSeconds", {"tests.timeoutSeconds": 5}, "at '/tests/timeoutSeconds'"),
    ("tests.podAnnotations", {"tests.podAnnotations": {"kwok.x-k8s.io/status": 1}},
     "at '/tests/podAnnotations/kwok.x-k8s.io~1status': got number, want string"),
    # Rules across values: the template says what to change.
    ("operator.watchNamespaces", {"operator.watchNamespaces": ["a"]},
     "operator.watchNamespaces only applies with operator.scope=Namespace"),
    ("operator.metricsPort", {"operator.metricsPort": 8080},
     "operator.healthPort and operator.metricsPort must differ"),
    ("serviceAccount.create", {"serviceAccount.create": False},
     "serviceAccount.name is required when serviceAccount.create is false"),
    ("monitoring.podMonitor.scrapeTimeout",
     {"monitoring.podMonitor.enabled": True, "monitoring.podMonitor.scrapeTimeout": "1m"},
     "monitoring.podMonitor.scrapeTimeout (1m) must not exceed its interval (15s)"),
    ("deployment.create",
     {"deployment.create": True, "operator.scope": "Namespace",
      "operator.watchNamespaces": ["other"]},
     "which the operator does not watch: add it to operator.watchNamespaces"),
    # deployment.spec.autoscaling: the CRD's rules across fields, with its messages
    # (test_autoscaling_rules_are_the_crds).
    *[("deployment.spec.autoscaling", {"deployment.create": True, "deployment.spec": spec},
       message) for spec, message in (
        ({"autoscaling": {"enabled": True, "minReplicas": 5}, "adaptive": _PROMETHEUS},
         "autoscaling.minReplicas must not exceed autoscaling.maxReplicas (5 > 4)"),
        ({"autoscaling": {"enabled": True, "maxReplicas": 2},
          "adaptive": {**_PROMETHEUS, "minStreamingReplicas": 3}},
         "adaptive.minStreamingReplicas must not exceed autoscaling.maxReplicas (3 > 2)"),
        ({"autoscaling": {"enabled": True, "minReplicas": 0}, "router": {"enabled": False},
          "adaptive": _PROMETHEUS},
         "autoscaling.minReplicas 0 needs router.enabled"),
        ({"autoscaling": {"enabled": True}},
         "autoscaling.enabled needs adaptive.prometheus.url"),
    )],
]  # fmt: skip
BOUNDARY = "malformed Helm values (helm template)"


@pytest.mark.parametrize(
    ("values", "message"),
    [case[1:] for case in BAD_VALUES],
    ids=[f"{key}-{index}" for index, (key, _, _) in enumerate(BAD_VALUES)],
)
def test_bad_values_are_refused_with_a_clear_message(
    values: dict[str, Any], message: str, record_input: Callable[[str, str, bool], None]
) -> None:
    out = run_helm(*template_args(values), check=False)
    refused = out.returncode != 0 and message in out.stderr
    record_input(BOUNDARY, "refused with a message naming the value", refused)
    assert out.returncode != 0, f"helm accepted values it must refuse: {values}"
    assert message in out.stderr, out.stderr


def _schema_keys(node: dict[str, Any], path: str = "") -> list[str]:
    """Every key a user sets: our own settings down to their leaves; Kubernetes types
    (resources, tolerations) and free maps (labels) count as one key each."""
    keys = []
    for key, sub in node.get("properties", {}).items():
        if key == "global":  # helm's own, shared with subcharts
            continue
        if sub.get("additionalProperties") is False and "properties" in sub:
            keys += _schema_keys(sub, f"{path}{key}.")
        else:
            keys.append(f"{path}{key}")
    return keys


def test_every_values_key_has_a_bad_value_case() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    keys = _schema_keys(schema)
    covered = {key for key, _, _ in BAD_VALUES}
    assert not set(keys) - covered, f"no bad-value case for {sorted(set(keys) - covered)}"
    print(f"{len(keys)} values keys, {len(BAD_VALUES)} bad-value cases")


def test_values_yaml_documents_every_key_the_schema_knows() -> None:
    """A schema key missing from values.yaml is a knob nobody can find; the reverse is caught by
    additionalProperties: false (helm refuses to install)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if key == "global":
                continue
            assert isinstance(value, dict) and key in value, f"values.yaml lacks {path}{key}"
            # Our own settings only; Kubernetes types (resources) pass through unlisted keys.
            if sub.get("additionalProperties") is False and "properties" in sub:
                walk(sub, value[key], f"{path}{key}.")

    walk(schema, values, "")


def _crd_spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CHART_CRD.read_text())
    spec: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"]
    return spec


def test_autoscaling_schema_is_the_crds() -> None:
    """values.schema.json checks deployment.spec.autoscaling with the CRD's own keys, types and
    bounds: one that drifts from the CRD would refuse a valid spec or pass a bad one."""

    def shape(node: dict[str, Any]) -> dict[str, Any]:
        kept: dict[str, Any] = {k: node[k] for k in ("type", "minimum", "maximum") if k in node}
        if "properties" in node:
            kept["properties"] = {k: shape(v) for k, v in node["properties"].items()}
        return kept

    schema = json.loads((CHART / "values.schema.json").read_text())
    chart = schema["properties"]["deployment"]["properties"]["spec"]["properties"]["autoscaling"]
    assert shape(chart) == shape(_crd_spec_schema()["properties"]["autoscaling"])


def test_autoscaling_rules_are_the_crds() -> None:
    """The chart refuses, with the CRD's message, every rule the CRD applies to a spec with
    autoscaling on; and checks nothing the CRD does not."""
    crd = {r["message"] for r in _crd_spec_schema()["x-kubernetes-validations"]
           if r["rule"].startswith("!self.autoscaling.enabled ||")}  # fmt: skip
    tpl = (CHART / "templates" / "_validate.tpl").read_text()
    body = tpl.split('define "autoglm.validateAutoscaling"')[1]
    chart = {re.sub(r" \(%d > %d\)$", "", m)
             for m in re.findall(r'"deployment\.spec: ([^"]+)"', body)}  # fmt: skip
    assert chart == crd
    cases = {m for key, _, m in BAD_VALUES if key == "deployment.spec.autoscaling"}
    for message in crd:
        assert any(message.startswith(c.split(" (")[0]) for c in cases), f"no case: {message}"


def test_chart_crd_is_the_generated_crd() -> None:
    assert CHART_CRD.read_bytes() == CRD_SOURCE.read_bytes(), (
        "charts/autoglm/crds/ differs from crds/: run hack/sync-chart-crd.sh"
    )
    check = subprocess.run(
        ["bash", str(REPO / "hack" / "sync-chart-crd.sh"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


# -- the `helm test` script, run with the same sh and curl semantics as in the hook pod ----------


class _Models(BaseHTTPRequestHandler):
    responses: list[tuple[int, str]] = []
    seen_auth: list[str | None] = []

    def do_GET(self) -> None:
        type(self).seen_auth.append(self.headers.get("Authorization"))
        status, body = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if self.path != "/v1/models":
            status, body = 404, "{}"
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        return


@pytest.fixture
def models_server() -> Iterator[tuple[str, type[_Models]]]:
    handler = type("Handler", (_Models,), {"responses": [], "seen_auth": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    server.shutdown()
    server.server_close()


def _models_body(*ids: str) -> str:
    return json.dumps(
        {"object": "list", "data": [{"id": i, "object": "model", "owned_by": "vllm"} for i in ids]}
    )


def _run_hook(
    endpoint: str, model: str, timeout: int = 20, api_key: str | None = None
) -> subprocess.CompletedProcess[str]:
    values: dict[str, Any] = {
        "tests.endpoint": endpoint,
        "tests.expectModel": model,
        "tests.timeoutSeconds": timeout,
    }
    pod = one(render(values), "Pod")
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["RETRY_SECONDS"] = "1"
    env["PATH"] = "/usr/bin:/bin"
    if api_key:
        env["API_KEY"] = api_key
    assert container["command"] == ["/bin/sh", "-c"]
    return subprocess.run(
        [*container["command"], *container["args"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hook_passes_when_the_model_is_listed(models_server: tuple[str, type[_Models]]) -> None:
    url, handler = models_server
    handler.responses[:] = [(200, _models_body("other", "autoglm-phone-9b"))]
    out = _run_hook(url, "autoglm-phone-9b", api_key="sk-test")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS: model autoglm-phone-9b is served" in out.stdout
    assert handler.seen_auth == ["Bearer sk-test"]


def test_hook_fails_when_only_a_similar_model_is_listed(
    models_server: tuple[str, type[_Models]],
) -> None:
    url, handler = models_server
    handler.responses[:] = [(200, _models_body("autoglm-phone-9b-int4"))]
    out = _run_hook(url, "autoglm-phone-9b")
    assert out.returncode == 1
    assert "FAIL: model autoglm-phone-9b not in /v1/models ids: autoglm-phone-9b-int4" in out.stdout


def test_hook_waits_for_a_loading_model(models_server: tuple[str, type[_Models]]) -> None:
    url, handler = models_server
    handler.responses[:] = [(503, "{}"), (503, "{}"), (200, _models_body("autoglm-phone-9b"))]
    out = _run_hook(url, "autoglm-phone-9b")
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(handler.seen_auth) == 3


def test_hook_gives_up_after_its_timeout(models_server: tuple[str, type[_Models]]) -> None:
    url, handler = models_server
    handler.responses[:] = [(500, "{}")]
    out = _run_hook(url, "autoglm-phone-9b", timeout=10)
    assert out.returncode == 1
    assert "did not answer within 10s" in out.stdout
