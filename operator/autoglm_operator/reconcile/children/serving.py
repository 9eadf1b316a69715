"""Pure builders: an AutoGLMDeployment spec in, the plain-dict manifests of its children out.

No I/O here (an import-linter contract keeps kopf and the Kubernetes client out). Every object
carries the same labels and a controller owner reference, so deleting the AutoGLMDeployment
deletes everything below it. The vLLM argv comes from the runtime's `build_vllm_argv`, the one
place that spells vLLM flags.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoglm_api.engine_args import (
    DEFAULT_MAX_TOKENS,
    EngineSettings,
    build_vllm_argv,
    without_newly_managed,
)
from autoglm_api.profiles import ADMIN_PORT, DRAIN_PATH, MODE_LABEL, Mode
from autoglm_operator.resource.names import (
    APP_NAME,
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    MANAGER,
    NAME_LABEL,
    ROUTER_APP_NAME,
    TEMPLATE_HASH_ANNOTATION,
)
from autoglm_operator.resource.spec import (
    ADMIN_MOUNT_PATH,
    API_VERSION,
    CONFIG_MOUNT_PATH,
    HOME_MOUNT_PATH,
    KIND,
    PODINFO_MOUNT_PATH,
    SHM_MOUNT_PATH,
    TMP_MOUNT_PATH,
    AutoGLMDeploymentSpec,
    ModePolicy,
    SwitchStrategy,
)

Manifest = dict[str, Any]

CONTAINER_NAME = "runtime"
HTTP_PORT = 8000
CONFIG_DIR = CONFIG_MOUNT_PATH
CONFIG_KEY = "config.json"
ADMIN_DIR = ADMIN_MOUNT_PATH
# The file the launcher reads the admin token from; the Secret holds one per pod template.
ADMIN_TOKEN_FILE = "token"
ADMIN_TOKEN_KEY_PREFIX = "token-"
PODINFO_DIR = PODINFO_MOUNT_PATH
# The root filesystem is read-only; what vLLM 0.32 and its libraries write goes to emptyDirs:
# $HOME holds their caches (vLLM's ~/.cache/vllm with the torch.compile cache and
# ~/.config/vllm, triton's ~/.triton, flashinfer's ~/.cache/flashinfer, tilelang's
# ~/.tilelang), /tmp torch inductor's cache and vLLM's IPC sockets (VLLM_RPC_BASE_PATH).
HOME_DIR = HOME_MOUNT_PATH
TMP_DIR = TMP_MOUNT_PATH
HOME_SIZE_LIMIT = "16Gi"
TMP_SIZE_LIMIT = "8Gi"
# After the drain call: time for endpoint controllers to drop the pod before SIGTERM arrives.
PRESTOP_SLEEP_SECONDS = 5
STARTUP_PROBE_PERIOD_SECONDS = 10
# The runtime image's user: above the uids nodes give their own users, so a process that
# escaped its container is no node user.
RUN_AS_USER = 10001


@dataclass(frozen=True)
class Owner:
    """The AutoGLMDeployment the children belong to."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


# -- names and labels ------------------------------------------------------------------------


def service_name(name: str, mode: Mode | None = None) -> str:
    return name if mode is None else f"{name}-{mode.value}"


def deployment_name(name: str, mode: Mode | None = None) -> str:
    """`<name>`, and under switchStrategy Rolling `<name>-batching` for the batching pods."""
    return f"{name}-{Mode.BATCHING.value}" if mode is Mode.BATCHING else name


def config_map_name(name: str) -> str:
    return f"{name}-config"


def admin_secret_name(name: str) -> str:
    return f"{name}-admin"


def admin_token_key(template_digest: str) -> str:
    """The admin Secret's key for the token of the pods of one template (one per rollout)."""
    return ADMIN_TOKEN_KEY_PREFIX + template_digest


def template_of_token_key(key: str) -> str | None:
    """The template digest an admin Secret key is for; None for a key of no template."""
    if not key.startswith(ADMIN_TOKEN_KEY_PREFIX):
        return None
    return key[len(ADMIN_TOKEN_KEY_PREFIX):]


def selector_labels(name: str) -> dict[str, str]:
    """The Deployment's selector: stable for the object's life, and never the mode label."""
    return {NAME_LABEL: APP_NAME, INSTANCE_LABEL: name}


