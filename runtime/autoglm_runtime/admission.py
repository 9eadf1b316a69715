"""The live admission policy of a replica: a concurrency cap, a bounded wait queue, a batch window.

A profile that puts streams first (`prioritize_streams`) caps only what other requests fill:
streamed chats are bounded by the engine's own sequence limit, and vLLM's priority scheduler
starts them ahead of the rest. Held behind the cap, a chat would wait in front of an engine with
room for it (measured on the real engine: docs/benchmarks/engine_modes.md).

`AdmissionQueue` and `BatchWindow` are the rule itself, with no event loop and time from a
clock parameter; `AdmissionController` runs them on the server's event loop with futures. The
policy benchmark's replicas run the same two classes in fast-forwarded time. Everything runs on
one event loop, so plain counters are safe without locks. Changing the profile never touches
admitted requests: a lower cap only slows new admissions.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from autoglm_api.profiles import ModeProfile
from autoglm_runtime.requests import STREAM_PRIORITY

T = TypeVar("T")


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


@dataclass(order=True, slots=True)
class Waiter(Generic[T]):
    """One request waiting for slots: lower priority value first, FIFO within one value."""

    priority: int
    seq: int
    item: T = field(compare=False)
    slots: int = field(default=1, compare=False)
    since: float = field(default=0.0, compare=False)
    timeout: float = field(default=math.inf, compare=False)
    gone: bool = field(default=False, compare=False)  # admitted, timed out or withdrawn


@dataclass
class Woken(Generic[T]):
    """What freed slots did to the queue: the requests admitted and those past their timeout."""

    admitted: list[T] = field(default_factory=list)
    timed_out: list[T] = field(default_factory=list)


class AdmissionQueue(Generic[T]):
    """The admission rule with no event loop: the cap, the bounded priority queue, its timeout.

    One piece of code for every model of a replica: the live middleware drives it in real time
    (`AdmissionController`, with futures as items), the policy benchmark's replicas in
    fast-forwarded time (`testkit.bench.policy_sim`, with its requests as items). Time comes from
    `clock`; a waiter's timeout is the one in force when it started waiting.
    """

    def __init__(self, profile: ModeProfile, clock: Callable[[], float], engine_max_seqs: int,
                 abandoned: Callable[[T], bool] = lambda item: False) -> None:
        self.profile = profile
        self._clock = clock
        self.engine_max_seqs = engine_max_seqs  # vLLM's --max-num-seqs
        # An item whose owner left before `withdraw` could run (a future cancelled in this
        # tick): it is skipped, so a freed slot goes to the next waiter.
        self._abandoned = abandoned
        self._heap: list[Waiter[T]] = []
        self._seq = 0  # FIFO within a priority (a plain int: the policy benchmark copies pools)
        self.inflight = 0
        self.queued = 0

    def cap(self, priority: int) -> int:
        """The most slots in flight under which a request at `priority` is admitted."""
        return self.profile.admission_cap(priority == STREAM_PRIORITY, self.engine_max_seqs)

    def has_free_slot(self, priority: int, slots: int = 1) -> bool:
        head = self._head()
        return ((head is None or head.priority > priority)
                and self.inflight + slots <= self.cap(priority))

    def try_admit(self, priority: int, slots: int = 1) -> bool:
        """Take the slots now if they are free and nobody waits ahead."""
        if not self.has_free_slot(priority, slots):
            return False
        self.inflight += slots
        return True

    def is_full(self) -> bool:
        return self.queued >= self.profile.max_queue

    def wait(self, item: T, priority: int, slots: int = 1) -> Waiter[T]:
        self._seq += 1
        waiter = Waiter(priority, self._seq, item, slots, self._clock(),
                        self.profile.queue_timeout_seconds)
        heapq.heappush(self._heap, waiter)
        self.queued += 1
        return waiter

    def withdraw(self, waiter: Waiter[T]) -> None:
        """The waiter left (its own timer fired, or its client went away)."""
        if not waiter.gone:
            waiter.gone = True
            self.queued -= 1

    def release(self, slots: int = 1) -> Woken[T]:
        self.inflight -= slots
        return self.wake()

    def set_profile(self, profile: ModeProfile) -> Woken[T]:
        """A new cap applies to new admissions only; a higher one admits waiters at once."""
        self.profile = profile
        return self.wake()

    def _head(self) -> Waiter[T] | None:
        """The first live waiter; those gone or abandoned are dropped on the way."""
        while self._heap:
            waiter = self._heap[0]
            if not (waiter.gone or self._abandoned(waiter.item)):
                return waiter
            heapq.heappop(self._heap)
            self.withdraw(waiter)
        return None

    def wake(self) -> Woken[T]:
        woken: Woken[T] = Woken()
        now = self._clock()
        while (waiter := self._head()) is not None:
            # The first in line waits for all its slots: nothing behind it jumps ahead. Streams
            # stand ahead of the rest, and their cap is the higher, so a head that cannot start
            # means no waiter can.
            if self.inflight + waiter.slots > self.cap(waiter.priority):
                break
            heapq.heappop(self._heap)
            waiter.gone = True
            self.queued -= 1
            if now - waiter.since > waiter.timeout:
                woken.timed_out.append(waiter.item)
                continue
            self.inflight += waiter.slots
            woken.admitted.append(waiter.item)
        return woken

    def expire(self) -> list[T]:
        """Take out every waiter past its timeout, wherever it stands in the queue."""
        now = self._clock()
        expired = [w for w in self._heap if not w.gone and now - w.since > w.timeout]
        for waiter in expired:
            self.withdraw(waiter)
        return [w.item for w in expired]

    def waiting(self) -> list[T]:
        return [w.item for w in self._heap if not w.gone]


class BatchWindow(Generic[T]):
    """The micro-batch window: admitted requests are held until `batch_size` of them are, or
    until `batch_window_millis` after the first. Drivers arm their own timer and hand its
    `generation` back to `on_timer`, so a timer from an earlier group releases nothing."""

    def __init__(self) -> None:
        self.held: list[T] = []
        self.generation = 0
        self.timer_armed = False

    @staticmethod
    def holds(profile: ModeProfile) -> bool:
        return profile.batch_window_millis > 0 and profile.batch_size > 1

    def hold(self, item: T, profile: ModeProfile) -> tuple[list[T], float | None]:
        """The items released now, and the seconds of a timer to arm (None: arm none)."""
        if not self.holds(profile):
            return [item], None
        self.held.append(item)
        if len(self.held) >= profile.batch_size:
            return self.release(), None
        if self.timer_armed:
            return [], None
        self.timer_armed = True
        return [], profile.batch_window_millis / 1000

    def release(self) -> list[T]:
        self.timer_armed = False
        self.generation += 1
        group, self.held = self.held, []
        return group

    def on_timer(self, generation: int) -> list[T]:
        return self.release() if generation == self.generation else []

    def on_profile(self, profile: ModeProfile) -> list[T]:
        """Release a held group the new profile would not hold."""
        if profile.batch_window_millis == 0 or len(self.held) >= profile.batch_size:
            return self.release()
        return []

    def leave(self, item: T) -> None:
        if item in self.held:
            self.held.remove(item)


@dataclass
class Ticket:
    """Proof of admission; hand it back with `release` exactly once."""

    admitted_at: float
    waited_seconds: float
    released: bool = False
    slots: int = 1  # a request's sequences (its `n`): each is one engine sequence


class AdmissionController:
    """The admission rule (`AdmissionQueue`, `BatchWindow`) on the server's event loop."""

    # Weight of the newest sample in the service-time average behind Retry-After.
    _EWMA = 0.2

    def __init__(self, profile: ModeProfile, engine_max_seqs: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queue: AdmissionQueue[asyncio.Future[None]] = AdmissionQueue(
            profile, clock, engine_max_seqs, abandoned=asyncio.Future.done)
        self._window: BatchWindow[asyncio.Future[None]] = BatchWindow()
        self._window_timer: asyncio.TimerHandle | None = None
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._service_seconds = 1.0
        self.draining = False

    @property
    def profile(self) -> ModeProfile:
        return self._queue.profile

    @property
    def inflight(self) -> int:
        return self._queue.inflight

    @property
    def queued(self) -> int:
        return self._queue.queued

    def set_profile(self, profile: ModeProfile) -> None:
        self._resolve(self._window.on_profile(profile))
        self._settle(self._queue.set_profile(profile))

    def start_draining(self) -> None:
        self.draining = True

    def has_free_slot(self, priority: int, slots: int = 1) -> bool:
        return self._queue.has_free_slot(priority, slots)

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead drained at the cap's pace."""
        p = self.profile
        estimate = (self.queued + 1) * self._service_seconds / p.max_concurrency
        return max(1, min(p.queue_timeout_seconds, math.ceil(estimate)))

    async def acquire(self, priority: int = 0, slots: int = 1) -> Ticket:
        """Wait for `slots` slots (lower priority value first, FIFO within one value)."""
        if self.draining:
            raise Draining("the replica is draining; retry on another replica", retry_after=1)
        start = self._clock()
        if not self._queue.try_admit(priority, slots):
            if self._queue.is_full():
                raise QueueFull(
                    f"the wait queue is full ({self.profile.max_queue} requests)",
                    retry_after=self.retry_after(),
                )
            await self._wait_in_queue(priority, slots)
        ticket = Ticket(admitted_at=self._clock(), waited_seconds=self._clock() - start,
                        slots=slots)
        try:
            await self._hold_for_batch()
        except BaseException:
            self.release(ticket)
            raise
        return ticket

    async def _wait_in_queue(self, priority: int, slots: int) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = self._queue.wait(future, priority, slots)
        try:
            async with asyncio.timeout(waiter.timeout):
                await future
        except QueueTimeout:
            raise  # the queue found it past its timeout; already uncounted
        except BaseException as exc:
            if future.done() and not future.cancelled() and future.exception() is None:
                # The slot arrived in the same tick as the timeout or cancel: give it back.
                self._settle(self._queue.release(slots))
            else:
                future.cancel()
                self._queue.withdraw(waiter)
                self._notify_idle()
            if isinstance(exc, TimeoutError):
                raise self._timed_out(waiter.timeout) from None
            raise

    @staticmethod
    def _timed_out(timeout: float) -> QueueTimeout:
        return QueueTimeout(f"no slot became free within {timeout:g} s", retry_after=1)

    async def _hold_for_batch(self) -> None:
        if not self._window.holds(self.profile):
            return  # the default: no future, no timer on the request's path
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        released, timer_seconds = self._window.hold(future, self.profile)
        if timer_seconds is not None:
            self._window_timer = loop.call_later(
                timer_seconds, self._on_window_timer, self._window.generation
            )
        self._resolve(released)
        try:
            await future
        except BaseException:
            self._window.leave(future)
            raise

    def _on_window_timer(self, generation: int) -> None:
        self._resolve(self._window.on_timer(generation))

    def _resolve(self, futures: list[asyncio.Future[None]]) -> None:
        if not self._window.timer_armed and self._window_timer is not None:
            self._window_timer.cancel()
            self._window_timer = None
        for future in futures:
            if not future.done():
                future.set_result(None)

    def _settle(self, woken: Woken[asyncio.Future[None]]) -> None:
        for future in woken.admitted:
            future.set_result(None)
        for future in woken.timed_out:
            future.set_exception(self._timed_out(self.profile.queue_timeout_seconds))
        self._notify_idle()

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        served = self._clock() - ticket.admitted_at
        self._service_seconds += self._EWMA * (served - self._service_seconds)
        self._settle(self._queue.release(ticket.slots))

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
