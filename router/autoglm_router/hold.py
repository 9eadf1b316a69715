"""The hold queue: a request that finds no replica waits for one, within bounds (scale to zero).

At zero replicas, or while the first pod loads its model, a request refused at once fails a
client that a replica could serve a minute later. Held, it waits instead: at most `size`
requests at once, at most `per_client` of one client (so one cannot fill the queue), and each
at most `seconds`; past a bound it is answered 503 with Retry-After, never left hanging.
While anything is held the proxy checks the pool every
CHECK_SECONDS and releases what the pool takes: streamed chats first (a person watches each),
then in arrival order, each charged to its replica before the next is placed, so a wake
releases what the replicas admit and the rest waits for room instead of being shed with 429.

Pure but for asyncio's Event, each waiter's wakeup; the clocks are injected.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from autoglm_router.features import RequestFeatures, TrafficClass
from autoglm_router.routing import (
    NO_REPLICA,
    Refusal,
    ReplicaState,
    RoutingConfig,
    charged_cost,
    decide,
)

# How often the pool is checked while anything is held: a replica that discovery shows is
# used within this, on top of discovery's own delay.
CHECK_SECONDS = 0.05


# A request a replica answered 429 at its release waits this long before the next try, so the
# queue does not hand it straight back to a replica that is full.
RETRY_AFTER_FULL_SECONDS = 1.0


class Outcome(StrEnum):
    RELEASED = "released"  # the pool takes it now: route it
    TIMEOUT = "timeout"  # held as long as it may be


class Overflow(StrEnum):
    """Why a request was not held (autoglm_router_hold_overflows_total's reason)."""

    FULL = "full"
    CLIENT = "client_full"  # its client holds its share already


@dataclass(eq=False)
class Ticket:
    """One held request."""

    features: RequestFeatures
    client: str  # who sent it: its share of the queue is bounded
    since: float  # the queue's clock when it arrived
    order: int  # arrival
    outcome: Outcome | None = None
    not_before: float = 0.0  # not released before this (the queue's clock)
    _woken: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def streamed(self) -> bool:
        return self.features.traffic_class is TrafficClass.STREAMED_CHAT

    async def wait(self) -> Outcome:
        await self._woken.wait()
        assert self.outcome is not None
        return self.outcome

    def _finish(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self._woken.set()


class HoldQueue:
    """The requests held now; `size` 0 holds none (holding off)."""

    def __init__(self, size: int, seconds: float, per_client: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.seconds = seconds
        self.per_client = max(1, size // 4) if per_client is None else per_client
        self._clock = clock
        self._held: dict[int, Ticket] = {}
        self._by_client: dict[str, int] = {}
        self._arrivals = itertools.count()
        self._cut_off: float | None = None

    def __len__(self) -> int:
        return len(self._held)

    def join(self, features: RequestFeatures, client: str) -> Ticket | Overflow:
        """Hold a request; or why not."""
        if len(self._held) >= self.size:
            return Overflow.FULL
        if self._by_client.get(client, 0) >= self.per_client:
            return Overflow.CLIENT
        ticket = Ticket(features, client, self._clock(), next(self._arrivals))
        self._add(ticket)
        return ticket

    def rejoin(self, ticket: Ticket, wait: float = 0.0) -> None:
        """Back to its place and its deadline, not released for `wait` seconds: released, it
        found the pool taken meanwhile, or its replica was not serving yet or full."""
        ticket.outcome = None
        ticket.not_before = self._clock() + wait
        ticket._woken.clear()
        self._add(ticket)

    def _add(self, ticket: Ticket) -> None:
        if ticket.order not in self._held:
            self._held[ticket.order] = ticket
            self._by_client[ticket.client] = self._by_client.get(ticket.client, 0) + 1

    def leave(self, ticket: Ticket) -> None:
        """Out of the queue (released, expired, or its client gone); once or more."""
        if self._held.pop(ticket.order, None) is None:
            return
        left = self._by_client[ticket.client] - 1
        if left:
            self._by_client[ticket.client] = left
        else:
            del self._by_client[ticket.client]

    def waited(self, ticket: Ticket) -> float:
        return self._clock() - ticket.since

    def arrivals(self) -> list[float]:
        """When each request held now arrived, on the queue's clock."""
        return [t.since for t in self._held.values()]

    def cut_off(self, at: float) -> None:
        """Nothing waits past `at` on the queue's clock (the end of a drain)."""
        self._cut_off = at

    def deadline(self, ticket: Ticket) -> float:
        deadline = ticket.since + self.seconds
        return deadline if self._cut_off is None else min(deadline, self._cut_off)

    def in_order(self) -> list[Ticket]:
        """Streamed chats first, each group in arrival order."""
        return sorted(self._held.values(), key=lambda t: (not t.streamed, t.order))

    def expire(self) -> list[Ticket]:
        """Wake, as timed out, every request held to its deadline."""
        now = self._clock()
        expired = [t for t in self.in_order() if now >= self.deadline(t)]
        for ticket in expired:
            self.leave(ticket)
            ticket._finish(Outcome.TIMEOUT)
        return expired

    def release(self, pool: Sequence[ReplicaState], config: RoutingConfig,
                placed: Callable[[RequestFeatures], str | None]) -> list[Ticket]:
        """Wake, as released, the requests `pool` takes now (see `releasable`)."""
        now = self._clock()
        ready = [t for t in self.in_order() if t.not_before <= now]
        released = releasable(ready, pool, config, placed)
        for ticket in released:
            self.leave(ticket)
            ticket._finish(Outcome.RELEASED)
        return released


def releasable(tickets: Sequence[Ticket], pool: Sequence[ReplicaState], config: RoutingConfig,
               placed: Callable[[RequestFeatures], str | None]) -> list[Ticket]:
    """Of `tickets`, in their order, those the pool takes now: each is placed as `decide`
    places it and charged to that replica before the next is, so no more are released than
    the replicas admit; one refused for want of room stays held, and one behind it that fits
    (a non-streamed request may queue past the caps) goes."""
    states = list(pool)
    released = []
    for ticket in tickets:
        route = decide(ticket.features, states, config, placed=placed(ticket.features))
        if isinstance(route, Refusal):
            if route.reason == NO_REPLICA:
                break
            continue
        released.append(ticket)
        cost, fanout = charged_cost(ticket.features, route), ticket.features.fanout
        states = [replace(r, inflight=r.inflight + fanout, load=r.load + cost,
                          fresh=r.fresh + 1, recent_load=r.recent_load + cost)
                  if r.name == route.replica else r for r in states]
    return released
