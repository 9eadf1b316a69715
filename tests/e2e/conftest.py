"""Fixtures of the end-to-end tier: Prometheus, the pod runner (a `sim` runtime per pod, its
targets in Prometheus' file discovery) and the operator as a subprocess (operator_kit)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.localcluster import LocalCluster, free_port
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import Operator
from testkit.podrunner import PodRunner


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPrometheus]:
    prom = LocalPrometheus(tmp_path_factory.mktemp("prometheus")).start()
    yield prom
    prom.stop()


@pytest.fixture(scope="module")
def pod_runner(
    cluster: LocalCluster, prometheus: LocalPrometheus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRunner]:
    runner = PodRunner(
        cluster, tmp_path_factory.mktemp("pods"), targets_file=prometheus.targets_file
    ).start()
    yield runner
    runner.stop()


@pytest.fixture
def operator(cluster: LocalCluster, crd: str, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    """One operator replica, so without leader election; its /metrics on `metrics_port`."""
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    op = Operator(
        cluster, namespace, tmp_path, args=["--no-leader-election", "--liveness", liveness]
    ).start()
    yield op
    cluster.kubectl("delete", "agd", "--all", "-n", namespace, "--timeout=30s", check=False)
    op.stop()
    print(op.logs()[-6000:])
