"""The routing decision, rule by rule (router/README.md lists the rules and their reasons)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from autoglm_api.profiles import Mode
from autoglm_router.features import KeyKind, RequestFeatures, TrafficClass
from autoglm_router.metrics import router_metrics
from autoglm_router.proxy import LoadBook
from autoglm_router.routing import (
    Failure,
    Reason,
    Refusal,
    ReplicaState,
    Route,
    RoutingConfig,
    charged_cost,
    decide,
    has_room,
    retry_route,
)

S, B = Mode.STREAMING, Mode.BATCHING
CONFIG = RoutingConfig()  # caps: streaming 8 (64 for streamed chats), batching 64; load 1.25
# A streaming replica full for a streamed chat: streams first run up to the engine's 64.
S_FULL = {"inflight": 64, "load": 64.0}


def chat(stream: bool, key: str | None = None, cost: float = 1.0,
         kind: KeyKind = KeyKind.SESSION) -> RequestFeatures:
    traffic = TrafficClass.STREAMED_CHAT if stream else TrafficClass.OTHER
    return RequestFeatures(traffic, key, kind if key else KeyKind.NONE, cost)


def pool(*specs: tuple[str, Mode | None], **changes: dict[str, object]) -> list[ReplicaState]:
    replicas = [ReplicaState(name, mode) for name, mode in specs]
    return [replace(r, **changes.get(r.name, {})) for r in replicas]  # type: ignore[arg-type]


def routed(result: Route | Refusal) -> Route:
    assert isinstance(result, Route), result
    return result


# --- rule 1: class --------------------------------------------------------------------------

CLASS_CASES = [
    # (case, features, replicas, expected replica, expected reason, in preferred mode)
    ("streamed chat goes to the streaming replica", chat(True),
     pool(("s", S), ("b", B)), "s", Reason.LEAST_LOADED, True),
    ("non-streamed chat goes to the batching replica", chat(False),
     pool(("s", S), ("b", B)), "b", Reason.LEAST_LOADED, True),
    ("no streaming replica: streamed chats use all", chat(True),
     pool(("b1", B), ("b2", B), b1={"load": 2.0, "inflight": 2}), "b2", Reason.LEAST_FRESH,
     False),
    ("no batching replica: the rest use all", chat(False),
     pool(("s1", S), ("s2", S), s2={"load": 1.0, "inflight": 1}), "s1", Reason.LEAST_LOADED,
     False),
    ("unknown mode counts in 'all' only", chat(True),
     pool(("x", None), ("b", B), b={"load": 5.0, "inflight": 5}), "x", Reason.LEAST_FRESH,
     False),
    ("streaming replica at its chat cap: spill to the least-loaded other", chat(True),
     pool(("s", S), ("b1", B), ("b2", B), s=S_FULL,
          b1={"inflight": 3, "load": 3.0}, b2={"inflight": 1, "load": 1.0}),
     "b2", Reason.SPILLED, False),
    ("streaming replica past its cap of 8: a streamed chat still goes there", chat(True),
     pool(("s", S), ("b", B), s={"inflight": 8, "load": 8.0}), "s", Reason.LEAST_LOADED, True),
    ("streaming replica at its cap of 8: a spilled batch job finds it full", chat(False),
     pool(("s", S), ("b", B), s={"inflight": 8, "load": 8.0}, b={"inflight": 64, "load": 64.0}),
     "b", Reason.LEAST_LOADED, True),
    ("batching replica at its cap: spill to the streaming one", chat(False),
     pool(("s", S), ("b", B), b={"inflight": 64, "load": 64.0}), "s", Reason.SPILLED, False),
    ("one preferred replica at cap, another not: no spill", chat(True),
     pool(("s1", S), ("s2", S), ("b", B), s1=S_FULL), "s2", Reason.LEAST_LOADED, True),
]


@pytest.mark.parametrize(("case", "features", "replicas", "expected", "reason", "in_mode"),
                         CLASS_CASES, ids=[c[0] for c in CLASS_CASES])
def test_class_rule(case: str, features: RequestFeatures, replicas: list[ReplicaState],
                    expected: str, reason: Reason, in_mode: bool) -> None:
    route = routed(decide(features, replicas, CONFIG))
    assert (route.replica, route.reason, route.in_preferred_mode) == (expected, reason, in_mode)


def test_spill_off_keeps_the_class_in_its_mode() -> None:
    replicas = pool(("s", S), ("b", B), s=S_FULL)
    config = RoutingConfig(spill=False, shed=False)
    assert routed(decide(chat(True), replicas, config)).replica == "s"


# --- rule 1c: shed when every replica is at its cap -------------------------------------------

FULL = {"s": S_FULL, "b": {"inflight": 64, "load": 64.0}}
DOUBLE = {"s": {"inflight": 128, "load": 128.0}, "b": {"inflight": 128, "load": 128.0}}
SHED_CASES = [
    # (case, features, replicas, config, expected: a replica name or 429)
    ("every replica at its cap: a streamed chat gets 429", chat(True),
     pool(("s", S), ("b", B), **FULL), CONFIG, 429),
    ("every replica at its cap, with a session key: 429", chat(True, "s:a"),
     pool(("s", S), ("b", B), **FULL), CONFIG, 429),
    ("single-mode pool, all at cap: a streamed chat gets 429", chat(True),
     pool(("b1", B), ("b2", B), b1=FULL["b"], b2=FULL["b"]), CONFIG, 429),
    ("every replica at its cap: a batch job still queues in its mode", chat(False),
     pool(("s", S), ("b", B), **FULL), CONFIG, "b"),
    ("batching replicas at twice their cap: a batch job gets 429", chat(False),
     pool(("s", S), ("b", B), **DOUBLE), CONFIG, 429),
    ("batch job: only the replicas of its pool count, not an idle-looking other mode",
     chat(False), pool(("s", S), ("b", B), s=FULL["s"], b=DOUBLE["b"]), CONFIG, 429),
    ("other_overflow 0: a batch job is shed at the cap", chat(False),
     pool(("s", S), ("b", B), **FULL), RoutingConfig(other_overflow=0.0), 429),
    ("one replica of the other mode under its cap: spill, no shed", chat(True),
     pool(("s", S), ("b", B), s=FULL["s"], b={"inflight": 63, "load": 63.0}), CONFIG, "b"),
    ("a replica of unknown mode has no cap: no shed", chat(True),
     pool(("s", S), ("x", None), s=FULL["s"], x={"inflight": 500, "load": 500.0}), CONFIG,
     "x"),
    ("shedding off: wait in the preferred mode's queue", chat(True),
     pool(("s", S), ("b", B), **FULL), RoutingConfig(shed=False), "s"),
    ("spill off, its mode full: 429 though the other mode has room", chat(True),
     pool(("s", S), ("b", B), s=FULL["s"]), RoutingConfig(spill=False), 429),
]


@pytest.mark.parametrize(("case", "features", "replicas", "config", "expected"),
                         SHED_CASES, ids=[c[0] for c in SHED_CASES])
def test_shed_rule(case: str, features: RequestFeatures, replicas: list[ReplicaState],
                   config: RoutingConfig, expected: str | int) -> None:
    result = decide(features, replicas, config)
    if isinstance(expected, int):
        assert isinstance(result, Refusal), result
        assert (result.status, result.reason) == (expected, "overloaded")
    else:
        assert routed(result).replica == expected


def test_caps_come_from_the_config() -> None:
    replicas = pool(("s", S), ("b", B), s={"inflight": 2, "load": 2.0})
    assert routed(decide(chat(True), replicas, RoutingConfig(chat_caps={S: 2, B: 64}))).reason \
        is Reason.SPILLED
    # The cap of 2 counts for other work; a streamed chat still has the default chat cap.
    config = RoutingConfig(caps={S: 2, B: 64})
    assert routed(decide(chat(False), replicas, config)).replica == "b"
    assert routed(decide(chat(True), replicas, config)).replica == "s"


def test_the_router_counts_a_replica_full_where_its_admission_queues() -> None:
    """The default caps are the middleware's rule (ModeProfile.admission_cap) at the defaults:
    a replica the router counts as having room admits the request without a queue."""
    from autoglm_api.profiles import ModeProfiles
    from autoglm_runtime.admission import AdmissionQueue
    from autoglm_runtime.requests import DEFAULT_PRIORITY, STREAM_PRIORITY

    profiles = ModeProfiles()
    for mode in (S, B):
        for stream, priority in ((True, STREAM_PRIORITY), (False, DEFAULT_PRIORITY)):
            queue: AdmissionQueue[None] = AdmissionQueue(
                profiles.for_mode(mode), clock=lambda: 0.0,
                engine_max_seqs=profiles.envelope_max_num_seqs)
            admitted = 0
            while queue.try_admit(priority):
                admitted += 1
            full = pool(("r", mode), r={"inflight": admitted, "load": float(admitted)})
            below = pool(("r", mode), r={"inflight": admitted - 1})
            assert not has_room(full[0], chat(stream), CONFIG), (mode, stream, admitted)
            assert has_room(below[0], chat(stream), CONFIG), (mode, stream, admitted)


# --- rule 2: sessions (consistent hashing with bounded loads) -------------------------------

def homes(keys: Sequence[str], replicas: list[ReplicaState], stream: bool = False,
          config: RoutingConfig = CONFIG) -> dict[str, str]:
    return {k: routed(decide(chat(stream, k), replicas, config)).replica for k in keys}


KEYS = [f"s:session-{i}" for i in range(2000)]


def test_a_session_keeps_its_replica_and_keys_spread_evenly() -> None:
    replicas = pool(*((f"r{i}", B) for i in range(4)))
    first = homes(KEYS, replicas)
    assert homes(KEYS, replicas) == first
    shares = [list(first.values()).count(f"r{i}") / len(KEYS) for i in range(4)]
    assert all(0.15 < share < 0.35 for share in shares), shares  # fair share is 0.25


def test_scale_up_moves_only_sessions_to_the_new_replica() -> None:
    before = homes(KEYS, pool(*((f"r{i}", B) for i in range(4))))
    after = homes(KEYS, pool(*((f"r{i}", B) for i in range(5))))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(after[k] == "r4" for k in moved)
    assert 0.1 < len(moved) / len(KEYS) < 0.3  # about 1/5


def test_scale_down_moves_only_the_removed_replicas_sessions() -> None:
    before = homes(KEYS, pool(*((f"r{i}", B) for i in range(4))))
    after = homes(KEYS, pool(("r0", B), ("r1", B), ("r3", B)))
    assert [k for k in KEYS if before[k] != after[k]] == [
        k for k in KEYS if before[k] == "r2"]


def test_a_flip_moves_only_the_sessions_of_the_flipped_replica() -> None:
    batching = pool(("b0", B), ("b1", B), ("b2", B), ("s0", S), ("s1", S))
    flipped = [replace(r, mode=S) if r.name == "b2" else r for r in batching]
    # Non-streamed turns: b2 left the batching ring; only its sessions move.
    before, after = homes(KEYS, batching), homes(KEYS, flipped)
    assert {k for k in KEYS if before[k] != after[k]} == {k for k in KEYS if before[k] == "b2"}
    # Streamed turns: b2 joined the streaming ring; the sessions that move all move to it.
    before, after = homes(KEYS, batching, stream=True), homes(KEYS, flipped, stream=True)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(after[k] == "b2" for k in moved)


def test_a_session_mixing_streamed_and_plain_turns_has_one_home_per_class() -> None:
    replicas = pool(("s0", S), ("s1", S), ("b0", B), ("b1", B))
    streamed, plain = homes(KEYS, replicas, stream=True), homes(KEYS, replicas)
    assert homes(KEYS, replicas, stream=True) == streamed and homes(KEYS, replicas) == plain
    assert {streamed[k][0] for k in KEYS} == {"s"} and {plain[k][0] for k in KEYS} == {"b"}


def test_a_session_over_the_load_bound_goes_to_the_next_on_the_ring() -> None:
    replicas = pool(("r0", B), ("r1", B), ("r2", B))
    home = routed(decide(chat(False, "s:x"), replicas, CONFIG)).replica
    # 3 requests on its home, none elsewhere: (3 + 1) > 1.25 * (3 + 1) / 3
    loaded = [replace(r, inflight=3, load=3.0) if r.name == home else r for r in replicas]
    route = routed(decide(chat(False, "s:x"), loaded, CONFIG))
    assert route.replica != home and route.reason is Reason.BOUNDED
    # A looser bound keeps it home: 4 <= 3.0 * 4 / 3
    assert routed(decide(chat(False, "s:x"), loaded, RoutingConfig(load_factor=3.0))).replica \
        == home


def test_a_session_key_gets_one_request_of_slack_over_the_bound() -> None:
    """A conversation has one turn in flight at a time, so its home stays while its load is
    within 1.25 x the mean plus one request; without the slack, at two requests per replica,
    half of a conversation's turns moved (each a cache miss). A shared prefix gets none."""
    replicas = pool(*((f"r{i}", S) for i in range(4)))
    home = routed(decide(chat(True, "s:z", cost=2.0), replicas, CONFIG)).replica

    def loaded(home_load: float) -> list[ReplicaState]:
        rest = iter((2.0, 2.0, 0.0))
        return [replace(r, load=home_load if r.name == home else next(rest)) for r in replicas]

    # Home 2, others 2, 2, 0: bound 1.25 x (6 + 2) / 4 = 2.5, + 2 of slack; 2 + 2 fits.
    stays = routed(decide(chat(True, "s:z", cost=2.0), loaded(2.0), CONFIG))
    assert stays.replica == home and stays.reason is Reason.HASHED
    # The same key as a prefix: 4 > 2.5, moved on.
    prefix = routed(decide(chat(True, "s:z", 2.0, KeyKind.PREFIX), loaded(2.0), CONFIG))
    assert prefix.replica != home and prefix.reason is Reason.BOUNDED
    # Home 4: 4 + 2 > 1.25 x (8 + 2) / 4 + 2 = 5.125, moved on.
    moved = routed(decide(chat(True, "s:z", cost=2.0), loaded(4.0), CONFIG))
    assert moved.replica != home and moved.reason is Reason.BOUNDED


