"""Pods as replicas, and the pod watch's events applied to the router's pool."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from autoglm_api.profiles import Mode
from autoglm_router.discovery import Endpoint
from autoglm_router.kube import (
    AccessError,
    ApiError,
    PodTable,
    WatchGone,
    in_cluster_access,
    kubeconfig_access,
    replica_of_pod,
)


def pod(name: str, ip: str | None = "10.1.0.7", mode: str | None = "streaming",
        ready: bool = True, terminating: bool = False, version: str = "1",
        port_name: str = "http") -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": "demo"}
    if mode is not None:
        labels["autoglm.io/mode"] = mode
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "labels": labels,
                            "resourceVersion": version}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-30T17:00:00Z"
    status: dict[str, Any] = {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    spec = {"containers": [{"name": "runtime", "ports": [
        {"name": "metrics", "containerPort": 9000},
        {"name": port_name, "containerPort": 8000}]}]}
    return {"metadata": meta, "spec": spec, "status": status}


# -- one pod -> one replica -------------------------------------------------------------------


def test_a_ready_pod_is_a_replica_at_its_ip_and_named_port_in_its_labelled_mode() -> None:
    replica = replica_of_pod(pod("a", mode="batching"), "http")
    assert replica.url == "http://10.1.0.7:8000"
    assert replica.mode is Mode.BATCHING and replica.ready and not replica.terminating
    assert replica_of_pod(pod("a"), "metrics").url == "http://10.1.0.7:9000"


def test_target_port_is_used_as_given() -> None:
    assert replica_of_pod(pod("a"), 8123).url == "http://10.1.0.7:8123"
    assert replica_of_pod(pod("a", ip="fd00::7"), 8000).url == "http://[fd00::7]:8000"


@pytest.mark.parametrize(("obj", "port", "url", "mode", "ready"), [
    (pod("a", ip=None), "http", None, Mode.STREAMING, True),  # scheduled, no IP yet
    (pod("a", port_name="web"), "http", None, Mode.STREAMING, True),  # no port of that name
    (pod("a", mode=None), "http", "http://10.1.0.7:8000", None, True),  # not labelled yet
    (pod("a", mode="turbo"), "http", "http://10.1.0.7:8000", None, True),  # unknown mode
    (pod("a", ready=False), "http", "http://10.1.0.7:8000", Mode.STREAMING, False),
])
def test_pods_without_an_address_mode_or_readiness(obj: dict[str, Any], port: str,
                                                   url: str | None, mode: Mode | None,
                                                   ready: bool) -> None:
    replica = replica_of_pod(obj, port)
    assert (replica.url, replica.mode, replica.ready) == (url, mode, ready)


def test_a_pod_not_running_is_not_ready() -> None:
    pending = pod("a")
    pending["status"]["phase"] = "Pending"
    assert not replica_of_pod(pending, "http").ready


# -- the watch's events -----------------------------------------------------------------------


def listed(*pods: dict[str, Any], version: str = "100") -> PodTable:
    table = PodTable("http")
    table.relist({"items": list(pods), "metadata": {"resourceVersion": version}})
    return table


def test_list_then_events_add_flip_and_delete_replicas() -> None:
    table = listed(pod("a", ip="10.1.0.1"), pod("b", ip="10.1.0.2", mode="batching"))
    assert table.resource_version == "100"
    assert table.endpoints() == [Endpoint("http://10.1.0.1:8000", Mode.STREAMING, True),
                                 Endpoint("http://10.1.0.2:8000", Mode.BATCHING, True)]
    table.apply({"type": "MODIFIED",
                 "object": pod("a", ip="10.1.0.1", mode="batching", version="101")})
    table.apply({"type": "ADDED", "object": pod("c", ip="10.1.0.3", version="102")})
    table.apply({"type": "DELETED", "object": pod("b", ip="10.1.0.2", version="103")})
    assert table.endpoints() == [Endpoint("http://10.1.0.1:8000", Mode.BATCHING, True),
                                 Endpoint("http://10.1.0.3:8000", Mode.STREAMING, True)]
    assert table.resource_version == "103"


def test_a_terminating_pod_leaves_at_once_though_still_ready() -> None:
    table = listed(pod("a", ip="10.1.0.1"), pod("b", ip="10.1.0.2"))
    table.apply({"type": "MODIFIED", "object": pod("a", ip="10.1.0.1", terminating=True)})
    assert [e.name for e in table.endpoints()] == ["http://10.1.0.2:8000"]


def test_a_bookmark_only_moves_the_resource_version() -> None:
    table = listed(pod("a"))
    table.apply({"type": "BOOKMARK", "object": {"kind": "Pod",
                                                "metadata": {"resourceVersion": "250"}}})
    assert table.resource_version == "250" and len(table.endpoints()) == 1


def test_gone_asks_for_a_new_list_and_other_errors_raise() -> None:
    table = listed(pod("a"))
    with pytest.raises(WatchGone):
        table.apply({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                 "message": "too old resource version"}})
    with pytest.raises(ApiError):
        table.apply({"type": "ERROR", "object": {"kind": "Status", "code": 500}})


def test_a_new_list_forgets_pods_deleted_while_the_watch_was_down() -> None:
    table = listed(pod("a", ip="10.1.0.1"), pod("b", ip="10.1.0.2"))
    table.relist({"items": [pod("b", ip="10.1.0.2")], "metadata": {"resourceVersion": "300"}})
    assert [e.name for e in table.endpoints()] == ["http://10.1.0.2:8000"]


def test_one_endpoint_per_address_the_ready_pod_first() -> None:
    # A new pod may get the IP of one that just went, before the old one's DELETED arrives.
    table = listed(pod("old", ready=False), pod("new"))
    assert table.endpoints() == [Endpoint("http://10.1.0.7:8000", Mode.STREAMING, True)]
    # Metrics name the pod, not its IP (which the next pod may reuse).
    assert [e.label for e in table.endpoints()] == ["new"]


def test_data_path_reports_mark_endpoints() -> None:
    table = listed(pod("a", ip="10.1.0.1"), pod("b", ip="10.1.0.2"))
    marked = table.endpoints(draining={"http://10.1.0.1:8000"},
                             unreachable={"http://10.1.0.2:8000"})
    assert [(e.draining, e.ready) for e in marked] == [(True, True), (False, False)]
    assert table.uid_of("http://10.1.0.1:8000") == "uid-a"


# -- reaching the apiserver -------------------------------------------------------------------


def test_in_cluster_access_reads_the_service_account(tmp_path: Path) -> None:
    for name, text in {"token": "tok\n", "ca.crt": "pem", "namespace": "serving"}.items():
        (tmp_path / name).write_text(text)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    access = in_cluster_access(env, tmp_path)
    assert access.server == "https://10.96.0.1:443" and access.namespace == "serving"
    assert access.bearer() == "tok"
    (tmp_path / "token").write_text("rotated")  # the kubelet rotates projected tokens
    assert access.bearer() == "rotated"
    ipv6 = in_cluster_access({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, tmp_path)
    assert ipv6.server == "https://[fd00::1]:443"
    with pytest.raises(AccessError, match="not inside a pod"):
        in_cluster_access({}, tmp_path)
    with pytest.raises(AccessError, match="no ServiceAccount token"):
        in_cluster_access(env, tmp_path / "missing")


def kubeconfig(tmp_path: Path, user: dict[str, Any]) -> str:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "c", "cluster": {
            "server": "https://127.0.0.1:6443/", "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u",
                                                 "namespace": "team"}},
                     {"name": "other", "context": {"cluster": "c", "user": "u"}}],
    }
    path = tmp_path / "config"
    path.write_text(json.dumps(config))
    return str(path)


def test_kubeconfig_access_takes_the_current_context(tmp_path: Path) -> None:
    access = kubeconfig_access(kubeconfig(tmp_path, {"token": "abc"}))
    assert access.server == "https://127.0.0.1:6443" and access.namespace == "team"
    assert access.ca_file == str(tmp_path / "ca.crt") and access.bearer() == "abc"
    assert kubeconfig_access(kubeconfig(tmp_path, {}), "other").namespace is None
    data = base64.b64encode(b"PEM").decode()
    cert = kubeconfig_access(kubeconfig(tmp_path, {"client-certificate-data": data,
                                                   "client-key-data": data}))
    assert cert.client_cert == ("PEM", "PEM")


@pytest.mark.parametrize(("user", "context", "message"), [
    ({"exec": {"command": "aws"}}, None, "exec and auth-provider"),
    ({"token": "abc"}, "nowhere", "no context named 'nowhere'"),
])
def test_kubeconfig_access_refuses_what_it_cannot_use(tmp_path: Path, user: dict[str, Any],
                                                      context: str | None,
                                                      message: str) -> None:
    with pytest.raises(AccessError, match=message):
        kubeconfig_access(kubeconfig(tmp_path, user), context)
    with pytest.raises(AccessError, match="cannot read kubeconfig"):
        kubeconfig_access(str(tmp_path / "absent"))


def test_a_missing_ca_file_is_an_access_error(tmp_path: Path) -> None:
    access = kubeconfig_access(kubeconfig(tmp_path, {"token": "abc"}))
    with pytest.raises(AccessError, match="CA"):
        access.ssl_context()


def test_a_kubeconfig_cluster_without_a_server_is_refused(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "abc"})
    config = json.loads(Path(path).read_text())
    del config["clusters"][0]["cluster"]["server"]
    Path(path).write_text(json.dumps(config))
    with pytest.raises(AccessError, match="has no server"):
        kubeconfig_access(path)
