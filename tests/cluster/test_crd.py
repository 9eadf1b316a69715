"""The CRD on a real apiserver: defaults, CEL rules, printer columns and the scale subresource."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.localcluster import LocalCluster

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


def _node_terms(terms: list[dict[str, Any]]) -> dict[str, Any]:
    """An affinity whose required node affinity has these terms."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}  # fmt: skip


def _pod_terms(term: dict[str, Any]) -> dict[str, Any]:
    """An affinity whose required pod affinity has this one term."""
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


VALID = {"replicas": 2, "adaptive": {"prometheus": {"url": "http://prom:9090"}}}

# (case id, spec, the message the apiserver must give)
INVALID: list[tuple[str, Any, str]] = [
    ("gpus-zero", _with(VALID, "gpusPerReplica", 0), "should be greater than or equal to 1"),
    ("gpus-nine", _with(VALID, "gpusPerReplica", 9), "should be less than or equal to 8"),
    ("context-over-model-limit", _with(VALID, "maxModelLen", 65537),
     "maxModelLen must be at most 65536, the positions AutoGLM-Phone-9B's architecture"),
    ("image-budget-over-context", _with(VALID, "multimodal.maxPixels", 5_000_000),
     "multimodal.maxPixels leaves no room in maxModelLen"),
    ("image-budget-under-floor", _with(VALID, "multimodal.maxPixels", 1000),
     "should be greater than or equal to 12544"),
    ("context-tiny", _with(VALID, "maxModelLen", 16), "should be greater than or equal to 128"),
    ("images-none", _with(VALID, "multimodal.imagesPerPrompt", 0),
     "should be greater than or equal to 1"),
    ("media-domain-ip", _with(VALID, "multimodal.allowedMediaDomains", ["169.254.169.254"]),
     "should match"),
    ("media-domain-bare-name", _with(VALID, "multimodal.allowedMediaDomains", ["kubernetes"]),
     "should match"),
    ("media-domain-cluster-service",
     _with(VALID, "multimodal.allowedMediaDomains", ["kubernetes.default.svc"]),
     "multimodal.allowedMediaDomains may not name a cluster-internal or local host"),
    ("media-domain-upper-case", _with(VALID, "multimodal.allowedMediaDomains", ["CDN.Example"]),
     "should match"),
    ("gateway-without-router",
     _with(_with(VALID, "router.enabled", False), "gateway.enabled", True),
     "gateway.enabled needs router.enabled: the InferencePool's endpoint picker runs in the "
     "router pods"),
    ("scale-to-zero-without-router",
     _with(_with(VALID, "router.enabled", False), "scaleToZero.enabled", True),
     "scaleToZero.enabled needs router.enabled: the router holds the requests that arrive "
     "while no replica runs"),
    ("scale-to-zero-floor-over-replicas",
     _with(VALID, "scaleToZero", {"enabled": True, "floor": 3}),
     "scaleToZero.floor must not exceed replicas"),
    ("sleep-after-zero",
     _with(VALID, "scaleToZero", {"enabled": True, "idleSeconds": 300,
                                  "sleep": {"enabled": True, "idleSeconds": 300}}),
     "scaleToZero.sleep.idleSeconds must be below scaleToZero.idleSeconds when floor is 0"),
    ("scale-to-zero-idle-too-short", _with(VALID, "scaleToZero.idleSeconds", 5),
     "should be greater than or equal to 10"),
    ("sleep-level-three", _with(VALID, "scaleToZero.sleep.level", 3),
     "should be less than or equal to 2"),
    ("autoscaling-min-over-max",
     _with(VALID, "autoscaling", {"enabled": True, "minReplicas": 5, "maxReplicas": 4}),
     "autoscaling.minReplicas must not exceed autoscaling.maxReplicas"),
    ("autoscaling-streaming-floor-over-max",
     _with(_with(VALID, "autoscaling", {"enabled": True, "maxReplicas": 2}),
           "adaptive.minStreamingReplicas", 3),
     "adaptive.minStreamingReplicas must not exceed autoscaling.maxReplicas"),
    ("autoscaling-to-zero-without-router",
     _with(_with(VALID, "router.enabled", False), "autoscaling",
           {"enabled": True, "minReplicas": 0}),
     "autoscaling.minReplicas 0 needs router.enabled: the router holds the requests that arrive "
     "while no replica runs"),
    ("autoscaling-without-prometheus",
     {"replicas": 1, "adaptive": {"paused": True}, "autoscaling": {"enabled": True}},
     "autoscaling.enabled needs adaptive.prometheus.url: the fleet is sized by the demand it "
     "measures"),
    ("autoscaling-max-zero", _with(VALID, "autoscaling.maxReplicas", 0),
     "should be greater than or equal to 1"),
    ("autoscaling-scale-down-step-zero", _with(VALID, "autoscaling.scaleDown.maxStep", 0),
     "should be greater than or equal to 1"),
    ("hold-queue-negative", _with(VALID, "router.hold.queueSize", -1),
     "should be greater than or equal to 0"),
    ("hold-per-client-over-the-queue",
     _with(_with(VALID, "router.hold.queueSize", 8), "router.hold.perClient", 9),
     "router.hold.perClient must not exceed router.hold.queueSize"),
    ("hold-heartbeat-zero", _with(VALID, "router.hold.heartbeatSeconds", 0),
     "should be greater than or equal to 1"),
    ("hold-wait-over-an-hour", _with(VALID, "router.hold.waitSeconds", 3601),
     "should be less than or equal to 3600"),
    ("gateway-failure-mode-unknown", _with(VALID, "gateway.failureMode", "FailSilently"),
     'Unsupported value: "FailSilently"'),
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
    ("slo-chat-ttft-beyond-batch-deadline",
     _with(VALID, "adaptive.slo",
           {"chatTimeToFirstTokenMillis": 5000, "batchCompletionSeconds": 4}),
     "chatTimeToFirstTokenMillis must not exceed batchCompletionSeconds"),
    ("slo-tpot-in-the-wrong-unit",
     _with(VALID, "adaptive.slo", {"chatTimeToFirstTokenMillis": 100,
                                   "chatTimePerOutputTokenMillis": 1001}),
     "chatTimePerOutputTokenMillis must be at most ten times chatTimeToFirstTokenMillis"),
    ("slo-ttft-below-a-replica", _with(VALID, "adaptive.slo.chatTimeToFirstTokenMillis", 10),
     "should be greater than or equal to 50"),
    ("capacity-seed-zero", _with(VALID, "adaptive.capacity.batchingPerReplicaMilli", 0),
     "should be greater than or equal to 1"),
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
    # model.mountPath: not /, not a system directory, clear of the runtime's own mounts
    ("mount-path-root", _with(VALID, "model.mountPath", "/"),
     "model.mountPath must be an absolute path other than '/'"),
    ("mount-path-trailing-slash", _with(VALID, "model.mountPath", "/models/"),
     "model.mountPath must be an absolute path other than '/'"),
    ("mount-path-dot-dot", _with(VALID, "model.mountPath", "/models/../etc"),
     "model.mountPath must be an absolute path other than '/'"),
    ("mount-path-system-dir", _with(VALID, "model.mountPath", "/usr"),
     "model.mountPath may not be or lie inside a system directory"),
    ("mount-path-inside-a-system-dir", _with(VALID, "model.mountPath", "/var/lib/models"),
     "model.mountPath may not be or lie inside a system directory"),
    ("mount-path-the-config-dir", _with(VALID, "model.mountPath", "/etc/autoglm"),
     "model.mountPath may not be, contain or lie inside a path the runtime mounts"),
    ("mount-path-inside-the-admin-token", _with(VALID, "model.mountPath", "/etc/autoglm/admin/w"),
     "model.mountPath may not be, contain or lie inside a path the runtime mounts"),
    ("mount-path-above-podinfo", _with(VALID, "model.mountPath", "/etc"),
     "model.mountPath may not be, contain or lie inside a path the runtime mounts"),
    ("mount-path-shared-memory", _with(VALID, "model.mountPath", "/dev/shm"),
     "model.mountPath may not be, contain or lie inside a path the runtime mounts"),
    # scheduling.tolerations: core/v1 Toleration and the pod validator's rules
    ("toleration-effect-unknown", _with(VALID, "scheduling.tolerations", [
        {"key": "gpu", "operator": "Exists", "effect": "Explode"}]),
     'spec.scheduling.tolerations[0].effect: Unsupported value: "Explode"'),
    ("toleration-operator-unknown", _with(VALID, "scheduling.tolerations", [
        {"key": "gpu", "operator": "Like", "value": "a"}]),
     'spec.scheduling.tolerations[0].operator: Unsupported value: "Like"'),
    ("toleration-exists-with-a-value", _with(VALID, "scheduling.tolerations", [
        {"key": "gpu", "operator": "Exists", "value": "a100"}]),
     "scheduling.tolerations: value must be empty when operator is Exists"),
    ("toleration-no-key-with-equal", _with(VALID, "scheduling.tolerations", [
        {"operator": "Equal", "value": "x"}]),
     "scheduling.tolerations: a toleration without a key must have operator Exists"),
    ("toleration-seconds-without-no-execute", _with(VALID, "scheduling.tolerations", [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}]),
     "scheduling.tolerations: tolerationSeconds needs effect NoExecute"),
    ("toleration-key-not-a-label-key", _with(VALID, "scheduling.tolerations", [
        {"key": "gpu type", "operator": "Exists"}]),
     "spec.scheduling.tolerations[0].key in body should match"),
    ("toleration-key-prefix-too-long", _with(VALID, "scheduling.tolerations", [
        {"key": "a" * 254 + "/gpu", "operator": "Exists"}]),
     "scheduling.tolerations: a label key's prefix (before '/') is at most 253 characters"),
    ("toleration-value-not-a-label-value", _with(VALID, "scheduling.tolerations", [
        {"key": "gpu", "operator": "Equal", "value": "a100 80g"}]),
     "spec.scheduling.tolerations[0].value in body should match"),
    ("toleration-field-misspelt", _with(VALID, "scheduling.tolerations", [
        {"key": "gpu", "operator": "Exists", "efect": "NoSchedule"}]),
     'unknown field "spec.scheduling.tolerations[0].efect"'),
    ("tolerations-too-many", _with(VALID, "scheduling.tolerations", [
        {"key": f"k{i}", "operator": "Exists"} for i in range(65)]),
     "spec.scheduling.tolerations: Too many"),
    # scheduling.affinity: core/v1 Affinity and the pod validator's rules
    ("affinity-field-misspelt", _with(VALID, "scheduling.affinity", {"nodeAfinity": {}}),
     'unknown field "spec.scheduling.affinity.nodeAfinity"'),
    ("node-affinity-no-terms", _with(VALID, "scheduling.affinity", _node_terms([])),
     "nodeSelectorTerms: Invalid value: 0: "
     "spec.scheduling.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
     ".nodeSelectorTerms in body should have at least 1 items"),
    ("node-affinity-operator-unknown", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchExpressions": [{"key": "zone", "operator": "Like", "values": ["a"]}]}])),
     'Unsupported value: "Like"'),
    ("node-affinity-in-without-values", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchExpressions": [{"key": "zone", "operator": "In"}]}])),
     "scheduling.affinity: a node selector requirement with operator In or NotIn needs values"),
    ("node-affinity-exists-with-values", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}])),
     "scheduling.affinity: a node selector requirement with operator Exists or DoesNotExist "
     "takes no values"),
    ("node-affinity-gt-two-values", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["1", "2"]}]}])),
     "needs exactly one integer value"),
    ("node-affinity-lt-not-a-number", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["eight"]}]}])),
     "needs exactly one integer value"),
    ("node-affinity-value-not-a-label-value", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["eu west"]}]}])),
     ".matchExpressions[0].values[0] in body should match"),
    ("node-affinity-key-missing", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchExpressions": [{"operator": "Exists"}]}])),
     ".matchExpressions[0].key: Required value"),
    ("node-affinity-match-field-label", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["a"]}]}])),
     "scheduling.affinity: matchFields can only select on the key metadata.name"),
    ("node-affinity-match-field-two-nodes", _with(VALID, "scheduling.affinity", _node_terms([
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]}])),
     "scheduling.affinity: matchFields needs operator In or NotIn with exactly one node name"),
    ("node-affinity-weight-zero", _with(VALID, "scheduling.affinity", {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}}),
     ".weight in body should be greater than or equal to 1"),
    ("pod-anti-affinity-weight-over-100", _with(VALID, "scheduling.affinity", {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 101, "podAffinityTerm": {"topologyKey": "zone"}}]}}),
     ".weight in body should be less than or equal to 100"),
    ("pod-affinity-without-topology-key", _with(VALID, "scheduling.affinity", _pod_terms(
        {"labelSelector": {"matchLabels": {"app": "cache"}}})),
     ".topologyKey: Required value"),
    ("pod-affinity-topology-key-empty", _with(VALID, "scheduling.affinity", _pod_terms(
        {"topologyKey": ""})),
     ".topologyKey in body should match"),
    ("pod-affinity-selector-exists-with-values", _with(VALID, "scheduling.affinity", _pod_terms(
        {"topologyKey": "zone", "labelSelector": {"matchExpressions": [
            {"key": "app", "operator": "DoesNotExist", "values": ["x"]}]}})),
     "scheduling.affinity: a label selector requirement with operator Exists or DoesNotExist "
     "takes no values"),
    ("pod-affinity-selector-in-without-values", _with(VALID, "scheduling.affinity", _pod_terms(
        {"topologyKey": "zone", "labelSelector": {"matchExpressions": [
            {"key": "app", "operator": "NotIn"}]}})),
     "scheduling.affinity: a label selector requirement with operator In or NotIn needs values"),
    ("pod-affinity-selector-operator-gt", _with(VALID, "scheduling.affinity", _pod_terms(
        {"topologyKey": "zone", "labelSelector": {"matchExpressions": [
            {"key": "app", "operator": "Gt", "values": ["1"]}]}})),
     'Unsupported value: "Gt"'),
    ("pod-affinity-match-labels-bad-key", _with(VALID, "scheduling.affinity", _pod_terms(
        {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app name": "cache"}}})),
     "scheduling.affinity: every matchLabels key must be a label key"),
    ("pod-affinity-match-labels-bad-value", _with(VALID, "scheduling.affinity", _pod_terms(
        {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "-cache"}}})),
     ".labelSelector.matchLabels.app in body should match"),
    ("pod-affinity-namespace-not-a-dns-label", _with(VALID, "scheduling.affinity", _pod_terms(
        {"topologyKey": "zone", "namespaces": ["Team_A"]})),
     ".namespaces[0] in body should match"),
    ("pod-affinity-match-label-keys-without-selector", _with(
        VALID, "scheduling.affinity", _pod_terms({"topologyKey": "zone",
                                                  "matchLabelKeys": ["pod-template-hash"]})),
     "scheduling.affinity: matchLabelKeys needs labelSelector"),
    ("pod-affinity-key-matched-and-mismatched", _with(
        VALID, "scheduling.affinity", _pod_terms({
            "topologyKey": "zone", "labelSelector": {}, "matchLabelKeys": ["tenant"],
            "mismatchLabelKeys": ["tenant"]})),
     "scheduling.affinity: a key may not be in both matchLabelKeys and mismatchLabelKeys"),
    ("pod-affinity-match-label-key-in-selector", _with(
        VALID, "scheduling.affinity", _pod_terms({
            "topologyKey": "zone", "labelSelector": {"matchLabels": {"tenant": "a"}},
            "matchLabelKeys": ["tenant"]})),
     "scheduling.affinity: a key in matchLabelKeys may not also be in labelSelector"),
    # The router (spec.router): CPU only, a load factor the bound can meet, whole replicas.
    ("router-gpu-limit", _with(VALID, "router.resources.limits", {"nvidia.com/gpu": 1}),
     "router.resources.limits may name only cpu, memory, ephemeral-storage"),
    ("router-gpu-request", _with(VALID, "router.resources.requests",
                                 {"cpu": "1", "amd.com/gpu": 1}),
     "router.resources.requests may name only cpu, memory, ephemeral-storage"),
    ("router-load-factor-below-one", _with(VALID, "router.sessionAffinity.loadFactor", "0.9"),
     "router.sessionAffinity.loadFactor must be from 1.0 to 10"),
    ("router-load-factor-too-high", _with(VALID, "router.sessionAffinity.loadFactor", "10.5"),
     "router.sessionAffinity.loadFactor must be from 1.0 to 10"),
    ("router-load-factor-not-a-number", _with(VALID, "router.sessionAffinity.loadFactor", "1,5"),
     "spec.router.sessionAffinity.loadFactor in body should match"),
    ("router-load-factor-a-yaml-number", _with(VALID, "router.sessionAffinity.loadFactor", 1.5),
     "spec.router.sessionAffinity.loadFactor: Invalid value: \"number\""),
    ("router-no-replicas", _with(VALID, "router.replicas", 0),
     "spec.router.replicas: Invalid value: 0"),
    ("router-bad-image", _with(VALID, "router.image", "ghcr.io/autoglm/router: 1"),
     "spec.router.image in body should match"),
    # Under the clients' own idle reuse (aiohttp's 15 s), a request meets the router's close.
    ("router-keep-alive-under-the-clients",
     _with(VALID, "router.limits.keepAliveTimeoutSeconds", 5),
     "spec.router.limits.keepAliveTimeoutSeconds: Invalid value: 5"),
    ("router-body-limit-under-a-screenshot", _with(VALID, "router.limits.maxBodyBytes", 1000),
     "spec.router.limits.maxBodyBytes: Invalid value: 1000"),
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
    assert stored["profiles"]["batching"]["batchWindowMillis"] == 0
    assert stored["profiles"]["batching"]["batchSize"] == 1
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
    if stored:  # the namespace is shared: the next case must create, not update
        cluster.kubectl("delete", "agd", name, "-n", namespace, "--wait=false", check=False)
    assert result.returncode != 0, f"accepted: {json.dumps(obj)}"
    assert message in result.stderr, result.stderr
    assert not stored


@pytest.mark.parametrize(("spec", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_object_is_rejected_with_its_message(
    cluster: LocalCluster,
    crd: str,
    module_namespace: str,
    spec: dict[str, Any],
    message: str,
    record_input: Callable[[str, str, bool], None],
) -> None:
    _assert_rejected(cluster, module_namespace, _object("bad", spec), message, record_input)


@pytest.mark.parametrize(
    ("name", "message"), [c[1:] for c in INVALID_NAMES], ids=[c[0] for c in INVALID_NAMES]
)
def test_invalid_name_is_rejected_with_its_message(
    cluster: LocalCluster,
    crd: str,
    module_namespace: str,
    name: str,
    message: str,
    record_input: Callable[[str, str, bool], None],
) -> None:
    _assert_rejected(cluster, module_namespace, _object(name, VALID), message, record_input)


def test_the_longest_name_its_services_allow_is_accepted(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    name = "p" * 53
    cluster.apply(_object(name, VALID), namespace)
    assert len(f"{name}-streaming") == 63  # a Service name's limit, reached and not passed


def test_autoscaling_next_to_its_rules_is_accepted(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    """With autoscaling on, spec.replicas is not read: it may sit below minStreamingReplicas
    and scaleToZero.floor (minReplicas is the floor); minReplicas may equal maxReplicas, and 0
    with the router on."""
    spec = {
        **VALID, "replicas": 0,
        "adaptive": {**VALID["adaptive"], "minStreamingReplicas": 2},
        "scaleToZero": {"enabled": True, "floor": 1},
        "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2,
                        "scaleDown": {"stabilizationSeconds": 0, "periodSeconds": 0}},
    }
    cluster.apply(_object("sized", spec), namespace)
    stored = cluster.get_json("agd", "sized", "-n", namespace)["spec"]["autoscaling"]
    assert stored["headroomPercent"] == 20 and stored["scaleUp"] == {
        "stabilizationSeconds": 0, "maxStep": 4}
    spec["autoscaling"] = {"enabled": True, "minReplicas": 2, "maxReplicas": 2}
    cluster.apply(_object("sized", spec), namespace)


def test_values_next_to_the_rules_are_accepted(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    """The rules refuse what the children cannot carry, and nothing that works."""
    spec = {
        **VALID,
        "model": {"pvcName": "weights.phone-9b", "source": "/weights/AutoGLM-Phone-9B"},
        "gpuResourceName": "amd.com/gpu",
        "engine": {"reasoningParser": ""},  # the way to turn the parser off
        "multimodal": {"imagesPerPrompt": 64, "allowedMediaDomains": ["cdn.example.com", "x.io"],
                       # at the edge: one image and the default completion fill the context
                       "maxPixels": (2048 - 512) * 1568},
        "resources": {"requests": {"cpu": "500m", "memory": "16Gi", "example.com/fpga": 1},
                      "limits": {"memory": "32G", "cpu": 4}},
        "scheduling": {"nodeSelector": {"zone": "eu-west-1a", "spare": ""},
                       "priorityClassName": "gpu.high"},
        "apiKeySecretRef": {"name": "phone.keys", "key": "api_key.v1"},
        "adaptive": {"prometheus": {"url": "https://prom.monitoring.svc:9090/prometheus"},
                     # both SLO rules at their edge: TTFT = the batch deadline, TPOT = 10 x TTFT
                     "slo": {"chatTimeToFirstTokenMillis": 1000, "batchCompletionSeconds": 1,
                             "chatTimePerOutputTokenMillis": 10000}},
    }  # fmt: skip
    spec["router"] = {
        "resources": {"requests": {"cpu": "100m", "ephemeral-storage": "1Gi"},
                      "limits": {"memory": "1Gi"}},
        "sessionAffinity": {"loadFactor": "1.0"}, "replicas": 32, "spill": False,
        "limits": {"keepAliveTimeoutSeconds": 16, "maxBodyBytes": 1 << 20, "maxInflight": 1},
    }  # fmt: skip
    spec["gateway"] = {"enabled": True, "failureMode": "FailOpen"}
    cluster.apply(_object("edges", spec), namespace)
    stored = cluster.get_json("agd", "edges", "-n", namespace)["spec"]
    assert stored["resources"]["requests"]["example.com/fpga"] == 1
    assert stored["engine"]["reasoningParser"] == ""
    assert stored["router"]["sessionAffinity"]["loadFactor"] == "1.0"
    assert stored["router"]["enabled"] is True  # defaulted
    assert stored["gateway"] == {"enabled": True, "failureMode": "FailOpen"}
    for factor in ("10", "10.0", "1.25"):
        spec["router"]["sessionAffinity"]["loadFactor"] = factor
        cluster.apply(_object("edges", spec), namespace)


# Scheduling a GPU fleet really uses, next to the rules: a keyless Exists toleration, Gt with an
# integer, matchFields on a node name, an empty namespaceSelector, matchLabelKeys.
REALISTIC_SCHEDULING: dict[str, Any] = {
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300},
        {"key": "spot", "value": "true"},  # operator left out: Equal
        {"operator": "Exists"},  # no key: tolerates every taint
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In",
                     "values": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]},
                    {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1"]},
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"},
                ]},
                {"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": ["gpu-node-0.eu-west-1"]}]},
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In",
                     "values": ["eu-west-1a"]}]}},
            ],
        },
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchExpressions": [
                {"key": "app", "operator": "In", "values": ["kv-cache"]}]},
             "namespaceSelector": {}, "namespaces": ["cache-system"],
             "topologyKey": "topology.kubernetes.io/zone"},
        ]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "scheduled"}},
                "matchLabelKeys": ["pod-template-hash"],
                "topologyKey": "kubernetes.io/hostname"}},
        ]},
    },
}  # fmt: skip


