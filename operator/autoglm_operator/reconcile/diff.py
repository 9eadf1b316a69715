"""Pure: whether a live object holds what the operator sets, and an account of what differs.

A child is in sync when every field the operator sets has the same value in the live object (the
apiserver adds defaults and status, which do not count): `contains`; a resource quantity counts
as the same however the apiserver spells it back. `describe_update` is the short account of a
write that its Event gives.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from autoglm_operator.resource import names

_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]{0,2})$")


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity as a number ("1Gi", "500m", 2), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value))
    if not match:
        return None
    number, suffix = match.groups()
    try:
        if suffix and suffix[0] in "eE":
            return Decimal(number + suffix)
        if suffix and suffix not in _SUFFIXES:
            return None
        return Decimal(number) * Decimal(str(_SUFFIXES[suffix]) if suffix else 1)
    except InvalidOperation:
        return None


def contains(actual: Any, desired: Any, *, path: tuple[str, ...] = ()) -> bool:
    """Whether `actual` holds every value `desired` sets (lists must match item by item)."""
    if isinstance(desired, dict):
        if not isinstance(actual, dict):
            return False
        return all(
            contains(actual[key], value, path=(*path, key))
            if key in actual
            else _omitted_zero(value)
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(actual) != len(desired):
            return False
        return all(contains(a, d, path=path) for a, d in zip(actual, desired, strict=True))
    if actual == desired:
        return True
    # Resource quantities come back canonicalized ("1000m" -> "1").
    if len(path) >= 2 and path[-2] in ("requests", "limits"):
        left, right = quantity(actual), quantity(desired)
        return left is not None and left == right
    return False


def _omitted_zero(value: Any) -> bool:
    """The API leaves out zero values of optional fields (`readOnly: false` is not echoed)."""
    return value is False or value is None or value in ("", 0) or value == {} or value == []


def describe_update(actual: dict[str, Any] | None, desired: dict[str, Any]) -> str:
    """A short human account of an update: a scale, or the fields that had drifted."""
    if actual is None:
        return "created"
    if desired["kind"] == "Deployment":
        have = (actual.get("spec") or {}).get("replicas")
        want = desired["spec"]["replicas"]
        rest_same = contains(
            {**actual, "spec": {**actual.get("spec", {}), "replicas": want}}, desired
        )
        if have != want and rest_same:
            return f"scaled from {have} to {want} replicas"
    if desired["kind"] == "Service":
        have = ((actual.get("spec") or {}).get("selector") or {}).get(names.NAME_LABEL)
        want = desired["spec"]["selector"].get(names.NAME_LABEL)
        if have != want:  # the router turned on or off
            pods = "router" if want == names.ROUTER_APP_NAME else "serving"
            return f"now selects the {pods} pods"
    drifted = differing_paths(actual, desired)
    shown = ", ".join(drifted[:3]) + (", ..." if len(drifted) > 3 else "")
    return f"restored {shown}" if drifted else "restored the desired state"


def differing_paths(actual: Any, desired: Any, prefix: str = "") -> list[str]:
    if isinstance(desired, dict) and isinstance(actual, dict):
        paths: list[str] = []
        for key, value in desired.items():
            child = f"{prefix}.{key}" if prefix else key
            if key not in actual:
                paths.append(child)
            else:
                paths += differing_paths(actual[key], value, child)
        return paths
    return [] if contains(actual, desired) else [prefix or "."]
