"""The real-engine mode benchmark: a mode wins a figure only when every round of it beats every
round of the other; and the pod runner's CPU argv is the engine tier's CPU settings, flag for
flag."""

from __future__ import annotations

from pathlib import Path

from testkit.paths import load_script

bench = load_script("bench/engine_modes.py")

from autoglm_api.engine_args import build_vllm_argv  # noqa: E402
from autoglm_operator.reconcile.children import serving  # noqa: E402
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec  # noqa: E402
from testkit.engine import cpu_argv, cpu_overrides  # noqa: E402


def _rows(key: str, streaming: list[float], batching: list[float]) -> list[dict[str, object]]:
    return [{"backend": "engine", "load": "l", "mode": mode, key: value}
            for mode, values in (("streaming", streaming), ("batching", batching))
            for value in values]


def test_lower_is_better_for_latency_and_higher_for_rates() -> None:
    assert bench.winner(_rows("chat_ttft_p50", [0.1, 0.2], [0.3, 0.4]), "engine", "l",
                        "chat_ttft_p50") == "streaming"
    assert bench.winner(_rows("goodput", [1.0, 2.0], [3.0, 4.0]), "engine", "l",
                        "goodput") == "batching"


def test_rounds_that_overlap_are_a_tie() -> None:
    rows = _rows("chat_ttft_p50", [0.1, 0.35], [0.3, 0.4])
    assert bench.winner(rows, "engine", "l", "chat_ttft_p50") == "tie"
    assert bench.winner(_rows("goodput", [2.0], [2.0]), "engine", "l", "goodput") == "tie"


def test_a_figure_one_mode_lacks_has_no_winner() -> None:
    assert bench.winner(_rows("job_rps", [1.0], []), "engine", "l", "job_rps") == "-"


def test_the_pod_runners_cpu_argv_is_the_cpu_settings_argv() -> None:
    for spec in (AutoGLMDeploymentSpec(),
                 AutoGLMDeploymentSpec.model_validate({"maxModelLen": 25480})):
        pod_argv = build_vllm_argv(serving.engine_settings(spec))
        assert "--mm-encoder-tp-mode" in pod_argv  # two GPUs: the case that must change
        local = cpu_overrides(serving.engine_settings(spec)).model_copy(
            update={"model": "/tiny", "host": "127.0.9.1"})
        assert cpu_argv(pod_argv, Path("/tiny"), "127.0.9.1") == build_vllm_argv(local)