def test_a_known_session_stays_where_this_router_last_sent_it() -> None:
    """The placement wins over the ring: the session's cache is there, wherever it hashes."""
    replicas = pool(*((f"r{i}", S) for i in range(4)))
    home = routed(decide(chat(True, "s:k"), replicas, CONFIG)).replica
    placed = next(r.name for r in replicas if r.name != home)
    route = routed(decide(chat(True, "s:k"), replicas, CONFIG, placed=placed))
    assert (route.replica, route.reason) == (placed, Reason.PLACED)
    # Over the bound plus its slack (3 + 1 > 1.25 x (3 + 1) / 4 + 1): back to the ring.
    busy = [replace(r, load=3.0, inflight=3) if r.name == placed else r for r in replicas]
    moved = routed(decide(chat(True, "s:k"), busy, CONFIG, placed=placed))
    assert moved.replica != placed and moved.reason is Reason.HASHED
    # Its replica left the pool (flipped, drained or gone): the ring, as with no placement.
    flipped = [replace(r, mode=B) if r.name == placed else r for r in replicas]
    assert routed(decide(chat(True, "s:k"), flipped, CONFIG, placed=placed)).replica == home


def test_a_placed_turn_weighs_at_home_only_its_uncached_prefill() -> None:
    """A later turn's home holds most of its prompt in the prefix cache, so the turn adds
    there only what it must still prefill; it stays home where its full cost would move it."""
    replicas = pool(*((f"r{i}", S) for i in range(4)))
    busy = [replace(r, load=6.0 if r.name == "r0" else 1.0) for r in replicas]
    full = chat(True, "s:h", cost=4.0)
    # 6 + 4 > 1.25 x (9 + 4) / 4, at least 1 + 4, + 4 of slack = 9: moved off its cache.
    assert routed(decide(full, busy, CONFIG, placed="r0")).replica != "r0"
    # 3 of its 4 units cached at home: 6 + 1 <= 1.25 x (9 + 1) / 4 + 4 = 7.125, it stays.
    cached = replace(full, cached_tokens=3 * 1024)
    route = routed(decide(cached, busy, CONFIG, placed="r0"))
    assert (route.replica, route.reason) == ("r0", Reason.PLACED)
    assert charged_cost(cached, route) == pytest.approx(1.0)
    # Anywhere else it pays its whole prefill.
    elsewhere = routed(decide(cached, busy, CONFIG, placed="gone"))
    assert charged_cost(cached, elsewhere) == 4.0


