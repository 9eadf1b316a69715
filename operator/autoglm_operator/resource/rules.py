"""How the resource's schema states a rule: CEL (`x-kubernetes-validations`) and the name pattern.

The apiserver checks these at admission, so every object the operator reads has passed them;
spec.py and scheduling.py both build their rules with these helpers.
"""

from __future__ import annotations

from pydantic import ConfigDict
from pydantic.json_schema import JsonDict

# Names of the objects a field refers to (PVC, Secret, PriorityClass): DNS-1123 subdomains.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    validation: JsonDict = {"rule": rule, "message": message}
    if field_path:
        validation["fieldPath"] = field_path
    return validation


def validations(*rules: JsonDict) -> ConfigDict:
    """A model's rules on the object it describes (its model_config)."""
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": list(rules)})


def cel_strings(values: tuple[str, ...]) -> str:
    """A CEL list literal of strings."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"
