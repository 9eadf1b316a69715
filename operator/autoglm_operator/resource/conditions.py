"""Status conditions and status patches, pure: merged by type, safe to run twice, and pruned
of the empty objects server-side apply would store as null. The reconcile and adaptive passes
write status through these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoglm_operator.resource.status import Condition


def transition_time(before: Mapping[str, Any] | None, status: str, now: str) -> str:
    """lastTransitionTime moves only when a condition's status changes (api-conventions)."""
    if before is not None and before.get("status") == status:
        return str(before.get("lastTransitionTime") or now)
    return now


def merge_conditions(
    existing: Sequence[Mapping[str, Any]], updates: Sequence[Condition], now: str
) -> list[dict[str, Any]]:
    """Replace the conditions named in updates, keep every other one as it is (safe to rerun)."""
    by_type = {u.type: u for u in updates}
    merged: list[dict[str, Any]] = []
    seen: set[str] = set()
    for current in existing:
        kind = current.get("type")
        if kind not in by_type:
            merged.append(dict(current))
            continue
        seen.add(kind)
        merged.append(_condition_dict(by_type[kind], current, now))
    for kind, update in by_type.items():
        if kind not in seen:
            merged.append(_condition_dict(update, None, now))
    return merged


def _condition_dict(
    update: Condition, before: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    when = transition_time(before, update.status, now)
    data = update.model_copy(update={"last_transition_time": when})
    return data.model_dump(by_alias=True, exclude_none=True)


def without_empty(value: Any) -> Any:
    """Drop empty objects: server-side apply stores an applied `{}` as null, which the
    schema then rejects (`metrics: Invalid value: "null"`); the CRD default fills them back."""
    if isinstance(value, Mapping):
        pruned = {k: without_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v != {} and v is not None}
    if isinstance(value, list):
        return [without_empty(v) for v in value]
    return value
