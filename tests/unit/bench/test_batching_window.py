"""The batching-window benchmark judges the profile's default against every window it runs."""

from __future__ import annotations

from testkit.paths import load_script

bench = load_script("bench/batching_window.py")

from autoglm_api.profiles import BatchingProfile  # noqa: E402


def _row(config: str, goodput: float) -> dict[str, object]:
    return {"trace": "t", "batching": 4, "config": config, "goodput": goodput}


def test_the_default_under_test_is_the_profiles_own() -> None:
    p = BatchingProfile()
    assert bench.default_config() == (p.batch_window_millis, p.batch_size)
    assert bench.name(bench.default_config()) in {bench.name(c) for c in bench.CONFIGS}


def test_a_window_that_beats_the_default_fails_and_a_tie_passes() -> None:
    default = bench.name(bench.default_config())
    rows = [_row(default, 8.0), _row("25ms x4", 8.0), _row("100ms x4", 8.5)]
    verdicts = bench.check(rows, [])
    assert [(v["verdict"], v["met"]) for v in verdicts] == [("TIE", True), ("FAIL", False)]


def test_a_window_holds_requests_in_the_pool_model() -> None:
    off = bench.simulate(("steady-low", 4, 2, (0, 1)))
    on = bench.simulate(("steady-low", 4, 2, (100, 4)))
    assert on["requests"] == off["requests"]
    assert on["ttft_p50"] > off["ttft_p50"]  # the window only adds its wait