def test_a_new_conversation_is_placed_by_recent_load_under_the_strict_bound() -> None:
    """A first turn has no cache to lose: placed by load, it stays there (the test above).
    The load is the recent average: conversations between turns have nothing in flight."""
    replicas = pool(*((f"r{i}", S) for i in range(4)))
    home = routed(decide(chat(True, "s:n"), replicas, CONFIG)).replica
    rest = iter((2.0, 2.0, 0.0))
    lately = [replace(r, recent_load=2.0 if r.name == home else next(rest)) for r in replicas]
    # Recently home 2, others 2, 2, 0: 2 + 1 > 1.25 x (6 + 1) / 4, so it moves on.
    first = replace(chat(True, "s:n"), new_conversation=True)
    new = routed(decide(first, lately, CONFIG))
    assert new.replica != home and new.reason is Reason.BOUNDED
    # The same loads in flight now: a later turn this router has not seen (another router
    # placed it) is placed by them, with the slack, and stays home.
    loaded = [replace(r, load=r.recent_load) for r in lately]
    assert routed(decide(chat(True, "s:n"), loaded, CONFIG)).replica == home


def test_the_book_averages_in_flight_cost_over_recent_seconds() -> None:
    now = [0.0]
    book = LoadBook(router_metrics(), clock=lambda: now[0], average_seconds=10.0)
    with book.open("r", 2.0):
        now[0] = 10.0
        assert book.recent_cost("r") == pytest.approx(2.0 * (1 - math.exp(-1)))
    now[0] = 20.0  # 10 s idle after it closed
    assert book.recent_cost("r") == pytest.approx(2.0 * (1 - math.exp(-1)) * math.exp(-1))
    assert book.recent_cost("never-used") == 0.0


