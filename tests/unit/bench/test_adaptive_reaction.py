"""The reaction benchmark's books: fast checks of testkit.bench.reaction_timing."""

from __future__ import annotations

import threading

import pytest

from testkit.bench.reaction_timing import (
    BATCHING,
    STREAMING,
    Confirmation,
    Decision,
    FlipTiming,
    Settings,
    Step,
    flip_decisions,
    match_flips,
    spread,
    verdicts,
)

SETTINGS = Settings(interval=5, to_batching_window=5, to_streaming_window=10)


def test_decision_reads_the_status_record_to_the_millisecond() -> None:
    record = {"time": "2026-03-01T10:00:05.123Z", "fromBatching": 0, "toBatching": 1,
              "reason": "QpsAboveHigh", "applied": True}  # fmt: skip
    decision = Decision.from_status(record)
    assert decision.t == pytest.approx(1772359205.123, abs=1e-6)
    assert decision.to_mode == BATCHING
    assert Decision.from_status({**record, "toBatching": 0}).to_mode is None
    assert Decision.from_status({**record, "fromBatching": 2}).to_mode == STREAMING


def test_under_rolling_only_the_start_of_a_replacement_is_a_flip() -> None:
    start = Decision(10.0, 0, 1, applied=False)
    done = Decision(17.0, 0, 1, applied=True)
    hold = Decision(22.0, 1, 1, applied=True)
    assert flip_decisions([done, hold, start, start], rolling=True) == [start]
    assert flip_decisions([done, hold, start], rolling=False) == [start, done]


def test_each_step_gets_its_own_decision_and_the_runtime_switch_after_it() -> None:
    steps = [Step(100.0, BATCHING), Step(120.0, STREAMING)]
    decisions = [
        Decision(99.0, 1, 0, applied=True),  # before the first step: not caused by it
        Decision(109.5, 0, 1, applied=True),
        Decision(133.2, 1, 0, applied=True),
    ]
    confirmations = [
        Confirmation("a", 95.0, BATCHING, "switched"),  # before the decision
        Confirmation("b", 109.56, BATCHING, "switched"),
        Confirmation("b", 133.27, STREAMING, "switched"),
    ]
    timings, extra = match_flips(steps, decisions, confirmations)
    assert [t.pod for t in timings] == ["b", "b"]
    assert timings[0].step_to_decision == pytest.approx(9.5)
    assert timings[0].decision_to_confirmation == pytest.approx(0.06)
    assert timings[1].step_to_flip == pytest.approx(13.27)
    assert extra == [decisions[0]]


def test_a_flip_the_wrong_way_or_after_the_next_step_does_not_count() -> None:
    steps = [Step(0.0, BATCHING), Step(30.0, STREAMING)]
    decisions = [Decision(5.0, 1, 0, applied=True), Decision(31.0, 0, 1, applied=True)]
    confirmations = [Confirmation("a", 31.1, BATCHING, "switched")]
    timings, extra = match_flips(steps, decisions, confirmations)
    assert timings == [FlipTiming(BATCHING, 0.0), FlipTiming(STREAMING, 30.0)]
    assert extra == decisions


def test_a_confirmation_counts_for_one_flip_only() -> None:
    steps = [Step(0.0, BATCHING), Step(20.0, BATCHING)]
    decisions = [Decision(8.0, 0, 1, applied=True), Decision(28.0, 1, 2, applied=True)]
    confirmations = [Confirmation("a", 8.05, BATCHING, "switched")]
    timings, _ = match_flips(steps, decisions, confirmations)
    assert timings[0].confirmed == 8.05
    assert timings[1].decision == 28.0 and timings[1].confirmed is None


def test_spread_takes_nearest_rank_percentiles_of_what_was_measured() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    stats = spread([*values, None])
    # The 10th and the 19th smallest of 20 (a rule taking index floor(q * n) gave 11 and 20).
    assert stats == {"n": 20, "p50": 10.0, "p95": 19.0, "max": 20.0}
    assert spread([None]) == {"n": 0, "p50": None, "p95": None, "max": None}


def test_targets_follow_from_the_settings() -> None:
    assert SETTINGS.step_to_flip_target(BATCHING) == 15
    assert SETTINGS.step_to_flip_target(STREAMING) == 20


def _flip(to_mode: str, step: float, to_decision: float, to_confirmation: float) -> FlipTiming:
    return FlipTiming(to_mode, step, step + to_decision, step + to_decision + to_confirmation)


def test_verdicts_pass_only_when_every_target_holds() -> None:
    good = [_flip(BATCHING, 0, 9.0, 0.05), _flip(STREAMING, 20, 14.0, 0.08)]
    assert all(v["pass"] for v in verdicts(good, [], 2, 0, SETTINGS))

    def failed(timings: list[FlipTiming], extra: list[Decision], failures: int) -> list[str]:
        return [v["target"] for v in verdicts(timings, extra, 2, failures, SETTINGS)
                if not v["pass"]]  # fmt: skip

    slow_switch = [good[0], _flip(STREAMING, 20, 14.0, 1.2)]
    assert failed(slow_switch, [], 0) == ["decision to runtime confirmation p95 < 1 s"]
    slow_return = [good[0], _flip(STREAMING, 20, 20.5, 0.08)]
    (only,) = failed(slow_return, [], 0)
    assert only.startswith("step to flip applied, to streaming, p95 < 20 s")
    missing = [good[0], FlipTiming(STREAMING, 20, 34.0)]
    assert failed(missing, [], 0)[0].startswith("all 2 flips")
    assert failed(good, [Decision(50.0, 1, 0, applied=True)], 0)[0].startswith("all 2 flips")
    assert failed(good, [], 3) == ["no request failed across the InPlace flips"]


def test_a_poller_polls_until_left_and_goes_on_after_a_failed_poll() -> None:
    from testkit.stack import Poller

    class Counting(Poller):
        def __init__(self) -> None:
            self.polls = 0
            self.third = threading.Event()
            super().__init__("counting", 0.01)

        def poll(self) -> None:
            self.polls += 1
            if self.polls == 3:
                self.third.set()
            if self.polls == 1:
                raise RuntimeError("the apiserver is restarting")

    with Counting() as poller:
        poller.third.wait(5)
    left_at = poller.polls
    # Its thread is gone once the context is left: no poll can come after.
    assert "counting" not in {thread.name for thread in threading.enumerate()}
    assert left_at >= 3
    assert poller.polls == left_at
