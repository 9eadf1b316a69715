"""The Helm chart on the real control plane (kube-apiserver + kwok GPU nodes).

- the rendered chart passes `kubectl apply --dry-run=server` (schema, CEL rules of the CRD, RBAC
  objects, Pod Security `restricted` in the test namespace);
- `helm install` (with the CRD and one AutoGLMDeployment from values), `upgrade`, a refused bad
  upgrade, `uninstall`;
- the ServiceAccount's permissions are what files/operator-rules.yaml says: `kubectl auth can-i`
  as that ServiceAccount, in scope Cluster and scope Namespace;
- the real operator, run with the chart's ServiceAccount token and the chart's arguments,
  reconciles an AutoGLMDeployment with exactly those permissions, and over a whole lifecycle
  uses every one of them (the apiserver's audit log says which it used);
- `helm test`: the hook pod's script runs for real (this test acts as its kubelet: kwok is told
  to leave the pod alone) against a local /v1/models server.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoglm_operator.resource.spec import DEFAULT_IMAGE
from testkit import operator_kit as kit
from testkit.chart import (
    CHART,
    CRD_SOURCE,
    KUBE_VERSION,
    by_kind,
    find_helm,
    operator_rules,
    render,
    run_helm,
    set_args,
)
from testkit.localcluster import LocalCluster
from testkit.operator_kit import KUBECTL_FAILED
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(300)

CRD_NAME = "autoglmdeployments.autoglm.io"
# Kinds from the Prometheus Operator; this control plane has no such CRDs.
PROMETHEUS_OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def helm(cluster: LocalCluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = find_helm(cluster.bin_dir)

    def run(
        *args: str, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        return run_helm(
            *args, "--kubeconfig", cluster.kubeconfig, helm=binary, check=check,
            env={"PATH": cluster.env["PATH"]}, timeout=timeout,
        )  # fmt: skip

    return run


def _assert_restricted(cluster: LocalCluster, namespace: str) -> None:
    """Pods created here are admitted only if they pass Pod Security `restricted`."""
    labels = cluster.get_json("namespace", namespace)["metadata"]["labels"]
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", labels


def _exists(cluster: LocalCluster, *args: str) -> bool:
    return cluster.kubectl("get", *args, check=False).returncode == 0


def _can(cluster: LocalCluster, sa: str, verb: str, resource: str, *where: str) -> bool:
    """`kubectl auth can-i` as `sa`; resource is plural[.group][/name]."""
    out = cluster.kubectl("auth", "can-i", verb, resource, f"--as={sa}", *where, check=False)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), out.stdout + out.stderr
    return answer == "yes"


def _rule_target(group: str, resource: str) -> list[str]:
    """A rule's resource as can-i arguments: `plural.group`, and --subresource for `plural/sub`."""
    plural, _, sub = resource.partition("/")
    target = [f"{plural}.{group}" if group else plural]
    return [*target, f"--subresource={sub}"] if sub else target


# -- server-side dry run ---------------------------------------------------------------------------

DRY_RUN_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespace-scoped": {"operator.scope": "Namespace"},
    "ha": {"operator.replicas": 2},
    "from-values": {
        "deployment.create": True,
        "deployment.spec": {
            "replicas": 2,
            "modePolicy": "Adaptive",
            "adaptive": {"prometheus": {"url": "http://prometheus.monitoring:9090"}},
        },
    },
    "monitoring": {
        "monitoring.podMonitor.enabled": True,
        "monitoring.serviceMonitor.enabled": True,
        "monitoring.prometheusRule.enabled": True,
        "monitoring.plainPrometheusConfig.enabled": True,
        "monitoring.dashboard.enabled": True,
    },
    "network-policy": {
        "networkPolicy.enabled": True,
        "networkPolicy.clients": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}},
            {"ipBlock": {"cidr": "10.0.0.0/8"}},
        ],
        "operator.replicas": 2,
    },
}


@pytest.mark.parametrize("name", list(DRY_RUN_SETS))
def test_rendered_chart_passes_server_side_dry_run(
    cluster: LocalCluster, crd: str, namespace: str, name: str
) -> None:
    docs = render(DRY_RUN_SETS[name], namespace=namespace, release=f"dry-{name}"[:20])
    applicable = [d for d in docs if d["kind"] not in PROMETHEUS_OPERATOR_KINDS]
    if name == "monitoring":
        assert len(applicable) < len(docs)
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-o", "name", "-f", "-",
        input="\n---\n".join(json.dumps(d) for d in applicable), check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == len(applicable)
    # The namespace enforces Pod Security `restricted`: no warning about the pods either.
    assert "PodSecurity" not in out.stderr, out.stderr


