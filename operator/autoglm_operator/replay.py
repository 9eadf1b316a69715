"""`autoglm-operator replay`: run the adaptive policy over past load and print what it would do.

    autoglm-operator replay --trace examples/traces/diurnal.csv [--config agd.yaml] [--replicas 4]
    autoglm-operator replay --prometheus http://prometheus:9090 --namespace prod --name phone-9b \\
        --start -6h --end now --step 30s

The trace is a CSV with a header: `timestamp` (RFC 3339, or seconds) and any of `qps` (the
deployment's total requests per second), `vram_percent` (or `gpu_memory_percent`), `queue`
(total waiting requests), `ttft_p95` (seconds), `kv_cache_percent`, `replicas_reporting`, and
for sizing by demand `chat_rate` and `other_rate` (requests/s arriving per traffic class) with,
optionally, `streaming_completions`/`batching_completions` (requests/s each mode completed) and
`streaming_busy`/`batching_busy` (requests in flight and queued per mode) for learning capacity,
and `streaming_own_share`/`batching_own_share` (the share of what each mode's replicas received
that was their own class: a mode below 0.9 learns nothing). Without the shares (every trace
written before them) each mode learns as if it had served only its own class.
A trace without both rates (every trace written before them) is decided by the threshold rules.
An empty cell or `NaN` is missing data, which the policy treats as it does live: it holds.

The policy is the one the operator runs (autoglm_operator.adaptive.policy.decide), stepped every
`adaptive.intervalSeconds` of trace time with the latest trace row at or before each step, and
flips applied at once, so the table shows the decisions the live loop would have made.

With `spec.autoscaling.enabled` in the --config spec, each step first sizes the fleet as the
operator does (autoglm_operator.adaptive.scaling.size_fleet, the shipped function) from the
step's `chat_rate` and `other_rate` (the demand), `streaming_busy` + `batching_busy` (the
requests held and relayed, when the trace has them) and the capacity the policy has learned so
far, and the policy then decides over that many replicas: the table gains the columns `demand`
(requests/s), `need` (neededReplicas), `replicas` (desiredReplicas) and `fleet` (the sizing's
reason, as status.autoscaling.reason), and the summary the replicas over time and the steps up
and down. --replicas (default spec.replicas) is the fleet at the trace's start. Replicas added
start at once in the initial mode; a step down removes the replica the operator would mark
(scaling.victims). The sizing runs once per step here (every second live), so its windows
(scaleUp/scaleDown.stabilizationSeconds, periodSeconds) count in steps of the interval. Not
replayed: the idle floor of scale to zero (minReplicas 0 shows as 1 replica) and an HPA
conflict. A trace without both rates has no demand: the count holds (DemandUnknown), as live,
unless the trace shows no request (qps 0) for scaleDown.stabilizationSeconds; a row with
neither qps nor rates says nothing of requests, and holds.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import yaml

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive import policy as pol
from autoglm_operator.adaptive import scaling
from autoglm_operator.adaptive.capacity import Capacity
from autoglm_operator.adaptive.demand import demand_of
from autoglm_operator.resource.spec import AdaptiveSettings, AutoGLMDeploymentSpec, ModePolicy

DEFAULT_REPLICAS = 4
_COLUMNS = {
    "qps": "qps",
    "vram_percent": "gpu_memory_percent",
    "gpu_memory_percent": "gpu_memory_percent",
    "queue": "queue_depth",
    "queue_depth": "queue_depth",
    "ttft_p95": "ttft_p95_seconds",
    "ttft_p95_seconds": "ttft_p95_seconds",
    "kv_cache_percent": "kv_cache_percent",
    "chat_rate": "chat_rate",
    "other_rate": "other_rate",
    "streaming_completions": "streaming_completions",
    "batching_completions": "batching_completions",
    "streaming_busy": "streaming_busy",
    "batching_busy": "batching_busy",
    "streaming_own_share": "streaming_own_share",
    "batching_own_share": "batching_own_share",
}


class TraceError(ValueError):
    """The trace or config cannot be read; the message says where and why."""


@dataclass(frozen=True)
class FleetStep:
    """What the fleet sizing (spec.autoscaling) chose at one step."""

    desired: int
    needed: int
    reason: str
    message: str
    demand: float | None  # requests/s, both classes; None: unknown
    goodput: float | None  # requests/s the desired fleet serves within the SLOs


@dataclass(frozen=True)
class Step:
    time: float
    samples: pol.Samples
    decision: pol.PolicyDecision
    streaming: int
    batching: int
    fleet: FleetStep | None = None  # with spec.autoscaling on


# -- input -----------------------------------------------------------------------------------


def _parse_time(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as error:
        raise TraceError(f"timestamp {text!r} is neither seconds nor RFC 3339") from error
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _parse_value(text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def read_trace(source: TextIO, name: str = "trace") -> list[tuple[float, pol.Samples]]:
    reader = csv.DictReader(source)
    fields = [f.strip() for f in reader.fieldnames or []]
    if "timestamp" not in fields:
        raise TraceError(f"{name}: the header has no 'timestamp' column (found {fields})")
    if not any(f in _COLUMNS for f in fields):
        raise TraceError(f"{name}: no metric column; expected some of {sorted(_COLUMNS)}")
    rows: list[tuple[float, pol.Samples]] = []
    for line, raw in enumerate(reader, start=2):
        row = {(k or "").strip(): v for k, v in raw.items()}
        try:
            values: dict[str, Any] = {}
            for column, target in _COLUMNS.items():
                if column in row:
                    values[target] = _parse_value(row[column])
            reporting = _parse_value(row.get("replicas_reporting"))
            if reporting is not None:
                values["reporting_replicas"] = int(reporting)
            rows.append((_parse_time(row["timestamp"] or ""), pol.Samples(**values)))
        except (TraceError, ValueError) as error:
            raise TraceError(f"{name}:{line}: {error}") from error
    if not rows:
        raise TraceError(f"{name}: no data rows")
    rows.sort(key=lambda r: r[0])
    return rows


def load_spec(path: Path) -> AutoGLMDeploymentSpec:
    """A whole AutoGLMDeployment manifest, or just its spec."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise TraceError(f"{path}: {error}") from error
    if not isinstance(document, dict):
        raise TraceError(f"{path}: expected a YAML mapping")
    if "spec" in document:
        document = document["spec"]
    try:
        return AutoGLMDeploymentSpec.model_validate(document)
    except ValueError as error:
        raise TraceError(f"{path}: {error}") from error