def common_labels(name: str) -> dict[str, str]:
    return {**selector_labels(name), MANAGED_BY_LABEL: MANAGER}


def router_selector_labels(name: str) -> dict[str, str]:
    """The router pods' selector. Its own app name, so that no selector of the serving pods
    (the Deployment's, immutable; the PodDisruptionBudget's; status.selector) matches them."""
    return {NAME_LABEL: ROUTER_APP_NAME, INSTANCE_LABEL: name}


def serving_pod_labels(name: str) -> dict[str, str]:
    """The labels every serving pod of one deployment carries, in either mode's Deployment:
    what the router watches and what its InferencePool selects."""
    return {**selector_labels(name), COMPONENT_LABEL: "server"}


def serving_pod_selector(name: str) -> str:
    """The label selector of one deployment's serving pods, as the router's --selector."""
    return ",".join(f"{k}={v}" for k, v in sorted(serving_pod_labels(name).items()))


def selector_string(name: str) -> str:
    """status.selector for the scale subresource (what HPA and `kubectl scale` read)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def endpoint_url(name: str, namespace: str, spec: AutoGLMDeploymentSpec) -> str:
    return f"http://{service_name(name)}.{namespace}.svc:{spec.service.port}/v1"


def initial_mode(spec: AutoGLMDeploymentSpec) -> Mode:
    """The mode a new pod starts in: batching only when the policy pins batching."""
    return Mode.BATCHING if spec.mode_policy == ModePolicy.BATCHING else Mode.STREAMING


def _metadata(owner: Owner, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": common_labels(owner.name),
        "ownerReferences": [owner.reference()],
        **extra,
    }


def digest(obj: Any) -> str:
    """A short stable hash of any JSON-able value."""
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# -- the engine ------------------------------------------------------------------------------


def model_path(spec: AutoGLMDeploymentSpec) -> str:
    """What vLLM loads: a path under the mounted volume, or a model id when none is mounted."""
    model = spec.model
    if model.pvc_name or model.host_path:
        if model.source.startswith("/"):
            return model.source
        return posixpath.join(model.mount_path, model.source)
    return model.source


def rolling(spec: AutoGLMDeploymentSpec) -> bool:
    """switchStrategy Rolling: each mode has its own pod template, with that mode's engine flags."""
    return spec.switch_strategy is SwitchStrategy.ROLLING


def engine_settings(spec: AutoGLMDeploymentSpec, mode: Mode | None = None) -> EngineSettings:
    """The envelope both modes fit in (mode None), or one mode's own engine flags (Rolling)."""
    engine = spec.engine
    max_num_seqs = spec.engine_max_num_seqs(mode)
    stream_interval = None
    if mode is not None:
        profile = spec.profiles.for_mode(mode)
        if profile.stream_coalesce_chunks > 1:
            stream_interval = profile.stream_coalesce_chunks
    return EngineSettings(
        model=model_path(spec),
        served_model_name=spec.model.served_name,
        port=HTTP_PORT,
        tensor_parallel_size=spec.gpus_per_replica,
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        gpu_memory_utilization_percent=engine.gpu_memory_utilization_percent,
        enable_prefix_caching=engine.enable_prefix_caching,
        shutdown_timeout_seconds=engine.shutdown_timeout_seconds,
        reasoning_parser=engine.reasoning_parser,
        stream_interval=stream_interval,
        images_per_prompt=spec.multimodal.images_per_prompt,
        allowed_media_domains=tuple(spec.multimodal.allowed_media_domains),
        max_pixels=spec.multimodal.effective_max_pixels(spec.max_model_len),
        extra_args=tuple(without_newly_managed(engine.extra_args)[0]),
        enable_sleep_mode=spec.scale_to_zero.sleep.enabled,
    )


def runtime_config(spec: AutoGLMDeploymentSpec) -> dict[str, Any]:
    """The runtime's config file (the ConfigMap): live settings, read without a restart."""
    profiles = spec.profiles
    if rolling(spec):
        # The engine's --stream-interval coalesces under Rolling; the middleware must not again.
        profiles = profiles.model_copy(
            update={
                "streaming": profiles.streaming.model_copy(update={"stream_coalesce_chunks": 1}),
                "batching": profiles.batching.model_copy(update={"stream_coalesce_chunks": 1}),
            }
        )
    return {
        "profiles": profiles.model_dump(by_alias=True, mode="json"),
        "servedModelName": spec.model.served_name,
        "maxModelLen": spec.max_model_len,
        "defaultMaxTokens": min(DEFAULT_MAX_TOKENS, spec.max_model_len),
        "initialMode": initial_mode(spec).value,
    }


