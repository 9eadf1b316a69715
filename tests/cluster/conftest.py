"""Fixtures of the cluster tier: `operator` runs the real operator against a test namespace."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.localcluster import LocalCluster
from testkit.operator_kit import Operator


@pytest.fixture
def operator(cluster: LocalCluster, crd: str, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    op = Operator(cluster, namespace, tmp_path).start()
    yield op
    # Delete our objects while the operator still runs, so its finalizer comes off.
    t0 = time.monotonic()
    cluster.kubectl(
        "delete", "agd", "--all", "-n", namespace, "--wait=true", "--timeout=30s", check=False
    )
    t1 = time.monotonic()
    op.stop()
    print(f"teardown: delete {t1 - t0:.1f}s, stop {time.monotonic() - t1:.1f}s")
    if op.proc is not None and op.proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
        print(op.logs())
    print(op.logs()[-4000:])
