"""The CRD on a real apiserver: defaults, CEL rules, printer columns and the scale subresource."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoglm_operator.spec import AutoGLMDeploymentSpec
from localcluster import LocalCluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "autoglm.yaml").read_text())


def _object(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "autoglm.io/v1alpha1",
        "kind": "AutoGLMDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `base` with the dotted `path` set to `value`."""
    result = copy.deepcopy(base)
    node = result
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return result


VALID = {"replicas": 2, "adaptive": {"prometheus": {"url": "http://prom:9090"}}}

# (case id, spec, the message the apiserver must give)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("gpus-zero", _with(VALID, "gpusPerReplica", 0), "should be greater than or equal to 1"),
    ("gpus-nine", _with(VALID, "gpusPerReplica", 9), "should be less than or equal to 8"),
    ("context-over-model-limit", _with(VALID, "maxModelLen", 16384),
     "maxModelLen must be at most 8192, the context limit of AutoGLM-Phone-9B"),
    ("context-tiny", _with(VALID, "maxModelLen", 16), "should be greater than or equal to 128"),
    ("dtype-unknown", _with(VALID, "dtype", "int8"), 'Unsupported value: "int8"'),
    ("policy-unknown", _with(VALID, "modePolicy", "Turbo"), 'Unsupported value: "Turbo"'),
    ("strategy-unknown", _with(VALID, "switchStrategy", "Instant"), 'Unsupported value: "Instant"'),
    ("replicas-negative", _with(VALID, "replicas", -1), "should be greater than or equal to 0"),
    ("qps-low-above-high", _with(VALID, "adaptive.qpsPerReplicaMilli", {"high": 2000, "low": 2500}),
     "low must be below high: the gap between them is the hysteresis band"),
    ("vram-low-equals-high", _with(VALID, "adaptive.gpuMemoryPercent", {"high": 96, "low": 96}),
     "low must be below high"),
    ("queue-low-above-high", _with(VALID, "adaptive.queueDepthPerReplica", {"high": 2, "low": 5}),
     "low must be below high"),
    ("vram-over-100", _with(VALID, "adaptive.gpuMemoryPercent", {"high": 120, "low": 96}),
     "should be less than or equal to 100"),
    ("vram-band-under-reservation",
     _with(VALID, "adaptive.gpuMemoryPercent", {"high": 85, "low": 70}),
     "adaptive.gpuMemoryPercent.low must be above engine.gpuMemoryUtilizationPercent"),
    ("min-streaming-over-replicas", _with(VALID, "adaptive.minStreamingReplicas", 3),
     "adaptive.minStreamingReplicas must not exceed replicas"),
    ("adaptive-without-prometheus", {"replicas": 1},
     "modePolicy Adaptive needs adaptive.prometheus.url (or adaptive.paused: true)"),
    ("prometheus-url-scheme", _with(VALID, "adaptive.prometheus.url", "ftp://prom:9090"),
     "should match '^https?://'"),
    ("interval-too-short", _with(VALID, "adaptive.intervalSeconds", 1),
     "should be greater than or equal to 5"),
    ("extra-args-dtype", _with(VALID, "engine.extraArgs", ["--dtype=float32"]),
     "engine.extraArgs may not set a flag the operator manages"),
    ("extra-args-tp", _with(VALID, "engine.extraArgs", ["--tensor-parallel-size", "4"]),
     "engine.extraArgs may not set a flag the operator manages"),
    ("gpu-memory-utilization-100", _with(VALID, "engine.gpuMemoryUtilizationPercent", 100),
     "should be less than or equal to 99"),
    ("batched-tokens-below-batch", _with(
        _with(VALID, "engine.maxNumBatchedTokens", 256), "profiles.batching.maxConcurrency", 512),
     "engine.maxNumBatchedTokens must be at least profiles.batching.maxConcurrency"),
    ("pvc-and-hostpath", _with(_with(VALID, "model.pvcName", "w"), "model.hostPath", "/data"),
     "model.pvcName and model.hostPath are alternatives: set at most one"),
    ("served-name-pattern", _with(VALID, "model.servedName", "bad name!"), "should match"),
    ("gpu-in-resources", _with(VALID, "resources.limits", {"nvidia.com/gpu": 2}),
     "resources.limits may not name a GPU: use gpusPerReplica"),
    ("node-port-on-cluster-ip", _with(VALID, "service.nodePort", 30080),
     "service.nodePort needs service.type NodePort"),
    ("batch-size-without-window", _with(
        VALID, "profiles.batching", {"batchSize": 8, "batchWindowMillis": 0}),
     "batchSize above 1 needs batchWindowMillis above 0"),
    ("concurrency-zero", _with(VALID, "profiles.streaming", {"maxConcurrency": 0}),
     "should be greater than or equal to 1"),
    ("secret-ref-without-name", _with(VALID, "apiKeySecretRef", {"key": "k"}), "Required value"),
    ("unknown-field", _with(VALID, "gpus", 2), 'unknown field "spec.gpus"'),
    ("replicas-not-a-number", _with(VALID, "replicas", "two"), 'must be of type integer'),
]  # fmt: skip