def test_bounded_loads_keep_every_replica_near_the_mean() -> None:
    """Hot keys pile up without the bound; with it no replica passes 1.25 x the mean + 1."""
    replicas = pool(*((f"r{i}", B) for i in range(4)))
    for i in range(200):
        key = f"s:hot-{i % 3}"  # three sessions carry all the traffic
        name = routed(decide(chat(False, key), replicas, CONFIG)).replica
        replicas = [replace(r, inflight=r.inflight + 1, load=r.load + 1.0)
                    if r.name == name else r for r in replicas]
    loads = [r.load for r in replicas]
    mean = sum(loads) / len(loads)
    assert max(loads) <= 1.25 * mean + 1, loads


def test_an_idle_pool_always_sends_a_key_home() -> None:
    replicas = pool(("r0", B), ("r1", B))
    route = routed(decide(chat(False, "s:y", cost=50.0), replicas, CONFIG))
    assert route.reason is Reason.HASHED


# --- rule 3: prefix keys hash like session keys ---------------------------------------------

def test_prefix_keys_use_the_same_ring() -> None:
    replicas = pool(*((f"r{i}", B) for i in range(4)))
    as_session = routed(decide(chat(False, "p:abc"), replicas, CONFIG)).replica
    as_prefix = routed(decide(chat(False, "p:abc", kind=KeyKind.PREFIX), replicas, CONFIG))
    assert as_prefix.replica == as_session and as_prefix.reason is Reason.HASHED


