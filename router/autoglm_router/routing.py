"""The routing decision: request features + the pool's state -> a replica, or a refusal.

Pure: no clock, no I/O, no shared state. The proxy calls it per request; benchmarks and replay
can call it with a simulated pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from autoglm_api.profiles import Mode, ModeProfiles
from autoglm_router.features import KeyKind, RequestFeatures, TrafficClass
from autoglm_router.ring import ring_of


@dataclass(frozen=True)
class ReplicaState:
    name: str
    mode: Mode | None  # None: the replica exports no autoglm_mode (plain vLLM, not yet read)
    ready: bool = True
    draining: bool = False
    inflight: int = 0  # requests this router has open on it
    load: float = 0.0  # their summed cost (see RequestFeatures.cost)
    # Requests this router sent it within RoutingConfig.fresh_seconds: the prefill work a chat
    # sent now would wait behind before its first token.
    fresh: int = 0
    # `load` averaged over the last seconds: a conversation between two turns has nothing in
    # flight but will send its next turn here, so new conversations are placed by this.
    recent_load: float = 0.0
    # Its engine sleeps (the runtime's autoglm_sleeping gauge): a request wakes it, in about a
    # second, so it takes requests only when no awake replica can.
    asleep: bool = False


def _default_caps() -> dict[Mode, int]:
    return {mode: ModeProfiles().for_mode(mode).max_concurrency for mode in Mode}


def _default_chat_caps() -> dict[Mode, int]:
    profiles = ModeProfiles()
    return {mode: profiles.for_mode(mode).admission_cap(True, profiles.envelope_max_num_seqs)
            for mode in Mode}


@dataclass(frozen=True)
class RoutingConfig:
    load_factor: float = 1.25
    spill: bool = True
    # In flight on a replica of each mode before it counts as full (its admission cap): `caps`
    # for most requests, `chat_caps` for streamed chats, which a profile that puts streams first
    # admits up to the engine's sequence limit (ModeProfile.admission_cap).
    caps: Mapping[Mode, int] = field(default_factory=_default_caps)
    chat_caps: Mapping[Mode, int] = field(default_factory=_default_chat_caps)
    virtual_nodes: int = 100
    shed: bool = True
    # Non-streamed work waits for seconds, not for a first token: it is shed only past
    # (1 + other_overflow) x the caps. 1.0 by measurement (router/README.md, rule 1c).
    other_overflow: float = 1.0
    # How far back a replica's recent requests count as work ahead of a chat's first token
    # (rule 1d): the spec's default chat time-to-first-token target, 0.5 s.
    fresh_seconds: float = 0.5

    def __post_init__(self) -> None:
        if self.load_factor < 1.0:
            raise ValueError(f"load_factor must be at least 1.0, got {self.load_factor}")
        if self.virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be at least 1, got {self.virtual_nodes}")
        if not self.fresh_seconds > 0.0:
            raise ValueError(f"fresh_seconds must be above 0, got {self.fresh_seconds}")
        if self.other_overflow < 0.0:
            raise ValueError(f"other_overflow must be at least 0, got {self.other_overflow}")
        if any(cap < 1 for cap in (*self.caps.values(), *self.chat_caps.values())):
            raise ValueError("every mode's concurrency cap must be at least 1")

    def cap(self, mode: Mode, features: RequestFeatures) -> int:
        caps = self.chat_caps if features.traffic_class is TrafficClass.STREAMED_CHAT else self.caps
        return caps.get(mode, 1 << 30)


class Reason(StrEnum):
    HASHED = "hashed"  # the key's home on the ring
    PLACED = "placed"  # where this router sent the session's last turn (rule 2)
    BOUNDED = "bounded"  # the home was over the load bound; the next one on the ring
    LEAST_LOADED = "least_loaded"  # no key to hash
    LEAST_FRESH = "least_fresh"  # a chat with no streaming replica: the fewest recent requests
    SPILLED = "spilled"  # every preferred replica at its cap
    WAKING = "waking"  # every replica asleep: the one that wakes for all (rule 0)


@dataclass(frozen=True)
class Route:
    replica: str
    reason: Reason
    in_preferred_mode: bool


NO_REPLICA = "no_replica"  # Refusal.reason when nothing takes requests: what holding waits out


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str
    message: str


def decide(
    features: RequestFeatures,
    replicas: Sequence[ReplicaState],
    config: RoutingConfig,
    exclude: Iterable[str] = (),
    placed: str | None = None,
) -> Route | Refusal:
    """Rule 1 picks the pool (class, spill, shed), rules 2-4 pick within it (CHWBL on cost).

    Sleeping replicas are left out while an awake one is eligible; with none awake, all
    requests go to the first sleeping one by name, which they wake (caps aside: it is one
    replica's wake, about a second, and each router picks the same one).
    `placed` is where this router sent the session's last turn of this class, if it knows.
    """
    excluded = set(exclude)
    eligible = [r for r in replicas if r.ready and not r.draining and r.name not in excluded]
    if not eligible:
        return Refusal(503, NO_REPLICA, "No ready replica can take the request; retry later.")
    awake = [r for r in eligible if not r.asleep]
    if not awake:
        # Every router picks the same one (by name), so a burst wakes one replica, not all.
        sleeper = min(eligible, key=lambda r: r.name)
        return Route(sleeper.name, Reason.WAKING,
                     sleeper.mode is features.traffic_class.preferred_mode)
    eligible = awake
    wanted = features.traffic_class.preferred_mode
    preferred = [r for r in eligible if r.mode is wanted]
    in_mode = bool(preferred)
    if not preferred:
        preferred = eligible  # a class with no replica in its mode uses all
    with_room = [r for r in preferred if has_room(r, features, config)]
    if not with_room and config.spill:
        others = [r for r in eligible if r not in preferred and has_room(r, features, config)]
        if others:
            return Route(least_loaded(others).name, Reason.SPILLED, False)
    pool = with_room or preferred
    if config.shed and not with_room and overloaded(features, pool, config):
        return Refusal(429, "overloaded", "Every replica is at its concurrency cap; retry later.")
    if features.key_kind is KeyKind.NONE or features.key is None:
        if features.traffic_class is TrafficClass.STREAMED_CHAT and not in_mode:
            return Route(least_fresh(pool).name, Reason.LEAST_FRESH, in_mode)
        return Route(least_loaded(pool).name, Reason.LEAST_LOADED, in_mode)
    if features.key_kind is KeyKind.PREFIX:
        # A shared prefix can burst: the strict bound spreads it at once.
        name, bounded = bounded_hash(features.key, features.cost, pool, config)
        return Route(name, Reason.BOUNDED if bounded else Reason.HASHED, in_mode)
    if features.key_kind is KeyKind.CONVERSATION and features.new_conversation:
        # A first turn is placed as a session's is, by the recent load, wherever an earlier
        # conversation of the same task went; many first turns of one task (one key) also
        # count what is in flight now, so they spread at once.
        name, bounded = bounded_hash(features.key, features.cost, pool, config,
                                     load=lambda r: max(r.recent_load, r.load))
        return Route(name, Reason.BOUNDED if bounded else Reason.HASHED, in_mode)
    return session_route(features, pool, config, placed, in_mode)


def session_route(
    features: RequestFeatures, pool: Sequence[ReplicaState], config: RoutingConfig,
    placed: str | None, in_mode: bool,
) -> Route:
    """Rule 2: a conversation stays where its cache is; a new one goes where the load is low.

    One conversation rarely has two turns in flight, so what loads its replica is other
    conversations' work: a known session gets one request of slack over the load bound (the
    paper's ceil(), in cost units); without it, at two requests per replica, the bound moved
    half of all later turns off their cache. A new conversation (no answer in its history yet)
    has no cache to lose, so it takes the strict bound: placed by load, it stays there.
    """
    assert features.key is not None
    slack = features.cost
    home = next((r for r in pool if r.name == placed), None)
    # At home the turn prefills only what its cache lacks, so it adds less load there.
    cost = features.home_cost
    if home is not None and home.load + cost <= load_bound(cost, pool, config) + slack + 1e-9:
        return Route(home.name, Reason.PLACED, in_mode)
    if features.new_conversation and home is None:
        name, bounded = bounded_hash(features.key, features.cost, pool, config,
                                     load=lambda r: r.recent_load)
    else:
        name, bounded = bounded_hash(features.key, features.cost, pool, config, slack)
    return Route(name, Reason.BOUNDED if bounded else Reason.HASHED, in_mode)


def charged_cost(features: RequestFeatures, route: Route) -> float:
    """The load a routed request adds to its replica: a turn placed at its conversation's home
    prefills only what the cache there lacks."""
    return features.home_cost if route.reason is Reason.PLACED else features.cost


def has_room(replica: ReplicaState, features: RequestFeatures, config: RoutingConfig,
             scale: float = 1.0) -> bool:
    """Under its mode's admission cap for this request; a replica of unknown mode has none."""
    if replica.mode is None:
        return True
    return replica.inflight < scale * config.cap(replica.mode, features)


def overloaded(
    features: RequestFeatures, pool: Sequence[ReplicaState], config: RoutingConfig
) -> bool:
    """Rule 1c: no replica the request could go to takes it without a queue past its limit.

    Under sustained overload a queued request is served after its deadline, in the place of
    one that would have met it; a 429 lets the client back off or go elsewhere. A streamed
    chat's limit is the cap (queued, it misses its first token); other work may queue up to
    other_overflow x the cap more.
    """
    chat = features.traffic_class is TrafficClass.STREAMED_CHAT
    scale = 1.0 if chat else 1.0 + config.other_overflow
    return not any(has_room(r, features, config, scale) for r in pool)


def least_loaded(replicas: Sequence[ReplicaState]) -> ReplicaState:
    return min(replicas, key=lambda r: (r.load, r.inflight, r.name))


def least_fresh(replicas: Sequence[ReplicaState]) -> ReplicaState:
    """Rule 1d: with no streaming replica, a chat's first token waits behind the prefills that
    reached its replica just before it (chunked prefill shares each engine step among them), not
    behind the requests decoding there: the replica sent the fewest requests within
    fresh_seconds takes it; ties, the least loaded."""
    return min(replicas, key=lambda r: (r.fresh, r.load, r.inflight, r.name))


def current_load(replica: ReplicaState) -> float:
    return replica.load


def load_bound(cost: float, pool: Sequence[ReplicaState], config: RoutingConfig,
               load: Callable[[ReplicaState], float] = current_load) -> float:  # fmt: skip
    """The most load a replica may hold with a new request of `cost`: load_factor x the pool's
    mean with it, never below the least-loaded replica's load with it (the CHWBL paper's
    ceil(), in cost units), so some replica always fits and a burst on one key spreads at once
    even when the pool is nearly idle."""
    loads = [load(r) for r in pool]
    return max(config.load_factor * (sum(loads) + cost) / len(pool), min(loads) + cost)


def bounded_hash(
    key: str, cost: float, pool: Sequence[ReplicaState], config: RoutingConfig,
    slack: float = 0.0, load: Callable[[ReplicaState], float] = current_load,
) -> tuple[str, bool]:
    """Consistent hashing with bounded loads (KubeAI's chwbl, on cost instead of count).

    Walk the ring from the key's point; take the first replica whose `load` with this request
    stays within load_bound() + `slack`. Returns (replica, whether the bound moved it off its
    home).
    """
    by_name = {r.name: r for r in pool}
    bound = load_bound(cost, pool, config, load) + slack
    ring = ring_of(frozenset(by_name), config.virtual_nodes)
    home: str | None = None
    for name in ring.walk(key):
        home = home or name
        if load(by_name[name]) + cost <= bound + 1e-9:
            return name, name != home
    raise AssertionError("the least-loaded replica always fits the bound")


class Failure(StrEnum):
    CONNECT_ERROR = "connect_error"
    DRAINING = "draining"
    QUEUE_FULL = "queue_full"


def retry_route(
    failure: Failure,
    features: RequestFeatures,
    replicas: Sequence[ReplicaState],
    config: RoutingConfig,
    tried: Sequence[str],
) -> Route | None:
    """Where a request refused before its first byte goes next, or None: back to the client.

    Only failures before the first response byte reach here; one retry per request at most.
    """
    if len(tried) > 1:
        return None
    if failure is Failure.QUEUE_FULL:
        # Elsewhere only if another replica has room; else the client gets the 429.
        replicas = [r for r in replicas if has_room(r, features, config)]
    route = decide(features, replicas, config, exclude=tried)
    return route if isinstance(route, Route) else None
