"""switchStrategy Rolling, the pure parts: per-mode templates and the make-before-break steps."""

from __future__ import annotations

from typing import Any

import pytest

from autoglm_api.engine_args import EngineSettings, build_vllm_argv
from autoglm_api.profiles import MODE_LABEL, Mode
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.reconcile.rolling import rolling_batching_target, rolling_step
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec, ModePolicy, SwitchStrategy

OWNER = builders.Owner(name="phone-9b", namespace="serving", uid="u1")
ROLLING = AutoGLMDeploymentSpec.model_validate(
    {"replicas": 2, "switchStrategy": "Rolling", "modePolicy": "Streaming"}
)
IN_PLACE = ROLLING.model_copy(update={"switch_strategy": SwitchStrategy.IN_PLACE})


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def args_of(manifest: dict[str, Any]) -> list[str]:
    return list(manifest["spec"]["template"]["spec"]["containers"][0]["args"])


def test_in_place_keeps_one_deployment_with_the_envelope() -> None:
    deployments = [c for c in builders.children(OWNER, IN_PLACE) if c["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in deployments] == ["phone-9b"]
    args = args_of(deployments[0])
    assert flag(args, "--max-num-seqs") == "64" and "--stream-interval" not in args
    assert MODE_LABEL not in deployments[0]["spec"]["template"]["metadata"]["labels"]
    # The InPlace template is exactly the mode-less one: its digest does not move.
    assert builders.desired_template_hashes("phone-9b", IN_PLACE) == {
        builders.template_hash(builders.pod_template("phone-9b", IN_PLACE))
    }


def test_rolling_has_one_deployment_per_mode_with_that_modes_engine_flags() -> None:
    split = {Mode.STREAMING: 1, Mode.BATCHING: 2}
    children = builders.children(OWNER, ROLLING, split=split)
    by_name = {c["metadata"]["name"]: c for c in children if c["kind"] == "Deployment"}
    streaming, batching = by_name["phone-9b"], by_name["phone-9b-batching"]
    assert (streaming["spec"]["replicas"], batching["spec"]["replicas"]) == (1, 2)

    s_args, b_args = args_of(streaming), args_of(batching)
    assert flag(s_args, "--max-num-seqs") == "8" and "--stream-interval" not in s_args
    assert flag(b_args, "--max-num-seqs") == "64" and flag(b_args, "--stream-interval") == "4"
    # The one argv builder made them: same argv as EngineSettings with the mode's values.
    settings = builders.engine_settings(ROLLING, Mode.BATCHING)
    assert isinstance(settings, EngineSettings) and b_args == build_vllm_argv(settings)

    for deployment, mode in ((streaming, Mode.STREAMING), (batching, Mode.BATCHING)):
        assert deployment["spec"]["template"]["metadata"]["labels"][MODE_LABEL] == mode.value
    # `<name>` keeps the InPlace selector (immutable); the batching one adds the mode.
    assert streaming["spec"]["selector"] == builders.deployment(OWNER, IN_PLACE)["spec"]["selector"]
    assert batching["spec"]["selector"]["matchLabels"][MODE_LABEL] == "batching"
    hashes = builders.desired_template_hashes("phone-9b", ROLLING)
    assert len(hashes) == 2
    assert builders.template_hash(batching["spec"]["template"]) in hashes


def test_stream_coalescing_happens_once_engine_or_middleware() -> None:
    """Under Rolling the engine's --stream-interval merges chunks, so the runtime's ConfigMap
    turns the middleware's coalescing off; InPlace leaves it to the middleware."""
    rolling_profiles = builders.runtime_config(ROLLING)["profiles"]
    assert rolling_profiles["batching"]["streamCoalesceChunks"] == 1
    batching_args = build_vllm_argv(builders.engine_settings(ROLLING, Mode.BATCHING))
    assert flag(batching_args, "--stream-interval") == "4"
    in_place_profiles = builders.runtime_config(IN_PLACE)["profiles"]
    assert in_place_profiles["batching"]["streamCoalesceChunks"] == 4


def test_rolling_without_a_split_starts_all_in_the_initial_mode() -> None:
    batching = ROLLING.model_copy(update={"mode_policy": ModePolicy.BATCHING})
    by_name = {
        c["metadata"]["name"]: c["spec"]["replicas"]
        for c in builders.children(OWNER, batching)
        if c["kind"] == "Deployment"
    }
    assert by_name == {"phone-9b": 0, "phone-9b-batching": 2}


@pytest.mark.parametrize(
    ("policy", "dry_run", "stored", "current", "expected"),
    [
        ("Batching", False, None, {Mode.STREAMING: 2}, 2),
        ("Streaming", False, 2, {Mode.BATCHING: 2}, 0),
        ("Batching", True, None, {Mode.STREAMING: 2}, 0),  # dryRun holds the split
        ("Adaptive", False, None, None, 0),  # nothing decided yet: the initial mode
        ("Adaptive", False, None, {Mode.STREAMING: 1, Mode.BATCHING: 1}, 1),
        ("Adaptive", False, 2, None, 1),  # minStreamingReplicas 1 keeps one streaming
    ],
)
def test_batching_target(
    policy: str, dry_run: bool, stored: int | None, current: dict[Mode, int] | None, expected: int
) -> None:
    spec = AutoGLMDeploymentSpec.model_validate(
        {
            "replicas": 2,
            "switchStrategy": "Rolling",
            "modePolicy": policy,
            "adaptive": {"prometheus": {"url": "http://p:9090"}, "dryRun": dry_run},
        }
    )
    assert rolling_batching_target(spec, stored, current) == expected


# -- the steps, simulated: Deployments scale, the ReplicaSets create and remove pods -----------

HASHES = {Mode.STREAMING: "s-hash", Mode.BATCHING: "b-hash"}


def pod(name: str, mode: Mode, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": f"2026-01-01T00:00:{int(name.split('-')[-1]):02d}Z",
            "labels": {MODE_LABEL: mode.value},
            "annotations": {builders.TEMPLATE_HASH_ANNOTATION: HASHES[mode]},
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def simulate(replicas: int, target: int, pods: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Run steps until nothing changes; return the log and check the invariants on the way."""
    modes = [p["metadata"]["labels"][MODE_LABEL] for p in pods]
    split = {m: modes.count(m.value) for m in Mode}
    counter = len(pods)
    log: list[tuple[str, Any]] = []
    for _ in range(50):
        step = rolling_step(replicas, target, split, pods, HASHES)
        for name in step.retire:  # the operator marks, the ReplicaSet removes the marked pod
            pods = [p for p in pods if p["metadata"]["name"] != name]
            log.append(("delete", name))
        for mode in Mode:
            have = [p for p in pods if p["metadata"]["labels"][MODE_LABEL] == mode.value]
            for _ in range(step.split[mode] - len(have)):
                counter += 1
                pods.append(pod(f"{mode.value}-{counter}", mode, ready=False))
                log.append(("create", mode.value))
        ready = sum(1 for p in pods if p["status"]["conditions"][0]["status"] == "True")
        assert ready >= replicas, log  # make-before-break: never below the full count
        assert len(pods) <= replicas + 1, log  # one surge pod at a time
        all_ready = all(p["status"]["conditions"][0]["status"] == "True" for p in pods)
        if step.split == split and not step.retire and all_ready:
            break
        split = step.split
        for p in pods:  # the new pods become ready (kwok, or a model load)
            p["status"]["conditions"][0]["status"] = "True"
    final = sorted(p["metadata"]["labels"][MODE_LABEL] for p in pods)
    log.append(("final", final))
    return log


def test_pinning_batching_replaces_every_pod_one_at_a_time_new_before_old() -> None:
    log = simulate(2, 2, [pod("streaming-1", Mode.STREAMING), pod("streaming-2", Mode.STREAMING)])
    assert log == [
        ("create", "batching"),
        ("delete", "streaming-1"),  # the oldest goes first, after its replacement is ready
        ("create", "batching"),
        ("delete", "streaming-2"),
        ("final", ["batching", "batching"]),
    ]


def test_back_to_streaming_and_a_partial_share() -> None:
    log = simulate(3, 1, [pod(f"batching-{i}", Mode.BATCHING) for i in (1, 2, 3)])
    assert log[-1] == ("final", ["batching", "streaming", "streaming"])
    assert log[0] == ("create", "streaming")


def test_no_old_pod_goes_while_its_replacement_is_not_ready() -> None:
    pods = [pod("streaming-1", Mode.STREAMING), pod("batching-2", Mode.BATCHING, ready=False)]
    step = rolling_step(1, 1, {Mode.STREAMING: 1, Mode.BATCHING: 1}, pods, HASHES)
    assert step.split == {Mode.STREAMING: 1, Mode.BATCHING: 1} and step.retire == ()
    pods[1]["status"]["conditions"][0]["status"] = "True"
    step = rolling_step(1, 1, {Mode.STREAMING: 1, Mode.BATCHING: 1}, pods, HASHES)
    assert step.split == {Mode.STREAMING: 0, Mode.BATCHING: 1}
    assert step.retire == ("streaming-1",)


def test_a_plain_scale_needs_no_replacement() -> None:
    pods = [pod("streaming-1", Mode.STREAMING), pod("streaming-2", Mode.STREAMING)]
    up = rolling_step(4, 0, {Mode.STREAMING: 2}, pods, HASHES)
    assert up.split == {Mode.STREAMING: 4, Mode.BATCHING: 0}
    down = rolling_step(1, 0, {Mode.STREAMING: 2}, pods, HASHES)
    assert down.split == {Mode.STREAMING: 1, Mode.BATCHING: 0}
    assert down.retire == ()  # the ReplicaSet picks; no pod is being replaced


def test_without_a_spare_gpu_one_old_pod_goes_first() -> None:
    pending = pod("batching-3", Mode.BATCHING, ready=False)
    pending["status"]["phase"] = "Pending"
    pending["status"]["conditions"].append(
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        }
    )
    pods = [pod("streaming-1", Mode.STREAMING), pod("streaming-2", Mode.STREAMING), pending]
    step = rolling_step(2, 2, {Mode.STREAMING: 2, Mode.BATCHING: 1}, pods, HASHES)
    assert step.split == {Mode.STREAMING: 1, Mode.BATCHING: 1}
    assert step.retire == ("streaming-1",)