# --- rule 1d: with no streaming replica, chats go where the least prefill is ahead -----------

def test_no_streaming_replica_a_chat_goes_to_the_replica_sent_the_fewest_recent_requests() -> None:
    # b1 holds more requests, but they are decoding; b2 was just sent four whose prefill a new
    # chat's first token would wait behind.
    replicas = pool(("b1", B), ("b2", B), b1={"inflight": 10, "load": 20.0, "fresh": 1},
                    b2={"inflight": 4, "load": 8.0, "fresh": 4})
    route = routed(decide(chat(True), replicas, CONFIG))
    assert (route.replica, route.reason) == ("b1", Reason.LEAST_FRESH)
    # Other work still goes to the least-loaded replica.
    assert routed(decide(chat(False), replicas, CONFIG)).replica == "b2"


def test_least_fresh_ties_go_to_the_least_loaded() -> None:
    replicas = pool(("b1", B), ("b2", B), b1={"inflight": 3, "load": 6.0, "fresh": 2},
                    b2={"inflight": 2, "load": 4.0, "fresh": 2})
    assert routed(decide(chat(True), replicas, CONFIG)).replica == "b2"


def test_with_a_streaming_replica_chats_ignore_recent_requests() -> None:
    # A streaming replica serves chats first with few sequences: rule 1 as before, and spill
    # from a full one goes to the least-loaded other replica.
    replicas = pool(("s", S), ("b", B), s={"inflight": 3, "load": 3.0, "fresh": 3})
    assert routed(decide(chat(True), replicas, CONFIG)).replica == "s"
    full = pool(("s", S), ("b1", B), ("b2", B), s=S_FULL,
                b1={"inflight": 1, "load": 1.0, "fresh": 5}, b2={"inflight": 6, "load": 6.0})
    route = routed(decide(chat(True), full, CONFIG))
    assert (route.replica, route.reason) == ("b1", Reason.SPILLED)


