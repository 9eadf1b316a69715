"""The optional NetworkPolicies: serving pods' API port reachable only from the named clients, the
routers, Prometheus and the helm test pod, their admin port only from the operator, and reaching
neither link-local nor the cluster's ranges; the routers' ops port only from Prometheus and the
operator (which reads their demand there); the operator pod only on its metrics port, from
Prometheus. The local test cluster enforces no NetworkPolicy: these tests are the check.

Selectors are checked against the objects they must match (the operator's own pod template, the
chart's operator Deployment and test pod), so a renamed label breaks a test, not the traffic.
Bad values: tests/helm/test_chart_values.py."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from autoglm_operator.reconcile.children import router as router_builders
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.chart import NAMESPACE, RELEASE, by_kind, one, render

FULLNAME = f"{RELEASE}-autoglm"
APPS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
ENABLED = {"networkPolicy.enabled": True, "networkPolicy.clients": [APPS]}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector
    return selector["matchLabels"].items() <= labels.items()


def _peer_matches(
    peer: dict[str, Any], namespace: str, labels: dict[str, str], policy_namespace: str = NAMESPACE
) -> bool:
    ns = peer.get("namespaceSelector")
    if ns is None:  # a podSelector alone: pods of the policy's own namespace
        ns_ok = namespace == policy_namespace
    else:
        ns_ok = ns == {} or _selects(ns, {"kubernetes.io/metadata.name": namespace})
    return ns_ok and _selects(peer["podSelector"], labels)


def test_off_by_default() -> None:
    assert by_kind(render(), "NetworkPolicy") == []


def test_serving_pods_api_port_takes_only_the_clients_routers_prometheus_and_helm_test() -> None:
    docs = render({**ENABLED, "tests.namespace": NAMESPACE})
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-serving")
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # It selects the pods the operator creates, and their ports by name.
    pod = builders.pod_template("phone-9b", AutoGLMDeploymentSpec())
    assert _selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    api, admin = policy["spec"]["ingress"]
    port_names = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert api["ports"] == [{"port": "http", "protocol": "TCP"}] and "http" in port_names
    peers = api["from"]
    operator_pod = one(docs, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    test_pod = one(docs, "Pod", f"{FULLNAME}-test-models")["metadata"]["labels"]
    # The operator calls only the admin port: the API port is not its.
    assert not any(_peer_matches(p, NAMESPACE, operator_pod) for p in peers if "podSelector" in p)
    assert any(_peer_matches(p, NAMESPACE, test_pod) for p in peers if "podSelector" in p)
    prometheus = {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}
    assert any(_peer_matches(p, "monitoring", prometheus) for p in peers if "podSelector" in p)
    assert APPS in peers
    # The routers in front (Service <name>) of the same namespace.
    owner = builders.Owner("phone-9b", NAMESPACE, "u")
    router_pod = router_builders.pod_template(owner, AutoGLMDeploymentSpec())
    assert any(_peer_matches(p, NAMESPACE, router_pod["metadata"]["labels"]) for p in peers
               if "podSelector" in p)  # fmt: skip
    assert not any(_peer_matches(p, "elsewhere", router_pod["metadata"]["labels"]) for p in peers
                   if "podSelector" in p)  # fmt: skip
    # Nobody else: an unlabelled pod in the release namespace matches no peer.
    assert not any(
        _peer_matches(p, NAMESPACE, {"app": "other"}) for p in peers if "podSelector" in p
    )
    assert len(peers) == 4
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}] and "admin" in port_names


@pytest.mark.parametrize("operator_namespace", [NAMESPACE, "autoglm-system"])
def test_serving_pods_admin_port_takes_only_the_operator(operator_namespace: str) -> None:
    """The admin port (the launcher's, where the operator pushes each flip) answers only with a
    token, and only the operator's pods may reach it: not the clients, the routers,
    Prometheus, the helm test pod, nor a pod elsewhere that copies the operator's labels."""
    docs = render({**ENABLED, "tests.namespace": NAMESPACE,
                   "networkPolicy.namespaces": [NAMESPACE]}, namespace=operator_namespace)
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-serving")
    _, admin = policy["spec"]["ingress"]
    pod = builders.pod_template("phone-9b", AutoGLMDeploymentSpec())
    (admin_port,) = [p for p in pod["spec"]["containers"][0]["ports"] if p["name"] == "admin"]
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert admin_port["containerPort"] == builders.ADMIN_PORT
    (peer,) = admin["from"]
    operator_pod = one(docs, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    assert _peer_matches(peer, operator_namespace, operator_pod, NAMESPACE)
    assert not _peer_matches(peer, "elsewhere", operator_pod, NAMESPACE)
    owner = builders.Owner("phone-9b", NAMESPACE, "u")
    router_pod = router_builders.pod_template(owner, AutoGLMDeploymentSpec())
    test_pod = one(docs, "Pod", f"{FULLNAME}-test-models")["metadata"]["labels"]
    for labels in (router_pod["metadata"]["labels"], test_pod, pod["metadata"]["labels"],
                   {"app.kubernetes.io/name": "prometheus"}):
        assert not _peer_matches(peer, NAMESPACE, labels), labels
    assert APPS not in admin["from"]


def test_router_pods_take_only_the_named_clients_prometheus_and_helm_test() -> None:
    docs = render({**ENABLED, "tests.namespace": NAMESPACE})
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-router")
    assert policy["metadata"]["namespace"] == NAMESPACE
    owner = builders.Owner("phone-9b", NAMESPACE, "u")
    pod = router_builders.pod_template(owner, AutoGLMDeploymentSpec())
    assert _selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    serving = builders.pod_template("phone-9b", AutoGLMDeploymentSpec())
    assert not _selects(policy["spec"]["podSelector"], serving["metadata"]["labels"])
    # The API port for the clients and the helm test; the ops port for Prometheus and the
    # operator (test_router_ops_port_takes_only_prometheus_and_the_operator).
    api, ops = policy["spec"]["ingress"]
    assert api["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert ops["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert {"http", "metrics"} <= {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert not any(_peer_matches(p, NAMESPACE, {"app": "other"})
                   for p in ops["from"] if "podSelector" in p)
    assert APPS not in ops["from"]
    peers = api["from"]
    test_pod = one(docs, "Pod", f"{FULLNAME}-test-models")["metadata"]["labels"]
    assert any(_peer_matches(p, NAMESPACE, test_pod) for p in peers if "podSelector" in p)
    assert APPS in peers
    assert not any(
        _peer_matches(p, NAMESPACE, {"app": "other"}) for p in peers if "podSelector" in p
    )
    assert len(peers) == 2


@pytest.mark.parametrize("models_namespace", [NAMESPACE, "models"])
def test_router_ops_port_takes_only_prometheus_and_the_operator(models_namespace: str) -> None:
    """The ops port serves /metrics, /health and the demand report the operator reads for scale
    to zero (GET /autoglm/v1/demand): Prometheus and the operator's pods (the release
    namespace) reach it, wherever the models run; not the clients, the serving pods, the helm
    test pod, nor a pod elsewhere with the operator's labels."""
    docs = render({**ENABLED, "tests.namespace": NAMESPACE,
                   "networkPolicy.namespaces": [models_namespace]})
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-router")
    assert policy["metadata"]["namespace"] == models_namespace
    _, ops = policy["spec"]["ingress"]
    owner = builders.Owner("phone-9b", models_namespace, "u")
    router_pod = router_builders.pod_template(owner, AutoGLMDeploymentSpec())
    (ops_port,) = [p for p in router_pod["spec"]["containers"][0]["ports"]
                   if p["name"] == "metrics"]  # fmt: skip
    # The port the operator's RouterReader is given (handlers/reconcile.py) is this one.
    assert ops["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert ops_port["containerPort"] == router_builders.METRICS_PORT
    prometheus = one(docs, "NetworkPolicy", f"{FULLNAME}-operator")["spec"]["ingress"][0]["from"]
    operator_peers = [p for p in ops["from"] if p not in prometheus]
    assert ops["from"][: len(prometheus)] == prometheus and len(operator_peers) == 1
    (peer,) = operator_peers
    operator_pod = one(docs, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    assert _peer_matches(peer, NAMESPACE, operator_pod, models_namespace)
    assert not _peer_matches(peer, "elsewhere", operator_pod, models_namespace)
    serving = builders.pod_template("phone-9b", AutoGLMDeploymentSpec())["metadata"]["labels"]
    test_pod = one(docs, "Pod", f"{FULLNAME}-test-models")["metadata"]["labels"]
    for labels in (router_pod["metadata"]["labels"], serving, test_pod, {"app": "other"}):
        for namespace in {NAMESPACE, models_namespace}:
            assert not any(_peer_matches(p, namespace, labels, models_namespace)
                           for p in ops["from"] if "podSelector" in p), (labels, namespace)
    assert APPS not in ops["from"]


GATEWAY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-ingress"}},
           "podSelector": {"matchLabels": {"istio": "ingressgateway"}}}  # fmt: skip


def test_gateway_pods_reach_serving_pods_and_the_routers_picker_port_only() -> None:
    docs = render({**ENABLED, "networkPolicy.gateway": [GATEWAY]})
    gateway_pod = {"istio": "ingressgateway"}
    serving = one(docs, "NetworkPolicy", f"{FULLNAME}-serving")
    rule, admin = serving["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert any(_peer_matches(p, "istio-ingress", gateway_pod) for p in rule["from"])
    assert len(rule["from"]) == 5
    # Not the admin port: that is the operator's alone.
    assert not any(_peer_matches(p, "istio-ingress", gateway_pod) for p in admin["from"])
    # On the routers: the picker's port, for the gateway alone; not the API or metrics ports.
    router = one(docs, "NetworkPolicy", f"{FULLNAME}-router")
    api, ops, picker = router["spec"]["ingress"]
    assert picker == {"ports": [{"port": "grpc-ext-proc", "protocol": "TCP"}], "from": [GATEWAY]}
    assert GATEWAY not in api["from"] and GATEWAY not in ops["from"]
    # The port's name is the one the router container has with spec.gateway on.
    owner = builders.Owner("phone-9b", NAMESPACE, "u")
    spec = AutoGLMDeploymentSpec.model_validate({"gateway": {"enabled": True}})
    ports = router_builders.pod_template(owner, spec)["spec"]["containers"][0]["ports"]
    assert {p["name"]: p["containerPort"] for p in ports}["grpc-ext-proc"] == 9002
    # Without gateway peers, no gateway rule: nothing reaches the picker's port.
    plain = one(render(ENABLED), "NetworkPolicy", f"{FULLNAME}-router")
    assert len(plain["spec"]["ingress"]) == 2


def test_operator_pod_takes_only_prometheus_on_its_metrics_port() -> None:
    docs = render(ENABLED)
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-operator")
    operator = one(docs, "Deployment", FULLNAME)["spec"]["template"]
    assert _selects(policy["spec"]["podSelector"], operator["metadata"]["labels"])
    [rule] = policy["spec"]["ingress"]
    ports = {p["name"] for p in operator["spec"]["containers"][0]["ports"]}
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}] and "metrics" in ports
    # The values' default: the Prometheus Operator's and the prometheus-community chart's pods,
    # in the namespace named by the label only the apiserver sets.
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert rule["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": prometheus}}]  # fmt: skip
    assert not any(_peer_matches(p, "elsewhere", prometheus) for p in rule["from"])


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [
        ({}, [NAMESPACE]),
        ({"operator.scope": "Namespace", "operator.watchNamespaces": ["a", "b"]}, ["a", "b"]),
        ({"networkPolicy.namespaces": ["serving", "serving", "lab"]}, ["serving", "lab"]),
    ],
)
def test_one_serving_policy_per_namespace_that_runs_models(
    values: dict[str, Any], namespaces: list[str]
) -> None:
    docs = render({**ENABLED, **values})
    for kind in ("-serving", "-serving-egress", "-router"):
        policies = [
            d for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["name"].endswith(kind)
        ]
        assert [d["metadata"]["namespace"] for d in policies] == namespaces


def test_the_helm_test_pod_takes_no_connections() -> None:
    docs = render(ENABLED)
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-test")
    test_pod = one(docs, "Pod", f"{FULLNAME}-test-models")
    assert policy["metadata"]["namespace"] == test_pod["metadata"]["namespace"]
    assert _selects(policy["spec"]["podSelector"], test_pod["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in policy["spec"]


def test_no_operator_policy_without_an_operator_pod() -> None:
    docs = render({**ENABLED, "operator.replicas": 0})
    names = [d["metadata"]["name"] for d in by_kind(docs, "NetworkPolicy")]
    assert names == [f"{FULLNAME}-serving", f"{FULLNAME}-serving-egress", f"{FULLNAME}-router",
                     f"{FULLNAME}-test"]  # fmt: skip


def _denied(rule: dict[str, Any], address: str) -> bool:
    """Whether an ipBlock rule leaves `address` out: outside every block or in an except."""
    ip = ipaddress.ip_address(address)
    for peer in rule["to"]:
        block = peer["ipBlock"]
        if ip.version != ipaddress.ip_network(block["cidr"]).version:
            continue
        inside = ip in ipaddress.ip_network(block["cidr"])
        if inside and not any(ip in ipaddress.ip_network(c) for c in block.get("except", [])):
            return False
    return True


def test_serving_pods_reach_the_internet_and_dns_but_not_metadata_or_cluster_addresses() -> None:
    docs = render(ENABLED)
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-serving-egress")
    pod = builders.pod_template("phone-9b", AutoGLMDeploymentSpec())
    assert _selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Egress"]
    addresses, dns = policy["spec"]["egress"]
    for inside in ("169.254.169.254", "10.96.0.1", "10.0.0.1", "172.20.0.5", "192.168.1.1",
                   "100.64.0.1", "fe80::1", "fd00::1"):
        assert _denied(addresses, inside), inside
    for outside in ("18.154.227.7", "8.8.8.8", "2600:9000:2000::1"):  # a hub's CDN, DNS, IPv6
        assert not _denied(addresses, outside), outside
    assert "ports" not in addresses
    coredns = {"k8s-app": "kube-dns", "pod-template-hash": "x"}
    assert any(_peer_matches(p, "kube-system", coredns) for p in dns["to"])
    assert not any(_peer_matches(p, NAMESPACE, coredns) for p in dns["to"])
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]


def test_serving_egress_takes_more_peers_and_can_be_left_off() -> None:
    mirror = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "models"}}}
    docs = render({**ENABLED, "networkPolicy.egress.allowed": [mirror],
                   "networkPolicy.egress.deniedCidrs": ["10.0.0.0/8"]})  # fmt: skip
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-serving-egress")
    addresses, _, extra = policy["spec"]["egress"]
    assert extra == {"to": [mirror]}
    assert _denied(addresses, "10.1.2.3") and not _denied(addresses, "169.254.169.254")
    off = render({**ENABLED, "networkPolicy.egress.enabled": False})
    assert f"{FULLNAME}-serving-egress" not in {d["metadata"]["name"]
                                                for d in by_kind(off, "NetworkPolicy")}