def test_example_kwok_gpu_node_and_one_step_values_are_accepted(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    examples = CHART.parent.parent / "examples"
    node = cluster.kubectl(
        "apply", "--dry-run=server", "-f", str(examples / "kwok-gpu-node.yaml"), check=False
    )
    assert node.returncode == 0, node.stderr
    docs = render(namespace=namespace, extra=["-f", str(examples / "values-one-step.yaml")])
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-",
        input="\n---\n".join(json.dumps(d) for d in docs), check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "autoglmdeployment.autoglm.io/phone-9b created (server dry run)" in out.stdout


def test_bad_autoglmdeployment_from_values_is_refused_by_the_apiserver(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    values = {
        "deployment.create": True,
        "deployment.spec": {"replicas": 1, "modePolicy": "Adaptive"},  # no Prometheus URL
    }
    docs = render(values, namespace=namespace)
    (agd,) = by_kind(docs, "AutoGLMDeployment")
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(agd), check=False
    )
    assert out.returncode != 0
    assert "modePolicy Adaptive needs adaptive.prometheus.url" in out.stderr


# -- install, upgrade, uninstall -------------------------------------------------------------------


def test_install_upgrade_uninstall(
    cluster: LocalCluster, crd: str, namespace: str, helm: Callable[..., Any]
) -> None:
    release = "agl"
    fullname = f"{release}-autoglm"
    # helm installs the CRD only when it is missing: take it away, put it back whatever happens.
    cluster.kubectl("delete", "crd", CRD_NAME, "--wait=true", "--timeout=60s")
    try:
        values = {
            "deployment.create": True,
            "deployment.name": "phone",
            "deployment.spec": {"replicas": 1, "modePolicy": "Streaming"},
        }
        out = helm(
            "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "120s",
            *set_args(values),
        )  # fmt: skip
        assert "STATUS: deployed" in out.stdout
        assert "kubectl -n " + namespace + " get agd phone -w" in out.stdout  # NOTES
        assert "WARNING: the AutoGLMDeployment CRD in the cluster differs" not in out.stdout
        crd_obj = cluster.get_json("crd", CRD_NAME)
        established = {c["type"]: c["status"] for c in crd_obj["status"]["conditions"]}
        assert established["Established"] == "True"
        assert crd_obj["spec"] == yaml.safe_load(CRD_SOURCE.read_text())["spec"] | {
            "conversion": crd_obj["spec"]["conversion"]
        }
        agd = cluster.get_json("agd", "phone", "-n", namespace)
        assert agd["spec"]["gpusPerReplica"] == 2  # defaulted by the apiserver from the CRD
        deployment = cluster.get_json("deployment", fullname, "-n", namespace)
        assert deployment["status"].get("readyReplicas") == 1
        _assert_restricted(cluster, namespace)  # so the operator pod passed `restricted`
        assert _exists(cluster, "clusterrole", fullname)
        assert _exists(cluster, "clusterrolebinding", fullname)
        assert _exists(cluster, "role", f"{fullname}-leader-election", "-n", namespace)

        # Upgrade: two operator replicas (a PDB appears) and a scaled AutoGLMDeployment.
        values["operator.replicas"] = 2
        values["deployment.spec"] = {"replicas": 3, "modePolicy": "Streaming"}
        out = helm(
            "upgrade", release, str(CHART), "-n", namespace, "--wait", "--timeout", "120s",
            *set_args(values),
        )  # fmt: skip
        assert "REVISION: 2" in out.stdout
        assert cluster.get_json("deployment", fullname, "-n", namespace)["spec"]["replicas"] == 2
        assert _exists(cluster, "pdb", fullname, "-n", namespace)
        assert cluster.get_json("agd", "phone", "-n", namespace)["spec"]["replicas"] == 3

        # A bad upgrade is refused before anything changes.
        bad = helm(
            "upgrade", release, str(CHART), "-n", namespace, "--set", "operator.scope=Everywhere",
            check=False,
        )  # fmt: skip
        assert bad.returncode != 0
        assert "at '/operator/scope': value must be one of 'Cluster', 'Namespace'" in bad.stderr
        history = json.loads(helm("history", release, "-n", namespace, "-o", "json").stdout)
        assert [h["status"] for h in history] == ["superseded", "deployed"]

        # A changed CRD in the cluster (an older chart's, say) is pointed out on upgrade.
        column = {"name": "Extra", "type": "string", "jsonPath": ".spec.image"}
        path = "/spec/versions/0/additionalPrinterColumns/-"
        patch = json.dumps([{"op": "add", "path": path, "value": column}])
        cluster.kubectl("patch", "crd", CRD_NAME, "--type=json", "-p", patch)
        out = helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values")
        assert "WARNING: the AutoGLMDeployment CRD in the cluster differs" in out.stdout

        out = helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
        assert "uninstalled" in out.stdout
        for args in (
            ("deployment", fullname, "-n", namespace),
            ("serviceaccount", fullname, "-n", namespace),
            ("agd", "phone", "-n", namespace),
            ("clusterrole", fullname),
            ("clusterrole", f"{fullname}-edit"),
            ("clusterrole", f"{fullname}-view"),
            ("clusterrolebinding", fullname),
            ("role", f"{fullname}-leader-election", "-n", namespace),
        ):
            eventually(lambda a=args: not _exists(cluster, *a),  # type: ignore[misc]
                       60, every=0.5, what=f"{args} to go", ignoring=KUBECTL_FAILED)
        # Helm never deletes what crds/ installed: other releases' objects depend on it.
        assert _exists(cluster, "crd", CRD_NAME)
    finally:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_SOURCE))
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")


