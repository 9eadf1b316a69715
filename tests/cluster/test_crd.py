"""The CRD on a real apiserver: defaults, CEL rules, printer columns and the scale subresource."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
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
INVALID: list[tuple[str, Any, str]] = [
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
     "spec.adaptive.prometheus.url in body should match"),
    ("interval-too-short", _with(VALID, "adaptive.intervalSeconds", 1),
     "should be greater than or equal to 5"),
    ("extra-args-dtype", _with(VALID, "engine.extraArgs", ["--dtype=float32"]),
     "engine.extraArgs may not set a flag the operator manages"),
    ("extra-args-tp", _with(VALID, "engine.extraArgs", ["--tensor-parallel-size", "4"]),
     "engine.extraArgs may not set a flag the operator manages"),
    # vLLM's parser reads `_` as `-`, expands unique abbreviations and knows aliases
    ("extra-args-underscores", _with(VALID, "engine.extraArgs", ["--max_model_len", "4096"]),
     "engine.extraArgs may not set a flag the operator manages: --max-model-len "),
    ("extra-args-abbreviated", _with(VALID, "engine.extraArgs", ["--dtyp", "float32"]),
     "engine.extraArgs may not set a flag the operator manages: --dtype "),
    ("extra-args-abbreviated-inline", _with(VALID, "engine.extraArgs", ["--tensor-parallel=1"]),
     "engine.extraArgs may not set a flag the operator manages: --tensor-parallel-size "),
    ("extra-args-alias", _with(VALID, "engine.extraArgs", ["-tp", "1"]),
     "engine.extraArgs may not set a flag the operator manages: --tensor-parallel-size "),
    ("extra-args-disable-alias", _with(VALID, "engine.extraArgs", ["--disable-prefix-caching"]),
     "engine.extraArgs may not set a flag the operator manages: --enable-prefix-caching "),
    ("extra-args-json-form", _with(VALID, "engine.extraArgs", ["--served_model.x", "y"]),
     "engine.extraArgs may not set a flag the operator manages: --served-model-name "),
    ("extra-args-config-file", _with(VALID, "engine.extraArgs", ["--config", "/m/vllm.yaml"]),
     "engine.extraArgs may not use --config: its YAML could set a managed flag or --api-key"),
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
    ("spec-not-an-object", "replicas: 2", "spec in body must be of type object"),
    ("replicas-over-256", _with(VALID, "replicas", 300), "should be less than or equal to 256"),
    # model: what vLLM loads and where from
    ("source-empty", _with(VALID, "model.source", ""),
     "spec.model.source in body should be at least 1 chars long"),
    ("source-looks-like-a-flag", _with(VALID, "model.source", "--trust-remote-code"),
     "spec.model.source in body should match"),
    ("served-name-too-long", _with(VALID, "model.servedName", "m" * 129),
     "spec.model.servedName: Too long"),
    ("pvc-name-not-a-dns-name", _with(VALID, "model.pvcName", "Weights_PVC"),
     "spec.model.pvcName in body should match"),
    ("host-path-relative", _with(VALID, "model.hostPath", "data/models"),
     "spec.model.hostPath in body should match"),
    ("mount-path-relative", _with(VALID, "model.mountPath", "models"),
     "spec.model.mountPath in body should match"),
    # the image and the GPUs
    ("image-empty", _with(VALID, "image", ""),
     "spec.image in body should be at least 1 chars long"),
    ("image-with-a-space", _with(VALID, "image", "ghcr.io/autoglm/runtime 0.1"),
     "spec.image in body should match"),
    ("pull-policy-unknown", _with(VALID, "imagePullPolicy", "Sometimes"),
     'Unsupported value: "Sometimes"'),
    ("gpu-resource-unqualified", _with(VALID, "gpuResourceName", "gpu"),
     "spec.gpuResourceName in body should match"),
    ("dtype-vllm-alias", _with(VALID, "dtype", "half"), 'Unsupported value: "half"'),
    ("policy-lowercase", _with(VALID, "modePolicy", "streaming"), 'Unsupported value: "streaming"'),
    # engine
    ("prefix-caching-not-a-bool", _with(VALID, "engine.enablePrefixCaching", "yes"),
     "spec.engine.enablePrefixCaching: Invalid value"),
    ("batched-tokens-tiny", _with(VALID, "engine.maxNumBatchedTokens", 64),
     "should be greater than or equal to 128"),
    ("reasoning-parser-looks-like-a-flag",
     _with(VALID, "engine.reasoningParser", "--enable-auto-tool-choice"),
     "spec.engine.reasoningParser in body should match"),
    ("shutdown-timeout-zero", _with(VALID, "engine.shutdownTimeoutSeconds", 0),
     "spec.engine.shutdownTimeoutSeconds in body should be greater than or equal to 1"),
    ("startup-timeout-under-a-minute", _with(VALID, "engine.startupTimeoutSeconds", 30),
     "should be greater than or equal to 60"),
    ("extra-args-served-name", _with(VALID, "engine.extraArgs", ["--served-model-name=gpt-4"]),
     "engine.extraArgs may not set a flag the operator manages"),
    ("extra-args-api-key", _with(VALID, "engine.extraArgs", ["--api-key", "k"]),
     "engine.extraArgs: the API key may not be given as --api-key: put it in a Secret and name "
     "it in apiKeySecretRef"),
    ("extra-args-api-key-inline", _with(VALID, "engine.extraArgs", ["--api-key=k"]),
     "name it in apiKeySecretRef"),
    ("extra-args-api-key-underscore", _with(VALID, "engine.extraArgs", ["--api_key=k"]),
     "name it in apiKeySecretRef"),
    ("extra-args-api-key-json-form", _with(VALID, "engine.extraArgs", ["--api-key.x", "k"]),
     "engine.extraArgs: the API key may not be given as --api-key"),
    ("extra-args-api-key-prefix", _with(VALID, "engine.extraArgs", ["--api-ke", "k"]),
     "name it in apiKeySecretRef"),
    ("extra-args-too-many", _with(VALID, "engine.extraArgs", ["--enforce-eager"] * 65),
     "spec.engine.extraArgs: Too many"),
    ("extra-arg-too-long", _with(VALID, "engine.extraArgs", ["--chat-template=" + "x" * 600]),
     "spec.engine.extraArgs[0]: Too long"),
    ("extra-args-not-a-list", _with(VALID, "engine.extraArgs", "--enforce-eager"),
     "spec.engine.extraArgs: Invalid value"),
    # profiles: the admission policy of each mode
    ("max-queue-negative", _with(VALID, "profiles.streaming", {"maxQueue": -1}),
     "spec.profiles.streaming.maxQueue in body should be greater than or equal to 0"),
    ("concurrency-over-1024", _with(VALID, "profiles.batching", {"maxConcurrency": 2048}),
     "spec.profiles.batching.maxConcurrency in body should be less than or equal to 1024"),
    ("queue-timeout-zero", _with(VALID, "profiles.batching", {"queueTimeoutSeconds": 0}),
     "spec.profiles.batching.queueTimeoutSeconds in body should be greater than or equal to 1"),
    ("batch-window-over-5s", _with(VALID, "profiles.batching", {"batchWindowMillis": 6000}),
     "should be less than or equal to 5000"),
    ("batch-size-over-256", _with(VALID, "profiles.batching", {"batchSize": 300}),
     "should be less than or equal to 256"),
    ("coalesce-zero", _with(VALID, "profiles.batching", {"streamCoalesceChunks": 0}),
     "spec.profiles.batching.streamCoalesceChunks in body should be greater than or equal to 1"),
    ("prioritize-not-a-bool", _with(VALID, "profiles.streaming", {"prioritizeStreams": "yes"}),
     "spec.profiles.streaming.prioritizeStreams: Invalid value"),
    ("profile-of-an-unknown-mode", _with(VALID, "profiles.turbo", {"maxConcurrency": 4}),
     'unknown field "spec.profiles.turbo"'),
    # adaptive: the loop and its Prometheus
    ("prometheus-url-without-host", _with(VALID, "adaptive.prometheus.url", "http://"),
     "spec.adaptive.prometheus.url in body should match"),
    ("prometheus-url-with-a-space", _with(VALID, "adaptive.prometheus.url", "http://prom :9090"),
     "spec.adaptive.prometheus.url in body should match"),
    ("prometheus-timeout-over-a-minute", _with(VALID, "adaptive.prometheus.timeoutSeconds", 120),
     "should be less than or equal to 60"),
    ("query-not-a-string", _with(VALID, "adaptive.prometheus.queries.qps", 42),
     "spec.adaptive.prometheus.queries.qps: Invalid value"),
    ("query-of-an-unknown-signal", _with(VALID, "adaptive.prometheus.queries.latency", "up"),
     'unknown field "spec.adaptive.prometheus.queries.latency"'),
    ("qps-high-zero", _with(VALID, "adaptive.qpsPerReplicaMilli", {"high": 0}),
     "spec.adaptive.qpsPerReplicaMilli.high in body should be greater than or equal to 1"),
    ("queue-low-negative", _with(VALID, "adaptive.queueDepthPerReplica", {"low": -1}),
     "spec.adaptive.queueDepthPerReplica.low in body should be greater than or equal to 0"),
    ("to-batching-over-an-hour", _with(VALID, "adaptive.toBatchingStabilizationSeconds", 7200),
     "should be less than or equal to 3600"),
    ("to-streaming-over-a-day",
     _with(VALID, "adaptive.toStreamingStabilizationSeconds", 100000),
     "should be less than or equal to 86400"),
    ("cooldown-negative", _with(VALID, "adaptive.cooldownSeconds", -5),
     "spec.adaptive.cooldownSeconds in body should be greater than or equal to 0"),
    ("max-flips-zero", _with(VALID, "adaptive.maxFlipsPerStep", 0),
     "spec.adaptive.maxFlipsPerStep in body should be greater than or equal to 1"),
    ("min-streaming-negative", _with(VALID, "adaptive.minStreamingReplicas", -1),
     "spec.adaptive.minStreamingReplicas in body should be greater than or equal to 0"),
    ("dry-run-a-string", _with(VALID, "adaptive.dryRun", "true"),
     "spec.adaptive.dryRun: Invalid value"),
    ("paused-a-number", _with(VALID, "adaptive.paused", 1), "spec.adaptive.paused: Invalid value"),
    # resources, scheduling, service, API key
    ("gpu-in-requests", _with(VALID, "resources.requests", {"amd.com/gpu": 1}),
     "resources.requests may not name a GPU: use gpusPerReplica"),
    ("memory-not-a-quantity", _with(VALID, "resources.limits", {"memory": "lots"}),
     "spec.resources.limits.memory in body should match"),
    ("cpu-negative", _with(VALID, "resources.requests", {"cpu": -1}),
     "spec.resources.requests.cpu in body should be greater than or equal to 0"),
    ("requests-too-many", _with(VALID, "resources.requests", {f"example.com/r{i}": 1
                                                               for i in range(33)}),
     "spec.resources.requests: Too many"),
    ("node-selector-not-a-string", _with(VALID, "scheduling.nodeSelector", {"zone": 1}),
     "spec.scheduling.nodeSelector.zone: Invalid value"),
    ("node-selector-not-a-label-value",
     _with(VALID, "scheduling.nodeSelector", {"zone": "eu west"}),
     "spec.scheduling.nodeSelector.zone in body should match"),
    ("tolerations-not-a-list", _with(VALID, "scheduling.tolerations", "gpu"),
     "spec.scheduling.tolerations: Invalid value"),
    ("affinity-not-an-object", _with(VALID, "scheduling.affinity", "zone-a"),
     "spec.scheduling.affinity: Invalid value"),
    ("priority-class-not-a-dns-name",
     _with(VALID, "scheduling.priorityClassName", "High Priority"),
     "spec.scheduling.priorityClassName in body should match"),
    ("service-type-external-name", _with(VALID, "service.type", "ExternalName"),
     'Unsupported value: "ExternalName"'),
    ("service-port-over-65535", _with(VALID, "service.port", 70000),
     "spec.service.port in body should be less than or equal to 65535"),
    ("node-port-out-of-range", _with(VALID, "service", {"type": "NodePort", "nodePort": 80}),
     "spec.service.nodePort in body should be greater than or equal to 30000"),
    ("service-annotation-not-a-string", _with(VALID, "service.annotations", {"team": 7}),
     "spec.service.annotations.team: Invalid value"),
    ("secret-ref-name-not-a-dns-name", _with(VALID, "apiKeySecretRef", {"name": "API key"}),
     "spec.apiKeySecretRef.name in body should match"),
    ("secret-ref-key-with-a-space", _with(VALID, "apiKeySecretRef", {"name": "k", "key": "a b"}),
     "spec.apiKeySecretRef.key in body should match"),
]  # fmt: skip

# Names the CRD's schema allows but the children cannot have: the Services are named
# <name>-streaming and <name>-batching, DNS-1035 labels of at most 63 characters.
NAME_RULE = "metadata.name must be a DNS-1035 label of at most 53 characters"
INVALID_NAMES: list[tuple[str, str, str]] = [
    ("name-with-a-dot", "phone.9b", NAME_RULE),
    ("name-starting-with-a-digit", "9b-phone", NAME_RULE),
    ("name-too-long-for-its-services", "p" * 54, NAME_RULE),
]
BOUNDARY = "invalid AutoGLMDeployments (real apiserver)"
OUTCOME = "rejected at admission with their message"


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


def _assert_rejected(
    cluster: LocalCluster,
    namespace: str,
    obj: dict[str, Any],
    message: str,
    record_input: Callable[[str, str, bool], None],
) -> None:
    result = cluster.apply(obj, namespace, check=False)
    name = obj["metadata"]["name"]
    stored = cluster.kubectl("get", "agd", name, "-n", namespace, check=False).returncode == 0
    rejected = result.returncode != 0 and message in result.stderr and not stored
    record_input(BOUNDARY, OUTCOME, rejected)
    assert result.returncode != 0, f"accepted: {json.dumps(obj)}"
    assert message in result.stderr, result.stderr
    assert not stored


@pytest.mark.parametrize(("spec", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_object_is_rejected_with_its_message(
    cluster: LocalCluster,
    crd: str,
    namespace: str,
    spec: dict[str, Any],
    message: str,
    record_input: Callable[[str, str, bool], None],
) -> None:
    _assert_rejected(cluster, namespace, _object("bad", spec), message, record_input)


@pytest.mark.parametrize(
    ("name", "message"), [c[1:] for c in INVALID_NAMES], ids=[c[0] for c in INVALID_NAMES]
)
def test_invalid_name_is_rejected_with_its_message(
    cluster: LocalCluster,
    crd: str,
    namespace: str,
    name: str,
    message: str,
    record_input: Callable[[str, str, bool], None],
) -> None:
    _assert_rejected(cluster, namespace, _object(name, VALID), message, record_input)


def test_the_longest_name_its_services_allow_is_accepted(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    name = "p" * 53
    cluster.apply(_object(name, VALID), namespace)
    assert len(f"{name}-streaming") == 63  # a Service name's limit, reached and not passed


def test_values_next_to_the_rules_are_accepted(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    """The rules refuse what the children cannot carry, and nothing that works."""
    spec = {
        **VALID,
        "model": {"pvcName": "weights.phone-9b", "source": "/weights/AutoGLM-Phone-9B"},
        "gpuResourceName": "amd.com/gpu",
        "engine": {"reasoningParser": ""},  # the way to turn the parser off
        "resources": {"requests": {"cpu": "500m", "memory": "16Gi", "example.com/fpga": 1},
                      "limits": {"memory": "32G", "cpu": 4}},
        "scheduling": {"nodeSelector": {"zone": "eu-west-1a", "spare": ""},
                       "priorityClassName": "gpu.high"},
        "apiKeySecretRef": {"name": "phone.keys", "key": "api_key.v1"},
        "adaptive": {"prometheus": {"url": "https://prom.monitoring.svc:9090/prometheus"}},
    }  # fmt: skip
    cluster.apply(_object("edges", spec), namespace)
    stored = cluster.get_json("agd", "edges", "-n", namespace)["spec"]
    assert stored["resources"]["requests"]["example.com/fpga"] == 1
    assert stored["engine"]["reasoningParser"] == ""


def test_extra_args_that_set_no_managed_flag_are_accepted(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    """Flags of their own, also ones sharing a prefix with a managed flag, pass the rules."""
    extra = ["--enforce-eager", "--seed=0", "--max-num-partial-prefills", "2",
             "--reasoning-parser-plugin", "/p.py", "--config-format=hf", "--pooler-config", "{}",
             "--disable-log-stats", "--limit-mm-per-prompt.image", "2"]
    cluster.apply(_object("extras", _with(VALID, "engine.extraArgs", extra)), namespace)
    stored = cluster.get_json("agd", "extras", "-n", namespace)["spec"]
    assert stored["engine"]["extraArgs"] == extra


def test_at_least_fifty_invalid_cases() -> None:
    cases = [c[0] for c in INVALID] + [c[0] for c in INVALID_NAMES]
    assert len(set(cases)) == len(cases), "case ids must be distinct"
    print(f"{len(cases)} invalid AutoGLMDeployments, each with the message it must be refused with")
    assert len(cases) >= 50


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