def test_a_keyed_chat_keeps_its_home_with_no_streaming_replica() -> None:
    replicas = pool(*((f"b{i}", B) for i in range(4)))
    home = routed(decide(chat(True, "conv-1"), replicas, CONFIG)).replica
    busy = [replace(r, fresh=3) if r.name == home else r for r in replicas]
    assert routed(decide(chat(True, "conv-1"), busy, CONFIG)).replica == home


def test_the_book_counts_requests_sent_within_the_window() -> None:
    now = [100.0]
    book = LoadBook(router_metrics(), clock=lambda: now[0])
    for _ in range(3):
        with book.open("r", 1.0):
            pass
    now[0] = 100.4
    with book.open("r", 1.0):
        assert book.fresh("r", 0.5) == 4  # the open one counts from when it was sent
    now[0] = 100.6
    assert book.fresh("r", 0.5) == 1  # the first three are older than 0.5 s
    assert book.fresh("other", 0.5) == 0


# --- rule 4: load is weighed by cost --------------------------------------------------------

def test_least_loaded_weighs_cost_not_count() -> None:
    # a: one screenshot request (cost 2); b: two short text requests (cost 1.1 each).
    replicas = pool(("a", B), ("b", B), a={"inflight": 1, "load": 2.0},
                    b={"inflight": 2, "load": 2.2})
    assert routed(decide(chat(False), replicas, CONFIG)).replica == "a"
    cheaper = [replace(r, load=1.9) if r.name == "b" else r for r in replicas]
    assert routed(decide(chat(False), cheaper, CONFIG)).replica == "b"