def termination_grace_seconds(spec: AutoGLMDeploymentSpec) -> int:
    """preStop drain and sleep, then vLLM's own shutdown timeout, then a margin to exit."""
    return PRESTOP_SLEEP_SECONDS + spec.engine.shutdown_timeout_seconds + 15


def _prestop_command() -> list[str]:
    # Ask the runtime to drain (readiness turns 503, no new work), then give endpoints time to
    # notice before the kubelet's SIGTERM; a failed call must not block the shutdown.
    script = (
        "import pathlib,time,urllib.request\n"
        "try:\n"
        f" t=pathlib.Path('{ADMIN_DIR}/{ADMIN_TOKEN_FILE}').read_text().strip()\n"
        f" r=urllib.request.Request('http://127.0.0.1:{ADMIN_PORT}{DRAIN_PATH}',"
        "method='POST',headers={'Authorization':'Bearer '+t})\n"
        " urllib.request.urlopen(r,timeout=5).close()\n"
        "except Exception:\n"
        " pass\n"
        f"time.sleep({PRESTOP_SLEEP_SECONDS})\n"
    )
    return ["python3", "-c", script]


def _resources(spec: AutoGLMDeploymentSpec) -> dict[str, Any]:
    gpus = str(spec.gpus_per_replica)
    requests = {k: str(v) for k, v in (spec.resources.requests or {}).items()}
    limits = {k: str(v) for k, v in (spec.resources.limits or {}).items()}
    requests[spec.gpu_resource_name] = gpus
    limits[spec.gpu_resource_name] = gpus
    return {"requests": requests, "limits": limits}


def _volumes(name: str, spec: AutoGLMDeploymentSpec) -> list[dict[str, Any]]:
    model = spec.model
    if model.pvc_name:
        model_volume: dict[str, Any] = {
            "persistentVolumeClaim": {"claimName": model.pvc_name, "readOnly": True}
        }
    elif model.host_path:
        model_volume = {"hostPath": {"path": model.host_path, "type": "Directory"}}
    else:
        # No weights volume: vLLM downloads into this cache (HF_HOME) once per pod.
        model_volume = {"emptyDir": {}}
    return [
        # Tensor-parallel workers exchange tensors through shared memory.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "model", **model_volume},
        {"name": "home", "emptyDir": {"sizeLimit": HOME_SIZE_LIMIT}},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}},
        {
            "name": "config",
            "configMap": {
                "name": config_map_name(name),
                "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}],
            },
        },
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
            },
        },
    ]


def _admin_volume(name: str, template_digest: str) -> dict[str, Any]:
    """The token of this template's pods, for the launcher (never the engine's environment)."""
    return {
        "name": "admin",
        "secret": {
            "secretName": admin_secret_name(name),
            "items": [{"key": admin_token_key(template_digest), "path": ADMIN_TOKEN_FILE}],
            "defaultMode": 0o440,
        },
    }


