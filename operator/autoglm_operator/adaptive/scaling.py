"""Fleet sizing, pure: how many serving replicas run (spec.autoscaling), and which one goes at a
scale-down.

The count comes from the model that chooses the split (demand.expected_goodput): for the
measured demand of each class raised by `headroomPercent`, every candidate fleet of n replicas
is scored at its best split (k of them batching, at least minStreamingReplicas streaming; the
one split a pinned modePolicy runs), and
the fleet is the smallest n whose best split serves that demand within the SLOs. Requests the
routers hold or relay now set a floor beside it (a burst the minute's rates have not seen yet,
or requests held at zero): the fewest replicas that admit them all.

How the count moves (FleetMemory, kept in status.autoscaling, so a restart keeps the windows):
- Up at once on a shortfall (after `scaleUp.stabilizationSeconds`, 0 by default), by at most
  `scaleUp.maxStep`, counted from the replicas already asked for, never waiting for them to be
  ready: a replica takes about a minute to start, and every second of a shortfall refuses work.
- Down only after fewer have been wanted for `scaleDown.stabilizationSeconds`, `maxStep` at a
  time, `periodSeconds` apart, and never within `adaptive.cooldownSeconds` of a flip: a flip just
  changed what each replica serves, and the demand measured since does not show it yet.
- Unknown demand (no Prometheus reading) holds the count, unless the routers saw no request
  for the whole scale-down window: no request is zero demand, whatever a missing series says.
- While the deployment idles at its floor (scale to zero, standby.py), the count a wake starts
  is what the held requests need, at least minReplicas and one.

Scale-down victims (victim): a replica that is not ready first, then one of the mode the best
split of the smaller fleet has too many of (never one of the last minStreamingReplicas
streaming), then the one with the fewest requests in flight, then the newest (the fewest
sessions homed, the coldest prefix cache); the
operator marks it with the lowest pod-deletion-cost, so the ReplicaSet removes that one, and the
pod's preStop drain lets its streams finish.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from autoglm_api.profiles import Mode
from autoglm_operator.adaptive.capacity import Capacity
from autoglm_operator.adaptive.demand import Demand, expected_goodput
from autoglm_operator.resource.spec import AutoscalingSettings, ServiceLevelObjectives

# Reasons, as status.autoscaling.reason and Event reasons.
SCALED_UP = "ScaledUp"
SCALED_DOWN = "ScaledDown"
FLEET_FITS_DEMAND = "FleetFitsDemand"
SCALE_UP_STABILIZING = "ScaleUpStabilizing"
SCALE_DOWN_STABILIZING = "ScaleDownStabilizing"
SCALE_DOWN_PACED = "ScaleDownPaced"
FLIP_COOLDOWN = "FlipCooldown"
DEMAND_UNKNOWN = "DemandUnknown"
AT_MAX_REPLICAS = "AtMaxReplicas"
IDLE = "Idle"

# A fleet meets the demand when its expected goodput is within this share of it: the model's
# figures are rates, and a fleet short by a rounding error is not short.
SHORTFALL_TOLERANCE = 0.005


@dataclass(frozen=True)
class FleetMemory:
    """What the sizing remembers between decisions (status.autoscaling)."""

    desired: int | None = None  # None: nothing decided yet (the running replicas stand)
    lower_since: float | None = None
    higher_since: float | None = None
    last_scale: float | None = None
    last_scale_down: float | None = None


@dataclass(frozen=True)
class FleetInput:
    """What one sizing decision reads."""

    demand: Demand | None  # requests/s by class, the adaptive pass's last reading; None: unknown
    busy: int  # requests the routers hold or relay now
    quiet_for: float | None  # seconds since the routers last saw a request; None: unknown
    running: int  # serving pods that run now
    capacity: Capacity  # per replica and mode (learned, else the CRD's seeds)
    caps: Mapping[Mode, int]  # requests in flight a replica of each mode admits
    slo: ServiceLevelObjectives
    min_streaming: int
    last_flip: float | None  # when the latest flip was, wall time
    cooldown_seconds: float
    idle: bool = False  # scale to zero: the deployment idles at its floor
    pinned: Mode | None = None  # modePolicy Streaming or Batching: every replica runs that mode


@dataclass(frozen=True)
class Fit:
    """A candidate fleet: `replicas`, the best split (`batching` of them), and the requests/s it
    serves within the SLOs of `demand` (the measured demand plus headroom)."""

    replicas: int
    batching: int
    goodput: float
    demand: float

    @property
    def meets(self) -> bool:
        return self.goodput >= (1 - SHORTFALL_TOLERANCE) * self.demand - 1e-9


@dataclass(frozen=True)
class FleetDecision:
    desired: int
    needed: int
    reason: str
    message: str
    memory: FleetMemory
    fit: Fit | None = None  # the desired fleet at the demand plus headroom; None: unknown

    @property
    def scaled(self) -> bool:
        return self.reason in (SCALED_UP, SCALED_DOWN)


def fit(replicas: int, demand: Demand, inp: FleetInput) -> Fit:
    """The best split of `replicas` for `demand` (at least min_streaming of them streaming), or
    the one a pinned modePolicy runs."""
    cs, cb = inp.capacity.streaming, inp.capacity.batching
    ok_at_cap = cb > 0 and inp.caps[Mode.BATCHING] / cb <= inp.slo.batch_completion_seconds
    splits = range(max(0, replicas - min(inp.min_streaming, replicas)) + 1)
    if inp.pinned is not None:
        splits = range(0, 1) if inp.pinned is Mode.STREAMING else range(replicas, replicas + 1)
    scored = [(expected_goodput(k, replicas, demand, cs, cb, ok_at_cap), -k) for k in splits]
    goodput, negated = max(scored)
    return Fit(replicas, -negated, goodput, demand.total)


def needed(inp: FleetInput, settings: AutoscalingSettings) -> tuple[int, Fit | None]:
    """The fewest replicas, within the bounds, that serve the demand plus headroom and admit
    what the routers hold and relay; the fit of that fleet (None: the demand is unknown)."""
    lo, hi = _bounds(settings)
    admitting = _admitting(inp)
    if inp.demand is None:
        return _clamp(admitting, lo, hi), None
    raised = 1 + settings.headroom_percent / 100
    target = Demand(inp.demand.chat * raised, inp.demand.other * raised)
    chosen = fit(hi, target, inp)
    for n in range(lo, hi + 1):
        candidate = fit(n, target, inp)
        if candidate.meets:
            chosen = candidate
            break
    count = _clamp(max(chosen.replicas, admitting), lo, hi)
    return count, chosen if count == chosen.replicas else fit(count, target, inp)


def size_fleet(
    inp: FleetInput, settings: AutoscalingSettings, memory: FleetMemory, now: float
) -> FleetDecision:
    """The replicas to run now, and why (the module docstring)."""
    lo, hi = _bounds(settings)
    current = _clamp(memory.desired if memory.desired is not None else inp.running, lo, hi)
    want, chosen = needed(inp, settings)
    if inp.idle:
        message = f"idle at the floor; a wake starts {want} replica(s)"
        return FleetDecision(want, want, IDLE, message, FleetMemory(desired=want), chosen)
    unknown = inp.demand is None
    if unknown and inp.quiet_for is not None \
            and inp.quiet_for >= settings.scale_down.stabilization_seconds:
        # No request for the window: no demand, and fewer have been wanted since the last one.
        want, unknown = lo, False
        last_request = now - inp.quiet_for
        if memory.lower_since is None or memory.lower_since > last_request:
            memory = replace(memory, lower_since=last_request)
    elif unknown:
        want = max(want, current)  # hold, unless what is held and relayed needs more
    summary = _summary(inp, chosen, want, settings)
    if want > current:
        return _up(current, want, chosen, summary, settings, memory, now)
    if want < current:
        return _down(inp, current, want, chosen, summary, settings, memory, now)
    reason = DEMAND_UNKNOWN if unknown else (
        AT_MAX_REPLICAS if chosen is not None and not chosen.meets else FLEET_FITS_DEMAND)
    kept = replace(memory, desired=current, lower_since=None, higher_since=None)
    return FleetDecision(current, want, reason, summary, kept, chosen)


def _up(current: int, want: int, chosen: Fit | None, summary: str,
        settings: AutoscalingSettings, memory: FleetMemory, now: float) -> FleetDecision:
    since = memory.higher_since if memory.higher_since is not None else now
    window = settings.scale_up.stabilization_seconds
    if now - since < window:
        kept = replace(memory, desired=current, higher_since=since, lower_since=None)
        message = f"{summary}; a step up once wanted for {window}s (higherSince)"
        return FleetDecision(current, want, SCALE_UP_STABILIZING, message, kept, chosen)
    desired = min(want, current + settings.scale_up.max_step)
    kept = FleetMemory(desired, None, None if desired == want else now, now,
                       memory.last_scale_down)
    message = f"{summary}; scaling up from {current} to {desired}"
    return FleetDecision(desired, want, SCALED_UP, message, kept, chosen)


def _down(inp: FleetInput, current: int, want: int, chosen: Fit | None, summary: str,
          settings: AutoscalingSettings, memory: FleetMemory, now: float) -> FleetDecision:
    rules = settings.scale_down
    since = memory.lower_since if memory.lower_since is not None else now
    kept = replace(memory, desired=current, lower_since=since, higher_since=None)
    if now - since < rules.stabilization_seconds:
        message = (f"{summary}; a step down once wanted for {rules.stabilization_seconds}s "
                   "(lowerSince)")
        return FleetDecision(current, want, SCALE_DOWN_STABILIZING, message, kept, chosen)
    last = memory.last_scale_down
    if last is not None and now - last < rules.period_seconds:
        message = (f"{summary}; the next step down {rules.period_seconds}s after the last "
                   "(lastScaleDownTime)")
        return FleetDecision(current, want, SCALE_DOWN_PACED, message, kept, chosen)
    if inp.last_flip is not None and now - inp.last_flip < inp.cooldown_seconds:
        message = (f"{summary}; no step down within cooldownSeconds "
                   f"({inp.cooldown_seconds:.0f}s) of a flip")
        return FleetDecision(current, want, FLIP_COOLDOWN, message, kept, chosen)
    desired = max(want, current - rules.max_step)
    kept = FleetMemory(desired, since, None, now, now)
    message = f"{summary}; scaling down from {current} to {desired}"
    return FleetDecision(desired, want, SCALED_DOWN, message, kept, chosen)


def _summary(inp: FleetInput, chosen: Fit | None, want: int,
             settings: AutoscalingSettings) -> str:
    # Figures that change every second (what is held, for how long) stay out unless they set
    # the count: the message is in status, written when it changes.
    admitting = _admitting(inp)
    by_demand = needed(replace(inp, busy=0), settings)[0] if chosen else 0
    held = f"; {inp.busy} held or in flight need {admitting}" if admitting > by_demand else ""
    if inp.demand is None or chosen is None:
        quiet = (", no request for the scale-down window"
                 if inp.quiet_for is not None
                 and inp.quiet_for >= settings.scale_down.stabilization_seconds else "")
        return f"demand unknown (no recent metrics){quiet}{held}: {want} replica(s) wanted"
    d = inp.demand
    short = "" if chosen.meets else f" (short: maxReplicas is {settings.max_replicas})"
    return (f"demand {d.chat:.2f} chats/s + {d.other:.2f} other/s, "
            f"+{settings.headroom_percent}%: {chosen.demand:.2f}/s, of which {chosen.replicas} "
            f"replica(s) ({chosen.batching} batching) serve {chosen.goodput:.2f}/s within "
            f"the SLOs{short}{held}: {want} wanted")


def _admitting(inp: FleetInput) -> int:
    """The fewest replicas that admit every request held or relayed now."""
    return math.ceil(inp.busy / max(1, max(inp.caps.values())))


def _bounds(settings: AutoscalingSettings) -> tuple[int, int]:
    """The replicas a serving fleet runs: at least one (zero is the idle floor's)."""
    lo = max(1, settings.min_replicas)
    return lo, max(lo, settings.max_replicas)


def _clamp(value: int, lo: int, hi: int) -> int:
    return min(hi, max(lo, value))


@dataclass(frozen=True)
class Candidate:
    """A serving pod as a scale-down sees it."""

    name: str
    mode: Mode
    ready: bool
    inflight: int | None  # None: unknown (its runtime was not read)
    created: str = ""  # creationTimestamp: the newest has the fewest sessions homed, coldest cache


def victims(pods: Sequence[Candidate], keep: int, inp: FleetInput) -> tuple[str, ...]:
    """The pods a scale-down to `keep` replicas removes, cheapest first: not ready, then of the
    mode the smaller fleet's best split has too many of, then the fewest in flight."""
    surplus = len(pods) - keep
    if surplus <= 0:
        return ()
    batching = sum(1 for p in pods if p.mode is Mode.BATCHING)
    streaming = sum(1 for p in pods if p.ready and p.mode is Mode.STREAMING)
    wanted_batching = fit(keep, inp.demand, inp).batching if inp.demand is not None else None
    extra = Mode.STREAMING
    if streaming <= min(inp.min_streaming, keep) or (
            wanted_batching is not None and batching - wanted_batching > 0):
        extra = Mode.BATCHING  # the streaming floor stays, whatever the demand

    def cost(p: Candidate) -> tuple[int, int, float]:
        busy = math.inf if p.inflight is None else p.inflight
        return (1 if p.ready else 0, 0 if p.mode is extra else 1, busy)

    # Ties: the newest pod first (it has homed the fewest sessions), then by name.
    newest_first = sorted(sorted(pods, key=lambda p: p.name),
                          key=lambda p: p.created, reverse=True)
    return tuple(p.name for p in sorted(newest_first, key=cost)[:surplus])
