"""helm lint and helm template of the chart for the value sets people use, checked object by object.

Where the chart and the operator must agree (the serving pods' labels and port, the endpoint URL,
the AutoGLMDeployment spec), the expectation comes from the operator's own code, not a copy.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import API_VERSION, AutoGLMDeploymentSpec
from testkit.chart import (
    CHART,
    CHART_CRD,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    by_kind,
    one,
    operator_rules,
    render,
    run_helm,
)

FULLNAME = f"{RELEASE}-autoglm"
MONITORING_ON = {
    "monitoring.podMonitor.enabled": True,
    "monitoring.serviceMonitor.enabled": True,
    "monitoring.prometheusRule.enabled": True,
    "monitoring.plainPrometheusConfig.enabled": True,
    "monitoring.dashboard.enabled": True,
}
NAMESPACED = {"operator.scope": "Namespace", "operator.watchNamespaces": ["team-a", "team-b"]}
FROM_VALUES = {
    "deployment.create": True,
    "deployment.name": "phone",
    "deployment.spec": {
        "replicas": 2,
        "modePolicy": "Adaptive",
        "model": {"servedName": "glm-phone"},
        "service": {"port": 8080},
        "adaptive": {"prometheus": {"url": "http://prometheus.monitoring:9090"}},
    },
}
# spec.autoscaling from values: scale to zero at its floor (minReplicas 0), the rest given.
AUTOSCALING: dict[str, Any] = {
    "deployment.create": True,
    "deployment.name": "phone",
    "deployment.spec": {
        "modePolicy": "Adaptive",
        "adaptive": {"prometheus": {"url": "http://prometheus.monitoring:9090"}},
        "autoscaling": {
            "enabled": True, "minReplicas": 0, "maxReplicas": 6, "headroomPercent": 30,
            "scaleUp": {"stabilizationSeconds": 0, "maxStep": 2},
            "scaleDown": {"stabilizationSeconds": 600, "periodSeconds": 120, "maxStep": 1},
        },
    },
}  # fmt: skip
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespace-scoped": NAMESPACED,
    "monitoring": MONITORING_ON,
    "from-values": FROM_VALUES,
    "autoscaling": AUTOSCALING,
    "ha": {"operator.replicas": 2},
    "everything": {**MONITORING_ON, **FROM_VALUES, "operator.replicas": 3},
    "network-policy": {
        "networkPolicy.enabled": True,
        "networkPolicy.clients": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
        **NAMESPACED,
    },
}


def _operator(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"][0]


def _all_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        rule for kind in ("ClusterRole", "Role") for d in by_kind(docs, kind) for rule in d["rules"]
    ]


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_lint_passes_strict(name: str) -> None:
    from testkit.chart import set_args

    out = run_helm(
        "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION,
        "--namespace", NAMESPACE, *set_args(VALUE_SETS[name]),
    )  # fmt: skip
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_every_object_is_namespaced_where_it_belongs_and_labelled(name: str) -> None:
    docs = render(VALUE_SETS[name])
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for doc in docs:
        meta = doc["metadata"]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm", doc["kind"]
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in meta
        else:
            assert meta.get("namespace"), f"{doc['kind']} {meta['name']} has no namespace"


def test_default_install_is_cluster_scoped_with_exactly_the_listed_rules() -> None:
    docs = render()
    rules = operator_rules()
    role = one(docs, "ClusterRole", FULLNAME)
    assert role["rules"] == rules["workload"] + rules["cluster"]
    # The only ClusterRoleBinding binds the operator to its own role; the user roles are
    # aggregated into admin/edit/view and bound to nobody here.
    assert [b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")] == [FULLNAME]
    binding = one(docs, "ClusterRoleBinding", FULLNAME)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": FULLNAME,
    }  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    ]
    lease_role = one(docs, "Role", f"{FULLNAME}-leader-election")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    # The file's Lease verbs, with everything but create limited to this release's Lease.
    (lease_rule,) = rules["leaderElection"]
    assert lease_role["rules"] == [
        {**lease_rule, "verbs": ["create"]},
        {**lease_rule, "verbs": ["get", "update"], "resourceNames": [f"{FULLNAME}-leader"]},
    ]
    assert f"--lease-name={FULLNAME}-leader" in _operator(docs)["args"]
    assert by_kind(docs, "Role") == [lease_role]
    container = _operator(docs)
    assert "--all-namespaces" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--namespace")]
    # Nothing optional by default: no monitoring objects, no PDB for one replica, no CR; the
    # one Pod is the `helm test` hook, created only by `helm test`.
    kinds = {d["kind"] for d in docs if "helm.sh/hook" not in d["metadata"].get("annotations", {})}
    assert kinds == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "Deployment", "Service",
    }  # fmt: skip


def test_user_roles_aggregate_into_the_default_roles_in_cluster_scope_only() -> None:
    roles = {d["metadata"]["name"]: d for d in by_kind(render(), "ClusterRole")}
    assert set(roles) == {FULLNAME, f"{FULLNAME}-edit", f"{FULLNAME}-view"}
    edit, view = roles[f"{FULLNAME}-edit"], roles[f"{FULLNAME}-view"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in edit["metadata"]["labels"] if k.startswith(aggregate)} == {
        f"{aggregate}admin",
        f"{aggregate}edit",
    }
    assert {k for k in view["metadata"]["labels"] if k.startswith(aggregate)} == {
        f"{aggregate}view"
    }
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in view["rules"])
    assert not by_kind(render({"rbac.userRoles": False}), "ClusterRole")[1:]
    assert not by_kind(render(NAMESPACED, namespace="team-a"), "ClusterRole")


def test_rules_never_use_wildcards_or_escalation_verbs() -> None:
    rules = operator_rules()
    assert set(rules) == {"workload", "cluster", "leaderElection"}
    for rule in [r for group in rules.values() for r in group]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
        assert "nonResourceURLs" not in rule
    # Secrets and pods are the sensitive ones: never delete, never exec.
    resources = {res for group in rules.values() for r in group for res in r["resources"]}
    assert "pods/exec" not in resources and "secrets" in resources
    # A cluster-scoped resource in the namespaced list would silently do nothing in a Role.
    cluster_scoped = {"customresourcedefinitions", "namespaces", "nodes", "clusterroles"}
    assert not cluster_scoped & {res for r in rules["workload"] for res in r["resources"]}


def test_namespace_scope_grants_nothing_cluster_wide() -> None:
    docs = render(NAMESPACED, namespace="team-a")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    rules = operator_rules()
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in by_kind(docs, "Role")}
    assert set(roles) == {
        ("team-a", FULLNAME), ("team-b", FULLNAME), ("team-a", f"{FULLNAME}-leader-election"),
    }  # fmt: skip
    assert roles[("team-b", FULLNAME)]["rules"] == rules["workload"]
    for binding in by_kind(docs, "RoleBinding"):
        # Every binding names the operator's one ServiceAccount, in the release namespace.
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": FULLNAME, "namespace": "team-a"}
        ]
    args = _operator(docs)["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a", "--namespace=team-b",
    ]  # fmt: skip
    assert "--all-namespaces" not in args


def test_namespace_scope_defaults_to_the_release_namespace() -> None:
    docs = render({"operator.scope": "Namespace"}, namespace="solo")
    assert {d["metadata"]["namespace"] for d in by_kind(docs, "Role")} == {"solo"}
    assert "--namespace=solo" in _operator(docs)["args"]


def test_operator_pod_is_restricted_and_probed() -> None:
    docs = render()
    deployment = one(docs, "Deployment", FULLNAME)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _operator(docs)
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 8081}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AUTOGLM_OPERATOR_METRICS_PORT"] == "8081"
    assert "--identity=$(POD_NAME)" in container["args"] and "POD_NAME" in env
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["image"] == "ghcr.io/autoglm/autoglm-operator:0.1.0"
    assert container["resources"]["limits"]["memory"]
    # The scrape annotations point at the real metrics port.
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8081"
    # The Service selects the operator pods and nothing else.
    service = one(docs, "Service", f"{FULLNAME}-metrics")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "operator"


def test_image_digest_wins_over_tag() -> None:
    digest = "sha256:" + "ab" * 32
    docs = render({"image.tag": "9.9.9", "image.digest": digest})
    assert _operator(docs)["image"] == f"ghcr.io/autoglm/autoglm-operator@{digest}"


def test_replicas_above_one_get_a_disruption_budget() -> None:
    docs = render({"operator.replicas": 2})
    pdb = one(docs, "PodDisruptionBudget", FULLNAME)
    assert pdb["spec"]["minAvailable"] == 1
    assert one(docs, "Deployment", FULLNAME)["spec"]["replicas"] == 2
    assert not by_kind(render({"operator.replicas": 1}), "PodDisruptionBudget")


def test_pod_monitor_selects_the_pods_the_operator_builds() -> None:
    docs = render(MONITORING_ON)
    monitor = one(docs, "PodMonitor", f"{FULLNAME}-runtime")
    agd_spec = AutoGLMDeploymentSpec()
    template = builders.pod_template("phone", agd_spec)
    pod_labels = template["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items(), (selector, pod_labels)
    # The operator's own pods (the chart's Deployment) are not runtime pods.
    operator_labels = one(docs, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= operator_labels.items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    container = template["spec"]["containers"][0]
    assert endpoint["port"] in {p["name"] for p in container["ports"]}
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[endpoint["port"]] == 8000
    # autoglm_deployment comes from the label that carries the AutoGLMDeployment's name.
    relabel = endpoint["relabelings"][0]
    label = builders.INSTANCE_LABEL
    assert pod_labels[label] == "phone"
    assert relabel == {
        "sourceLabels": [
            "__meta_kubernetes_pod_label_" + label.replace(".", "_").replace("/", "_")
        ],
        "targetLabel": "autoglm_deployment",
    }
    assert monitor["spec"]["namespaceSelector"] == {"any": True}


def test_router_pod_monitor_selects_router_pods_not_serving_pods() -> None:
    docs = render(MONITORING_ON)
    monitor = one(docs, "PodMonitor", f"{FULLNAME}-router")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "router"
    serving = builders.pod_template("phone", AutoGLMDeploymentSpec())["metadata"]["labels"]
    assert not selector.items() <= serving.items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == "metrics"  # /metrics is apart from the API port
    assert endpoint["relabelings"][0]["targetLabel"] == "autoglm_deployment"


def test_namespaced_monitoring_only_looks_in_the_watched_namespaces() -> None:
    docs = render({**MONITORING_ON, **NAMESPACED}, namespace="team-a")
    monitor = one(docs, "PodMonitor", f"{FULLNAME}-runtime")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    snippet = yaml.safe_load(
        one(docs, "ConfigMap", f"{FULLNAME}-prometheus")["data"]["scrape-configs.yaml"]
    )
    runtime_sd = snippet[0]["kubernetes_sd_configs"][0]
    assert runtime_sd["namespaces"] == {"names": ["team-a", "team-b"]}


def test_plain_scrape_config_selects_the_pods_the_operator_builds() -> None:
    docs = render(MONITORING_ON)
    snippet = yaml.safe_load(
        one(docs, "ConfigMap", f"{FULLNAME}-prometheus")["data"]["scrape-configs.yaml"]
    )
    runtime_job = snippet[0]
    selector = runtime_job["kubernetes_sd_configs"][0]["selectors"][0]["label"]
    pod_labels = builders.pod_template("phone", AutoGLMDeploymentSpec())["metadata"]["labels"]
    wanted = dict(pair.split("=", 1) for pair in selector.split(","))
    assert wanted.items() <= pod_labels.items()


def test_service_monitor_selects_the_operator_metrics_service() -> None:
    docs = render(MONITORING_ON)
    monitor = one(docs, "ServiceMonitor", f"{FULLNAME}-operator")
    service = one(docs, "Service", f"{FULLNAME}-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_dashboard_is_valid_json_in_a_sidecar_configmap() -> None:
    import json

    docs = render(MONITORING_ON)
    cm = one(docs, "ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["autoglm-serving.json"])
    panels = {p["title"]: p for p in dashboard["panels"]}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for needed in ("Requests per second", "Time to first token", "Requests waiting in the engine",
                   "KV cache usage", "GPU memory used", "Mode per replica"):  # fmt: skip
        assert needed in panels
    # Scale to zero: what the routers hold, how long it waits, what they refuse, the state.
    for title, metric in (("Held requests", "autoglm_router_held_requests"),
                          ("Hold waits", "autoglm_router_hold_seconds_bucket"),
                          ("Hold overflows by reason", "autoglm_router_hold_overflows_total"),
                          ("Standby state", "autoglm_operator_standby_state")):  # fmt: skip
        assert any(metric in t["expr"] for t in panels[title]["targets"]), title
    # Fleet size (spec.autoscaling), a row of its own after scale to zero's.
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows.index("Fleet size") == rows.index("Scale to zero and holds") + 1
    for title, metrics in (
        ("Fleet replicas: desired, running, ready",
         ("autoglm_operator_autoscaling_desired_replicas",
          "autoglm_operator_autoscaling_running_replicas", "autoglm_operator_ready_replicas")),
        ("Replicas needed by the demand", ("autoglm_operator_autoscaling_needed_replicas",)),
        ("Demand and expected goodput",
         ("autoglm_operator_autoscaling_demand_requests_per_second",
          "autoglm_operator_autoscaling_expected_goodput_requests_per_second")),
        ("Scale events", ("autoglm_operator_autoscaling_scale_events_total",)),
        ("Fleet sizing reason", ("autoglm_operator_autoscaling_reason",)),
    ):  # fmt: skip
        for metric in metrics:
            assert any(metric in t["expr"] for t in panels[title]["targets"]), (title, metric)
    assert (CHART / "files" / "dashboard.json").read_text().strip() == cm["data"][
        "autoglm-serving.json"
    ]


def test_deployment_from_values_is_a_valid_autoglmdeployment() -> None:
    docs = render(FROM_VALUES)
    agd = one(docs, "AutoGLMDeployment", "phone")
    assert agd["apiVersion"] == API_VERSION
    assert agd["metadata"]["namespace"] == NAMESPACE
    parsed = AutoGLMDeploymentSpec.model_validate(agd["spec"])
    assert parsed.replicas == 2 and parsed.model.served_name == "glm-phone"


def test_autoscaling_from_values_reaches_the_autoglmdeployment_as_given() -> None:
    docs = render(AUTOSCALING)
    agd = one(docs, "AutoGLMDeployment", "phone")
    assert agd["spec"]["autoscaling"] == AUTOSCALING["deployment.spec"]["autoscaling"]
    parsed = AutoGLMDeploymentSpec.model_validate(agd["spec"])
    assert parsed.autoscaling.enabled and parsed.autoscaling.max_replicas == 6
    # minReplicas 0 is a value, not an absent one: scale to zero applies at that floor.
    assert parsed.autoscaling.min_replicas == 0
    assert parsed.standby().enabled and parsed.standby().floor == 0
    assert parsed.autoscaling.scale_down.period_seconds == 120
    # Off by default: the values' spec carries no autoscaling, the CRD's default (off) applies.
    default = one(render({"deployment.create": True}), "AutoGLMDeployment")
    assert "autoscaling" not in default["spec"]
    assert not AutoGLMDeploymentSpec.model_validate(default["spec"]).autoscaling.enabled


def test_default_deployment_spec_in_values_is_valid() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    AutoGLMDeploymentSpec.model_validate(values["deployment"]["spec"])
    # `helm test` checks the object examples/autoglm.yaml creates, without extra values.
    example = yaml.safe_load((CHART.parent.parent / "examples" / "autoglm.yaml").read_text())
    assert values["deployment"]["name"] == example["metadata"]["name"]


def _test_pod(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    pod = one(docs, "Pod", f"{FULLNAME}-test-models")
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    return pod, env


def test_helm_test_hook_targets_the_endpoint_the_operator_reports() -> None:
    docs = render(FROM_VALUES)
    pod, env = _test_pod(docs)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = AutoGLMDeploymentSpec.model_validate(FROM_VALUES["deployment.spec"])
    assert env["ENDPOINT"] == builders.endpoint_url("phone", NAMESPACE, spec)
    assert env["EXPECT_MODEL"] == "glm-phone"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_helm_test_hook_defaults_and_api_key() -> None:
    docs = render({"tests.apiKeySecret": {"name": "keys", "key": "k"}})
    pod, env = _test_pod(docs)
    spec = AutoGLMDeploymentSpec()
    assert env["ENDPOINT"] == builders.endpoint_url("phone-9b", NAMESPACE, spec)
    assert env["EXPECT_MODEL"] == spec.model.served_name
    key = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "API_KEY"]
    assert key == [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "k"}}}]


def test_crds_come_only_with_include_crds_and_equal_the_source() -> None:
    assert not by_kind(render(), "CustomResourceDefinition")
    docs = render(extra=["--include-crds"])
    rendered = one(docs, "CustomResourceDefinition")
    assert rendered == yaml.safe_load(CHART_CRD.read_text())


EXAMPLE_VALUES = sorted((CHART.parent.parent / "examples").glob("values-*.yaml"))


@pytest.mark.parametrize("path", EXAMPLE_VALUES, ids=lambda p: p.name)
def test_example_values_files_install_cleanly(path: Any) -> None:
    out = run_helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, "-f", str(path))
    assert "0 chart(s) failed" in out.stdout
    docs = render(extra=["-f", str(path)])
    for agd in by_kind(docs, "AutoGLMDeployment"):
        AutoGLMDeploymentSpec.model_validate(agd["spec"])


def test_there_are_example_values_files() -> None:
    assert {p.name for p in EXAMPLE_VALUES} >= {
        "values-kube-prometheus-stack.yaml",
        "values-one-step.yaml",
    }
