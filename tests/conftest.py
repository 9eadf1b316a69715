"""Fixtures shared by every tier.

The `cluster` fixture starts a real control plane (hack/localcluster.py) once per session;
tests that use it are marked `cluster` (or `e2e`) and skipped only when that marker is
deselected, never because the binaries are missing: then the fixture builds them.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import LocalCluster, loopback_pod_cidr, running_cluster

REPO = Path(__file__).resolve().parent.parent
CRD_FILE = REPO / "crds" / "autoglm.io_autoglmdeployments.yaml"


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    # Loopback pod IPs let the end-to-end tier run a sim runtime at each pod's own address.
    with running_cluster(gpu_nodes=2, pod_cidr=loopback_pod_cidr()) as local:
        yield local


@pytest.fixture(scope="session")
def crd(cluster: LocalCluster) -> str:
    """The AutoGLMDeployment CRD, installed and established."""
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    name = "autoglmdeployments.autoglm.io"
    # Polled rather than `kubectl wait`, which errors while the new CRD has no conditions yet.
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + 60
    while cluster.kubectl("get", "crd", name, "-o", f"jsonpath={jsonpath}").stdout != "True":
        assert time.monotonic() < deadline, f"CRD {name} not Established after 60s"
        time.sleep(0.2)
    return name


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    cluster.kubectl("create", "namespace", name)
    # Pods must pass the `restricted` Pod Security Standard everywhere the tests run.
    cluster.kubectl(
        "label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
