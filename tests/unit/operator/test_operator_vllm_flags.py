"""Every vLLM flag the operator writes into a Deployment exists in the pinned vLLM's parser.

The runtime's test checks `build_vllm_argv`; this one checks what the operator really puts in
the pod template (its mapping of spec fields onto engine settings included).
"""

from __future__ import annotations

import pytest

from autoglm_operator import builders
from autoglm_operator import spec as crd
from autoglm_runtime.engine_args import PINNED_VLLM_VERSION
from vllm_source import reasoning_parsers, vllm_serve_flags

SPECS = {
    "defaults": crd.AutoGLMDeploymentSpec(),
    "everything-on": crd.AutoGLMDeploymentSpec.model_validate(
        {
            "gpusPerReplica": 4,
            "dtype": "bfloat16",
            "engine": {"maxNumBatchedTokens": 8192, "reasoningParser": "glm45"},
            "model": {"pvcName": "weights"},
        }
    ),
    "no-prefix-cache": crd.AutoGLMDeploymentSpec.model_validate(
        {"engine": {"enablePrefixCaching": False, "reasoningParser": None}}
    ),
}


@pytest.fixture(scope="module")
def known() -> frozenset[str]:
    return vllm_serve_flags(PINNED_VLLM_VERSION)


@pytest.mark.parametrize("name", list(SPECS))
def test_every_flag_in_the_deployment_is_a_real_vllm_flag(name: str, known: frozenset[str]) -> None:
    deployment = builders.deployment(builders.Owner("x", "ns", "u"), SPECS[name])
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    written = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    assert {"--tensor-parallel-size", "--dtype", "--max-model-len", "--middleware"} <= written
    assert written - known == set(), f"not flags of vLLM {PINNED_VLLM_VERSION}"


def test_the_default_reasoning_parser_exists() -> None:
    default = crd.EngineOptions().reasoning_parser
    assert default in reasoning_parsers(PINNED_VLLM_VERSION)
