"""The sim-fidelity benchmark: its CPU fit recovers a decode step from TPOT at the training loads
only, and its verdict needs every held-out ratio within 20% and their median within 10%."""

from __future__ import annotations

import pytest

from testkit.paths import load_script

bench = load_script("bench/sim_fidelity.py")


def _training_rows(floor: float, t0: float, t1: float, a_pre: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for case in bench.TRAINING:
        for running in (0.5 * case.load.chats, 0.9 * case.load.chats):  # two rounds each
            step = max(floor, t0 + t1 * running)
            rows.append({"backend": "engine", "case": case.name, "running_mean": running,
                         "tpot_mean": step, "ttft_mean": a_pre + step})
    # A held-out load must not move the fit.
    rows.append({"backend": "engine", "case": bench.HELD_OUT[0].name, "running_mean": 30.0,
                 "tpot_mean": 9.0, "ttft_mean": 9.0})
    return rows


def test_the_step_fit_finds_the_floor_and_the_line_past_it() -> None:
    points = [(n, max(0.0045, 0.002 + 0.0004 * n)) for n in (1, 2, 4, 8, 12, 16)]
    assert bench.step_fit(points) == pytest.approx((0.0045, 0.002, 0.0004))
    line = [(n, 0.003 + 0.0002 * n) for n in (1, 4, 16)]
    floor, t0, t1 = bench.step_fit(line)
    assert (t0, t1) == pytest.approx((0.003, 0.0002)) and floor <= t0


def test_the_fit_reads_the_step_off_the_sequences_the_engine_ran_in_the_training_loads() -> None:
    fitted = bench.fit(_training_rows(floor=0.0045, t0=0.001, t1=0.0006, a_pre=0.008), search=0)
    assert (fitted.floor, fitted.t0, fitted.t1) == pytest.approx((0.0045, 0.001, 0.0006))
    assert fitted.shared_api_server
    # One user's TTFT is its preprocessing, one step and its first token's way out.
    one = (fitted.step_seconds(1, bench.CHAT_PROMPT_TOKENS, 0) + fitted.out_step
           + fitted.a_tok * bench.CHAT_PROMPT_TOKENS)
    assert fitted.a_pre + one == pytest.approx(0.008 + 0.0045)
    gpu = bench.LatencyModel()
    assert fitted.c_p / gpu.c_p == pytest.approx(0.0045 / gpu.t0)  # shares of a step kept


def test_the_simplex_search_finds_a_minimum() -> None:
    def bowl(x: object) -> float:
        a, b = x  # type: ignore[misc]
        return (a - 1.0) ** 2 + 3 * (b + 2.0) ** 2

    assert bench.nelder_mead(bowl, [0.0, 0.0], 80) == pytest.approx([1.0, -2.0], abs=1e-3)


def test_the_replay_is_the_sim_itself_on_a_virtual_clock() -> None:
    from testkit.virtual_time import run_virtual

    quick = bench.LatencyModel(a_pre=0.005, a_tok=0.0, t0=0.004, t1=0.0, c_p=0.0,
                               shared_api_server=True)
    one = run_virtual(bench.replay(quick, bench.Load("x1", 1), 4.0))
    # One user: 5 ms preprocessing, then 64 steps of 4 ms, back to back.
    assert one["ttft_mean"] == pytest.approx(0.009)
    assert one["tpot_mean"] == pytest.approx(0.004)
    assert one["rps"] == pytest.approx(1 / (0.005 + 64 * 0.004), rel=0.08)
    # An API server that spends 3 ms on each step's output slows what users get, not the step.
    slow = run_virtual(bench.replay(bench.replace(quick, out_step=0.003), bench.Load("x4", 4),
                                    4.0))
    fast = run_virtual(bench.replay(quick, bench.Load("x4", 4), 4.0))
    assert slow["tpot_mean"] == pytest.approx(fast["tpot_mean"], rel=0.05)
    assert slow["ttft_mean"] > fast["ttft_mean"]


def _judged(ratios: list[float]) -> bool:
    rows: list[dict[str, object]] = []
    for i, ratio in enumerate(ratios):
        case = bench.HELD_OUT[i % len(bench.HELD_OUT)].name
        key = bench.FIGURES[i // len(bench.HELD_OUT)]
        rows.append({"backend": "engine", "case": case, key: 1.0})
        rows.append({"backend": "sim", "case": case, key: ratio})
    return bench.held_out_table(rows)[1]


def test_the_target_needs_every_figure_within_20_and_the_median_within_10_percent() -> None:
    assert _judged([1.05, 0.95, 1.08, 0.92, 1.0])
    assert not _judged([1.05, 0.95, 1.25, 0.92, 1.0])  # one figure 25% off
    assert not _judged([1.15, 0.85, 1.15, 0.85, 1.0])  # each within 20%, median 15%


def test_quantiles_interpolate_in_the_bucket_as_prometheus_does() -> None:
    before = bench.Histogram({0.1: 1, 0.25: 1, 0.5: 1, float("inf"): 1}, 0.05, 1)
    after = bench.Histogram({0.1: 3, 0.25: 7, 0.5: 11, float("inf"): 11}, 2.55, 11)
    load = after - before  # the load's own ten requests
    assert load.count == 10 and load.mean() == pytest.approx(0.25)
    assert load.quantile(0.5) == pytest.approx(0.1 + 0.15 * 3 / 4)
    assert load.quantile(0.95) == pytest.approx(0.25 + 0.25 * 3.5 / 4)
    assert bench.Histogram({float("inf"): 0}, 0, 0).quantile(0.5) is None
