"""The live admission policy of a replica: a concurrency cap, a bounded wait queue, a batch window.

Everything runs on the server's event loop, so plain counters are safe without locks. Changing
the profile never touches admitted requests: a lower cap only slows new admissions.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autoglm_runtime.profiles import ModeProfile


class Rejected(Exception):
    """A request the policy turns away; carries the HTTP answer."""

    status = 503
    reason = "rejected"

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class QueueFull(Rejected):
    status = 429
    reason = "queue_full"


class QueueTimeout(Rejected):
    status = 503
    reason = "queue_timeout"


class Draining(Rejected):
    status = 503
    reason = "draining"


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    future: asyncio.Future[None] = field(compare=False)
    slots: int = field(default=1, compare=False)


@dataclass
class Ticket:
    """Proof of admission; hand it back with `release` exactly once."""

    admitted_at: float
    waited_seconds: float
    released: bool = False
    slots: int = 1  # a request's sequences (its `n`): each is one engine sequence


class AdmissionController:
    # Weight of the newest sample in the service-time average behind Retry-After.
    _EWMA = 0.2

    def __init__(self, profile: ModeProfile, clock: Callable[[], float] = time.monotonic) -> None:
        self._profile = profile
        self._clock = clock
        self._heap: list[_Waiter] = []
        self._seq = itertools.count()
        self._group: list[asyncio.Future[None]] = []
        self._group_timer: asyncio.TimerHandle | None = None
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._service_seconds = 1.0
        self.inflight = 0
        self.queued = 0
        self.draining = False

    @property
    def profile(self) -> ModeProfile:
        return self._profile

    def set_profile(self, profile: ModeProfile) -> None:
        self._profile = profile
        if profile.batch_window_millis == 0 or len(self._group) >= profile.batch_size:
            self._release_group()
        self._wake()

    def start_draining(self) -> None:
        self.draining = True

    def has_free_slot(self, slots: int = 1) -> bool:
        return self.inflight + slots <= self._profile.max_concurrency and self.queued == 0

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead drained at the cap's pace."""
        p = self._profile
        estimate = (self.queued + 1) * self._service_seconds / p.max_concurrency
        return max(1, min(p.queue_timeout_seconds, math.ceil(estimate)))

    async def acquire(self, priority: int = 0, slots: int = 1) -> Ticket:
        """Wait for `slots` slots (lower priority value first, FIFO within one value)."""
        if self.draining:
            raise Draining("the replica is draining; retry on another replica", retry_after=1)
        start = self._clock()
        p = self._profile
        if self.inflight + slots <= p.max_concurrency and self.queued == 0:
            self.inflight += slots
        else:
            if self.queued >= p.max_queue:
                raise QueueFull(
                    f"the wait queue is full ({p.max_queue} requests)",
                    retry_after=self.retry_after(),
                )
            await self._wait_in_queue(priority, p.queue_timeout_seconds, slots)
        ticket = Ticket(admitted_at=self._clock(), waited_seconds=self._clock() - start,
                        slots=slots)
        try:
            await self._hold_for_batch()
        except BaseException:
            self.release(ticket)
            raise
        return ticket

    async def _wait_in_queue(self, priority: int, timeout: float, slots: int) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, _Waiter(priority, next(self._seq), future, slots))
        self.queued += 1
        try:
            async with asyncio.timeout(timeout):
                await future
        except BaseException as exc:
            if future.done() and not future.cancelled():
                # The slot arrived in the same tick as the timeout or cancel: give it back.
                self.inflight -= slots
                self._wake()
                self._notify_idle()
            else:
                future.cancel()
                self.queued -= 1
                self._notify_idle()
            if isinstance(exc, TimeoutError):
                raise QueueTimeout(
                    f"no slot became free within {timeout:g} s", retry_after=1
                ) from None
            raise

    async def _hold_for_batch(self) -> None:
        p = self._profile
        if p.batch_window_millis == 0 or p.batch_size <= 1:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._group.append(future)
        if len(self._group) >= p.batch_size:
            self._release_group()
        elif self._group_timer is None:
            self._group_timer = loop.call_later(p.batch_window_millis / 1000, self._release_group)
        try:
            await future
        except BaseException:
            if future in self._group:
                self._group.remove(future)
            raise

    def _release_group(self) -> None:
        if self._group_timer is not None:
            self._group_timer.cancel()
            self._group_timer = None
        group, self._group = self._group, []
        for future in group:
            if not future.done():
                future.set_result(None)

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        self.inflight -= ticket.slots
        served = self._clock() - ticket.admitted_at
        self._service_seconds += self._EWMA * (served - self._service_seconds)
        self._wake()
        self._notify_idle()

    def _wake(self) -> None:
        while self._heap:
            waiter = self._heap[0]
            if waiter.future.done():
                heapq.heappop(self._heap)
                continue  # timed out or cancelled; already uncounted
            # The first in line waits for all its slots: nothing behind it jumps ahead.
            if self.inflight + waiter.slots > self._profile.max_concurrency:
                break
            heapq.heappop(self._heap)
            self.queued -= 1
            self.inflight += waiter.slots
            waiter.future.set_result(None)

    def _notify_idle(self) -> None:
        if self.inflight == 0 and self.queued == 0:
            waiters, self._idle_waiters = self._idle_waiters, []
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """True once nothing is admitted or waiting; False if `timeout` passed first."""
        if self.inflight == 0 and self.queued == 0:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(future)
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            return False
        return True
