"""The adaptive pass as the loop runs it (observe, plan, execute, report) with its I/O faked:
apply, verify, revert, repair, dry run, status, events."""

from __future__ import annotations

from typing import Any

from adaptive_fakes import FakeIO, FakePod

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import pass_data, report
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive.pass_data import PassInput
from autoglm_operator.adaptive.planning import PodView
from autoglm_operator.adaptive.signals import Availability, Reading
from autoglm_operator.handlers.adaptive_pass import ReadIO, read_observation
from autoglm_operator.io import executor
from autoglm_operator.reconcile.iteration import plan_modes
from autoglm_operator.reconcile.rolling import rolling_batching_target
from autoglm_operator.resource.conditions import merge_conditions
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_operator.resource.status import Condition

NOW = 1_800_000_000.0


def spec(**adaptive_settings: Any) -> AutoGLMDeploymentSpec:
    settings = {"prometheus": {"url": "http://prom:9090"}, "toBatchingStabilizationSeconds": 0}
    settings.update(adaptive_settings)
    policy = settings.pop("modePolicy", "Adaptive")
    return AutoGLMDeploymentSpec.model_validate(
        {"replicas": 3, "modePolicy": policy, "adaptive": settings}
    )


def healthy(qps: float, queue: float = 0.0) -> Reading:
    return Reading(
        pol.Samples(qps=qps, gpu_memory_percent=60.0, queue_depth=queue, reporting_replicas=3),
        Availability.OK,
        "6 queries answered",
    )


def fleet(*pods: FakePod) -> dict[str, FakePod]:
    return {p.name: p for p in pods}


def three_streaming() -> dict[str, FakePod]:
    return fleet(
        *(FakePod(f"agd-{i}", f"10.0.0.{i}", Mode.STREAMING, Mode.STREAMING) for i in range(3))
    )


def views(pods: dict[str, FakePod]) -> list[PodView]:
    return [PodView(p.name, p.ip, p.label, p.ready) for p in pods.values()]


async def run_pass(inp: PassInput, io: ReadIO) -> pass_data.PassResult:
    """The adaptive pass as one loop iteration runs it (handlers.Reconciler): observe, plan
    (pure), the executor's repairs, flips and replan rule, report (pure)."""
    observation = await read_observation(inp, io)
    the_plan, outcomes = await executor.execute_modes(
        plan_modes(inp, observation), io, lambda done: plan_modes(inp, observation, done)
    )
    return report.report(inp, the_plan, outcomes)


async def one_pass(
    io: FakeIO,
    the_spec: AutoGLMDeploymentSpec,
    status: dict[str, Any] | None = None,
    now: float = NOW,
) -> pass_data.PassResult:
    return await run_pass(
        PassInput("prod", "agd", 4, the_spec, status or {}, views(io.pods), now), io
    )


def condition(patch: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in patch["conditions"] if c["type"] == kind)


