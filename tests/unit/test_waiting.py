"""testkit.waiting: the one wait of every tier, on a fake clock (and once on the real one)."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import types
from collections.abc import Callable, Iterator

import pytest

from testkit import waiting
from testkit.waiting import eventually, eventually_async, parse_scale


class FakeClock:
    """monotonic() and sleep() for the waiting module: sleeping only moves the clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(waiting, "time", fake)
    monkeypatch.setattr(waiting, "asyncio", types.SimpleNamespace(sleep=fake.async_sleep))
    monkeypatch.setattr(waiting, "TIME_SCALE", 1.0)
    yield fake


def reads(*values: object, clock: FakeClock | None = None,
          slow: float = 0.0) -> tuple[Callable[[], object], list[float]]:
    """A predicate returning `values` in turn (an exception is raised), and the clock at each
    read; each read takes `slow` seconds."""
    queue, times = list(values), []

    def predicate() -> object:
        if clock is not None:
            times.append(clock.now)
            clock.now += slow
        value = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(value, BaseException):
            raise value
        return value

    return predicate, times


def test_returns_the_first_truthy_value(clock: FakeClock) -> None:
    predicate, times = reads(0, None, "", "ready", clock=clock)
    assert eventually(predicate, 10, every=1) == "ready"
    assert times == [0, 1, 2, 3]


def test_a_read_after_the_deadline_is_the_last_one(clock: FakeClock) -> None:
    predicate, times = reads(False, clock=clock)
    with pytest.raises(AssertionError):
        eventually(predicate, 1, every=0.3)
    assert times == pytest.approx([0, 0.3, 0.6, 0.9, 1.2])  # one read past the deadline, no more


def test_a_state_first_seen_after_the_deadline_passes(clock: FakeClock) -> None:
    assert eventually(lambda: clock.now >= 1, 1, every=0.3) is True


def test_a_slow_read_is_never_taken_as_the_last_state(clock: FakeClock) -> None:
    # The first read starts in time and ends 5 s after the deadline: it is read again.
    predicate, times = reads(False, "there", clock=clock, slow=6)
    assert eventually(predicate, 1, every=0.5) == "there"
    assert times == [0, 6.5]


def test_ignored_errors_are_a_falsy_read_and_the_last_is_reported(clock: FakeClock) -> None:
    predicate, _ = reads(KeyError("a"), KeyError("b"), 7, clock=clock)
    assert eventually(predicate, 5, ignoring=(KeyError,)) == 7
    predicate, _ = reads(KeyError("a"), KeyError("b"), clock=clock)
    with pytest.raises(AssertionError, match=r"last: KeyError\('b'\)"):
        eventually(predicate, 1, ignoring=(LookupError,))


def test_other_errors_fail_the_wait_at_once(clock: FakeClock) -> None:
    predicate, times = reads(ValueError("broken"), clock=clock)
    with pytest.raises(ValueError, match="broken"):
        eventually(predicate, 5, ignoring=(KeyError,))
    assert times == [0]


def test_the_failure_names_what_and_the_last_read(clock: FakeClock) -> None:
    predicate, _ = reads([], clock=clock)
    with pytest.raises(AssertionError) as failed:
        eventually(predicate, 2.4, what="the pods Ready")
    assert str(failed.value) == "not true within 2 s: the pods Ready; last: []"


def test_the_deadline_is_scaled(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "TIME_SCALE", 3.0)
    predicate, times = reads(False, clock=clock)
    with pytest.raises(AssertionError, match="not true within 6 s: x"):
        eventually(predicate, 2, every=1, what="x")
    assert times[-2:] == [5, 6]


async def test_the_async_wait_takes_sync_and_async_predicates(clock: FakeClock) -> None:
    predicate, times = reads(None, {"a": 1}, clock=clock)
    assert await eventually_async(predicate, 10, every=2) == {"a": 1}
    assert times == [0, 2]

    async def read() -> object:
        return clock.now >= 1  # true only on the read after the deadline

    assert await eventually_async(read, 1, every=0.3) is True


async def test_the_async_wait_has_the_same_contract(clock: FakeClock) -> None:
    async def read() -> int:
        clock.now += 6  # slow: ends past the deadline; read again
        raise KeyError("gone")

    with pytest.raises(AssertionError) as failed:
        await eventually_async(read, 1, every=0.5, what="a reading", ignoring=(KeyError,))
    assert str(failed.value) == "not true within 1 s: a reading; last: KeyError('gone')"
    assert clock.now == 12.5  # two reads: the one in time and the one after the deadline
    with pytest.raises(ValueError):
        await eventually_async(reads(ValueError())[0], 5, ignoring=(KeyError,))


def test_the_sync_wait_refuses_a_coroutine_at_once_and_closes_it(clock: FakeClock) -> None:
    async def ready() -> bool:
        return True

    made: list[object] = []

    def predicate() -> object:
        made.append(ready())
        return made[-1]

    with pytest.raises(TypeError, match="eventually_async") as refused:
        eventually(predicate, 5, what="the replica ready", ignoring=(TypeError,))
    assert "the replica ready" in str(refused.value)
    assert len(made) == 1 and clock.now == 0  # refused on the first read, not waited on
    coroutine = made[0]
    assert inspect.iscoroutine(coroutine)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED  # no 'never awaited'


def test_the_sync_wait_refuses_any_awaitable() -> None:
    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()
        done.set_result(True)  # truthy as an object, whatever it holds
        with pytest.raises(TypeError, match="awaitable"):
            eventually(lambda: done, 5)
    finally:
        loop.close()


def test_on_the_real_clock() -> None:
    assert eventually(lambda: 1, 0.01) == 1
    with pytest.raises(AssertionError, match="nothing"):
        eventually(lambda: 0, 0.01, every=0.002, what="nothing")


@pytest.mark.parametrize(("text", "scale"), [(None, 1.0), ("", 1.0), (" ", 1.0), ("1", 1.0),
                                             ("2.5", 2.5), ("0.5", 0.5)])
def test_the_scale_from_the_environment(text: str | None, scale: float) -> None:
    assert parse_scale(text) == scale


@pytest.mark.parametrize("text", ["0", "-1", "abc", "nan", "inf", "2s"])
def test_a_scale_that_is_no_number_above_0_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="AUTOGLM_TEST_TIME_SCALE"):
        parse_scale(text)


def test_a_bad_scale_is_refused_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOGLM_TEST_TIME_SCALE", "0")
    spec = importlib.util.spec_from_file_location("waiting_again", waiting.__file__)
    assert spec is not None and spec.loader is not None
    with pytest.raises(ValueError, match="AUTOGLM_TEST_TIME_SCALE='0'"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
