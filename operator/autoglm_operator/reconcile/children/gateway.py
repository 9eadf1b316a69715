"""Pure builders of what spec.gateway publishes: InferencePool `<name>` (the Gateway API
Inference Extension's GA API, inference.networking.k8s.io/v1) and Service `<name>-epp`, its
endpoint picker: the router pods' ext_proc port.

A gateway that implements GIE routes an HTTPRoute's requests to the pool: for each one it asks
the picker (Envoy ext_proc over gRPC) which serving pod takes it, then sends it there itself.
The picker runs in the router pods (`autoglm-router --ext-proc-port`), so it makes the same
decision the router makes for its own HTTP clients, who keep Service `<name>`.

Field names follow GIE v1's Go types (api/v1/inferencepool_types.go of the module pinned in
hack/gie-crds.sh): spec.selector.matchLabels, spec.targetPorts[].number, spec.appProtocol,
spec.endpointPickerRef {group, kind, name, port.number, failureMode}.
"""

from __future__ import annotations

from typing import Any

from autoglm_operator.reconcile.children import router, serving
from autoglm_operator.reconcile.children.serving import Manifest, Owner
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

# The GIE release the tests install (hack/gie-crds.sh pins the same; a unit test keeps them so).
GIE_VERSION = "v1.5.0"
GROUP = "inference.networking.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"
CRD_NAME = f"{PLURAL}.{GROUP}"
SERVICE_KIND = "Service"
# The serving pods speak HTTP/1.1 (vLLM's API server).
APP_PROTOCOL = "http"
# gRPC without TLS, for gateways that pick the upstream protocol from the Service port.
H2C = "kubernetes.io/h2c"


def pool_name(name: str) -> str:
    """The pool is named after the deployment: an HTTPRoute's backendRef names it."""
    return name


def picker_service_name(name: str) -> str:
    return f"{name}-epp"


def picker_address(name: str) -> str:
    """The picker as status.gateway.endpointPicker shows it: service:port."""
    return f"{picker_service_name(name)}:{router.EXT_PROC_PORT}"


def crd_missing_message(name: str) -> str:
    """What status says while the cluster does not serve InferencePools."""
    return (
        f"gateway.enabled: this cluster does not serve {KIND} {API_VERSION} (CRD {CRD_NAME}, "
        "the Gateway API Inference Extension's); install it, e.g. kubectl apply -f "
        "https://github.com/kubernetes-sigs/gateway-api-inference-extension/releases/download/"
        f"{GIE_VERSION}/manifests.yaml (docs/operations/install.md), and InferencePool {name} "
        "follows; everything else is served meanwhile"
    )


def _metadata(owner: Owner, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": serving.common_labels(owner.name),
        "ownerReferences": [owner.reference()],
    }


def inference_pool(owner: Owner, spec: AutoGLMDeploymentSpec) -> Manifest:
    """Every serving pod of this deployment (both modes' Deployments under Rolling, never the
    router's pods), on their OpenAI port; the router's picker chooses among them."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _metadata(owner, pool_name(owner.name)),
        "spec": {
            "selector": {"matchLabels": serving.serving_pod_labels(owner.name)},
            "targetPorts": [{"number": serving.HTTP_PORT}],
            "appProtocol": APP_PROTOCOL,
            "endpointPickerRef": {
                "group": "",
                "kind": SERVICE_KIND,
                "name": picker_service_name(owner.name),
                "port": {"number": router.EXT_PROC_PORT},
                "failureMode": spec.gateway.failure_mode.value,
            },
        },
    }


def picker_service(owner: Owner) -> Manifest:
    """A ClusterIP Service of its own in front of the router pods' ext_proc port: Service
    `<name>` is the clients' (it may be a LoadBalancer, and selects the serving pods until a
    router is ready), and the picker is for the gateway only."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, picker_service_name(owner.name)),
        "spec": {
            "type": "ClusterIP",
            "selector": serving.router_selector_labels(owner.name),
            "ports": [
                {
                    "name": router.EXT_PROC_PORT_NAME,
                    "port": router.EXT_PROC_PORT,
                    "targetPort": router.EXT_PROC_PORT_NAME,
                    "protocol": "TCP",
                    "appProtocol": H2C,
                }
            ],
        },
    }


def children(owner: Owner, spec: AutoGLMDeploymentSpec) -> list[Manifest]:
    """The picker's Service, then the pool that names it, when spec.gateway.enabled; else none."""
    if not spec.gateway.enabled:
        return []
    return [picker_service(owner), inference_pool(owner, spec)]


def keys(name: str) -> tuple[tuple[str, str], ...]:
    """(kind, name) of what spec.gateway publishes, in the order a gateway turned off deletes
    them: the pool first, so no gateway is left pointing at a picker that is gone."""
    return ((KIND, pool_name(name)), ("Service", picker_service_name(name)))