def resample(
    rows: Sequence[tuple[float, pol.Samples]], interval: float
) -> Iterator[tuple[float, pol.Samples]]:
    """One sample per loop interval: the latest row at or before each tick."""
    if interval <= 0:
        raise TraceError("interval must be positive")
    index = 0
    t = rows[0][0]
    end = rows[-1][0]
    while t <= end + 1e-9:
        while index + 1 < len(rows) and rows[index + 1][0] <= t + 1e-9:
            index += 1
        yield t, rows[index][1]
        t += interval


# -- the simulation --------------------------------------------------------------------------


class FleetSizer:
    """spec.autoscaling over a trace: size_fleet once per step, with the memory it keeps in
    status.autoscaling live (windows, the last steps) kept here between steps."""

    def __init__(self, spec: AutoGLMDeploymentSpec) -> None:
        self.spec = spec
        self.memory = scaling.FleetMemory()
        self.last_request: float | None = None  # trace time a request was last seen

    def size(
        self, t: float, samples: pol.Samples, running: int, loop: pol.HysteresisState
    ) -> tuple[scaling.FleetDecision, scaling.FleetInput]:
        adaptive = self.spec.adaptive
        demand = demand_of(samples)
        busy_values = [v for v in (samples.streaming_busy, samples.batching_busy)
                       if v is not None and math.isfinite(v)]  # fmt: skip
        busy = max(0, round(sum(busy_values)))
        qps = samples.qps if samples.qps is not None and math.isfinite(samples.qps) else None
        if busy > 0 or (qps or 0) > 0 or (demand is not None and demand.total > 0):
            self.last_request = t
        # Live, the routers say when they last saw a request; here the trace does, and a row
        # without qps, rates or busy counts says nothing (quiet unknown: the count holds).
        known = qps is not None or demand is not None or bool(busy_values)
        quiet = busy == 0 and known and self.last_request is not None
        quiet_for = t - self.last_request if quiet and self.last_request is not None else None
        flips = [when for when, _ in loop.last_flips.values()]
        inp = scaling.FleetInput(
            demand=demand,
            busy=busy,
            quiet_for=quiet_for,
            running=running,
            capacity=loop.capacity or Capacity.seeded(adaptive),
            caps=self.spec.admission_caps(streamed_chat=False),
            slo=adaptive.slo,
            min_streaming=adaptive.min_streaming_replicas,
            last_flip=max(flips, default=None),
            cooldown_seconds=adaptive.cooldown_seconds,
        )
        decision = scaling.size_fleet(inp, self.spec.autoscaling, self.memory, t)
        self.memory = decision.memory
        return decision, inp


