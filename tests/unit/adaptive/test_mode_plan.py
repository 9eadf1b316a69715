"""iteration.plan_modes, pure: one plan of what a pass does to pods; InPlace and Rolling differ
only in the plan they produce."""

from __future__ import annotations

from test_adaptive_pass import NOW, healthy, rolling_spec, spec, three_streaming, views

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive.pass_data import Observation, PassInput, Repair, RepairOutcome
from autoglm_operator.reconcile.iteration import plan_modes
from autoglm_operator.resource.pods import PodView
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

STREAMING = {f"agd-{i}": Mode.STREAMING for i in range(3)}


def inp(the_spec: AutoGLMDeploymentSpec, pods: list[PodView]) -> PassInput:
    return PassInput("prod", "agd", 4, the_spec, {}, pods, NOW)


def test_in_place_plans_the_announce_and_the_flip_rolling_plans_the_share() -> None:
    pods = views(three_streaming())
    seen = Observation(STREAMING, {}, healthy(qps=12.0))

    in_place = plan_modes(inp(spec(), pods), seen)
    assert [(s.flip.pod, s.flip.to_mode, s.ip) for s in in_place.switches] == [
        ("agd-0", Mode.BATCHING, "10.0.0.0")
    ]
    assert in_place.announce is not None
    assert in_place.announce["adaptiveState"]["lastFlips"][0]["pod"] == "agd-0"
    assert in_place.rolling is None

    rolling = plan_modes(inp(rolling_spec(), pods), seen)
    assert rolling.switches == () and rolling.announce is None
    assert rolling.rolling is not None and rolling.rolling.batching_target == 1
    assert in_place.decision == rolling.decision, "one decision, two plans"


def test_a_label_runtime_disagreement_is_a_repair_entry_and_the_decision_counts_it_done() -> None:
    pods = views(three_streaming())
    pods[1] = PodView("agd-1", "10.0.0.1", None, True)  # unlabelled
    modes = {**STREAMING, "agd-1": Mode.BATCHING}
    the_plan = plan_modes(inp(spec(), pods), Observation(modes, {}, healthy(qps=1.0)))
    assert the_plan.repairs == (Repair("agd-1", "10.0.0.1", None, Mode.BATCHING),)
    assert the_plan.seen.labels["agd-1"] is Mode.BATCHING, "planned as labelled"

    # The label patch failed: planned again from what happened, the pod is not flippable.
    failed = [RepairOutcome("agd-1", None, Mode.BATCHING, "Failed", "500")]
    again = plan_modes(inp(spec(), pods), Observation(modes, {}, None), failed)
    assert again.repairs == () and again.seen.mismatched == {"agd-1"}
