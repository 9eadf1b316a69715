"""Every flag the argv builder emits exists in the pinned vLLM's own argument parser source.

Reads the real sdist from PyPI (cached outside the repo by hack/vllm_source.py); CI has network.
"""

from __future__ import annotations

import pytest

from autoglm_runtime.engine_args import (
    MANAGED_FLAGS,
    MANAGED_SPELLINGS,
    PINNED_VLLM_VERSION,
    EngineSettings,
    build_vllm_argv,
)
from vllm_source import reasoning_parsers, vllm_serve_flags

SETTINGS = [
    EngineSettings(model="/models/autoglm-phone-9b"),
    EngineSettings(model="zai-org/AutoGLM-Phone-9B", dtype="bfloat16", tensor_parallel_size=1,
                   max_num_batched_tokens=4096, enable_prefix_caching=False,
                   reasoning_parser=None, shutdown_timeout_seconds=120,
                   max_num_seqs=8, stream_interval=4),
    EngineSettings(model="/m", extra_args=("--enforce-eager", "--seed=0",
                                          "--limit-mm-per-prompt", '{"image": 2}')),
]


@pytest.fixture(scope="module")
def flags() -> frozenset[str]:
    return vllm_serve_flags(PINNED_VLLM_VERSION)


def test_the_parser_source_was_read(flags: frozenset[str]) -> None:
    # A broken extraction would make every check below pass vacuously.
    assert len(flags) > 150
    assert {"--model", "--max-model-len", "--port", "--api-key"} <= flags
    assert "--not-a-vllm-flag" not in flags


@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "variant", "extras"])
def test_every_emitted_flag_exists(settings: EngineSettings, flags: frozenset[str]) -> None:
    argv = build_vllm_argv(settings)
    emitted = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    assert emitted, argv
    assert emitted - flags == set()


def test_managed_flags_exist(flags: frozenset[str]) -> None:
    assert set(MANAGED_FLAGS) - flags == set()


def test_every_managed_flag_has_its_spellings() -> None:
    spellings = {option for m in MANAGED_SPELLINGS.values() for option in m.spellings}
    assert set(MANAGED_FLAGS) <= spellings
    assert set(MANAGED_SPELLINGS) <= set(MANAGED_FLAGS)


def test_managed_abbreviations_shadow_no_other_flag(flags: frozenset[str]) -> None:
    """An abbreviation another vLLM flag starts with is not vLLM's for the managed flag (it is
    ambiguous, or exact for the other), and refusing it would refuse that flag. Whether each is
    the shortest vLLM expands is checked on the real parser: hack/check_managed_flags.py."""
    spellings = {o: short for m in MANAGED_SPELLINGS.values() for o, short in m.spellings.items()}
    others = flags - set(spellings)
    for option, shortest in spellings.items():
        assert option.startswith(shortest), option
        if shortest != option:  # an exact flag wins over the flags it is a prefix of
            assert sorted(f for f in others if f.startswith(shortest)) == [], option


def test_glm_reasoning_parser_is_registered() -> None:
    parsers = reasoning_parsers(PINNED_VLLM_VERSION)
    assert "glm45" in parsers
    assert EngineSettings(model="/m").reasoning_parser in parsers


def test_a_removed_flag_is_caught(flags: frozenset[str]) -> None:
    # --swap-space existed in older vLLM and is gone from the pinned one: the check must see it.
    argv = build_vllm_argv(EngineSettings(model="/m", extra_args=("--swap-space", "4")))
    assert {a for a in argv if a.startswith("--")} - flags == {"--swap-space"}