def _env(spec: AutoGLMDeploymentSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "AUTOGLM_CONFIG_FILE", "value": f"{CONFIG_DIR}/{CONFIG_KEY}"},
        # The launcher's: it serves the admin API and keeps both out of the engine's env.
        {"name": "AUTOGLM_ADMIN_TOKEN_FILE", "value": f"{ADMIN_DIR}/{ADMIN_TOKEN_FILE}"},
        {"name": "AUTOGLM_ADMIN_PORT", "value": str(ADMIN_PORT)},
        {"name": "AUTOGLM_LABELS_FILE", "value": f"{PODINFO_DIR}/labels"},
        {"name": "AUTOGLM_DRAIN_GRACE_SECONDS", "value": str(spec.engine.shutdown_timeout_seconds)},
        {"name": "AUTOGLM_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "HF_HOME", "value": spec.model.mount_path},
        # Any image: the caches land in the writable home, not on the read-only root.
        {"name": "HOME", "value": HOME_DIR},
        {"name": "XDG_CACHE_HOME", "value": f"{HOME_DIR}/.cache"},
        {"name": "XDG_CONFIG_HOME", "value": f"{HOME_DIR}/.config"},
    ]
    if spec.api_key_secret_ref is not None:
        # vLLM's own variable: clients must send this key on the /v1 routes.
        ref = spec.api_key_secret_ref
        env.append(
            {
                "name": "VLLM_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        )
    return env


def restricted_container_security() -> dict[str, Any]:
    """Pod Security "restricted" for a container: every pod the operator creates runs this way."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_pod_security() -> dict[str, Any]:
    """Pod Security "restricted" for a pod: non-root as RUN_AS_USER, the runtime's seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container(spec: AutoGLMDeploymentSpec, mode: Mode | None) -> dict[str, Any]:
    http_probe = {"path": "/health", "port": "http", "scheme": "HTTP"}
    startup_failures = -(-spec.engine.startup_timeout_seconds // STARTUP_PROBE_PERIOD_SECONDS)
    model_read_only = bool(spec.model.pvc_name or spec.model.host_path)
    return {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["autoglm-runtime", "serve", "--"],
        "args": build_vllm_argv(engine_settings(spec, mode)),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            # The admin API (the launcher's): the chart's NetworkPolicy opens it to the operator.
            {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": [
            {"name": "dshm", "mountPath": SHM_MOUNT_PATH},
            {"name": "model", "mountPath": spec.model.mount_path}
            | ({"readOnly": True} if model_read_only else {}),
            {"name": "home", "mountPath": HOME_DIR},
            {"name": "tmp", "mountPath": TMP_DIR},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "admin", "mountPath": ADMIN_DIR, "readOnly": True},
            {"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True},
        ],
        # A model load takes minutes: the startup probe holds liveness off until /health answers.
        "startupProbe": {
            "httpGet": http_probe,
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": startup_failures,
        },
        # /health turns 503 while draining: readiness drops the pod from the Services.
        "readinessProbe": {
            "httpGet": http_probe,
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
            "successThreshold": 1,
        },
        # A draining pod must not be killed for its 503, so liveness only checks the socket.
        "livenessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 15,
            "timeoutSeconds": 5,
            "failureThreshold": 4,
        },
        "lifecycle": {"preStop": {"exec": {"command": _prestop_command()}}},
        "securityContext": restricted_container_security(),
    }


def pod_template(
    name: str, spec: AutoGLMDeploymentSpec, mode: Mode | None = None
) -> dict[str, Any]:
    """The pod template, with its own digest as an annotation (pods inherit it).

    mode None: the InPlace template, one for both modes (the operator labels each pod). A mode:
    that mode's template under switchStrategy Rolling, its label and engine flags built in.
    """
    scheduling = spec.scheduling
    pod_spec: dict[str, Any] = {
        "containers": [_container(spec, mode)],
        "volumes": _volumes(name, spec),
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {**restricted_pod_security(), "fsGroup": RUN_AS_USER},
        # GPU nodes are commonly tainted with the GPU resource name; the pods belong there.
        "tolerations": [
            {"key": spec.gpu_resource_name, "operator": "Exists", "effect": "NoSchedule"},
            *(scheduling.tolerations or []),
        ],
    }
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.affinity:
        pod_spec["affinity"] = scheduling.affinity
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    # InPlace: no mode label here, the operator labels each pod, so a flip never changes the
    # template. Rolling: a pod keeps its template's mode for life; a flip replaces the pod.
    labels = {**common_labels(name), **serving_pod_labels(name)}
    if mode is not None:
        labels[MODE_LABEL] = mode.value
    template = {
        "metadata": {
            "labels": labels,
            "annotations": {},
        },
        "spec": pod_spec,
    }
    # A new template is a rollout, and its pods get a new admin token: the volume names the
    # token by the digest of the rest of the template.
    template_digest = digest(template)
    pod_spec["volumes"].append(_admin_volume(name, template_digest))
    template["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION] = template_digest
    return template


def desired_template_hashes(name: str, spec: AutoGLMDeploymentSpec) -> frozenset[str]:
    """The digests of the pod templates current for this spec (one per mode under Rolling)."""
    modes: tuple[Mode | None, ...] = tuple(Mode) if rolling(spec) else (None,)
    return frozenset(template_hash(pod_template(name, spec, m)) or "" for m in modes)


def template_hash(template: dict[str, Any]) -> str | None:
    annotations = template.get("metadata", {}).get("annotations") or {}
    value = annotations.get(TEMPLATE_HASH_ANNOTATION)
    return str(value) if value is not None else None


# -- the children ----------------------------------------------------------------------------


def rolling_strategy(*, surge: bool) -> dict[str, Any]:
    """Make-before-break (one extra pod, none down) when GPUs allow, else one down at a time."""
    if surge:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def deployment(
    owner: Owner,
    spec: AutoGLMDeploymentSpec,
    *,
    surge: bool = True,
    mode: Mode | None = None,
    replicas: int | None = None,
) -> Manifest:
    """The InPlace Deployment (mode None), or one mode's Deployment under Rolling.

    Under Rolling `<name>` runs the streaming pods (its selector is immutable, so it stays the
    InPlace one; ReplicaSets never adopt a pod another controller owns) and `<name>-batching`
    the batching pods; `replicas` is that mode's share, which the reconcile loop steps.
    """
    template = pod_template(owner.name, spec, mode)
    selector = selector_labels(owner.name)
    if mode is Mode.BATCHING:
        selector = {**selector, MODE_LABEL: mode.value}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, deployment_name(owner.name, mode)),
        "spec": {
            "replicas": spec.replicas if replicas is None else replicas,
            "selector": {"matchLabels": selector},
            "strategy": rolling_strategy(surge=surge),
            "revisionHistoryLimit": 3,
            # The model load is part of every rollout step.
            "progressDeadlineSeconds": spec.engine.startup_timeout_seconds + 300,
            "template": template,
        },
    }


def service(
    owner: Owner,
    spec: AutoGLMDeploymentSpec,
    mode: Mode | None = None,
    *,
    via_router: bool = False,
) -> Manifest:
    """`<name>` selects every ready replica, or the router pods (`via_router`);
    `<name>-<mode>` only the replicas in that mode."""
    port: dict[str, Any] = {
        "name": "http",
        "port": spec.service.port,
        "targetPort": "http",
        "protocol": "TCP",
    }
    selector = selector_labels(owner.name)
    metadata = _metadata(owner, service_name(owner.name, mode))
    service_spec: dict[str, Any] = {"type": "ClusterIP"}
    if mode is None:
        service_spec["type"] = spec.service.type
        if spec.service.node_port is not None:
            port["nodePort"] = spec.service.node_port
        if spec.service.annotations:
            metadata["annotations"] = dict(spec.service.annotations)
        if via_router:
            selector = router_selector_labels(owner.name)
    else:
        selector = {**selector, MODE_LABEL: mode.value}
    service_spec.update({"selector": selector, "ports": [port]})
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": service_spec}


def pod_disruption_budget(owner: Owner) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, owner.name),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner.name)},
            # A pod that never became ready protects nothing: let a drain evict it.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def config_map(owner: Owner, spec: AutoGLMDeploymentSpec) -> Manifest:
    body = json.dumps(runtime_config(spec), sort_keys=True, indent=2) + "\n"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, config_map_name(owner.name)),
        "data": {CONFIG_KEY: body},
    }