# -- the ServiceAccount's permissions --------------------------------------------------------------


def test_cluster_scope_permissions_are_the_listed_ones(
    cluster: LocalCluster,
    crd: str,
    inference_pool_crd: str,
    namespace: str,
    helm: Callable[..., Any],
) -> None:
    out = helm(
        "install", "perm", str(CHART), "-n", namespace, "--skip-crds", "--wait", "--timeout", "120s"
    )
    # NOTES' first AutoGLMDeployment runs the runtime image from the same registry.
    assert f"image: {DEFAULT_IMAGE}" in out.stdout
    sa = f"system:serviceaccount:{namespace}:perm-autoglm"
    try:
        elsewhere = ("-n", "kube-system")
        for rule in operator_rules()["workload"]:
            group = rule["apiGroups"][0]
            for resource in rule["resources"]:
                target, *sub = _rule_target(group, resource)
                for verb in rule["verbs"]:
                    assert _can(cluster, sa, verb, target, *sub, *elsewhere), f"{verb} {resource}"
                for verb in {"get", "list", "watch", "create", "patch", "update", "delete"} - set(
                    rule["verbs"]
                ):
                    assert not _can(cluster, sa, verb, target, *sub, *elsewhere), (
                        f"{verb} {resource} granted"
                    )
        assert _can(cluster, sa, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        assert not _can(cluster, sa, "update", "customresourcedefinitions.apiextensions.k8s.io")
        assert not _can(cluster, sa, "create", "clusterroles.rbac.authorization.k8s.io")
        assert not _can(cluster, sa, "create", "pods/exec", *elsewhere)
        assert not _can(cluster, sa, "delete", "pods", *elsewhere)
        assert not _can(cluster, sa, "list", "nodes")
        # The Lease: create in the release namespace, get/update only the release's own.
        here = ("-n", namespace)
        assert _can(cluster, sa, "create", "leases.coordination.k8s.io", *here)
        assert _can(cluster, sa, "update", "leases.coordination.k8s.io/perm-autoglm-leader", *here)
        assert not _can(cluster, sa, "update", "leases.coordination.k8s.io/other", *here)
        assert not _can(cluster, sa, "create", "leases.coordination.k8s.io", *elsewhere)
        # People: whoever holds edit (or view) in a namespace gets AutoGLMDeployments with it,
        # once the controller-manager has aggregated the chart's user roles.
        for user, role in (("jane", "edit"), ("vic", "view")):
            cluster.kubectl(
                "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
                f"--user={user}", "-n", namespace,
            )  # fmt: skip
        agd = "autoglmdeployments.autoglm.io"
        eventually(
            lambda: _can(cluster, "jane", "create", agd, *here),
            60, every=0.5, what="edit to aggregate AutoGLMDeployments", ignoring=KUBECTL_FAILED,
        )
        assert _can(cluster, "jane", "update", agd, "--subresource=scale", *here)
        assert not _can(cluster, "jane", "patch", agd, "--subresource=status", *here)
        eventually(
            lambda: _can(cluster, "vic", "list", agd, *here),
            60, every=0.5, what="view to aggregate AutoGLMDeployments", ignoring=KUBECTL_FAILED,
        )
        assert not _can(cluster, "vic", "create", agd, *here)
        assert not _can(cluster, "jane", "create", agd, *elsewhere)
    finally:
        helm("uninstall", "perm", "-n", namespace, "--wait")


def test_namespace_scope_grants_nothing_outside_the_watched_namespaces(
    cluster: LocalCluster, crd: str, namespace: str, helm: Callable[..., Any]
) -> None:
    other = f"{namespace}-b"
    cluster.kubectl("create", "namespace", other)
    try:
        helm(
            "install", "scoped", str(CHART), "-n", namespace, "--skip-crds", "--wait",
            "--set", "operator.scope=Namespace",
            "--set-json", f'operator.watchNamespaces=["{namespace}","{other}"]',
        )  # fmt: skip
        sa = f"system:serviceaccount:{namespace}:scoped-autoglm"
        assert not _exists(cluster, "clusterrole", "scoped-autoglm")
        for ns in (namespace, other):
            assert _can(cluster, sa, "patch", "deployments.apps", "-n", ns)
            assert _can(cluster, sa, "watch", "autoglmdeployments.autoglm.io", "-n", ns)
            status = ("autoglmdeployments.autoglm.io", "--subresource=status")
            assert _can(cluster, sa, "patch", *status, "-n", ns)
        assert not _can(cluster, sa, "list", "secrets", "-n", "kube-system")
        assert not _can(cluster, sa, "patch", "deployments.apps", "-n", "default")
        assert not _can(cluster, sa, "list", "customresourcedefinitions.apiextensions.k8s.io")
        helm("uninstall", "scoped", "-n", namespace, "--wait")
        assert not _exists(cluster, "role", "scoped-autoglm", "-n", other)
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


# -- the real operator with the chart's ServiceAccount ---------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _service_account_kubeconfig(cluster: LocalCluster, namespace: str, sa: str, path: Path) -> Path:
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": cluster.server, "certificate-authority": cluster.ca_file},
            }
        ],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [
            {"name": "sa", "context": {"cluster": "local", "user": sa, "namespace": namespace}}
        ],
        "current-context": "sa",
    }
    path.write_text(json.dumps(config))
    return path