def test_a_burst_of_screenshots_on_one_prefix_spreads() -> None:
    replicas = pool(*((f"r{i}", B) for i in range(4)))
    used = set()
    for _ in range(8):
        name = routed(decide(chat(False, "p:same", cost=2.0, kind=KeyKind.PREFIX),
                             replicas, CONFIG)).replica
        used.add(name)
        replicas = [replace(r, inflight=r.inflight + 1, load=r.load + 2.0)
                    if r.name == name else r for r in replicas]
    assert len(used) == 4
    assert max(r.load for r in replicas) <= 4.0


# --- rule 5: draining and failures ----------------------------------------------------------

def test_draining_and_unready_replicas_leave_the_ring_at_once() -> None:
    replicas = pool(*((f"r{i}", B) for i in range(4)))
    before = homes(KEYS, replicas)
    gone = [replace(r, draining=True) if r.name == "r1" else
            replace(r, ready=False) if r.name == "r3" else r for r in replicas]
    after = homes(KEYS, gone)
    assert set(after.values()) == {"r0", "r2"}
    assert all(after[k] == before[k] for k in KEYS if before[k] in ("r0", "r2"))


def test_no_replica_left_is_a_refusal() -> None:
    replicas = pool(("r0", B), ("r1", S), r0={"draining": True}, r1={"ready": False})
    refusal = decide(chat(True), replicas, CONFIG)
    assert isinstance(refusal, Refusal) and refusal.status == 503


# --- sleeping replicas (scale to zero) -------------------------------------------------------

ASLEEP = {"asleep": True}
SLEEP_CASES = [
    # (case, features, replicas, expected replica, expected reason)
    ("an awake replica takes it, though the sleeping one is idle and of its mode", chat(True),
     pool(("s", S), ("b", B), s=ASLEEP, b={"inflight": 30, "load": 30.0}), "b",
     Reason.LEAST_FRESH),
    ("an awake replica takes a keyed chat whose ring home sleeps", chat(True, "s:a"),
     pool(("s1", S), ("s2", S), s1=ASLEEP), "s2", Reason.HASHED),
    ("every replica asleep: the first by name wakes, whatever its load", chat(True),
     pool(("s2", S), ("b1", B), ("s1", S), s2=ASLEEP, b1={**ASLEEP, "inflight": 99},
          s1=ASLEEP), "b1", Reason.WAKING),
    ("every replica asleep: batch work wakes the same one", chat(False, "s:z"),
     pool(("s2", S), ("b1", B), ("s1", S), s2=ASLEEP, b1=ASLEEP, s1=ASLEEP), "b1",
     Reason.WAKING),
    ("a sleeping replica not ready does not count", chat(True),
     pool(("a", S), ("b", S), a={**ASLEEP, "ready": False}, b=ASLEEP), "b", Reason.WAKING),
    ("the only awake replica full: shed, no sleeping one woken", chat(True),
     pool(("a", S), ("b", S), a=ASLEEP, b=S_FULL), None, None),
]


@pytest.mark.parametrize(("case", "features", "replicas", "expected", "reason"), SLEEP_CASES,
                         ids=[c[0] for c in SLEEP_CASES])
def test_sleeping_replicas_take_requests_only_when_none_is_awake(
        case: str, features: RequestFeatures, replicas: list[ReplicaState],
        expected: str | None, reason: Reason | None) -> None:
    result = decide(features, replicas, CONFIG)
    if expected is None:
        assert isinstance(result, Refusal) and result.status == 429, result
        return
    assert (routed(result).replica, routed(result).reason) == (expected, reason)


def test_when_the_waking_replica_fails_to_connect_the_retry_wakes_the_next_by_name() -> None:
    replicas = pool(("r1", B), ("r0", B), ("r2", B), r0=ASLEEP, r1=ASLEEP, r2=ASLEEP)
    route = retry_route(Failure.CONNECT_ERROR, chat(True), replicas, CONFIG, ["r0"])
    assert route is not None and (route.replica, route.reason) == ("r1", Reason.WAKING)


