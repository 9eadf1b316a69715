"""The scale-to-zero benchmark's simulation: the operator's planner, called only when its answer
can change, decides what a call every second decides; the router holds at zero, KEDA refuses,
a sleeping replica wakes in one wake; the tuning rule and the ties."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.paths import load_script

bench = load_script("bench/scale_to_zero.py")

from autoglm_operator.reconcile.standby import PodState  # noqa: E402


class EveryTick(bench.Operator):
    """The operator as it runs: the planner called every second, whatever changed."""

    def tick(self, dep: Any, n: int, horizon: int) -> int:
        now = dep.time(n)
        pods = [PodState(p.name, p.ready(now), p.asleep) for p in dep.pods]
        plan = self.plan(dep, n, pods)
        self.status = dict(plan.status) if plan.status is not None else None
        self.apply(dep, plan, now)
        return int(n + 1)


def run(policy: Any, tasks: Any, end: float, operator: type = bench.Operator,
        timing: Any = bench.CALIBRATED) -> Any:  # fmt: skip
    dep = bench.Deployment(policy, tasks, timing, end, seed=1)
    controller = (operator(dep.spec) if policy.kind == "ours"
                  else bench.Keda(policy.idle, timing.keda_poll))  # fmt: skip
    return dep.run(controller, phase=0.37)


def one_task(at: float, steps: int = 1) -> tuple[Any, ...]:
    return (bench.Task(at, (5.0,) * (steps - 1)),)


S2Z = bench.Policy(bench.S2Z, "ours", 300)
SLEEP = bench.Policy(bench.S2Z_SLEEP, "ours", 600, sleep=60)
WARM = bench.Policy(bench.WARM, "ours", 300, floor=1, sleep=60)
KEDA = bench.Policy(bench.KEDA, "keda", 300)


@pytest.mark.parametrize("policy", [S2Z, SLEEP, WARM], ids=lambda p: p.name)
def test_skipping_ticks_decides_what_a_call_every_second_decides(policy: Any) -> None:
    tasks = bench.week(3, 1)
    end = 11 * 3600.0  # the night, the first cold start and the morning
    fast, slow = run(policy, tasks, end), run(policy, tasks, end, EveryTick)
    assert fast.planner_calls < slow.planner_calls / 5
    assert fast.pods_started > 0 and fast.first_arrivals > 0
    for key in ("gpu_hours", "awake_gpu_hours", "pods_started", "wakes", "refused",
                "requests", "waits", "zero_waits", "asleep_waits"):  # fmt: skip
        assert getattr(fast, key) == pytest.approx(getattr(slow, key)), key


def test_a_request_at_zero_is_held_through_the_cold_start() -> None:
    result = run(S2Z, one_task(2000.0, steps=3), 3000.0)
    assert result.refused == 0 and result.pods_started == 2
    held = result.zero_waits
    assert len(held) == 1
    assert bench.COLD_START_SECONDS <= held[0] <= bench.COLD_START_SECONDS + 1.0  # a tick
    assert result.waits[1:] == [0.0, 0.0]  # the task's later steps find it serving
    assert result.gpu_hours < 2 * 2 * 3000 / 3600


def test_past_the_hold_bound_the_request_is_refused_and_the_task_fails() -> None:
    slow = bench.Timing("slow", cold_start=240.0)
    result = run(S2Z, one_task(2000.0, steps=3), 3000.0, timing=slow)
    assert (result.refused, result.tasks_failed, result.requests) == (1, 1, 1)


def test_keda_refuses_at_zero_and_a_retrying_client_gets_through() -> None:
    refused = run(KEDA, one_task(2000.0, steps=3), 3000.0)
    assert (refused.refused, refused.tasks_failed, refused.requests) == (1, 1, 1)
    assert refused.pods_started == 2  # the refusal is the activity that scales it up
    retry = bench.Policy(bench.KEDA_RETRY, "keda", 300, retry=10.0)
    served = run(retry, one_task(2000.0), 3000.0)
    assert served.tasks_failed == 0 and served.refused == 8  # every 10 s through 75 s
    assert bench.COLD_START_SECONDS < served.zero_waits[0] <= bench.COLD_START_SECONDS + 11


def test_a_sleeping_floor_replica_wakes_for_the_first_request() -> None:
    result = run(WARM, one_task(2000.0, steps=2), 3000.0)
    assert result.asleep_waits == [pytest.approx(bench.WAKE_SECONDS)]
    assert result.zero_waits == [] and result.refused == 0
    assert result.pods_started == 1  # the second replica starts behind it
    assert result.awake_gpu_hours < result.gpu_hours


def test_the_week_is_busy_by_day_and_sparse_at_night() -> None:
    week = bench.week(5)
    assert week == bench.week(5) and week != bench.week(6)
    hour = [int(t.start % bench.DAY // 3600) for t in week if t.start < 5 * bench.DAY]
    night = sum(1 for h in hour if h < 6)
    day = sum(1 for h in hour if 9 <= h < 17)
    assert day > 20 * max(1, night)


def _summary(gpu: float, long: float, any_: float = 0.0, awake: float | None = None
             ) -> dict[str, Any]:  # fmt: skip
    return {"gpu_hours": gpu, "awake_gpu_hours": gpu if awake is None else awake,
            "long_wait_share": long, "any_wait_share": any_, "refused": 0}  # fmt: skip


def test_the_tuning_rule_takes_the_cheapest_window_that_meets_the_slo() -> None:
    rows = [(bench.Policy(bench.S2Z, "ours", idle), _summary(gpu, long))
            for idle, gpu, long in ((300, 300.0, 0.02), (600, 350.0, 0.009),
                                    (900, 352.0, 0.006), (1800, 400.0, 0.002))]  # fmt: skip
    choice, _, met = bench.pick(rows)
    assert met and choice.idle == 900  # 600 and 900 tie within 1%: the longer window
    none_meet = [(p, {**s, "long_wait_share": 0.5}) for p, s in rows]
    assert bench.pick(none_meet)[2] is False


def test_ties_are_within_the_tolerance() -> None:
    assert bench.compare(100.0, 100.9, bench.TIE_GPU, True) == "tie"
    assert bench.compare(100.0, 102.0, bench.TIE_GPU, True) == "lower"
    assert bench.compare(75.05, 75.0, bench.TIE_WAIT, False) == "tie"
    assert bench.compare(0.0, 3.0, 0.0, False) == "lower"