def simulate(
    rows: Iterable[tuple[float, pol.Samples]],
    replicas: int | Sequence[str],
    config: AdaptiveSettings,
    mode_policy: ModePolicy = ModePolicy.ADAPTIVE,
    *,
    initial: Mode = Mode.STREAMING,
    state: pol.HysteresisState | None = None,
    sizing: AutoGLMDeploymentSpec | None = None,
) -> list[Step]:
    """Run decide() over a sequence of samples, applying every flip at once. `sizing`: a spec
    with autoscaling on sizes the fleet before each decision (FleetSizer; `replicas` is the
    fleet at the start), replicas added and removed at once."""
    names = (
        [f"replica-{i}" for i in range(replicas)] if isinstance(replicas, int) else list(replicas)
    )
    modes = dict.fromkeys(names, initial)
    loop = state or pol.HysteresisState()
    sizer = FleetSizer(sizing) if sizing is not None and sizing.autoscaling.enabled else None
    added = len(names)
    steps = []
    for t, samples in rows:
        fleet = None
        if sizer is not None:
            sized, inp = sizer.size(t, samples, len(names), loop)
            while len(names) < sized.desired:
                name = f"replica-{added}"
                added += 1
                if name not in modes:
                    names.append(name)
                    modes[name] = initial
            if len(names) > sized.desired:
                pods = [scaling.Candidate(n, modes[n], True, None) for n in names]
                gone = set(scaling.victims(pods, sized.desired, inp))
                names = [n for n in names if n not in gone]
                for name in gone:
                    del modes[name]
            fit = sized.fit
            fleet = FleetStep(sized.desired, sized.needed, sized.reason, sized.message,
                              None if inp.demand is None else inp.demand.total,
                              None if fit is None else fit.goodput)
        replica_states = [pol.ReplicaState(n, modes[n]) for n in names]
        decision = pol.decide(samples, replica_states, loop, config, mode_policy, t)
        for flip in decision.flips:
            modes[flip.pod] = flip.to_mode
        loop = decision.state
        batching = sum(1 for m in modes.values() if m is Mode.BATCHING)
        steps.append(Step(t, samples, decision, len(names) - batching, batching, fleet))
    return steps


@dataclass(frozen=True)
class Summary:
    passes: int
    flips: int
    to_batching: int
    to_streaming: int
    max_flips_per_replica: int
    cooldown_violations: int
    seconds_by_batching: dict[int, float]
    reasons: dict[str, int]
    # spec.autoscaling: time at each fleet size, the steps each way, the sizing's reasons
    seconds_by_replicas: dict[int, float] = field(default_factory=dict)
    scale_ups: int = 0
    scale_downs: int = 0
    fleet_reasons: dict[str, int] = field(default_factory=dict)


def summarize(steps: Sequence[Step], config: AdaptiveSettings) -> Summary:
    last_flip: dict[str, float] = {}
    per_replica: Counter[str] = Counter()
    violations = 0
    to_batching = to_streaming = 0
    seconds: dict[int, float] = {}
    by_replicas: dict[int, float] = {}
    for i, step in enumerate(steps):
        for flip in step.decision.flips:
            per_replica[flip.pod] += 1
            if flip.to_mode is Mode.BATCHING:
                to_batching += 1
            else:
                to_streaming += 1
            previous = last_flip.get(flip.pod)
            pinned = step.decision.reason in (pol.PINNED_BATCHING, pol.PINNED_STREAMING)
            if previous is not None and step.time - previous < config.cooldown_seconds:
                violations += 0 if pinned else 1
            last_flip[flip.pod] = step.time
        if i + 1 < len(steps):
            gap = steps[i + 1].time - step.time
            seconds[step.batching] = seconds.get(step.batching, 0.0) + gap
            if step.fleet is not None:
                by_replicas[step.fleet.desired] = by_replicas.get(step.fleet.desired, 0.0) + gap
    sized = [s.fleet for s in steps if s.fleet is not None]
    return Summary(
        passes=len(steps),
        flips=to_batching + to_streaming,
        to_batching=to_batching,
        to_streaming=to_streaming,
        max_flips_per_replica=max(per_replica.values(), default=0),
        cooldown_violations=violations,
        seconds_by_batching=dict(sorted(seconds.items())),
        reasons=dict(Counter(s.decision.reason for s in steps)),
        seconds_by_replicas=dict(sorted(by_replicas.items())),
        scale_ups=sum(1 for f in sized if f.reason == scaling.SCALED_UP),
        scale_downs=sum(1 for f in sized if f.reason == scaling.SCALED_DOWN),
        fleet_reasons=dict(Counter(f.reason for f in sized)),
    )


