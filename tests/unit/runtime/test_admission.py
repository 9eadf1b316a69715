from __future__ import annotations

import asyncio

import pytest

from autoglm_api.profiles import ModeProfile
from autoglm_runtime.admission import (
    AdmissionController,
    AdmissionQueue,
    BatchWindow,
    Draining,
    QueueFull,
    QueueTimeout,
    Ticket,
)
from autoglm_runtime.requests import DEFAULT_PRIORITY, STREAM_PRIORITY
from testkit.virtual_time import on_virtual_clock

ENGINE_MAX_SEQS = 16  # the engine's --max-num-seqs


def profile(**kwargs: int) -> ModeProfile:
    values = {"max_concurrency": 2, "max_queue": 2, "queue_timeout_seconds": 5}
    values.update(kwargs)
    return ModeProfile(**values)


def controller(**kwargs: int) -> AdmissionController:
    return AdmissionController(profile(**kwargs), engine_max_seqs=ENGINE_MAX_SEQS)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_cap_then_fifo_queue() -> None:
    ctrl = controller()
    first, second = await ctrl.acquire(), await ctrl.acquire()
    order: list[str] = []

    async def wait(name: str) -> Ticket:
        ticket = await ctrl.acquire()
        order.append(name)
        return ticket

    waiters = [asyncio.create_task(wait("a")), asyncio.create_task(wait("b"))]
    await settle()
    assert (ctrl.inflight, ctrl.queued) == (2, 2)
    with pytest.raises(QueueFull) as full:
        await ctrl.acquire()
    assert full.value.status == 429 and full.value.retry_after is not None
    assert full.value.retry_after >= 1
    ctrl.release(first)
    ctrl.release(second)
    tickets = await asyncio.gather(*waiters)
    assert order == ["a", "b"]
    for ticket in tickets:
        ctrl.release(ticket)
        ctrl.release(ticket)  # twice is harmless
    assert (ctrl.inflight, ctrl.queued) == (0, 0)


async def test_lower_priority_value_goes_first() -> None:
    ctrl = controller(max_concurrency=1, max_queue=5)
    held = await ctrl.acquire()
    order: list[int] = []

    async def wait(priority: int) -> None:
        ticket = await ctrl.acquire(priority)
        order.append(priority)
        ctrl.release(ticket)

    tasks = [asyncio.create_task(wait(p)) for p in (1, 1, 0)]
    await settle()
    ctrl.release(held)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 1]


@on_virtual_clock  # the wait is timed exactly, not by a busy machine's clock
async def test_queue_timeout_is_503_and_frees_the_place() -> None:
    ctrl = controller(max_concurrency=1, queue_timeout_seconds=1)
    held = await ctrl.acquire()
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(QueueTimeout) as timeout:
        await ctrl.acquire()
    assert timeout.value.status == 503
    assert 0.9 < loop.time() - start < 2
    assert ctrl.queued == 0
    ctrl.release(held)
    assert ctrl.inflight == 0


async def test_cancelled_waiter_leaks_nothing() -> None:
    ctrl = controller(max_concurrency=1)
    held = await ctrl.acquire()
    task = asyncio.create_task(ctrl.acquire())
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ctrl.queued == 0
    ctrl.release(held)
    assert ctrl.inflight == 0
    ctrl.release(await ctrl.acquire())


async def test_a_slot_freed_in_the_tick_a_waiter_is_cancelled_goes_to_the_next() -> None:
    # A client leaves (its task cancelled) and a running request ends before the cancelled
    # task runs again: the freed slot must go to the next waiter, not to the one that left.
    ctrl = controller(max_concurrency=1, max_queue=3)
    held = await ctrl.acquire()
    leaving = asyncio.create_task(ctrl.acquire())
    staying = asyncio.create_task(ctrl.acquire())
    await settle()
    leaving.cancel()
    ctrl.release(held)
    with pytest.raises(asyncio.CancelledError):
        await leaving
    ticket = await asyncio.wait_for(staying, timeout=1)
    assert (ctrl.inflight, ctrl.queued) == (1, 0)
    ctrl.release(ticket)
    assert ctrl.inflight == 0


