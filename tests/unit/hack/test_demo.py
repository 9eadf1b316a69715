"""`make demo`'s pure parts: the resource it applies (examples/autoglm-autoscaling.yaml with demo
timings) is a valid spec, and the fleet's story is read right from the live table's samples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo", REPO / "hack" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["demo"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_autoscaling_example_is_a_valid_spec() -> None:
    example = yaml.safe_load((REPO / "examples" / "autoglm-autoscaling.yaml").read_text())
    parsed = AutoGLMDeploymentSpec.model_validate(example["spec"])
    settings = parsed.autoscaling
    assert settings.enabled and (settings.min_replicas, settings.max_replicas) == (1, 4)
    # What the CRD's CEL rules ask of it: a Prometheus to read demand from, min <= max.
    assert parsed.adaptive.prometheus.url
    assert parsed.adaptive.min_streaming_replicas <= settings.max_replicas
    assert not parsed.standby().enabled  # minReplicas 1: no scale to zero


def test_the_demo_resource_scales_to_zero_through_min_replicas(demo: ModuleType) -> None:
    resource = demo.demo_resource("http://127.0.0.1:9090", 4)
    parsed = AutoGLMDeploymentSpec.model_validate(resource["spec"])
    assert parsed.autoscaling.enabled and parsed.autoscaling.min_replicas == 0
    assert parsed.autoscaling.scale_down.stabilization_seconds == 20
    standby = parsed.standby()
    assert standby.enabled and standby.floor == 0
    assert parsed.router.enabled  # minReplicas 0 needs the router's hold


def _sample(
    demo: ModuleType, t: float, fleet: int, batching: int = 0, standby: str = "Serving"
) -> object:
    running = 0 if standby == "Idle" else fleet
    return demo.Sample(t=t, offered_qps=0, served_qps=0, ttft_p95=None, batching=batching,
                       streaming=running - batching, running=running, desired=running,
                       standby=standby, held=0, fleet_desired=fleet,
                       fleet_running=running, fleet_reason="-")  # fmt: skip


def test_the_fleet_story_grows_and_shrinks_before_the_idle_floor(demo: ModuleType) -> None:
    samples = [_sample(demo, 0, 1), _sample(demo, 10, 3), _sample(demo, 20, 4, batching=1),
               _sample(demo, 30, 3), _sample(demo, 40, 1), _sample(demo, 50, 1, standby="Idle"),
               _sample(demo, 60, 2)]  # fmt: skip
    story = demo.fleet_story(samples)
    assert (story.start, story.peak, story.after) == (1, 4, 1)
    assert (story.peak_at, story.after_at) == (20, 40)
    assert story.grew and story.shrank
    assert demo.describe_fleet(story) == "1 at the start, grew to 4 at t=20s, shrank to 1 at t=40s"
    assert demo.back_to_streaming(samples)


def test_a_fleet_that_never_moved_is_told_so(demo: ModuleType) -> None:
    samples = [_sample(demo, 0, 2), _sample(demo, 10, 2, batching=1)]
    story = demo.fleet_story(samples)
    assert not story.grew and not story.shrank
    assert not demo.back_to_streaming(samples)  # still batching at the end
    assert demo.fleet_story([]) is None