# -- output ----------------------------------------------------------------------------------


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _when(t: float, start: float, absolute: bool) -> str:
    if absolute:
        return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(timedelta(seconds=round(t - start)))


def format_table(steps: Sequence[Step], *, show_all: bool = False) -> str:
    """One line per change (a flip, another reason; with autoscaling another size or sizing
    reason), or per step with show_all."""
    if not steps:
        return "(no steps)\n"
    absolute = steps[0].time > 1e9  # epoch timestamps print as dates, offsets as h:mm:ss
    start = steps[0].time
    sized = any(step.fleet is not None for step in steps)
    header: tuple[str, ...] = ("time", "qps", "qps/rep", "gpu%", "queue", "ttft95")
    if sized:
        header += ("demand", "need", "replicas")
    header += ("strm/btch", "reason", *(("fleet",) if sized else ()), "flips")
    lines: list[tuple[str, ...]] = []
    previous: tuple[object, ...] | None = None
    for step in steps:
        decision, fleet = step.decision, step.fleet
        shown = (decision.reason, fleet and (fleet.reason, fleet.desired, fleet.needed))
        if not show_all and not decision.flips and shown == previous:
            continue
        previous = shown
        s = step.samples
        per_replica = decision.metrics.qps_per_replica
        flips = ", ".join(f"{f.pod}->{f.to_mode.value}" for f in decision.flips)
        cells: tuple[str, ...] = (
            _when(step.time, start, absolute),
            _cell(s.qps),
            per_replica or "-",
            _cell(s.gpu_memory_percent, 0),
            _cell(s.queue_depth, 1),
            _cell(s.ttft_p95_seconds, 3),
        )
        if sized:
            cells += ((_cell(fleet.demand), str(fleet.needed), str(fleet.desired))
                      if fleet is not None else ("-", "-", "-"))
        cells += (f"{step.streaming}/{step.batching}", decision.reason)
        if sized:
            cells += (fleet.reason if fleet is not None else "-",)
        lines.append((*cells, flips))
    widths = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines]
    return "\n".join(out) + "\n"


def format_summary(summary: Summary) -> str:
    mix = ", ".join(
        f"{n} batching {seconds / 60:.1f} min" for n, seconds in summary.seconds_by_batching.items()
    )
    text = (
        f"passes {summary.passes}, flips {summary.flips} "
        f"({summary.to_batching} to batching, {summary.to_streaming} to streaming), "
        f"most flips of one replica {summary.max_flips_per_replica}, "
        f"cooldown violations {summary.cooldown_violations}\n"
        f"time by batching replicas: {mix}\n"
    )
    if summary.fleet_reasons:
        sizes = ", ".join(f"{n} replicas {seconds / 60:.1f} min"
                          for n, seconds in summary.seconds_by_replicas.items())  # fmt: skip
        text += (f"fleet: scale-ups {summary.scale_ups}, scale-downs {summary.scale_downs}; "
                 f"time by replicas: {sizes}\n")
    return text


def to_json(steps: Sequence[Step], summary: Summary) -> str:
    return json.dumps(
        {
            "summary": summary.__dict__,
            "steps": [
                {
                    "time": step.time,
                    "reason": step.decision.reason,
                    "message": step.decision.message,
                    "streaming": step.streaming,
                    "batching": step.batching,
                    "flips": [{"pod": f.pod, "to": f.to_mode.value} for f in step.decision.flips],
                    "metrics": step.decision.metrics.model_dump(by_alias=True, exclude_none=True),
                    **({} if step.fleet is None else {"fleet": {
                        "desiredReplicas": step.fleet.desired,
                        "neededReplicas": step.fleet.needed,
                        "reason": step.fleet.reason,
                        "message": step.fleet.message,
                        "demand": step.fleet.demand,
                        "expectedGoodput": step.fleet.goodput,
                    }}),
                }
                for step in steps
            ],
        },
        indent=2,
    )


# -- the command -----------------------------------------------------------------------------

_RELATIVE = re.compile(r"^-(\d+)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _cli_time(text: str, now: datetime) -> datetime:
    if text == "now":
        return now
    match = _RELATIVE.match(text)
    if match:
        return now - timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])
    return datetime.fromtimestamp(_parse_time(text), tz=UTC)