def admin_secret(owner: Owner, tokens: Mapping[str, str]) -> Manifest:
    """The admin tokens, one per pod template (`tokens`: template digest -> token): generated
    by the caller and kept, never rebuilt on a pass."""
    data = {
        admin_token_key(template): base64.b64encode(token.encode()).decode()
        for template, token in sorted(tokens.items())
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(owner, admin_secret_name(owner.name)),
        "type": "Opaque",
        "data": data,
    }


def children(
    owner: Owner,
    spec: AutoGLMDeploymentSpec,
    *,
    surge: bool = True,
    split: Mapping[Mode, int] | None = None,
    via_router: bool = False,
) -> list[Manifest]:
    """Every serving child except the admin Secret (whose token is not a function of the spec);
    the router's are router.children.

    Under switchStrategy Rolling, `split` is how many replicas each mode's Deployment runs;
    `via_router`: Service `<name>` selects the router pods.
    """
    if rolling(spec):
        split = split or {initial_mode(spec): spec.replicas}
        deployments = [
            deployment(owner, spec, surge=surge, mode=mode, replicas=split.get(mode, 0))
            for mode in Mode
        ]
    else:
        deployments = [deployment(owner, spec, surge=surge)]
    return [
        config_map(owner, spec),
        *deployments,
        service(owner, spec, via_router=via_router),
        service(owner, spec, Mode.STREAMING),
        service(owner, spec, Mode.BATCHING),
        pod_disruption_budget(owner),
    ]