@contextlib.contextmanager
def _run_under_the_charts_account(
    cluster: LocalCluster,
    namespace: str,
    helm: Callable[..., Any],
    workdir: Path,
    release: str,
    scope: str,
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`helm install` in `scope`, then the operator process run exactly as the chart's
    Deployment would run it, with its ServiceAccount's token (kwok only fakes the pod).

    In scope Cluster it watches only the test namespace (--namespace instead of the chart's
    --all-namespaces): the other tests' objects in this shared cluster are none of its business.
    """
    helm("install", release, str(CHART), "-n", namespace, "--skip-crds",
         "--set", f"operator.scope={scope}")  # fmt: skip
    fullname = f"{release}-autoglm"
    deployment = cluster.get_json("deployment", fullname, "-n", namespace)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    pod_name = f"{fullname}-local"
    health, metrics = _free_port(), _free_port()
    args = [
        a.replace("$(POD_NAME)", pod_name).replace(":8080/", f":{health}/")
        for a in container["args"]
    ]
    args = [f"--namespace={namespace}" if a == "--all-namespaces" else a for a in args]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["AUTOGLM_OPERATOR_METRICS_PORT"] = str(metrics)
    kubeconfig = _service_account_kubeconfig(
        cluster, namespace, fullname, workdir / "sa.kubeconfig"
    )
    log = workdir / "operator.log"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("autoglm-operator")), *args],
        env={**os.environ, **env, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield proc, log
    finally:
        cluster.kubectl(
            "delete", "agd", "--all", "-n", namespace, "--wait=true", "--timeout=30s", check=False
        )
        _stop(proc)
        print(log.read_text(errors="replace")[-4000:])
        helm("uninstall", release, "-n", namespace, "--wait", check=False)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture
def chart_operator(
    cluster: LocalCluster, crd: str, namespace: str, helm: Callable[..., Any], tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The operator under the ServiceAccount of a scope-Namespace install."""
    with _run_under_the_charts_account(
        cluster, namespace, helm, tmp_path, release="live", scope="Namespace"
    ) as running:
        yield running


def test_operator_reconciles_with_exactly_the_charts_permissions(
    cluster: LocalCluster, namespace: str, chart_operator: tuple[subprocess.Popen[bytes], Path]
) -> None:
    proc, log = chart_operator
    agd = {
        "apiVersion": "autoglm.io/v1alpha1",
        "kind": "AutoGLMDeployment",
        "metadata": {"name": "phone", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "modePolicy": "Streaming",
            "apiKeySecretRef": {"name": "phone-key"},
        },
    }
    cluster.kubectl(
        "create", "secret", "generic", "phone-key", "-n", namespace, "--from-literal=api-key=sk-1"
    )
    cluster.apply(agd)

    def ready() -> dict[str, Any] | None:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        status = cluster.get_json("agd", "phone", "-n", namespace).get("status") or {}
        return status if status.get("readyReplicas") == 1 else None

    # kopf spends about a minute retrying namespace listing in scope Namespace before it falls
    # back to the named namespaces (see the report: settings.scanning.disabled avoids it).
    status = eventually(ready, 180, every=0.5, what="the AutoGLMDeployment to be ready",
                        ignoring=KUBECTL_FAILED)
    assert status["endpoint"] == f"http://phone.{namespace}.svc:8000/v1"
    for kind, name in [
        ("deployment", "phone"), ("service", "phone"), ("service", "phone-streaming"),
        ("service", "phone-batching"), ("configmap", "phone-config"), ("secret", "phone-admin"),
        ("pdb", "phone"), ("deployment", "phone-router"), ("pdb", "phone-router"),
        ("serviceaccount", "phone-router"), ("role", "phone-router"),
        ("rolebinding", "phone-router"),
    ]:  # fmt: skip
        assert _exists(cluster, kind, name, "-n", namespace), f"{kind}/{name} missing"
    serving = "app.kubernetes.io/instance=phone,app.kubernetes.io/name=autoglm"
    pods = cluster.get_json("pods", "-n", namespace, "-l", serving)["items"]
    assert [p["metadata"]["labels"].get("autoglm.io/mode") for p in pods] == ["streaming"]
    lease = cluster.get_json("lease", "live-autoglm-leader", "-n", namespace)
    assert lease["spec"]["holderIdentity"] == "live-autoglm-local"
    text = log.read_text(errors="replace")
    assert "Acquired leadership" in text, text[-2000:]  # the log below is the operator's own
    # kopf's fallbacks without cluster-wide rights (namespace and CRD watching) are expected in
    # scope Namespace and logged as such; any other refusal is a missing rule.
    # A status 403, not digits of a number: the operator's random metrics port (":34403") and
    # a log timestamp's milliseconds ("03:53:27,403") are no refusal.
    refusals = [
        line for line in text.splitlines()
        if re.search(r"(?<![\d,.:])403\b|[Ff]orbidden", line)
        and "customresourcedefinitions" not in line and "namespaces" not in line
    ]  # fmt: skip
    assert not refusals, "\n".join(refusals)


# -- the permissions the operator uses: the apiserver's audit log ---------------------------------

# (apiGroup, resource, subresource, verb), as RBAC rules and audit events both name a request.
Permission = tuple[str, str, str, str]


def _granted(cluster: LocalCluster, namespace: str, account: str) -> set[Permission]:
    """Every permission the chart's (Cluster)RoleBindings give the ServiceAccount, expanded."""
    rules: list[dict[str, Any]] = []
    for kind, where in (("clusterrolebindings", ()), ("rolebindings", ("-n", namespace))):
        for binding in cluster.get_json(kind, *where)["items"]:
            subjects = binding.get("subjects") or []
            if not any(
                s["kind"] == "ServiceAccount" and s["name"] == account
                and s.get("namespace") == namespace
                for s in subjects
            ):  # fmt: skip
                continue
            ref = binding["roleRef"]
            scope = where if ref["kind"] == "Role" else ()
            rules += cluster.get_json(ref["kind"].lower(), ref["name"], *scope)["rules"]
    granted = set()
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                plural, _, sub = resource.partition("/")
                granted |= {(group, plural, sub, verb) for verb in rule["verbs"]}
    return granted


def _audited(events: list[dict[str, Any]], decision: str) -> Counter[Permission]:
    """Requests on resources by the authorizer's decision ("allow" or "forbid"), counted.

    A server-side apply that creates its object (201) is authorized as patch and as create."""
    counts: Counter[Permission] = Counter()
    for event in events:
        ref = event.get("objectRef")
        annotations = event.get("annotations") or {}
        if ref is None or annotations.get("authorization.k8s.io/decision") != decision:
            continue  # discovery (non-resource URLs), or the other decision
        key = (ref.get("apiGroup", ""), ref["resource"], ref.get("subresource", ""))
        counts[(*key, event["verb"])] += 1
        if event["verb"] == "patch" and event.get("responseStatus", {}).get("code") == 201:
            counts[(*key, "create")] += 1
    return counts


def _table(granted: set[Permission], used: Counter[Permission]) -> str:
    rows = [f"{'permission':<58} {'granted':>7} {'requests':>8}"]
    for group, resource, sub, verb in sorted(granted | set(used)):
        name = f"{group or 'core'} {resource}{'/' + sub if sub else ''} {verb}"
        mark = "yes" if (group, resource, sub, verb) in granted else "NO"
        rows.append(f"{name:<58} {mark:>7} {used[(group, resource, sub, verb)]:>8}")
    return "\n".join(rows)


@pytest.mark.timeout(600)
def test_a_whole_lifecycle_uses_every_permission_the_chart_grants(
    cluster: LocalCluster,
    crd: str,
    inference_pool_crd: str,
    namespace: str,
    helm: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """The chart grants no verb the operator never calls.

    The operator runs under the ServiceAccount of a scope-Cluster install (ClusterRole, CRD
    watch, Lease Role) through everything it does to an AutoGLMDeployment; the apiserver's
    audit log (testkit.localcluster logs ServiceAccount requests) then says which permissions
    it used. The test above shows the grants suffice; this one, that none is spare.
    """
    release = "audit"
    account = f"{release}-autoglm"
    user = f"system:serviceaccount:{namespace}:{account}"
    ns = namespace
    cluster.kubectl(
        "create", "secret", "generic", "phone-key", "-n", ns, "--from-literal=api-key=k"
    )
    obj = kit.agd_object(
        replicas=1, modePolicy="Streaming", switchStrategy="Rolling",
        apiKeySecretRef={"name": "phone-key"},
    )  # fmt: skip
    obj["spec"]["adaptive"]["intervalSeconds"] = 5
    with _run_under_the_charts_account(cluster, ns, helm, tmp_path, release, "Cluster") as (
        proc,
        log,
    ):

        def settled(ready: str) -> Callable[[], dict[str, Any] | None]:
            probe = kit.ready_as(cluster, ns, ready)

            def alive_and_settled() -> dict[str, Any] | None:
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                return probe()

            return alive_and_settled

        def deployments() -> set[str]:
            items = kit.get(cluster, ns, "deployments", "-l", kit.INSTANCE)["items"]
            return {d["metadata"]["name"] for d in items}

        # Create (kopf's CRD scan and namespace fallback take about a minute in front of it).
        cluster.apply(obj, namespace=ns)
        eventually(settled("1/1"), 180, every=0.5, what="1/1", ignoring=KUBECTL_FAILED)
        # Scale.
        cluster.kubectl("scale", "agd", kit.NAME, "-n", ns, "--replicas=2")
        eventually(settled("2/2"), 90, every=0.5, what="2/2", ignoring=KUBECTL_FAILED)
        # A mode flip by pinning the policy; under Rolling it replaces the pods.
        kit.patch_agd(cluster, ns, {"spec": {"modePolicy": "Batching"}})

        def all_batching() -> bool:
            pods = kit.live_pods(cluster, ns)
            return len(pods) == 2 and all(
                p["metadata"]["labels"].get(kit.MODE_LABEL) == "batching" for p in pods
            ) and kit.status(cluster, ns).get("batchingReplicas") == 2

        eventually(all_batching, 180, every=0.5, what="both replicas batching",
                   ignoring=KUBECTL_FAILED)
        # An engine change: the pods roll.
        kit.patch_agd(cluster, ns, {"spec": {"maxModelLen": 4096}})

        def rolled() -> bool:
            pods = kit.live_pods(cluster, ns)
            args = [p["spec"]["containers"][0]["args"] for p in pods]
            return len(pods) == 2 and all(a[a.index("--max-model-len") + 1] == "4096" for a in args)

        eventually(rolled, 180, every=0.5, what="the engine change rolled out",
                   ignoring=KUBECTL_FAILED)
        eventually(settled("2/2"), 90, every=0.5, what="2/2 after the roll",
                   ignoring=KUBECTL_FAILED)
        # Back to streaming, InPlace: `<name>-batching` is deleted once `<name>` serves.
        back = {"spec": {"modePolicy": "Streaming", "switchStrategy": "InPlace"}}
        kit.patch_agd(cluster, ns, back)
        eventually(lambda: deployments() == {kit.NAME}, 180, every=0.5, what="one Deployment again",
                   ignoring=KUBECTL_FAILED)
        eventually(settled("2/2"), 90, every=0.5, what="2/2 in place", ignoring=KUBECTL_FAILED)
        # Children deleted or emptied by hand, and repaired. The operator watches no Secret:
        # the admin Secret is read by name when a serving pod appears (it mounts it), so a
        # replaced pod brings it back.
        admin = f"{kit.NAME}-admin"

        def replace_a_pod() -> None:
            pod = kit.live_pods(cluster, ns)[0]["metadata"]["name"]  # a serving pod
            cluster.kubectl("delete", "pod", pod, "-n", ns, "--wait=false")

        cluster.kubectl("delete", "service", f"{kit.NAME}-streaming", "-n", ns)
        cluster.kubectl("delete", "secret", admin, "-n", ns)
        replace_a_pod()
        eventually(
            lambda: cluster.kubectl("get", "service", f"{kit.NAME}-streaming", "-n", ns,
                                    check=False).returncode == 0
            and cluster.kubectl("get", "secret", admin, "-n", ns, check=False).returncode == 0,
            60, every=0.5, what="the Service and the admin Secret back", ignoring=KUBECTL_FAILED,
        )  # fmt: skip
        eventually(settled("2/2"), 90, every=0.5, what="2/2 after the pod was replaced",
                   ignoring=KUBECTL_FAILED)
        template = kit.get(cluster, ns, "deployment", kit.NAME)["spec"]["template"]
        key = f"token-{template['metadata']['annotations'][kit.HASH_ANNOTATION]}"
        emptied = json.dumps([{"op": "replace", "path": f"/data/{key}", "value": ""}])
        cluster.kubectl("patch", "secret", admin, "-n", ns, "--type=json", "-p", emptied)
        replace_a_pod()
        eventually(
            lambda: kit.get(cluster, ns, "secret", admin).get("data", {}).get(key),
            60, every=0.5, what="a new admin token", ignoring=KUBECTL_FAILED,
        )
        eventually(settled("2/2"), 90, every=0.5, what="2/2 after the second pod was replaced",
                   ignoring=KUBECTL_FAILED)
        # The gateway on: InferencePool <name> and Service <name>-epp published, a changed
        # failure mode applied to the pool, then both deleted when it is off again.
        def failure_mode() -> str:
            out = cluster.kubectl("get", "inferencepool", kit.NAME, "-n", ns, "-o",
                                  "jsonpath={.spec.endpointPickerRef.failureMode}", check=False)
            return out.stdout if out.returncode == 0 else ""  # fmt: skip

        kit.patch_agd(cluster, ns, {"spec": {"gateway": {"enabled": True}}})
        eventually(lambda: failure_mode() == "FailClose", 60, every=0.5, what="the InferencePool",
                   ignoring=KUBECTL_FAILED)
        kit.patch_agd(cluster, ns, {"spec": {"gateway": {"failureMode": "FailOpen"}}})
        eventually(lambda: failure_mode() == "FailOpen", 60, every=0.5,
                   what="the pool to fail open", ignoring=KUBECTL_FAILED)
        kit.patch_agd(cluster, ns, {"spec": {"gateway": {"enabled": False}}})
        picker = (f"inferencepool/{kit.NAME}", f"service/{kit.NAME}-epp")
        eventually(
            lambda: cluster.kubectl("get", *picker, "-n", ns, "-o", "name",
                                    "--ignore-not-found").stdout.strip() == "",
            60, every=0.5, what="the pool and the picker deleted", ignoring=KUBECTL_FAILED,
        )  # fmt: skip
        # Scale to zero on: the namespace's autoscalers are listed (one that scales this object
        # would own its replicas) and the router's Role may patch this object.
        kit.patch_agd(cluster, ns, {"spec": {"scaleToZero": {"enabled": True}}})
        eventually(
            lambda: (kit.status(cluster, ns).get("standby") or {}).get("state") == "Serving",
            60, every=0.5, what="status.standby", ignoring=KUBECTL_FAILED,
        )
        # The router off (scale to zero with it: it needs the router's hold): Service <name>
        # back on the serving pods, the router's children gone.
        router = [f"{kind}/{kit.NAME}-router" for kind in
                  ("deployment", "pdb", "serviceaccount", "role", "rolebinding")]  # fmt: skip

        def router_gone() -> bool:
            found = cluster.kubectl("get", *router, "-n", ns, "-o", "name", "--ignore-not-found")
            return found.stdout.strip() == ""

        assert not router_gone()
        kit.patch_agd(cluster, ns, {"spec": {"router": {"enabled": False},
                                             "scaleToZero": {"enabled": False}}})
        eventually(router_gone, 60, every=0.5, what="the router's children deleted",
                   ignoring=KUBECTL_FAILED)
        # Delete: the operator takes its finalizer off.
        cluster.kubectl("delete", "agd", kit.NAME, "-n", ns, "--timeout=60s")
        _stop(proc)  # hands the Lease back: an update
        assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
        granted = _granted(cluster, ns, account)  # before the uninstall takes the roles away

    events = cluster.audit_events(user)
    used, refused = _audited(events, "allow"), _audited(events, "forbid")
    print(f"{len(events)} requests by {user}\n{_table(granted, used)}")
    print("refused:", dict(refused))
    assert granted, "no (Cluster)RoleBinding names the chart's ServiceAccount"
    assert not set(used) - granted, "used beyond the chart's grants"
    assert not granted - set(used), f"granted but never used: {sorted(granted - set(used))}"
    # Only kopf's namespace observer is refused: scope Cluster grants no namespace listing, and
    # with --namespace kopf falls back to the named namespace.
    assert {(g, r) for g, r, _, _ in refused} <= {("", "namespaces")}, refused


# -- helm test -------------------------------------------------------------------------------------


class _Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(
            {"object": "list", "data": [{"id": "autoglm-phone-9b", "object": "model"}]}
        )
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: Any) -> None:
        return


def test_helm_test_runs_the_hook_and_reports_its_result(
    cluster: LocalCluster, crd: str, namespace: str, helm: Callable[..., Any]
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1"
    values = {
        "tests.endpoint": endpoint,
        # kwok leaves this pod alone; the thread below plays its kubelet.
        "tests.podAnnotations": {"kwok.x-k8s.io/status": "custom"},
    }
    helm("install", "hook", str(CHART), "-n", namespace, "--skip-crds", *set_args(values))
    pod_name = "hook-autoglm-test-models"
    results: list[subprocess.CompletedProcess[str]] = []

    def kubelet() -> None:
        def created() -> dict[str, Any] | None:
            out = cluster.kubectl(
                "get", "pod", pod_name, "-n", namespace, "-o", "json", check=False
            )
            return json.loads(out.stdout) if out.returncode == 0 else None

        pod = eventually(created, 60, every=0.5, what="the test hook pod", ignoring=KUBECTL_FAILED)
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        result = subprocess.run(
            [*container["command"], *container["args"]],
            env={**env, "PATH": "/usr/bin:/bin", "RETRY_SECONDS": "1"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        results.append(result)
        phase = "Succeeded" if result.returncode == 0 else "Failed"
        status = {"status": {"phase": phase, "containerStatuses": [{
            "name": container["name"], "image": container["image"], "ready": False,
            "restartCount": 0, "imageID": "", "started": False,
            "state": {"terminated": {"exitCode": result.returncode, "reason": "Completed"}},
        }]}}  # fmt: skip
        cluster.kubectl(
            "patch", "pod", pod_name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps(status),
        )  # fmt: skip

    thread = threading.Thread(target=kubelet, daemon=True)
    thread.start()
    try:
        out = helm("test", "hook", "-n", namespace, "--timeout", "90s", check=False)
        thread.join(timeout=30)
        assert results, "the hook pod never ran"
        _assert_restricted(cluster, namespace)  # so the hook pod passed `restricted`
        assert "PASS: model autoglm-phone-9b is served" in results[0].stdout
        assert out.returncode == 0, out.stdout + out.stderr
        assert "Phase:          Succeeded" in out.stdout
    finally:
        server.shutdown()
        server.server_close()
        helm("uninstall", "hook", "-n", namespace, "--wait", check=False)


def test_lint_with_the_clusters_kube_version(helm: Callable[..., Any]) -> None:
    out = helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION)
    assert "0 chart(s) failed" in out.stdout
