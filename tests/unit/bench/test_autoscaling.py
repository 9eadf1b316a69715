"""The autoscaling benchmark's model, piece by piece: GPU-hours count every pod from creation
to deletion; always-on at maxReplicas holds the most; each front door does what its product
does at zero (our router and the KEDA HTTP add-on hold, plain KEDA refuses and its clients give
up); seconds jumped over and answers reused decide what running every second decides; the
table stops serving past its edge; the tuning rule and the ties; a quick run's JSON carries
every figure. Each check is one the model could fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testkit.paths import load_script

bench = load_script("bench/autoscaling.py")
fs = bench.fs

AT = 3000.0  # after the warm-up (900 s quick) every scale-to-zero policy is at zero


@pytest.fixture(scope="module")
def table() -> Any:
    return bench.build_table(1, quick=True)


def one_task(at: float, steps: int = 1, service: float = 2.0) -> list[Any]:
    return [bench.s2z.Task(at, (5.0,) * (steps - 1), (service,) * steps)]


def run(policy: Any, table: Any, source: Any, end: int, *, warmup: int = 900,
        skip: bool = True, memo: bool = True) -> tuple[Any, Any]:  # fmt: skip
    spec = bench.the_spec()
    fleet = fs.Fleet(source, table, policy.front_door(spec), fs.Client(2), gpus=2,
                     cold_start=bench.COLD_START, replicas=bench.MAX_REPLICAS, end=end,
                     warmup=warmup, slo=bench.slo_of(spec), seed=1, skip=skip)  # fmt: skip
    modes = bench.ModePass(spec, 4)
    controller = policy.controller(spec, modes, 7)
    modes.memo = memo
    if isinstance(controller, bench.Ours):
        controller.memo = memo
    return fleet.run([modes, controller]), controller


class Scaler:
    """Scales the fleet to given counts at given seconds."""

    def __init__(self, steps: dict[int, int]) -> None:
        self.steps = steps

    def tick(self, fleet: Any, t: int) -> None:
        if t in self.steps:
            fleet.scale_to(self.steps[t], t)

    def quiet_until(self, fleet: Any, t: int) -> int:
        return min((s - 1 for s in self.steps if s > t), default=2**62)


def test_gpu_hours_count_every_pod_from_creation_to_deletion(table: Any) -> None:
    source = fs.AgentSource([])
    fleet = fs.Fleet(source, table, fs.FrontDoor(fs.REFUSE), fs.Client(), gpus=2,
                     cold_start=75, replicas=1, end=3600, warmup=600, slo=(0.5, 0.1, 30.0),
                     seed=1)  # fmt: skip
    # -300: a second pod (warm-up: counts from 0); 600: four; 1800: one; 3000: none
    books = fleet.run([Scaler({-300: 2, 600: 4, 1800: 1, 3000: 0})])
    pod_seconds = 2 * 600 + 4 * 1200 + 1 * 1200
    assert books.gpu_seconds == pytest.approx(2 * pod_seconds)
    assert books.replica_seconds == pytest.approx(pod_seconds)
    assert books.scale_events == 3 and books.starts == 2  # the warm-up's start not counted


@pytest.mark.parametrize("trace", ["agent-week", "flash-crowd", "day-night"])
def test_always_on_at_max_replicas_holds_the_most_gpu_hours(table: Any, trace: str) -> None:
    span = bench.spans(True)[trace]
    runs = {p.name: bench.simulate((p, span, 1, False, True), table) for p in (
        bench.Policy(bench.ALWAYS), bench.Policy(bench.OURS), bench.Policy(bench.HPA, 4.0, 300),
        bench.Policy(bench.KEDA, 2.0, 300), bench.Policy(bench.HTTP_ADDON, 8.0, 300),
        bench.Policy(bench.KUBEAI, 8.0, 30))}  # fmt: skip
    always = runs.pop(bench.ALWAYS)
    hours = bench.MAX_REPLICAS * 2 * span.seconds / 3600
    assert always["gpu_hours"] == pytest.approx(hours)
    assert always["scale_events"] == 0
    for name, r in runs.items():
        assert r["gpu_hours"] < always["gpu_hours"], name


def test_the_add_on_holds_at_zero_and_starts_one_replica(table: Any) -> None:
    books, _ = run(bench.Policy(bench.HTTP_ADDON, 8.0, 300), table,
                   fs.AgentSource(one_task(AT, steps=3)), 4000)
    assert books.refused == 0 and books.zero_arrivals == 1
    (wait,) = books.zero_waits  # read within the second, then the cold start
    assert bench.COLD_START <= wait <= bench.COLD_START + 2
    assert books.starts == 1 and books.met[0] == 2  # the held step misses, the next two meet


def test_keda_refuses_at_zero_and_its_client_gives_up(table: Any) -> None:
    books, _ = run(bench.Policy(bench.KEDA, 2.0, 300), table,
                   fs.AgentSource(one_task(AT, steps=3)), 4000)
    # three attempts within about two seconds, each refused; the refusals wake it
    assert books.refused == 3 and books.failed[0] == 1 and not books.zero_waits
    assert books.starts == 1 and books.met[0] == 0


def test_ours_holds_at_zero_and_wakes_what_the_held_requests_need(table: Any) -> None:
    books, ours = run(bench.Policy(bench.OURS), table, fs.AgentSource(one_task(AT, steps=3)),
                      3500)
    assert books.refused == 0 and books.starts == 1
    (wait,) = books.zero_waits  # demand once held a second, then the cold start
    assert bench.COLD_START + 1 <= wait <= bench.COLD_START + 3
    assert ours.standby["state"] == "Serving"  # idleSeconds (900) have not passed since


def test_kubeai_proxy_holds_and_scales_from_zero(table: Any) -> None:
    books, _ = run(bench.Policy(bench.KUBEAI, 8.0, 30), table,
                   fs.AgentSource(one_task(AT, steps=2)), 4000)
    assert books.refused == 0 and books.starts == 1 and len(books.zero_waits) == 1


@pytest.mark.parametrize("name", bench.POLICIES)
def test_jumping_over_quiet_seconds_changes_nothing(table: Any, name: str) -> None:
    span = bench.spans(True)["agent-week"]
    policy = bench.Policy(name, 8.0, 300) if name not in (bench.OURS, bench.ALWAYS) else \
        bench.Policy(name)
    fast, _ = run(policy, table, bench.source_for(span, 2, 900), span.seconds)
    slow, _ = run(policy, table, bench.source_for(span, 2, 900), span.seconds, skip=False)
    assert fast.met[0] > 0
    for key in ("gpu_seconds", "met", "late", "refused", "failed", "zero_waits",
                "scale_events", "starts", "flips"):  # fmt: skip
        assert getattr(fast, key) == pytest.approx(getattr(slow, key)), key


@pytest.mark.parametrize("trace", ["agent-week", "day-night"])
def test_reusing_an_answer_decides_what_a_call_every_second_decides(table: Any,
                                                                    trace: str) -> None:
    span = bench.spans(True)[trace]
    fast, ours = run(bench.Policy(bench.OURS), table, bench.source_for(span, 3, 900),
                     span.seconds)
    slow, reference = run(bench.Policy(bench.OURS), table, bench.source_for(span, 3, 900),
                          span.seconds, skip=False, memo=False)
    assert ours.calls < reference.calls / 2
    for key in ("gpu_seconds", "met", "late", "refused", "zero_waits", "scale_events",
                "starts", "flips"):  # fmt: skip
        assert getattr(fast, key) == pytest.approx(getattr(slow, key)), key


def test_past_the_table_edge_a_replica_serves_the_edge_rate(table: Any) -> None:
    edge = table.batching_others[-1]
    at, twice = table.batching_load(edge), table.batching_load(2 * edge)
    assert 2 * twice.other[0] == pytest.approx(at.other[0])
    assert sum(twice.other) == pytest.approx(1.0)
    light = table.streaming_load(0.5, 0.0)
    assert light.chat[0] > 0.99 and light.chat[2] == 0.0


def run_of(policy: str, gpu: float, chat: float, other: float = 1.0,
           knobs: str = "") -> dict[str, Any]:  # fmt: skip
    return {"policy": policy, "gpu_hours": gpu, "knobs": knobs,
            "requests": {"chat": 100, "other": 100},
            "attainment": {"chat": chat, "other": other}}


def test_the_tuning_rule_takes_the_cheapest_within_the_band() -> None:
    always = run_of(bench.ALWAYS, 100.0, 0.999)
    rows = [run_of(bench.HPA, 50.0, 0.990, knobs="cheap, outside"),
            run_of(bench.HPA, 60.0, 0.995, knobs="within"),
            run_of(bench.HPA, 60.3, 0.998, knobs="within, a tie, better"),
            run_of(bench.HPA, 80.0, 0.999, knobs="dear")]  # fmt: skip
    chosen, ok = bench.pick(rows, always)
    assert ok and chosen["knobs"] == "within, a tie, better"
    chosen, ok = bench.pick([rows[0], run_of(bench.HPA, 40.0, 0.980)], always)
    assert not ok and chosen["knobs"] == "cheap, outside"


def test_a_tie_meets_the_gpu_bar_and_attainment_is_per_class() -> None:
    assert bench.compare(80.5, 80.0) == "tie" and bench.compare(82.0, 80.0) == "higher"
    always = run_of(bench.ALWAYS, 100.0, 0.999, 0.999)
    assert bench.reaches(run_of(bench.OURS, 1.0, 0.994, 0.999), always)
    assert not bench.reaches(run_of(bench.OURS, 1.0, 0.999, 0.993), always)


def test_a_quick_run_writes_every_figure(table: Any, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "OUT_DIR", tmp_path)
    monkeypatch.setattr(bench, "build_table", lambda workers, quick: table)
    code = bench.main(["--quick", "--jobs", "1", "--seeds", "1", "--out", "quick"])
    assert code in (0, 1)
    data = json.loads((tmp_path / "quick.json").read_text())
    runs = [r for r in data["runs"]]
    assert {(r["policy"], r["trace"]) for r in runs} == {
        (p, t) for p in bench.POLICIES for t in bench.TRACES}
    for r in runs:
        for key in ("gpu_hours", "attainment", "refused", "failed", "ttft_p95",
                    "zero_requests", "zero_wait_p95", "zero_wait_max", "scale_events",
                    "starts", "knobs"):  # fmt: skip
            assert key in r, key
        assert r["gpu_hours"] > 0 and 0 <= r["attainment"]["all"] <= 1
    verdicts = {(v["trace"], v["seed"]): v for v in data["targets"]}
    assert set(verdicts) == {(t, 1) for t in bench.TRACES}
    assert all(v["verdict"] in ("PASS", "FAIL", "TIE") for v in verdicts.values())
    assert code == (0 if all(v["met"] for v in verdicts.values()) else 1)
    assert (tmp_path / "quick.png").exists()