def test_example_is_accepted_and_defaulted(cluster: LocalCluster, crd: str, namespace: str) -> None:
    cluster.apply(EXAMPLE, namespace)
    stored = cluster.get_json("agd", "phone-9b", "-n", namespace)["spec"]
    assert stored["gpusPerReplica"] == 2
    assert stored["dtype"] == "float16"
    assert stored["maxModelLen"] == 2048
    assert stored["modePolicy"] == "Adaptive"
    assert stored["switchStrategy"] == "InPlace"
    assert stored["profiles"]["streaming"]["maxConcurrency"] == 8
    assert stored["profiles"]["batching"]["batchWindowMillis"] == 100
    assert stored["profiles"]["batching"]["batchSize"] == 4
    assert stored["adaptive"]["intervalSeconds"] == 15
    assert "apiKeySecretRef" not in stored
    # The apiserver's defaults and the model's are one and the same.
    expected = AutoGLMDeploymentSpec.model_validate(EXAMPLE["spec"])
    assert stored == expected.model_dump(by_alias=True, mode="json", exclude_none=True)


@pytest.mark.parametrize(("spec", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_object_is_rejected_with_its_message(
    cluster: LocalCluster, crd: str, namespace: str, spec: dict[str, Any], message: str
) -> None:
    result = cluster.apply(_object("bad", spec), namespace, check=False)
    assert result.returncode != 0, f"accepted: {json.dumps(spec)}"
    assert message in result.stderr, result.stderr
    assert cluster.kubectl("get", "agd", "bad", "-n", namespace, check=False).returncode != 0


def test_at_least_twenty_invalid_cases() -> None:
    assert len(INVALID) >= 20


def test_served_name_is_immutable(cluster: LocalCluster, crd: str, namespace: str) -> None:
    cluster.apply(_object("named", VALID), namespace)
    changed = _object("named", _with(VALID, "model.servedName", "other"))
    result = cluster.apply(changed, namespace, check=False)
    assert result.returncode != 0
    assert "model.servedName is immutable" in result.stderr


def test_printer_columns_and_scale(cluster: LocalCluster, crd: str, namespace: str) -> None:
    cluster.apply(_object("scaled", VALID), namespace)
    header = cluster.kubectl("get", "agd", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "STREAMING", "BATCHING", "POLICY", "ENDPOINT", "AGE"]
    row = cluster.kubectl("get", "agd", "scaled", "-n", namespace, "--no-headers").stdout.split()
    assert row[0] == "scaled" and "Adaptive" in row
    cluster.kubectl("scale", "agd/scaled", "--replicas=3", "-n", namespace)
    assert cluster.get_json("agd", "scaled", "-n", namespace)["spec"]["replicas"] == 3
    scale = json.loads(
        cluster.kubectl(
            "get", "--raw",
            f"/apis/autoglm.io/v1alpha1/namespaces/{namespace}/autoglmdeployments/scaled/scale",
        ).stdout
    )  # fmt: skip
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
