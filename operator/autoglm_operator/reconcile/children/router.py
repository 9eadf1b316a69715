"""Pure builders of the router's children: `<name>-router` (Deployment, PodDisruptionBudget,
ServiceAccount, Role, RoleBinding), from the spec, as plain dicts.

The router (`autoglm-router --kubernetes`, router/README.md) watches the serving pods of its
own deployment and routes each request by mode and session. It needs `list` and `watch` on
pods of its namespace: that is all its Role grants, with scale to zero too (the operator reads
each router's demand from its ops port, autoglm_api.standby), so the process that parses every
client's bytes can change nothing in the cluster. Service `<name>` selects its pods
(serving.service with `via_router`).
"""

from __future__ import annotations

from typing import Any

from autoglm_api.profiles import Mode
from autoglm_operator.reconcile.children import serving
from autoglm_operator.reconcile.children.serving import Manifest, Owner
from autoglm_operator.resource import names
from autoglm_operator.resource.names import router_name
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

ROUTER_COMPONENT = "router"
CONTAINER_NAME = "router"
HTTP_PORT = serving.HTTP_PORT
# /health and /metrics: apart from the API, so clients reach neither (docs/operations/security.md).
METRICS_PORT = 9090
# The endpoint picker (Envoy ext_proc, gRPC) that gateways ask, with spec.gateway on: GIE's
# conventional picker port.
EXT_PROC_PORT = 9002
EXT_PROC_PORT_NAME = "grpc-ext-proc"
# After SIGTERM uvicorn stops listening at once: the preStop sleep gives the endpoints
# controllers time to drop the pod first, so no new connection meets a closed port.
PRESTOP_SLEEP_SECONDS = 5
TMP_SIZE_LIMIT = "64Mi"
RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"
# What the router's pod watch calls (router/autoglm_router/kube.py: a list, then watches).
POD_VERBS = ("list", "watch")
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def router_labels(name: str) -> dict[str, str]:
    return {**serving.router_selector_labels(name), names.MANAGED_BY_LABEL: names.MANAGER}


def _metadata(owner: Owner, **extra: Any) -> dict[str, Any]:
    return {
        "name": router_name(owner.name),
        "namespace": owner.namespace,
        "labels": router_labels(owner.name),
        "ownerReferences": [owner.reference()],
        **extra,
    }


def drain_seconds(spec: AutoGLMDeploymentSpec) -> int:
    """How long a stopping router lets its requests finish: as long as a serving pod drains,
    and as long as a request may be held, so a held one is not lost."""
    held = spec.router.hold.wait_seconds if spec.router.hold.queue_size else 0
    return max(spec.engine.shutdown_timeout_seconds, held)


def termination_grace_seconds(spec: AutoGLMDeploymentSpec) -> int:
    return PRESTOP_SLEEP_SECONDS + drain_seconds(spec) + 10


def router_args(owner: Owner, spec: AutoGLMDeploymentSpec) -> list[str]:
    """`autoglm-router`'s flags (router/autoglm_router/cli.py) for this deployment."""
    router = spec.router
    caps, chat_caps = spec.admission_caps(streamed_chat=False), spec.admission_caps(True)
    args = [
        "--host", "0.0.0.0",
        "--port", str(HTTP_PORT),
        "--metrics-port", str(METRICS_PORT),
        "--kubernetes",
        "--namespace", owner.namespace,
        "--selector", serving.serving_pod_selector(owner.name),
        "--port-name", "http",
        "--load-factor", router.session_affinity.load_factor,
        # The caps match what each mode admits, so spill starts where a replica's queue would.
        "--streaming-cap", str(caps[Mode.STREAMING]),
        "--batching-cap", str(caps[Mode.BATCHING]),
        "--streaming-chat-cap", str(chat_caps[Mode.STREAMING]),
        "--batching-chat-cap", str(chat_caps[Mode.BATCHING]),
        "--drain-seconds", str(drain_seconds(spec)),
        # Screenshots are priced as the replicas' processor scales them.
        "--image-max-pixels", str(spec.multimodal.effective_max_pixels(spec.max_model_len)),
    ]  # fmt: skip
    hold = router.hold
    args += [
        # At zero the router answers GET /v1/models itself, waking nothing.
        "--served-model-name", spec.model.served_name,
        "--hold-queue-size", str(hold.queue_size),
        "--hold-seconds", str(hold.wait_seconds),
        "--hold-heartbeat-seconds", str(hold.heartbeat_seconds),
    ]
    if hold.per_client is not None:
        args += ["--hold-per-client", str(hold.per_client)]
    if not router.spill:
        args.append("--no-spill")
    if spec.gateway.enabled:
        args += ["--ext-proc-port", str(EXT_PROC_PORT)]
    for field, value in router.limits.model_dump(exclude_none=True).items():
        args += [ROUTER_LIMIT_FLAGS[field], str(value)]
    return args


