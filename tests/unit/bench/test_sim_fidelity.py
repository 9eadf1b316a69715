"""The sim-fidelity benchmark: its CPU fit recovers a decode step from TPOT at the training loads
only, and its verdict needs every held-out ratio within 20% and their median within 10%."""

from __future__ import annotations

import pytest

from testkit.paths import load_script

bench = load_script("bench/sim_fidelity.py")


def _training_rows(t0: float, t1: float, a_pre: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for case in bench.TRAINING:
        users = case.load.chats
        rows.append({"backend": "engine", "case": case.name,
                     "tpot_mean": t0 + t1 * users, "ttft_mean": a_pre + t0 + t1 * users})
    # A held-out load must not move the fit.
    rows.append({"backend": "engine", "case": bench.HELD_OUT[0].name,
                 "tpot_mean": 9.0, "ttft_mean": 9.0})
    return rows


def test_the_fit_reads_the_decode_step_and_preprocessing_off_the_training_loads() -> None:
    fitted = bench.fit(_training_rows(t0=0.005, t1=0.0004, a_pre=0.05))
    assert fitted.t0 == pytest.approx(0.005)
    assert fitted.t1 == pytest.approx(0.0004)
    assert fitted.a_pre == pytest.approx(0.05 + 0.0004)  # one user's step is t0 + t1
    gpu = bench.LatencyModel()
    assert fitted.c_p / gpu.c_p == pytest.approx(fitted.t0 / gpu.t0)  # shares of a step kept


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