async def test_raising_the_cap_admits_waiters_lowering_keeps_running() -> None:
    ctrl = controller(max_concurrency=1, max_queue=4)
    held = await ctrl.acquire()
    tasks = [asyncio.create_task(ctrl.acquire()) for _ in range(3)]
    await settle()
    assert ctrl.queued == 3
    ctrl.set_profile(profile(max_concurrency=4, max_queue=4))
    tickets = await asyncio.gather(*tasks)
    assert (ctrl.inflight, ctrl.queued) == (4, 0)
    ctrl.set_profile(profile(max_concurrency=1))
    assert ctrl.inflight == 4  # nothing admitted is dropped
    for ticket in [held, *tickets]:
        ctrl.release(ticket)
    assert ctrl.inflight == 0


async def test_batch_window_releases_when_full() -> None:
    ctrl = controller(max_concurrency=8, batch_window_millis=5000, batch_size=3)
    tasks = [asyncio.create_task(ctrl.acquire()) for _ in range(2)]
    await settle()
    assert not any(t.done() for t in tasks)  # held: the group is not full
    tasks.append(asyncio.create_task(ctrl.acquire()))
    tickets = await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert len(tickets) == 3


@on_virtual_clock  # the wait is timed exactly, not by a busy machine's clock
async def test_batch_window_releases_on_time() -> None:
    ctrl = controller(max_concurrency=8, batch_window_millis=100, batch_size=4)
    loop = asyncio.get_running_loop()
    start = loop.time()
    ticket = await ctrl.acquire()
    assert 0.09 < loop.time() - start < 0.5
    ctrl.release(ticket)


async def test_switching_off_the_window_releases_the_group() -> None:
    ctrl = controller(max_concurrency=8, batch_window_millis=5000, batch_size=4)
    task = asyncio.create_task(ctrl.acquire())
    await settle()
    ctrl.set_profile(profile(max_concurrency=8))
    assert isinstance(await asyncio.wait_for(task, 1), Ticket)


@on_virtual_clock  # the waits are timed exactly, not by a busy machine's clock
async def test_draining_refuses_new_and_waits_for_admitted() -> None:
    ctrl = controller()
    ticket = await ctrl.acquire()
    ctrl.start_draining()
    with pytest.raises(Draining):
        await ctrl.acquire()
    assert await ctrl.wait_idle(0.05) is False
    asyncio.get_running_loop().call_later(0.05, ctrl.release, ticket)
    assert await ctrl.wait_idle(2) is True


async def test_a_request_of_n_sequences_takes_n_slots_and_waits_for_all_of_them() -> None:
    ctrl = controller(max_concurrency=3)
    one = await ctrl.acquire()
    pair = await ctrl.acquire(slots=2)
    assert ctrl.inflight == 3 and not ctrl.has_free_slot(DEFAULT_PRIORITY)
    ctrl.release(one)
    # One slot is free, but the next in line needs two: it waits, and nothing passes it.
    waiting = asyncio.create_task(ctrl.acquire(slots=2))
    behind = asyncio.create_task(ctrl.acquire())
    await settle()
    assert (ctrl.inflight, ctrl.queued) == (2, 2)
    ctrl.release(pair)
    await settle()
    assert waiting.done() and behind.done() and ctrl.inflight == 3
    ctrl.release(waiting.result())
    ctrl.release(behind.result())
    assert ctrl.inflight == 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_queue_admits_in_priority_order_as_slots_free_without_an_event_loop() -> None:
    clock = FakeClock()
    queue: AdmissionQueue[str] = AdmissionQueue(
        profile(max_concurrency=1, max_queue=3), clock, ENGINE_MAX_SEQS
    )
    assert queue.try_admit(DEFAULT_PRIORITY)
    assert not queue.try_admit(DEFAULT_PRIORITY)
    for name, priority in (("late", 1), ("first", 0), ("later", 1)):
        queue.wait(name, priority)
    assert queue.is_full() and (queue.inflight, queue.queued) == (1, 3)
    assert queue.release().admitted == ["first"]
    assert queue.release().admitted == ["late"]
    assert (queue.inflight, queue.queued, queue.waiting()) == (1, 1, ["later"])