def test_realistic_scheduling_is_accepted_and_so_is_its_deployment(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    """What the rules let through is stored whole (no field pruned) and the Deployment the
    operator builds from it passes the apiserver's own pod template validation."""
    cluster.apply(_object("scheduled", {**VALID, "scheduling": REALISTIC_SCHEDULING}), namespace)
    stored = cluster.get_json("agd", "scheduled", "-n", namespace)
    assert stored["spec"]["scheduling"] == REALISTIC_SCHEDULING
    owner = builders.Owner("scheduled", namespace, stored["metadata"]["uid"])
    deployment = builders.deployment(owner, AutoGLMDeploymentSpec.model_validate(stored["spec"]))
    result = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
        input=json.dumps(deployment), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    pod_spec = json.loads(result.stdout)["spec"]["template"]["spec"]
    # after the operator's own toleration of the GPU taint
    assert pod_spec["tolerations"][1:] == REALISTIC_SCHEDULING["tolerations"]
    assert pod_spec["affinity"] == REALISTIC_SCHEDULING["affinity"]


# Scheduling the CRD refuses although a Deployment carrying it is accepted, each with the reason.
STRICTER_THAN_A_DEPLOYMENT = {
    "tolerations-too-many": "a bound, so the apiserver can bound the CEL rules' cost",
    "node-affinity-lt-not-a-number": "the scheduler cannot compare it: the pods never schedule",
    "pod-affinity-match-label-key-in-selector":
        "refused when the ReplicaSet creates a pod, once the key is merged into the selector",
}  # fmt: skip
SCHEDULING_CASES = [
    c
    for c in INVALID
    if c[0].startswith(("toleration-", "tolerations-too", "node-affinity", "pod-a", "affinity-f"))
]


@pytest.mark.parametrize(
    "spec", [c[1] for c in SCHEDULING_CASES], ids=[c[0] for c in SCHEDULING_CASES]
)
def test_refused_scheduling_is_what_kubernetes_refuses(
    cluster: LocalCluster, module_namespace: str, spec: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    """The scheduling rules are Kubernetes' own: the Deployment the operator would build from
    each refused spec is refused by the apiserver too, but for the few listed stricter ones."""
    case = request.node.callspec.id
    owner = builders.Owner("refused", module_namespace, "0000")
    deployment = builders.deployment(owner, AutoGLMDeploymentSpec.model_validate(spec))
    result = cluster.kubectl(
        "create", "--dry-run=server", "-n", module_namespace, "-f", "-",
        input=json.dumps(deployment), check=False,
    )  # fmt: skip
    assert (result.returncode == 0) == (case in STRICTER_THAN_A_DEPLOYMENT), result.stderr


def test_extra_args_that_set_no_managed_flag_are_accepted(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    """Flags of their own, also ones sharing a prefix with a managed flag, pass the rules."""
    extra = ["--enforce-eager", "--seed=0", "--max-num-partial-prefills", "2",
             "--reasoning-parser-plugin", "/p.py", "--config-format=hf", "--pooler-config", "{}",
             "--disable-log-stats", "--max-logprobs", "10"]
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


def test_the_router_stays_on_while_a_gateway_uses_it(
    cluster: LocalCluster, crd: str, namespace: str
) -> None:
    on = _with(VALID, "gateway.enabled", True)
    cluster.apply(_object("gated", on), namespace)
    result = cluster.apply(_object("gated", _with(on, "router.enabled", False)), namespace,
                           check=False)  # fmt: skip
    assert result.returncode != 0
    assert "gateway.enabled needs router.enabled" in result.stderr
    both_off = _with(_with(on, "router.enabled", False), "gateway.enabled", False)
    cluster.apply(_object("gated", both_off), namespace)


def test_printer_columns_and_scale(cluster: LocalCluster, crd: str, namespace: str) -> None:
    cluster.apply(_object("scaled", VALID), namespace)
    header = cluster.kubectl("get", "agd", "-n", namespace).stdout.splitlines()[0].split()
    assert header == [
        "NAME", "READY", "STREAMING", "BATCHING", "ROUTERS", "POLICY", "ENDPOINT", "AGE",
    ]  # fmt: skip
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