RETRY_CASES = [
    # (case, failure, replicas, tried, expected replica or None)
    ("connect error: once more, elsewhere", Failure.CONNECT_ERROR,
     pool(("b0", B), ("b1", B)), ["b0"], "b1"),
    ("draining 503: once more, elsewhere", Failure.DRAINING,
     pool(("b0", B), ("s0", S)), ["b0"], "s0"),
    ("a second failure goes back to the client", Failure.CONNECT_ERROR,
     pool(("b0", B), ("b1", B), ("b2", B)), ["b0", "b1"], None),
    ("connect error with no other replica", Failure.CONNECT_ERROR,
     pool(("b0", B)), ["b0"], None),
    ("429: elsewhere when another replica has room", Failure.QUEUE_FULL,
     pool(("b0", B), ("b1", B), b1={"inflight": 3, "load": 3.0}), ["b0"], "b1"),
    ("429: back to the client when no other replica has room", Failure.QUEUE_FULL,
     pool(("b0", B), ("s0", S), s0={"inflight": 8, "load": 8.0}), ["b0"], None),
]


@pytest.mark.parametrize(("case", "failure", "replicas", "tried", "expected"), RETRY_CASES,
                         ids=[c[0] for c in RETRY_CASES])
def test_what_is_retried(case: str, failure: Failure, replicas: list[ReplicaState],
                         tried: list[str], expected: str | None) -> None:
    route = retry_route(failure, chat(False, "s:r"), replicas, CONFIG, tried)
    assert (route.replica if route else None) == expected


def test_config_rejects_a_load_factor_below_one() -> None:
    with pytest.raises(ValueError, match="load_factor"):
        RoutingConfig(load_factor=0.9)


def test_config_rejects_a_fresh_window_of_zero() -> None:
    with pytest.raises(ValueError, match="fresh_seconds"):
        RoutingConfig(fresh_seconds=0.0)


def test_config_rejects_a_negative_other_overflow() -> None:
    with pytest.raises(ValueError, match="other_overflow"):
        RoutingConfig(other_overflow=-0.5)


def test_a_conversation_key_spreads_first_turns_and_keeps_later_turns_where_they_went() -> None:
    """The official agent sends no session id: its conversation key (system prompt and task)
    places a first turn as a burst of one prefix would be, then keeps the conversation there."""
    replicas = pool(*((f"r{i}", S) for i in range(4)))

    def turn(new: bool) -> RequestFeatures:
        return RequestFeatures(TrafficClass.STREAMED_CHAT, "p:task", KeyKind.CONVERSATION, 1.0,
                               new_conversation=new)

    home = routed(decide(turn(True), replicas, CONFIG)).replica
    placed = next(r.name for r in replicas if r.name != home)
    # A first turn ignores where an earlier conversation of the same task went.
    assert routed(decide(turn(True), replicas, CONFIG, placed=placed)).replica == home
    # A later turn goes back where its conversation was, as a session's does.
    later = routed(decide(turn(False), replicas, CONFIG, placed=placed))
    assert (later.replica, later.reason) == (placed, Reason.PLACED)


def test_first_turns_of_one_task_spread_at_once() -> None:
    """An evaluation may start one task many times at once: one key, no history."""
    replicas = pool(*((f"r{i}", S) for i in range(4)))
    first = RequestFeatures(TrafficClass.STREAMED_CHAT, "p:same-task", KeyKind.CONVERSATION,
                            2.0, new_conversation=True)
    used = set()
    for _ in range(8):
        name = routed(decide(first, replicas, CONFIG)).replica
        used.add(name)
        replicas = [replace(r, inflight=r.inflight + 1, load=r.load + 2.0)
                    if r.name == name else r for r in replicas]
    assert len(used) == 4
    assert max(r.load for r in replicas) <= 4.0