def test_a_waiter_keeps_the_timeout_in_force_when_it_started_waiting() -> None:
    clock = FakeClock()
    queue: AdmissionQueue[str] = AdmissionQueue(
        profile(max_concurrency=1, queue_timeout_seconds=30), clock, ENGINE_MAX_SEQS
    )
    queue.try_admit(DEFAULT_PRIORITY)
    queue.wait("chat", 0)
    queue.set_profile(profile(max_concurrency=1, queue_timeout_seconds=60))
    clock.now = 45.0
    woken = queue.release()
    assert (woken.admitted, woken.timed_out) == ([], ["chat"])
    assert (queue.inflight, queue.queued) == (0, 0)


def test_expire_takes_out_waiters_past_their_timeout_anywhere_in_the_queue() -> None:
    clock = FakeClock()
    queue: AdmissionQueue[str] = AdmissionQueue(
        profile(max_concurrency=1, max_queue=5, queue_timeout_seconds=10), clock, ENGINE_MAX_SEQS
    )
    queue.try_admit(DEFAULT_PRIORITY)
    queue.wait("old", 1)
    clock.now = 8.0
    queue.wait("new", 0)
    withdrawn = queue.wait("gone", 0)
    queue.withdraw(withdrawn)
    queue.withdraw(withdrawn)  # twice is harmless
    clock.now = 12.0
    assert queue.expire() == ["old"]
    assert (queue.queued, queue.waiting()) == (1, ["new"])


def test_a_window_timer_from_an_earlier_group_releases_nothing() -> None:
    window: BatchWindow[str] = BatchWindow()
    held = profile(batch_window_millis=100, batch_size=3)
    assert window.hold("a", held) == ([], 0.1)
    stale = window.generation
    assert window.hold("b", held) == ([], None)
    assert window.hold("c", held) == (["a", "b", "c"], None)
    assert window.hold("d", held) == ([], 0.1)
    assert window.on_timer(stale) == []
    assert window.on_timer(window.generation) == ["d"]
    assert window.hold("e", profile()) == (["e"], None)  # no window: straight through


def streams_first_queue(clock: FakeClock, **kwargs: int) -> AdmissionQueue[str]:
    return AdmissionQueue(
        profile(max_concurrency=2, max_queue=8, prioritize_streams=True, **kwargs),
        clock, ENGINE_MAX_SEQS,
    )


def test_streams_first_caps_the_rest_and_runs_streamed_chats_up_to_the_engine_limit() -> None:
    queue = streams_first_queue(FakeClock())
    assert all(queue.try_admit(STREAM_PRIORITY) for _ in range(ENGINE_MAX_SEQS))
    assert not queue.try_admit(STREAM_PRIORITY)  # the engine is full: the chat waits
    queue.wait("chat", STREAM_PRIORITY)
    queue.wait("batch", DEFAULT_PRIORITY)
    # A freed slot goes to the waiting chat; the batch request waits for the inflight to fall
    # under the cap, whatever slots the engine has.
    assert queue.release().admitted == ["chat"]
    for _ in range(ENGINE_MAX_SEQS - 2):
        assert queue.release().admitted == []
    assert queue.release().admitted == ["batch"]
    assert (queue.inflight, queue.queued) == (2, 0)


def test_a_streamed_chat_passes_batch_work_that_waits_for_the_cap() -> None:
    queue = streams_first_queue(FakeClock())
    assert queue.try_admit(DEFAULT_PRIORITY) and queue.try_admit(DEFAULT_PRIORITY)
    assert not queue.try_admit(DEFAULT_PRIORITY)
    queue.wait("batch", DEFAULT_PRIORITY)
    assert queue.has_free_slot(STREAM_PRIORITY) and queue.try_admit(STREAM_PRIORITY)
    assert not queue.has_free_slot(DEFAULT_PRIORITY)  # nothing passes the batch request
    assert (queue.inflight, queue.queued, queue.waiting()) == (3, 1, ["batch"])


def test_without_streams_first_every_request_waits_behind_the_cap() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(
        profile(max_concurrency=2, max_queue=8), FakeClock(), ENGINE_MAX_SEQS
    )
    assert queue.try_admit(STREAM_PRIORITY) and queue.try_admit(STREAM_PRIORITY)
    assert not queue.try_admit(STREAM_PRIORITY)
    assert queue.cap(STREAM_PRIORITY) == queue.cap(DEFAULT_PRIORITY) == 2
