"""The router and the gateway in front of the serving pods: when Service `<name>` selects the
router, and which of their children go once spec.router or spec.gateway is turned off."""

from __future__ import annotations

from autoglm_operator.reconcile.children import gateway, router, serving
from autoglm_operator.reconcile.observe import Key, Observed
from autoglm_operator.resource import pods as pods_
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec


def router_ready_replicas(name: str, observed: Observed) -> int:
    """Ready pods of `<name>-router`, as its Deployment's status says."""
    live = observed.children.get(("Deployment", router.router_name(name))) or {}
    return int((live.get("status") or {}).get("readyReplicas") or 0)


def service_via_router(
    owner: serving.Owner, spec: AutoGLMDeploymentSpec, observed: Observed
) -> bool:
    """Whether Service `<name>` selects the router: once a router pod is ready (make before
    break: until then it keeps selecting the serving pods), and from then on for good, so a
    router that loses its replicas for a while does not flip the Service back and forth."""
    if not spec.router.enabled:
        return False
    live = observed.children.get(("Service", serving.service_name(owner.name))) or {}
    selector = (live.get("spec") or {}).get("selector") or {}
    already = selector == serving.router_selector_labels(owner.name)
    return already or router_ready_replicas(owner.name, observed) > 0


def router_children_to_delete(
    owner: serving.Owner, spec: AutoGLMDeploymentSpec, observed: Observed
) -> tuple[Key, ...]:
    """spec.router.enabled false: the router's children that still exist, once Service
    `<name>` selects the serving pods again (this pass's update comes back first)."""
    if spec.router.enabled:
        return ()
    live = observed.children.get(("Service", serving.service_name(owner.name))) or {}
    selector = (live.get("spec") or {}).get("selector") or {}
    if selector == serving.router_selector_labels(owner.name):
        return ()
    return tuple(
        key
        for key in router.keys(owner.name)
        if key in observed.children and not pods_.is_terminating(observed.children[key])
    )


def gateway_children_to_delete(
    owner: serving.Owner, spec: AutoGLMDeploymentSpec, observed: Observed
) -> tuple[Key, ...]:
    """spec.gateway.enabled false: the pool and the picker's Service that still exist (only
    ours are observed: a same-named object someone else made is left alone)."""
    if spec.gateway.enabled:
        return ()
    return tuple(
        key
        for key in gateway.keys(owner.name)
        if key in observed.children and not pods_.is_terminating(observed.children[key])
    )


def gateway_observed(name: str, observed: Observed) -> tuple[Key, ...]:
    """Which of spec.gateway's objects this deployment holds now."""
    return tuple(key for key in gateway.keys(name) if key in observed.children)
