"""`autoglm-operator replay` on the shipped example trace, and on bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoglm_operator import replay
from autoglm_operator.resource.spec import AdaptiveSettings

REPO = Path(__file__).resolve().parents[3]
DIURNAL = REPO / "examples" / "traces" / "diurnal.csv"


def run(*argv: str) -> tuple[int, str]:
    parser = replay.argparse.ArgumentParser()
    replay.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["replay", *argv])
    out = io.StringIO()
    return replay.run(args, out), out.getvalue()


def test_the_diurnal_example_replays_into_a_readable_table() -> None:
    code, out = run("--trace", str(DIURNAL), "--replicas", "4")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "4 replicas, policy Adaptive, interval 15s, minStreamingReplicas 1"
    assert lines[1].split() == [
        "time",
        "qps",
        "qps/rep",
        "gpu%",
        "queue",
        "ttft95",
        "strm/btch",
        "reason",
        "flips",
    ]
    flips = [line for line in lines if "->" in line]
    assert any("QpsAboveHigh" in line and "->batching" in line for line in flips)
    assert any("LoadBelowLow" in line and "->streaming" in line for line in flips)
    assert any("MetricsUnavailable" in line for line in lines), "the 14:00 outage holds"
    assert "cooldown violations 0" in out
    assert not any(" 0/4 " in line for line in lines), "one replica always streams"


def test_json_output_and_the_summary_agree(tmp_path: Path) -> None:
    code, out = run("--trace", str(DIURNAL), "--replicas", "4", "--json")
    assert code == 0
    document = json.loads(out)
    steps = document["steps"]
    assert len(steps) == 24 * 60 * 4 - 3, "one pass per 15 s over the day's rows"
    flips = sum(len(s["flips"]) for s in steps)
    assert flips == document["summary"]["flips"] > 0
    assert max(s["batching"] for s in steps) == 3


def test_a_config_manifest_sets_thresholds_and_replicas(tmp_path: Path) -> None:
    manifest = tmp_path / "agd.yaml"
    manifest.write_text(
        "apiVersion: autoglm.io/v1alpha1\nkind: AutoGLMDeployment\nmetadata: {name: x}\n"
        "spec:\n  replicas: 6\n  adaptive:\n    prometheus: {url: 'http://p:9090'}\n"
        "    minStreamingReplicas: 2\n    qpsPerReplicaMilli: {high: 2000, low: 1000}\n"
    )
    code, out = run("--trace", str(DIURNAL), "--config", str(manifest))
    assert code == 0
    assert out.startswith("6 replicas, policy Adaptive, interval 15s, minStreamingReplicas 2")
    assert not any(" 1/5 " in line or " 0/6 " in line for line in out.splitlines())
    assert " 2/4 " in out, "lower thresholds move four of six to batching"


def test_pinned_policy_override() -> None:
    code, out = run("--trace", str(DIURNAL), "--policy", "Streaming")
    assert code == 0 and "flips 0" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("time,qps\n1,2\n", "no 'timestamp' column"),
        ("timestamp,foo\n1,2\n", "no metric column"),
        ("timestamp,qps\nyesterday,2\n", "trace.csv:2: timestamp 'yesterday'"),
        ("timestamp,qps\n1,lots\n", "trace.csv:2"),
        ("timestamp,qps\n", "no data rows"),
    ],
)
def test_bad_traces_get_a_clear_error(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(content)
    code, out = run("--trace", str(trace))
    assert code == 2 and out == ""
    assert message in capsys.readouterr().err


def test_prometheus_mode_needs_namespace_and_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("--prometheus", "http://127.0.0.1:9")
    assert code == 2 and "--namespace and --name" in capsys.readouterr().err


def test_resample_holds_the_latest_row() -> None:
    rows = replay.read_trace(io.StringIO("timestamp,qps,queue\n0,1,0\n60,5,\n"))
    ticks = list(replay.resample(rows, 15))
    assert [t for t, _ in ticks] == [0, 15, 30, 45, 60]
    assert [s.qps for _, s in ticks] == [1, 1, 1, 1, 5]
    assert ticks[-1][1].queue_depth is None
    summary = replay.summarize(replay.simulate(ticks, 2, AdaptiveSettings()), AdaptiveSettings())
    assert summary.passes == 5


def test_the_operator_cli_carries_the_replay_subcommand() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "autoglm_operator.cli", "replay", "--trace", str(DIURNAL)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "cooldown violations 0" in result.stdout


# -- spec.autoscaling: the fleet's size over the trace ---------------------------------------

AUTOSCALING = (
    "spec:\n  adaptive:\n    prometheus: {url: 'http://p:9090'}\n"
    "  autoscaling:\n    enabled: true\n    minReplicas: 1\n    maxReplicas: 6\n"
)


def _demand_trace(tmp_path: Path) -> Path:
    """Two hours by the minute: quiet, a peak no 6 replicas serve, a metrics outage, quiet."""
    rows = ["timestamp,qps,chat_rate,other_rate"]
    for minute in range(121):
        chat, other = (12.0, 60.0) if 30 <= minute < 60 else (0.5, 0.3)
        if 60 <= minute < 70:
            rows.append(f"{minute * 60},,,")
            continue
        rows.append(f"{minute * 60},{chat + other},{chat},{other}")
    trace = tmp_path / "demand.csv"
    trace.write_text("\n".join(rows) + "\n")
    return trace


def test_autoscaling_replays_the_fleet_size_size_fleet_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "agd.yaml"
    config.write_text(AUTOSCALING)
    calls: list[float] = []
    shipped = replay.scaling.size_fleet

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        return shipped(*args, **kwargs)

    monkeypatch.setattr(replay.scaling, "size_fleet", counted)
    code, out = run("--trace", str(_demand_trace(tmp_path)), "--config", str(config), "--json")
    assert code == 0
    steps = json.loads(out)["steps"]
    assert calls == [s["time"] for s in steps], "size_fleet once per replayed step, in order"
    fleet = [s["fleet"] for s in steps]
    # The policy decides over the replicas the sizing chose.
    assert all(s["streaming"] + s["batching"] == f["desiredReplicas"]
               for s, f in zip(steps, fleet, strict=True))  # fmt: skip
    by_minute = {int(s["time"]) // 60: f for s, f in zip(steps, fleet, strict=True)}
    assert by_minute[10]["desiredReplicas"] == 1 and by_minute[10]["reason"] == "FleetFitsDemand"
    # The peak: up by scaleUp.maxStep (4) at once, then to maxReplicas, and short there.
    assert [f["desiredReplicas"] for f in fleet if f["reason"] == "ScaledUp"] == [5, 6]
    assert by_minute[45]["desiredReplicas"] == 6 and by_minute[45]["reason"] == "AtMaxReplicas"
    assert by_minute[45]["expectedGoodput"] < by_minute[45]["demand"] == pytest.approx(72)
    # The outage: unknown demand holds the count (the trace says nothing of requests).
    assert by_minute[65]["reason"] == "DemandUnknown" and by_minute[65]["desiredReplicas"] == 6
    # Quiet again: down only after scaleDown.stabilizationSeconds, one replica a step.
    assert by_minute[74]["desiredReplicas"] == 6
    downs = [f["desiredReplicas"] for f in fleet if f["reason"] == "ScaledDown"]
    assert downs == [5, 4, 3, 2, 1]
    assert by_minute[120]["desiredReplicas"] == 1
    # The sizing never goes past its bounds, never below minStreamingReplicas streaming.
    assert all(1 <= f["desiredReplicas"] <= 6 for f in fleet)
    assert min(s["streaming"] for s in steps) >= 1


def test_autoscaling_table_and_summary_show_the_replicas(tmp_path: Path) -> None:
    config = tmp_path / "agd.yaml"
    config.write_text(AUTOSCALING)
    code, out = run("--trace", str(_demand_trace(tmp_path)), "--config", str(config))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("autoscaling 1-6 replicas (headroom 20%), starting at 1, policy")
    header = lines[1].split()
    assert header[6:9] == ["demand", "need", "replicas"] and "fleet" in header
    row = next(line.split() for line in lines if "AtMaxReplicas" in line)
    assert row[6:9] == ["72.00", "6", "6"]
    assert "fleet: scale-ups 2, scale-downs 5; time by replicas: 1 replicas" in out
    assert "6 replicas" in lines[-1]


def test_without_autoscaling_the_fleet_is_not_sized(tmp_path: Path) -> None:
    config = tmp_path / "agd.yaml"
    config.write_text(AUTOSCALING.replace("enabled: true", "enabled: false"))
    code, out = run("--trace", str(_demand_trace(tmp_path)), "--config", str(config), "--json")
    assert code == 0
    document = json.loads(out)
    assert not any("fleet" in s for s in document["steps"])
    assert {s["streaming"] + s["batching"] for s in document["steps"]} == {1}
    assert document["summary"]["fleet_reasons"] == {}