def apply_patch(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    return {**status, **patch}


# -- a flip ----------------------------------------------------------------------------------


async def test_a_flip_labels_then_switches_then_reports() -> None:
    io = FakeIO(three_streaming(), reading=healthy(qps=12.0))
    result = await one_pass(io, spec())

    pod = io.pods["agd-0"]
    assert pod.label is Mode.BATCHING and pod.runtime is Mode.BATCHING
    flip_calls = [c for c in io.calls if c[0] in ("announce", "set_label", "set_runtime_mode")]
    assert flip_calls == [
        ("announce",),
        ("set_label", "agd-0", "batching"),
        ("set_runtime_mode", "agd-0", "batching"),
    ]
    assert condition(io.announced[0], "ModeTransitioning")["status"] == "True"
    patch = result.status_patch
    last = patch["lastDecision"]
    assert last["reason"] == "QpsAboveHigh" and last["applied"] is True
    assert (last["fromBatching"], last["toBatching"]) == (0, 1)
    assert last["metrics"]["qpsPerReplica"] == "4.000"
    assert patch["decisionHistory"] == [last]
    assert condition(patch, "MetricsAvailable") | {"lastTransitionTime": None} == {
        "type": "MetricsAvailable",
        "status": "True",
        "reason": "QueriesSucceeded",
        "message": "6 queries answered",
        "observedGeneration": 4,
        "lastTransitionTime": None,
    }
    assert condition(patch, "ModeTransitioning")["reason"] == "Stable"
    assert patch["adaptiveState"]["lastFlips"][0]["pod"] == "agd-0"
    assert [e.reason for e in result.events] == ["ModeFlipped"]
    assert "from streaming to batching (QpsAboveHigh)" in result.events[0].message


async def test_a_refused_switch_reverts_the_label() -> None:
    pods = three_streaming()
    pods["agd-0"].refuses = True
    io = FakeIO(pods, reading=healthy(qps=12.0))
    result = await one_pass(io, spec())

    assert pods["agd-0"].label is Mode.STREAMING and pods["agd-0"].runtime is Mode.STREAMING
    calls = [c for c in io.calls if c[0] in ("set_label", "set_runtime_mode")]
    assert calls == [
        ("set_label", "agd-0", "batching"),
        ("set_runtime_mode", "agd-0", "batching"),
        ("set_label", "agd-0", "streaming"),  # a refused PUT changed nothing: no runtime revert
    ]
    last = result.status_patch["lastDecision"]
    assert last["applied"] is False and last["toBatching"] == 0
    assert "label reverted" in last["message"]
    assert [e.type for e in result.events] == ["Warning"]
    assert result.events[0].reason == "ModeFlipFailed"
    assert condition(result.status_patch, "ModeTransitioning")["status"] == "False"


async def test_an_unverified_switch_puts_the_runtime_back_too() -> None:
    pods = three_streaming()
    pods["agd-0"].sticky = True
    io = FakeIO(pods, reading=healthy(qps=12.0))
    await one_pass(io, spec())
    calls = [c[1:] for c in io.calls if c[0] in ("set_label", "set_runtime_mode")]
    assert calls == [
        ("agd-0", "batching"),
        ("agd-0", "batching"),
        ("agd-0", "streaming"),  # runtime revert
        ("agd-0", "streaming"),  # label revert
    ]


async def test_when_nothing_can_be_reverted_status_says_so() -> None:
    pods = three_streaming()
    pods["agd-0"].refuses = True
    io = FakeIO(pods, reading=healthy(qps=12.0), label_fail_after={"agd-0": 1})
    result = await one_pass(io, spec())
    assert pods["agd-0"].label is Mode.BATCHING and pods["agd-0"].runtime is Mode.STREAMING
    transitioning = condition(result.status_patch, "ModeTransitioning")
    assert (transitioning["status"], transitioning["reason"]) == ("True", "ModeMismatch")
    assert "agd-0" in transitioning["message"]
    assert "label revert failed" in result.status_patch["lastDecision"]["message"]


async def test_a_failed_label_patch_touches_no_runtime() -> None:
    pods = three_streaming()
    pods["agd-0"].label_patch_fails = True
    io = FakeIO(pods, reading=healthy(qps=12.0))
    result = await one_pass(io, spec())
    assert not [c for c in io.calls if c[0] == "set_runtime_mode"]
    assert "label patch failed" in result.status_patch["lastDecision"]["message"]


# -- repair after a restart ------------------------------------------------------------------


async def test_an_interrupted_flip_is_finished_and_counts_for_the_cooldown() -> None:
    pods = three_streaming()
    pods["agd-1"].label = Mode.BATCHING  # the operator died between label patch and PUT
    io = FakeIO(pods, reading=healthy(qps=0.3))
    the_spec = spec(toStreamingStabilizationSeconds=0, minStreamingReplicas=0)
    result = await one_pass(io, the_spec)

    assert pods["agd-1"].runtime is Mode.BATCHING
    assert [r.action for r in result.repairs] == ["Finished"]
    assert result.events[0].reason == "ModeFlipFinished"
    assert result.decision is not None and result.decision.reason == pol.COOLDOWN
    assert result.decision.flips == (), "the finished flip is not undone inside its cooldown"
    stored = result.status_patch["adaptiveState"]["lastFlips"]
    assert stored == [{"pod": "agd-1", "time": pol.iso_time(NOW), "mode": "batching"}]


async def test_a_flip_whose_status_write_was_lost_still_keeps_its_cooldown() -> None:
    io = FakeIO(three_streaming(), reading=healthy(qps=12.0))
    await one_pass(io, spec(cooldownSeconds=120))
    # The operator dies after the runtime switched, before the pass's status write: only what
    # it announced before touching the pod reached status.
    announced = io.announced[0]
    assert announced["adaptiveState"]["lastFlips"] == [
        {"pod": "agd-0", "time": pol.iso_time(NOW), "mode": "batching"}
    ]
    io.reading = healthy(qps=0.3)
    the_spec = spec(cooldownSeconds=120, toStreamingStabilizationSeconds=0)
    result = await one_pass(io, the_spec, status=announced, now=NOW + 30)

    assert result.repairs == []  # label and runtime already agree
    assert result.decision is not None and result.decision.reason == pol.COOLDOWN
    assert io.pods["agd-0"].label is Mode.BATCHING, "flipped back inside its cooldown"


async def test_a_runtime_that_refuses_the_label_mode_gets_the_label_reverted() -> None:
    pods = three_streaming()
    pods["agd-2"].label = Mode.BATCHING
    pods["agd-2"].refuses = True
    io = FakeIO(pods, reading=healthy(qps=6.0))
    result = await one_pass(io, spec())
    assert pods["agd-2"].label is Mode.STREAMING
    assert [(r.pod, r.action) for r in result.repairs] == [("agd-2", "Reverted")]
    assert result.events[0].type == "Warning"


async def test_an_unlabelled_pod_is_labelled_with_its_runtime_mode() -> None:
    pods = three_streaming()
    pods["agd-0"].label = None
    pods["agd-0"].runtime = Mode.BATCHING
    io = FakeIO(pods, reading=healthy(qps=6.0))
    result = await one_pass(io, spec())
    assert pods["agd-0"].label is Mode.BATCHING
    assert [r.action for r in result.repairs] == ["Adopted"]
    assert not [c for c in io.calls if c[0] == "set_runtime_mode"]


async def test_pods_whose_admin_api_is_down_are_never_flipped_and_status_says_why() -> None:
    pods = three_streaming()
    pods["agd-0"].runtime_down = True
    io = FakeIO(pods, reading=healthy(qps=12.0))
    result = await one_pass(io, spec())
    assert [c[1] for c in io.calls if c[0] == "set_label"] == ["agd-1"]
    transitioning = condition(result.status_patch, "ModeTransitioning")
    assert (transitioning["status"], transitioning["reason"]) == ("False", "AdminApiUnavailable")
    assert "agd-0: GET http://10.0.0.0:8000: connection refused" in transitioning["message"]
    assert "1 pods not flippable" in result.status_patch["lastDecision"]["message"]
    assert [e.reason for e in result.events] == ["AdminApiUnavailable", "ModeFlipped"]
    status = apply_patch({}, result.status_patch)
    again = await one_pass(io, spec(), status, NOW + 15)
    assert "AdminApiUnavailable" not in [e.reason for e in again.events], "warned once"


# -- dry run, pins, pause --------------------------------------------------------------------


async def test_dry_run_decides_and_records_but_touches_nothing() -> None:
    io = FakeIO(three_streaming(), reading=healthy(qps=12.0))
    result = await one_pass(io, spec(dryRun=True))
    assert [c[0] for c in io.calls if c[0] != "runtime_mode"] == ["read_metrics"]
    assert all(p.label is Mode.STREAMING for p in io.pods.values())
    last = result.status_patch["lastDecision"]
    assert last["applied"] is False and last["toBatching"] == 1
    assert "nothing applied: adaptive.dryRun is true" in last["message"]
    assert [e.reason for e in result.events] == ["DryRunFlip"]


def rolling_spec(**extra: Any) -> AutoGLMDeploymentSpec:
    return AutoGLMDeploymentSpec.model_validate(
        {
            "replicas": 3,
            "switchStrategy": "Rolling",
            "adaptive": {
                "prometheus": {"url": "http://p:9090"},
                "toBatchingStabilizationSeconds": 0,
            },
            **extra,
        }
    )


async def test_rolling_decides_a_batching_share_and_never_flips_live() -> None:
    io = FakeIO(three_streaming(), reading=healthy(qps=12.0))
    result = await one_pass(io, rolling_spec())
    assert not [c for c in io.calls if c[0] in ("set_label", "set_runtime_mode")]
    patch = result.status_patch
    last = patch["lastDecision"]
    assert (last["applied"], last["fromBatching"], last["toBatching"]) == (False, 0, 1)
    assert "switchStrategy Rolling" in last["message"]
    assert patch["adaptiveState"]["batchingTarget"] == 1
    assert condition(patch, "ModeTransitioning")["status"] == "True"
    assert condition(patch, "ModeTransitioning")["reason"] == "Replacing"
    assert [(e.type, e.reason) for e in result.events] == [("Normal", "ModeReplacing")]

    # A surge pod in batching mode is up, the old streaming pod not yet gone: still replacing,
    # and no new decision is recorded or taken.
    status = apply_patch({}, patch)
    io.pods["agd-new"] = FakePod("agd-new", "10.0.0.9", Mode.BATCHING, Mode.BATCHING)
    during = await one_pass(io, rolling_spec(), status, now=NOW + 2)
    assert "lastDecision" not in during.status_patch
    assert during.events == []
    status = apply_patch(status, during.status_patch)
    assert condition(status, "ModeTransitioning")["status"] == "True"

    # The old pod is gone: the decision is recorded as applied, and the condition clears.
    del io.pods["agd-0"]
    done = await one_pass(io, rolling_spec(), status, now=NOW + 7)
    last = done.status_patch["lastDecision"]
    assert (last["applied"], last["fromBatching"], last["toBatching"]) == (True, 0, 1)
    assert "replacement done in 7s" in last["message"]
    assert condition(done.status_patch, "ModeTransitioning")["status"] == "False"
    assert [e.reason for e in done.events] == ["ModeReplaced"]
    assert not [c for c in io.calls if c[0] in ("set_label", "set_runtime_mode")]


async def test_rolling_pinned_policy_reports_until_every_pod_is_replaced() -> None:
    io = FakeIO(three_streaming(), reading=healthy(qps=0.0))
    the_spec = rolling_spec(modePolicy="Batching")
    first = await one_pass(io, the_spec)
    assert first.status_patch["lastDecision"]["reason"] == pol.PINNED_BATCHING
    assert first.status_patch["lastDecision"]["applied"] is False
    assert first.status_patch["adaptiveState"]["batchingTarget"] == 3
    status = apply_patch({}, first.status_patch)
    io.pods = fleet(
        *(FakePod(f"agd-b{i}", f"10.0.1.{i}", Mode.BATCHING, Mode.BATCHING) for i in range(3))
    )
    done = await one_pass(io, the_spec, status, now=NOW + 30)
    last = done.status_patch["lastDecision"]
    assert (last["applied"], last["toBatching"], last["reason"]) == (True, 3, pol.PINNED_BATCHING)
    # A quiet pass afterwards writes nothing new.
    status = apply_patch(status, done.status_patch)
    quiet = await one_pass(io, the_spec, status, now=NOW + 45)
    assert "lastDecision" not in quiet.status_patch


async def test_rolling_with_dry_run_moves_nothing() -> None:
    io = FakeIO(three_streaming(), reading=healthy(qps=12.0))
    the_spec = rolling_spec()
    the_spec = the_spec.model_copy(
        update={"adaptive": the_spec.adaptive.model_copy(update={"dry_run": True})}
    )
    result = await one_pass(io, the_spec)
    assert result.status_patch["lastDecision"]["applied"] is False
    assert "batchingTarget" not in result.status_patch.get("adaptiveState", {})
    assert [e.reason for e in result.events] == ["DryRunFlip"]


async def test_pinned_batching_flips_every_pod_without_reading_metrics() -> None:
    io = FakeIO(three_streaming(), reading=None)
    result = await one_pass(io, spec(modePolicy="Batching"))
    assert not [c for c in io.calls if c[0] == "read_metrics"]
    assert all(p.label is Mode.BATCHING and p.runtime is Mode.BATCHING for p in io.pods.values())
    assert result.status_patch["lastDecision"]["reason"] == "PinnedBatching"
    metrics = condition(result.status_patch, "MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("Unknown", "NotQueried")


async def test_paused_holds_and_queries_nothing() -> None:
    pods = three_streaming()
    pods["agd-0"].label = pods["agd-0"].runtime = Mode.BATCHING
    io = FakeIO(pods, reading=healthy(qps=0.1))
    result = await one_pass(io, spec(paused=True))
    assert not [c for c in io.calls if c[0] in ("read_metrics", "set_label", "set_runtime_mode")]
    assert result.status_patch["lastDecision"]["reason"] == "Paused"
    assert condition(result.status_patch, "MetricsAvailable")["reason"] == "Paused"


# -- metrics outages, quiet passes, bounded history --------------------------------------------


async def test_prometheus_down_holds_warns_once_and_recovers() -> None:
    pods = three_streaming()
    pods["agd-0"].label = pods["agd-0"].runtime = Mode.BATCHING
    io = FakeIO(pods, reading=None)
    first = await one_pass(io, spec(toStreamingStabilizationSeconds=0))
    assert not [c for c in io.calls if c[0] == "set_label"]
    metrics = condition(first.status_patch, "MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("False", "PrometheusUnreachable")
    assert [e.reason for e in first.events] == ["PrometheusUnreachable"]
    status = apply_patch({}, first.status_patch)

    second = await one_pass(io, spec(toStreamingStabilizationSeconds=0), status, NOW + 15)
    assert second.events == [] and second.status_patch == {}, "a steady outage writes nothing"

    io.reading = healthy(qps=0.3)
    third = await one_pass(io, spec(toStreamingStabilizationSeconds=0), status, NOW + 30)
    assert next(e.reason for e in third.events) == "MetricsRecovered"
    assert pods["agd-0"].label is Mode.STREAMING, "the loop resumed by itself"
    recovered = condition(third.status_patch, "MetricsAvailable")
    assert recovered["lastTransitionTime"] == pol.iso_time(NOW + 30)


async def test_a_quiet_loop_writes_no_status() -> None:
    io = FakeIO(three_streaming(), reading=healthy(qps=6.0))
    status = apply_patch({}, (await one_pass(io, spec())).status_patch)
    for i in range(1, 5):
        io.reading = healthy(qps=6.0 + (i % 2) * 0.5)  # inside the band
        assert (await one_pass(io, spec(), status, NOW + 15 * i)).status_patch == {}


async def test_decision_history_stays_bounded() -> None:
    status: dict[str, Any] = {}
    io = FakeIO(three_streaming(), reading=None)
    for i in range(14):
        # Alternate pinned policies: every pass is a real change.
        the_spec = spec(modePolicy="Batching" if i % 2 == 0 else "Streaming")
        status = apply_patch(status, (await one_pass(io, the_spec, status, NOW + i)).status_patch)
    assert len(status["decisionHistory"]) == 10
    assert status["decisionHistory"][-1] == status["lastDecision"]
    assert status["decisionHistory"][0]["time"] == pol.iso_time(NOW + 4)


# -- conditions ------------------------------------------------------------------------------


def test_merge_conditions_keeps_others_and_transition_times() -> None:
    existing = [
        {
            "type": "Ready",
            "status": "True",
            "reason": "AllReplicasReady",
            "lastTransitionTime": "t0",
        },
        {
            "type": "MetricsAvailable",
            "status": "True",
            "reason": "QueriesSucceeded",
            "lastTransitionTime": "t1",
        },
    ]
    same = Condition(type="MetricsAvailable", status="True", reason="PartialData", message="m")
    merged = merge_conditions(existing, [same], "t2")
    assert merged[0] == existing[0]
    assert merged[1]["lastTransitionTime"] == "t1" and merged[1]["reason"] == "PartialData"
    flipped = Condition(type="MetricsAvailable", status="False", reason="NoData")
    new = Condition(type="ModeTransitioning", status="False", reason="Stable")
    merged = merge_conditions(existing, [flipped, new], "t2")
    assert [c["lastTransitionTime"] for c in merged] == ["t0", "t2", "t2"]
    assert merge_conditions(merged, [flipped, new], "t3") == merged, "safe to run twice"


async def test_a_deployment_without_pods_is_unknown_not_failing() -> None:
    io = FakeIO({}, reading=Reading(None, Availability.NO_PODS, "the deployment has no pods"))
    result = await one_pass(io, spec())
    metrics = condition(result.status_patch, "MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("Unknown", "NoPods")
    assert result.events == [], "a new deployment is not a warning"


async def test_rolling_keeps_the_stabilization_window_between_passes() -> None:
    io = FakeIO(three_streaming(), reading=healthy(qps=12.0))
    the_spec = rolling_spec(
        adaptive={"prometheus": {"url": "http://p:9090"}, "toBatchingStabilizationSeconds": 10}
    )
    first = await one_pass(io, the_spec)
    assert first.status_patch["lastDecision"]["reason"] == pol.STABILIZING
    assert first.status_patch["adaptiveState"]["highSince"]
    status = apply_patch({}, first.status_patch)
    waiting = await one_pass(io, the_spec, status, now=NOW + 5)
    status = apply_patch(status, waiting.status_patch)
    assert status["lastDecision"]["reason"] == pol.STABILIZING
    # High for the whole window since the first pass: the replacement starts.
    due = await one_pass(io, the_spec, status, now=NOW + 10)
    last = due.status_patch["lastDecision"]
    assert (last["applied"], last["fromBatching"], last["toBatching"]) == (False, 0, 1)
    assert due.status_patch["adaptiveState"]["batchingTarget"] == 1


async def test_rolling_target_keeps_min_streaming_replicas_as_the_plan_does() -> None:
    """One rule for the batching share: a target stored before minStreamingReplicas was raised
    is capped the way the Deployments are stepped, so the pass does not wait for a share the
    plan will never reach."""
    io = FakeIO(
        fleet(
            FakePod("agd-0", "10.0.0.0", Mode.STREAMING, Mode.STREAMING),
            FakePod("agd-1", "10.0.0.1", Mode.BATCHING, Mode.BATCHING),
            FakePod("agd-2", "10.0.0.2", Mode.BATCHING, Mode.BATCHING),
        ),
        reading=healthy(qps=6.0),
    )
    status = {"adaptiveState": {"batchingTarget": 3}}
    result = await one_pass(io, rolling_spec(), status)
    split = {Mode.STREAMING: 1, Mode.BATCHING: 2}
    assert rolling_batching_target(rolling_spec(), 3, split) == 2
    assert result.batching_target == 2
    assert result.status_patch["adaptiveState"]["batchingTarget"] == 2
    assert condition(result.status_patch, "ModeTransitioning")["reason"] != "Replacing"
