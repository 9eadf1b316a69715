"""The phone agent's own loop (phone_agent.py) through the router, on a real engine: at the
default 2048-token context it runs until its history is full and then gets a 400 that says so;
at the official 25,480 with the official image budget, an 8-step task completes.

What it relies on: max_tokens 3000 on every call is lowered to what fits, never refused; the
engine's processor scales each 1080x2400 screenshot to the operator's pixel budget; the
`<think>` part comes back as reasoning; no session id is needed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path

import openai
import pytest
from phone_agent import PhoneAgent

from autoglm_api.image_budget import OFFICIAL_MAX_PIXELS, image_tokens
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.engine import OPENAI_TIMEOUT, Engine, running_engine
from testkit.paths import REPO
from testkit.processes import RouterProcess

pytestmark = pytest.mark.timeout(900)

# The model's official serve command: --max-model-len 25480, max_pixels 5,000,000 (the
# operator's default at that context) and up to 10 images per prompt.
OFFICIAL = AutoGLMDeploymentSpec.model_validate(
    {"maxModelLen": 25480, "multimodal": {"imagesPerPrompt": 10}})
# The answer part of a turn: one action of the agent's grammar.
ACTION = re.compile(r'<answer>do\(action="Tap", element=\[\d+(?:,\d+)*\]\)</answer>')


@contextmanager
def routed(engine: Engine, spec: AutoGLMDeploymentSpec,
           workdir: Path) -> Iterator[openai.OpenAI]:
    """The official client through `autoglm-router` in front of `engine`, flagged as the
    operator flags it for `spec`; no retries, so nothing is hidden."""
    pixels = spec.multimodal.effective_max_pixels(spec.max_model_len)
    env = {"PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("api", "runtime", "router"))}
    router = RouterProcess([engine.base_url], "--image-max-pixels", str(pixels),
                           "--poll-interval", "0.5", env=env, log_path=workdir / "router.log")
    router.start(timeout=60.0)
    try:
        yield openai.OpenAI(base_url=f"{router.base_url}/v1", api_key="EMPTY", max_retries=0,
                            timeout=OPENAI_TIMEOUT)
    finally:
        router.stop()


def test_at_the_default_context_the_loop_runs_until_its_history_is_full(
    engine: Engine, answer: dict, default_spec: AutoGLMDeploymentSpec,
    tmp_path: Path,
) -> None:
    context = default_spec.max_model_len
    budget = default_spec.multimodal.effective_max_pixels(context)
    think, action = answer["answer"].removeprefix("<think>").split("</think>", 1)
    with routed(engine, default_spec, tmp_path) as client:
        agent = PhoneAgent(client)
        with pytest.raises(openai.BadRequestError) as refused:
            for _ in range(40):
                agent.step()
    steps = agent.steps
    image = image_tokens(1080, 2400, budget)  # 738: the screenshot scaled to ~0.6 Mpx
    assert image < steps[0].prompt_tokens < image + 1000  # plus the agent's text
    full = [s for s in steps if s.finish_reason == "stop"]
    for step in full:  # the whole turn, split by the reasoning parser
        assert (step.reasoning, step.content) == (think, action.strip())
        assert step.prompt_tokens + step.completion_tokens <= context
    # As many steps as fit: every one whose prompt leaves room for the turn; then at most one
    # whose answer the context cuts short; then the 400.
    turn = full[0].completion_tokens
    assert [s for s in steps if s.prompt_tokens + turn <= context] == full
    cut = steps[len(full):]
    assert len(cut) <= 1
    assert all(s.finish_reason == "length" and s.prompt_tokens + s.completion_tokens == context
               for s in cut)
    message = refused.value.body["message"] if isinstance(refused.value.body, dict) else ""
    assert refused.value.status_code == 400
    assert f"context of {context} tokens" in message and "spec.maxModelLen" in message
    # vLLM says "Input length (N) exceeds ..." or "your prompt contains N input tokens".
    counted = re.search(r"(?:Input length \(|contains (?:at least )?)(\d+)", message)
    assert counted is not None, message
    assert int(counted.group(1)) >= context > steps[-1].prompt_tokens
    print(f"at {context} tokens: {len(full)} steps of the loop fit (prompts "
          f"{steps[0].prompt_tokens} to {full[-1].prompt_tokens} tokens), "
          f"{len(cut)} cut short, then a 400 at a {counted.group(1)}-token prompt")


@pytest.fixture(scope="module")
def official_engine(model_dir: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with running_engine(OFFICIAL, model_dir, tmp_path_factory.mktemp("official")) as started:
        yield started


def test_at_the_official_context_an_eight_step_task_completes(
    official_engine: Engine, answer: dict, tmp_path: Path,
) -> None:
    assert OFFICIAL.multimodal.effective_max_pixels(25480) == OFFICIAL_MAX_PIXELS
    think, action = answer["answer"].removeprefix("<think>").split("</think>", 1)
    with routed(official_engine, OFFICIAL, tmp_path) as client:
        agent = PhoneAgent(client)
        steps = [agent.step() for _ in range(8)]
    image = image_tokens(1080, 2400, OFFICIAL_MAX_PIXELS)  # 3108: 1036x2352
    assert image < steps[0].prompt_tokens < image + 1000
    # Every turn ends and is split by the reasoning parser. The tiny model's random weights
    # hold its trained turn only so far: behind a 3,108-token screenshot and a growing
    # history, under the agent's frequency_penalty 0.2, a greedy decode has drifted (once in
    # CI, `element=[500,500,500]`). So the turn's shape is checked, not its exact tokens.
    for step in steps:
        assert step.finish_reason == "stop"
        assert step.reasoning and "think>" not in step.reasoning, step.reasoning
        assert ACTION.fullmatch(step.content or ""), step.content
    exact = sum((s.reasoning, s.content) == (think, action.strip()) for s in steps)
    # The history grows by the kept turns only: each earlier screenshot was stripped.
    growth = [b.prompt_tokens - a.prompt_tokens for a, b in pairwise(steps)]
    assert all(0 < g < image for g in growth), growth
    print(f"at 25480 tokens: 8 steps, prompts {steps[0].prompt_tokens} to "
          f"{steps[-1].prompt_tokens} tokens; {exact} of 8 turns exactly the trained one")
