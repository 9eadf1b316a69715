"""The scale-to-zero benchmark's model, piece by piece: the operator's planner, called only when
its answer can change, decides what a call every second decides; ours wakes one replica and
nothing for a poller or a client that leaves; the KEDA HTTP add-on holds at zero and starts one
replica for any request its scaler reads; plain KEDA refuses at zero; the tuning rule and the
ties. Each check is one the model could fail."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.paths import load_script

bench = load_script("bench/scale_to_zero.py")

from autoglm_operator.reconcile.standby import PodState  # noqa: E402


class EveryTick(bench.Operator):
    """The operator as it runs: the report read and the planner called every second."""

    def tick(self, dep: Any, n: int, horizon: int) -> int:
        now = dep.time(n)
        pods = [PodState(p.name, p.ready(now), p.asleep) for p in dep.pods]
        self.activity = dep.report_at(now)
        plan = self.plan(dep, n, pods)
        self.status = dict(plan.status) if plan.status is not None else None
        self.apply(dep, plan, now)
        return int(n + 1)


def run(policy: Any, tasks: Any, end: float, operator: type | None = None,
        timing: Any = bench.CALIBRATED, traffic: Any = bench.AGENTS,
        setup: Any = None) -> Any:  # fmt: skip
    dep = bench.Deployment(policy, traffic, tasks, timing, end, seed=1)
    controller = operator(dep.spec) if operator else bench.controller_for(policy, dep)
    if setup is not None:
        setup(controller)
    return dep.run(controller, phase=0.37)


def one_task(at: float, steps: int = 1, service: float = 2.0) -> tuple[Any, ...]:
    return (bench.Task(at, (5.0,) * (steps - 1), (service,) * steps),)


S2Z = bench.Policy(bench.S2Z, bench.MINE, 300)
SLEEP = bench.Policy(bench.S2Z_SLEEP, bench.MINE, 600, sleep=60)
WARM = bench.Policy(bench.WARM, bench.MINE, 300, floor=1, sleep=60)
ADDON = bench.Policy(bench.HTTP_ADDON, bench.HTTP, 300)
KEDA = bench.Policy(bench.KEDA, bench.PLAIN, 300, polling=15.0)
AT = 2000.0  # every policy is at zero (or its floor) by then: the night is empty


@pytest.mark.parametrize("policy", [S2Z, SLEEP, WARM], ids=lambda p: p.name)
def test_skipping_ticks_decides_what_a_call_every_second_decides(policy: Any) -> None:
    tasks = bench.week(3, 1)
    end = 11 * 3600.0  # the night, the first cold start and the morning
    fast, slow = run(policy, tasks, end), run(policy, tasks, end, EveryTick)
    assert fast.planner_calls < slow.planner_calls / 5
    assert fast.first_arrivals > 0 and (fast.pods_started > 0 or policy.floor)
    for key in ("gpu_hours", "awake_gpu_hours", "pods_started", "wakes", "refused", "failed",
                "requests", "waits", "zero_waits", "asleep_waits"):  # fmt: skip
        assert getattr(fast, key) == pytest.approx(getattr(slow, key)), key


def test_ours_holds_a_request_at_zero_and_wakes_one_replica() -> None:
    result = run(S2Z, one_task(AT, steps=3), 3000.0)
    assert result.refused == 0 and result.pods_started == 1
    (held,) = result.zero_waits
    # Demand once held a second, read at the next tick, then the cold start.
    cold = bench.COLD_START_SECONDS
    assert cold + bench.WAKE_AFTER_SECONDS <= held <= cold + bench.WAKE_AFTER_SECONDS + 1.0
    assert result.waits[1:] == [0.0, 0.0]  # the task's later steps find it serving


def test_ours_grows_to_every_replica_when_the_woken_one_is_full() -> None:
    burst = tuple(bench.Task(AT + i * 0.01, (0.5,) * 5, (60.0,) * 6) for i in range(12))
    result = run(S2Z, burst, 3000.0)
    assert result.pods_started == 2  # one wakes; 12 in flight fill its cap of 8, the other starts
    alone = run(S2Z, burst[:4], 3000.0)
    assert alone.pods_started == 1


def test_a_cold_start_past_the_hold_bound_serves_the_client_that_comes_back() -> None:
    slow = bench.Timing("slow", cold_start=240.0)
    result = run(S2Z, one_task(AT, steps=3), 4000.0, timing=slow)
    # Held 180 s, 503 with Retry-After 10: the wake goes on, the client's retry is held
    # again and served by the one replica that started.
    assert (result.failed, result.refused) == (0, 1)
    assert result.pods_started == 1


def test_a_poller_and_a_client_that_leaves_wake_nothing_under_ours() -> None:
    quiet = run(S2Z, (), 6 * 3600.0)
    polled = run(S2Z, (), 6 * 3600.0, traffic=bench.POLLER)
    left = run(S2Z, (), 6 * 3600.0, traffic=bench.LEAVING)
    assert polled.polls > 4000 and left.leavers > 0
    for result in (polled, left):
        assert result.pods_started == 0
        assert result.gpu_hours == pytest.approx(quiet.gpu_hours)


def test_the_add_on_holds_at_zero_and_starts_one_replica() -> None:
    result = run(ADDON, one_task(AT, steps=2), 3000.0)
    assert result.pods_started == 1 and result.refused == 0
    (held,) = result.zero_waits
    cold = bench.COLD_START_SECONDS
    assert cold <= held <= cold + bench.HTTP_QUEUE_TICK_SECONDS
    # Its scaledownPeriod counts from the last queue read that saw a request.
    timed = bench.Policy(bench.HTTP_ADDON, bench.HTTP, 20, readiness=20.0)
    cut = run(timed, one_task(AT), 3000.0)
    assert (cut.failed, cut.refused) == (1, 3)  # 3 attempts of 20 s and backoff < 75 s


def test_the_add_on_wakes_for_a_poller_and_for_a_client_its_scaler_reads() -> None:
    polled = run(ADDON, (), 6 * 3600.0, traffic=bench.POLLER)
    assert polled.pods_started > 10  # at zero every held GET /v1/models starts a replica

    def read_inside(controller: Any) -> None:  # a queue read falls while it waits
        controller.tick_phase = (first + 0.1) % bench.HTTP_QUEUE_TICK_SECONDS

    def read_outside(controller: Any) -> None:  # no read does
        controller.tick_phase = (first + 0.4) % bench.HTTP_QUEUE_TICK_SECONDS

    first = bench.leavers(1, 1, bench.LEAVERS_PER_HOUR)[0]
    traffic = bench.Traffic("one", leavers_per_hour=bench.LEAVERS_PER_HOUR)
    end = first + 200.0
    assert run(ADDON, (), end, traffic=traffic, setup=read_inside).pods_started == 1
    assert run(ADDON, (), end, traffic=traffic, setup=read_outside).pods_started == 0


def test_keda_refuses_at_zero_and_its_refusal_wakes_one_replica() -> None:
    refused = run(KEDA, one_task(AT, steps=3), 3000.0)
    assert (refused.refused, refused.failed, refused.requests) == (3, 1, 1)  # 2 retries
    assert refused.pods_started == 1
    patient = bench.Policy(bench.KEDA_RETRY, bench.PLAIN, 300, polling=15.0, retries=20)
    served = run(patient, one_task(AT), 3000.0)
    assert served.failed == 0 and served.refused > 3
    assert served.zero_waits[0] > bench.COLD_START_SECONDS
    left = run(KEDA, (), 6 * 3600.0, traffic=bench.LEAVING)
    assert left.pods_started > 0  # the router counted the chat it refused
    assert run(KEDA, (), 6 * 3600.0, traffic=bench.POLLER).pods_started == 0


def test_a_sleeping_floor_replica_wakes_for_the_first_request() -> None:
    result = run(WARM, one_task(AT, steps=2), 3000.0)
    assert result.asleep_waits == [pytest.approx(bench.WAKE_SECONDS)]
    assert result.zero_waits == [] and result.refused == 0
    assert result.pods_started == 0  # the floor replica serves; nothing fills it
    assert result.awake_gpu_hours < result.gpu_hours


def test_the_week_is_busy_by_day_and_sparse_at_night() -> None:
    week = bench.week(5)
    assert week == bench.week(5) and week != bench.week(6)
    hour = [int(t.start % bench.DAY // 3600) for t in week if t.start < 5 * bench.DAY]
    night = sum(1 for h in hour if h < 6)
    day = sum(1 for h in hour if 9 <= h < 17)
    assert day > 20 * max(1, night)
    assert all(len(t.services) == len(t.gaps) + 1 for t in week)


def _summary(gpu: float, long: float, any_: float = 0.0, awake: float | None = None,
             failed: float = 0.0) -> dict[str, Any]:  # fmt: skip
    return {"gpu_hours": gpu, "awake_gpu_hours": gpu if awake is None else awake,
            "long_wait_share": long, "any_wait_share": any_, "failed": failed}  # fmt: skip


def test_the_tuning_rule_takes_the_cheapest_window_that_meets_the_slo() -> None:
    rows = [(bench.Policy(bench.S2Z, bench.MINE, idle), _summary(gpu, long))
            for idle, gpu, long in ((300, 300.0, 0.02), (600, 350.0, 0.009),
                                    (900, 352.0, 0.006), (1800, 400.0, 0.002))]  # fmt: skip
    choice, _, met = bench.pick(rows)
    assert met and choice.idle == 900  # 600 and 900 tie within 1%: the longer window
    failing = [(p, {**s, "failed": 1.0 if p.idle < 1800 else 0.0}) for p, s in rows]
    assert bench.pick(failing)[0].idle == 1800  # a failed request disqualifies
    none_meet = [(p, {**s, "long_wait_share": 0.5, "failed": 3.0 - i})
                 for i, (p, s) in enumerate(rows)]  # fmt: skip
    choice, _, met = bench.pick(none_meet)
    assert met is False and choice.idle == 1800  # then the fewest failed


def test_ties_are_within_the_tolerance() -> None:
    assert bench.compare(100.0, 100.9, bench.TIE_GPU, True) == "tie"
    assert bench.compare(100.0, 102.0, bench.TIE_GPU, True) == "lower"
    assert bench.compare(75.05, 75.0, bench.TIE_WAIT, False) == "tie"
    assert bench.compare(0.0, 3.0, 0.0, False) == "lower"
