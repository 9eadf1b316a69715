"""Helpers for the chart tests: find helm, render the chart, pick objects out of the output.

helm comes from $AUTOGLM_BIN_DIR (the directory hack/k8s-bin.sh prints; the cluster fixture
uses the same one) or from PATH. A missing helm fails the test with what to do; it never skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.paths import REPO

CHART = REPO / "charts" / "autoglm"
CRD_SOURCE = REPO / "crds" / "autoglm.io_autoglmdeployments.yaml"
CHART_CRD = CHART / "crds" / "autoglm.io_autoglmdeployments.yaml"
RULES_FILE = CHART / "files" / "operator-rules.yaml"
# helm built without version ldflags assumes Kubernetes 1.20; the tests target this release.
KUBE_VERSION = "1.34.4"
RELEASE = "agl"
NAMESPACE = "autoglm-system"


def find_helm(bin_dir: str | os.PathLike[str] | None = None) -> str:
    candidates = []
    for directory in (bin_dir, os.environ.get("AUTOGLM_BIN_DIR")):
        if directory:
            candidates.append(Path(directory) / "helm")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    pytest.fail(
        "helm not found: looked in "
        + (", ".join(str(c) for c in candidates) or "$AUTOGLM_BIN_DIR (unset)")
        + " and on PATH. Run `bash hack/k8s-bin.sh` (it builds helm v3.19.0 into a cache and "
        "prints the directory) and export AUTOGLM_BIN_DIR=<that directory>.",
        pytrace=False,
    )


def run_helm(
    *args: str,
    helm: str | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    binary = helm or find_helm()
    # A private helm home, so the tests never read or write the user's repositories or cache.
    home = Path(os.environ.get("PYTEST_HELM_HOME", "/tmp/autoglm-helm-home"))
    base = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        **(env or {}),
    }
    result = subprocess.run(
        [binary, *args], capture_output=True, text=True, env=base, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}"
        )
    return result


def set_args(values: Mapping[str, Any] | None) -> list[str]:
    """Values as a YAML file argument would be clumsy in tests; --set-json keeps types exact."""
    import json

    args: list[str] = []
    for key, value in (values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def template_args(
    values: Mapping[str, Any] | None = None, *, namespace: str = NAMESPACE, release: str = RELEASE
) -> list[str]:
    return [
        "template", release, str(CHART), "--namespace", namespace,
        "--kube-version", KUBE_VERSION, *set_args(values),
    ]  # fmt: skip


def render(
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
    extra: Iterable[str] = (),
    helm: str | None = None,
) -> list[dict[str, Any]]:
    """`helm template` with values; the rendered objects, in order."""
    out = run_helm(*template_args(values, namespace=namespace, release=release), *extra, helm=helm)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def operator_rules() -> dict[str, list[dict[str, Any]]]:
    return yaml.safe_load(RULES_FILE.read_text())  # type: ignore[no-any-return]