def _seconds(text: str) -> int:
    match = re.match(r"^(\d+)([smhd]?)$", text)
    if not match:
        raise TraceError(f"step {text!r}: expected e.g. 15s, 1m")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="run the adaptive policy over a CSV trace or Prometheus history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="CSV trace (see above)")
    source.add_argument("--prometheus", help="Prometheus base URL to read history from")
    parser.add_argument(
        "--config", type=Path,
        help="AutoGLMDeployment YAML (or its spec); with spec.autoscaling.enabled the fleet is "
        "sized at each step too (see above)",
    )  # fmt: skip
    parser.add_argument(
        "--replicas", type=int,
        help="replicas to simulate (default: spec's); with spec.autoscaling on, the fleet at the "
        "trace's start, which the sizing then changes",
    )  # fmt: skip
    parser.add_argument("--interval", type=float, help="seconds between passes (default: spec)")
    parser.add_argument(
        "--policy", choices=[p.value for p in ModePolicy], help="override spec.modePolicy"
    )
    parser.add_argument("--namespace", help="with --prometheus: the deployment's namespace")
    parser.add_argument("--name", help="with --prometheus: the AutoGLMDeployment's name")
    parser.add_argument(
        "--pod-regex", help="with --prometheus: pods to read (default: <name>-<hash>-<id>)"
    )
    parser.add_argument("--start", default="-6h", help="RFC 3339, seconds, -6h or now")
    parser.add_argument("--end", default="now")
    parser.add_argument("--step", default="30s", help="range query resolution")
    parser.add_argument("--all", action="store_true", help="print every pass, not only changes")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)
    return parser


def _rows_from_prometheus(
    args: argparse.Namespace, spec: AutoGLMDeploymentSpec
) -> list[tuple[float, pol.Samples]]:
    from autoglm_operator.io.prom import PrometheusReader  # the HTTP client only where needed

    if not args.namespace or not args.name:
        raise TraceError("--prometheus needs --namespace and --name")
    now = datetime.now(tz=UTC)
    start, end = _cli_time(args.start, now), _cli_time(args.end, now)
    if end <= start:
        raise TraceError(f"--end {args.end} is not after --start {args.start}")
    source = spec.adaptive.prometheus.model_copy(update={"url": args.prometheus})
    reader = PrometheusReader(source)
    try:
        # Pods of a Deployment are <deployment>-<pod-template-hash>-<5 chars>.
        regex = args.pod_regex or f"{re.escape(args.name)}-[a-z0-9]+-[a-z0-9]{{5}}"
        rows = reader.read_range(
            args.namespace,
            None,
            start,
            end,
            _seconds(args.step),
            deployment=args.name,
            pod_regex=regex,
        )
    finally:
        reader.close()
    if not rows:
        raise TraceError("Prometheus returned no samples for that window and selector")
    return rows


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        spec = load_spec(args.config) if args.config else AutoGLMDeploymentSpec()
        replicas = args.replicas or (spec.replicas if args.config else DEFAULT_REPLICAS)
        if replicas < 1:
            raise TraceError("--replicas must be at least 1")
        interval = args.interval or spec.adaptive.interval_seconds
        if args.trace:
            with args.trace.open(newline="") as handle:
                rows = read_trace(handle, str(args.trace))
        else:
            rows = _rows_from_prometheus(args, spec)
    except (TraceError, OSError) as error:
        print(f"replay: {error}", file=sys.stderr)
        return 2
    mode_policy = ModePolicy(args.policy) if args.policy else spec.mode_policy
    steps = simulate(resample(rows, interval), replicas, spec.adaptive, mode_policy, sizing=spec)
    summary = summarize(steps, spec.adaptive)
    if args.json:
        out.write(to_json(steps, summary) + "\n")
    else:
        auto = spec.autoscaling
        fleet = (
            f"autoscaling {auto.min_replicas}-{auto.max_replicas} replicas "
            f"(headroom {auto.headroom_percent}%), starting at {replicas}"
            if auto.enabled else f"{replicas} replicas"
        )  # fmt: skip
        out.write(
            f"{fleet}, policy {mode_policy.value}, interval {interval:g}s, "
            f"minStreamingReplicas {spec.adaptive.min_streaming_replicas}\n"
        )
        out.write(format_table(steps, show_all=args.all))
        out.write(format_summary(summary))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autoglm-operator")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["replay", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