# spec.router.limits, field by field: the router's flag (router/autoglm_router/cli.py).
ROUTER_LIMIT_FLAGS = {
    "max_header_bytes": "--max-header-bytes",
    "max_headers": "--max-headers",
    "header_timeout_seconds": "--header-timeout",
    "body_timeout_seconds": "--body-timeout",
    "max_client_connections": "--max-client-connections",
    "max_inflight": "--max-inflight",
    "max_body_bytes": "--max-body-bytes",
    "max_buffered_body_bytes": "--max-buffered-body-bytes",
    "keep_alive_timeout_seconds": "--keep-alive-timeout",
    "send_timeout_seconds": "--send-timeout",
    "stream_timeout_seconds": "--stream-timeout",
}


def _resources(spec: AutoGLMDeploymentSpec) -> dict[str, Any]:
    resources = spec.router.resources
    return {
        "requests": {k: str(v) for k, v in (resources.requests or {}).items()},
        "limits": {k: str(v) for k, v in (resources.limits or {}).items()},
    }


def _container(owner: Owner, spec: AutoGLMDeploymentSpec) -> dict[str, Any]:
    return {
        "name": CONTAINER_NAME,
        "image": spec.router.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["autoglm-router"],
        "args": router_args(owner, spec),
        "ports": _ports(spec),
        "resources": _resources(spec),
        "volumeMounts": [{"name": "tmp", "mountPath": serving.TMP_DIR}],
        # /health answers 200 only while the router has a replica to send requests to, or
        # (scaleToZero) can hold them until one is ready.
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "metrics", "scheme": "HTTP"},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
            "successThreshold": 1,
        },
        # A router with no replica behind it is alive: liveness only checks the socket.
        "livenessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        "securityContext": serving.restricted_container_security(),
        **_env(spec),
    }


def _ports(spec: AutoGLMDeploymentSpec) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
             {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]  # fmt: skip
    if spec.gateway.enabled:
        ports.append(
            {"name": EXT_PROC_PORT_NAME, "containerPort": EXT_PROC_PORT, "protocol": "TCP"}
        )
    return ports


def _env(spec: AutoGLMDeploymentSpec) -> dict[str, Any]:
    """The replicas' key, so the router refuses a keyless request before reading its body."""
    ref = spec.api_key_secret_ref
    if ref is None:
        return {}
    return {"env": [{"name": "VLLM_API_KEY",
                     "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]}


def pod_template(owner: Owner, spec: AutoGLMDeploymentSpec) -> dict[str, Any]:
    selector = serving.router_selector_labels(owner.name)
    labels = {**router_labels(owner.name), names.COMPONENT_LABEL: ROUTER_COMPONENT}
    pod_spec: dict[str, Any] = {
        "serviceAccountName": router_name(owner.name),
        # The pod watch reads the ServiceAccount token (the only pod of ours that needs one).
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "containers": [_container(owner, spec)],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}}],
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "securityContext": serving.restricted_pod_security(),
        # Replicas on different nodes where there are several: one node's loss leaves a router.
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": HOSTNAME_TOPOLOGY,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector},
                "matchLabelKeys": ["pod-template-hash"],
            }
        ],
    }
    return {"metadata": {"labels": labels}, "spec": pod_spec}


def deployment(owner: Owner, spec: AutoGLMDeploymentSpec) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": serving.router_selector_labels(owner.name)},
            # A router rollout starts the new pod before it stops an old one.
            "strategy": serving.rolling_strategy(surge=True),
            "revisionHistoryLimit": 3,
            "template": pod_template(owner, spec),
        },
    }


def pod_disruption_budget(owner: Owner) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": serving.router_selector_labels(owner.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def service_account(owner: Owner) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(owner),
        # Only the router pods mount its token (their pod spec asks for it).
        "automountServiceAccountToken": False,
    }


def role(owner: Owner) -> Manifest:
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": _metadata(owner),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": list(POD_VERBS)}],
    }


def role_binding(owner: Owner) -> Manifest:
    name = router_name(owner.name)
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": _metadata(owner),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }


# The kinds of the router's children, in the order they are created (the account and its
# rights before the pods that use them).
KINDS = ("ServiceAccount", "Role", "RoleBinding", "Deployment", "PodDisruptionBudget")


def children(owner: Owner, spec: AutoGLMDeploymentSpec) -> list[Manifest]:
    """The router's children when spec.router.enabled, else none."""
    if not spec.router.enabled:
        return []
    return [
        service_account(owner),
        role(owner),
        role_binding(owner),
        deployment(owner, spec),
        pod_disruption_budget(owner),
    ]


def keys(name: str) -> tuple[tuple[str, str], ...]:
    """(kind, name) of every router child: what a disabled router deletes."""
    return tuple((kind, router_name(name)) for kind in KINDS)
