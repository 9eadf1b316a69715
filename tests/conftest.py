"""Fixtures shared by every tier, and the one rule that assigns tiers: a test's tier is its folder.

tests/<tier>/ holds the tests of one tier (unit, servers, gateway, helm, prometheus, abuse,
images, cluster, e2e, vllm, engine); each test is marked with its tier's name, so `make
test-<tier>` runs `pytest tests/<tier>` and `-m <tier>` picks the same tests. Helpers shared
across tiers live in testkit/, never in another tier's folder.

The `cluster` fixture starts a real control plane (testkit.localcluster) once per session;
tests that use it are marked `cluster` (or `e2e`) and skipped only when that marker is
deselected, never because the binaries are missing: then the fixture builds them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _pytest.terminal import TerminalReporter

from autoglm_operator.reconcile.children import gateway
from testkit.localcluster import LocalCluster, loopback_pod_cidr, running_cluster
from testkit.waiting import TIME_SCALE

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TIERS = (
    "unit", "servers", "gateway", "helm", "prometheus", "abuse", "images", "cluster", "e2e",
    "vllm", "engine",
)  # fmt: skip
CRD_FILE = REPO / "crds" / "autoglm.io_autoglmdeployments.yaml"
VLLM_TESTS = REPO / "tests" / "vllm"
ENGINE_TESTS = REPO / "tests" / "engine"


def _vllm_installed() -> bool:
    # The distribution, not find_spec: with tests/ on sys.path, tests/vllm is a namespace package.
    try:
        importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def pytest_configure(config: pytest.Config) -> None:
    if (config.option.markexpr or "").strip() == "vllm" and not _vllm_installed():
        raise pytest.UsageError("the vllm tier needs the pinned vLLM: run `make test-vllm`")
    if (config.option.markexpr or "").strip() == "engine" and not _vllm_installed():
        raise pytest.UsageError("the engine tier needs vLLM on the CPU: run `make test-engine`")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.path)).relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests/{tier}/ is not a tier ({TIERS})")
        item.add_marker(tier)
        _scale_timeout(item)


def _scale_timeout(item: pytest.Item) -> None:
    """A slow machine's AUTOGLM_TEST_TIME_SCALE stretches pytest-timeout's limits as it does
    every wait (testkit.waiting): the closest `timeout` marker, times the scale, put first on
    the item itself, where pytest-timeout looks first."""
    marker = item.get_closest_marker("timeout")
    if TIME_SCALE == 1 or marker is None:
        return
    args, kwargs = list(marker.args), dict(marker.kwargs)
    if args:
        args[0] = args[0] * TIME_SCALE
    elif "timeout" in kwargs:
        kwargs["timeout"] = kwargs["timeout"] * TIME_SCALE
    item.add_marker(pytest.mark.timeout(*args, **kwargs), append=False)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/vllm and tests/engine import vLLM, which only their tiers' environments have."""
    vllm_only = collection_path in (VLLM_TESTS, ENGINE_TESTS)
    return True if vllm_only and not _vllm_installed() else None


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    # Loopback pod IPs let the end-to-end tier run a sim runtime at each pod's own address.
    with running_cluster(gpu_nodes=2, pod_cidr=loopback_pod_cidr()) as local:
        yield local


@pytest.fixture(scope="session")
def crd(cluster: LocalCluster) -> str:
    """The AutoGLMDeployment CRD, installed and established."""
    return cluster.install_crd(CRD_FILE)


@contextlib.contextmanager
def _new_namespace(cluster: LocalCluster) -> Iterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    cluster.kubectl("create", "namespace", name)
    # Pods must pass the `restricted` Pod Security Standard everywhere the tests run.
    cluster.kubectl(
        "label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    """A namespace of the test's own."""
    with _new_namespace(cluster) as name:
        yield name


@pytest.fixture(scope="module")
def module_namespace(cluster: LocalCluster) -> Iterator[str]:
    """One namespace for a module's tests that leave nothing in it (requests the apiserver
    refuses, server-side dry runs)."""
    with _new_namespace(cluster) as name:
        yield name


@pytest.fixture(scope="session")
def inference_pool_crd_file() -> Path:
    """The Gateway API Inference Extension's InferencePool CRD at the pinned release."""
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "gie-crds.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def inference_pool_crd(cluster: LocalCluster, inference_pool_crd_file: Path) -> str:
    """The real InferencePool CRD (inference.networking.k8s.io/v1), installed and established
    (again, if a test before took it away)."""
    return cluster.install_crd(inference_pool_crd_file)


@pytest.fixture
def no_inference_pool_crd(cluster: LocalCluster, inference_pool_crd_file: Path) -> Iterator[str]:
    """A cluster without the InferencePool CRD, as one without a GIE gateway is; put back after.
    Its name."""
    cluster.remove_crd(gateway.CRD_NAME)
    yield gateway.CRD_NAME
    cluster.install_crd(inference_pool_crd_file)


class InputTally:
    """Bad input tried at each boundary, and how much of it got the answer it must get.

    Each boundary test records every input it sends; the totals close the run's summary, so a
    CI log shows how many cases each boundary was tried with, not only that the tests passed.
    """

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}

    def record(self, boundary: str, outcome: str, passed: bool) -> None:
        counts = self.counts.setdefault((boundary, outcome), [0, 0])
        counts[0] += 1
        counts[1] += int(passed)

    def lines(self) -> list[str]:
        return [
            f"{boundary}: {tried} tried, {passed} {outcome}"
            for (boundary, outcome), (tried, passed) in self.counts.items()
        ]


_TALLY = InputTally()


@pytest.fixture(scope="session")
def record_input() -> Callable[[str, str, bool], None]:
    """record_input(boundary, outcome, passed): one bad input sent, and whether it got `outcome`."""
    return _TALLY.record


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    lines = _TALLY.lines()
    if lines:
        terminalreporter.section("bad input")
        for line in lines:
            terminalreporter.write_line(line)
