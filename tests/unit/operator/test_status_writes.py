"""The one status writer: one field manager, one write per iteration carrying the reconcile
fields and the adaptive pass's, and the release of a retired manager's fields."""

from __future__ import annotations

import logging
from typing import Any

from operator_fakes import FakeKube
from test_reconcile_pass import NAME, NS, body, observed, recorded_events  # noqa: F401

from autoglm_operator.adaptive import pass_data
from autoglm_operator.handlers import reconcile as handlers
from autoglm_operator.io import executor, kube
from autoglm_operator.resource.conditions import without_empty
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec


class StatusKube(FakeKube):
    """Keeps each status write, answers with `managed` as the object's managedFields."""

    def __init__(self, managed: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.statuses: list[dict[str, Any]] = []
        self.released: list[str] = []
        self.managed = managed or []

    def apply_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self._check("apply_status", "AutoGLMDeployment", name)
        self.statuses.append(status)
        return {"metadata": {"resourceVersion": "99", "managedFields": self.managed}}

    def release_status(self, namespace: str, name: str, manager: str) -> dict[str, Any]:
        self._check("release_status", "AutoGLMDeployment", name)
        self.released.append(manager)
        self.managed = [m for m in self.managed if m["manager"] != manager]
        return {"metadata": {"managedFields": self.managed}}


DECIDED = {
    "conditions": [{"type": "ModeTransitioning", "status": "False", "reason": "Stable"}],
    "lastDecision": {"time": "t1", "reason": "QpsAboveHigh", "toBatching": 1},
    "decisionHistory": [{"time": "t1", "reason": "QpsAboveHigh", "toBatching": 1}],
}


def mode_step(agd: dict[str, Any]) -> handlers.ModeStep:
    """An adaptive pass over no pods, Prometheus not answering: it decides to hold, and says
    so in lastDecision, MetricsAvailable and ModeTransitioning."""
    spec = AutoGLMDeploymentSpec.model_validate(agd["spec"])
    inp = pass_data.PassInput(NS, NAME, 1, spec, agd["status"], [], 1_800_000_000.0)
    return handlers.ModeStep(inp, pass_data.Observation({}, {}, None), None)  # type: ignore[arg-type]


async def test_the_reconcile_fields_and_the_adaptive_part_go_out_in_one_write() -> None:
    api, state = StatusKube(), handlers.ReconcileMemory()
    reconciler = handlers.Reconciler(api, logging.getLogger("test"))  # type: ignore[arg-type]
    agd = body({"replicas": 2})
    done = await reconciler.pass_once(agd, observed(api, agd), state, mode_step(agd))  # type: ignore[arg-type]
    assert [c for c in api.calls if "status" in c[0]] == [
        ("apply_status", "AutoGLMDeployment", NAME)
    ]
    written = api.statuses[0]
    kinds = [c["type"] for c in written["conditions"]]
    assert sorted(kinds) == [
        "Degraded", "MetricsAvailable", "ModeTransitioning", "Progressing", "Ready"
    ]  # fmt: skip
    assert done.settled.report is not None
    decided = done.settled.report.status_patch["lastDecision"]
    assert written["lastDecision"] == without_empty(decided)
    assert written["replicas"] == 0 and written["ready"] == "0/2"


async def test_a_write_from_a_version_the_watch_has_not_replaced_keeps_what_was_written() -> None:
    """The watch lags behind a write: the next write starts from what was written, so the
    decision fields are not taken back to the stale copy, and an unchanged status is not
    written again."""
    api, state = StatusKube(), handlers.ReconcileMemory()
    reconciler = handlers.Reconciler(api, logging.getLogger("test"))  # type: ignore[arg-type]
    agd = body({"replicas": 2})
    obs = observed(api, agd)
    await reconciler.pass_once(agd, obs, state, mode_step(agd))  # type: ignore[arg-type]
    await reconciler.pass_once(agd, obs, state, mode_step(agd))  # type: ignore[arg-type]
    assert len(api.statuses) == 1, "nothing changed: no second write"
    part = {**DECIDED, "lastDecision": {"time": "t2", "reason": "QpsBelowLow", "toBatching": 0}}
    await reconciler.write_part(obs, state, part)
    assert len(api.statuses) == 2
    assert api.statuses[1]["replicas"] == 0, "the reconcile fields come from the last write"
    assert api.statuses[1]["lastDecision"]["time"] == "t2"


async def test_write_status_releases_a_retired_manager_on_the_status_subresource() -> None:
    managed = [
        {"manager": kube.STATUS_FIELD_MANAGER, "subresource": "status"},
        {"manager": "autoglm-adaptive", "subresource": "status"},
        {"manager": "kubectl-client-side-apply"},
    ]
    api = StatusKube(managed)
    writer = executor.Executor(api, logging.getLogger("test"))  # type: ignore[arg-type]
    await writer.write_status(NS, NAME, {"replicas": 1})
    assert api.released == ["autoglm-adaptive"]
    await writer.write_status(NS, NAME, {"replicas": 2})
    assert api.released == ["autoglm-adaptive"], "released once: the entry is gone"


def test_only_a_retired_manager_of_the_status_subresource_is_released() -> None:
    entries = [
        {"manager": "autoglm-adaptive"},  # the main resource: not a status manager
        {"manager": "autoglm-operator-status", "subresource": "status"},
        {"manager": "someone-else", "subresource": "status"},
    ]
    assert executor.retired_status_managers({"metadata": {"managedFields": entries}}) == []
    assert executor.retired_status_managers({}) == []
