"""The one wait every tier uses: `eventually(predicate, within)` and its async twin.

Why one: a test that waits for a state polls until it holds or a deadline passes, and every
tier did that with a loop of its own, each with its own idea of when to give up. Here there is
one, with one rule: the predicate is read once more after the deadline has passed before the
wait fails, so a read that was slow (the machine held the test still) is never taken as the
last state.

Why a scale: deadlines are sized for an ordinary machine. On a slow one (shared CI cores, an
emulated architecture) set AUTOGLM_TEST_TIME_SCALE, e.g. 3: every wait's deadline and every
test's pytest-timeout limit (tests/conftest.py) is multiplied by it, in one place, instead of
each test growing its own margins. Intervals between reads are not scaled.

Why no fixed sleep: `sleep(x)` and then asserting a state is a guess that the state arrives
within x; it fails on a slow machine and wastes x on a fast one. Wait for the state instead.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

SCALE_ENV = "AUTOGLM_TEST_TIME_SCALE"


def parse_scale(text: str | None) -> float:
    """The time scale AUTOGLM_TEST_TIME_SCALE gives: 1 when unset or empty, else a finite
    number above 0 (anything else is refused)."""
    if text is None or not text.strip():
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        raise ValueError(f"{SCALE_ENV}={text!r} is not a number (want one above 0)") from None
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{SCALE_ENV}={text!r}: the time scale must be a finite number above 0")
    return scale


TIME_SCALE = parse_scale(os.environ.get(SCALE_ENV))


def _failure(seconds: float, what: str, last: object) -> AssertionError:
    return AssertionError(f"not true within {seconds:.0f} s: {what}; last: {last!r}")


def _refuse_awaitable(value: object, what: str) -> None:
    """A coroutine is truthy: a synchronous wait given one would pass without reading."""
    if not inspect.isawaitable(value):
        return
    if inspect.iscoroutine(value):
        value.close()  # never awaited, on purpose: no RuntimeWarning
    raise TypeError(f"the predicate returned an awaitable ({type(value).__name__}), which a "
                    f"synchronous wait cannot read: use eventually_async. {what}")


def eventually(
    predicate: Callable[[], T | None],
    within: float,
    *,
    every: float = 0.1,
    what: str = "",
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `predicate` every `every` seconds until it returns something truthy, and return
    that. The deadline is `within` * TIME_SCALE seconds from now; a read that starts after it
    is the last one. An exception of a type in `ignoring` is a falsy read (the last one is in
    the failure's message); any other one fails the wait at once. A predicate that returns an
    awaitable is refused (TypeError): use `eventually_async`."""
    seconds = within * TIME_SCALE
    deadline = time.monotonic() + seconds
    while True:
        last_chance = time.monotonic() >= deadline
        try:
            last: object = predicate()
        except ignoring as err:
            last = err
        else:
            _refuse_awaitable(last, what)
            if last:
                return last  # type: ignore[return-value]
        if last_chance:
            raise _failure(seconds, what, last)
        time.sleep(every)


@overload
async def eventually_async(
    predicate: Callable[[], Awaitable[T | None]],
    within: float,
    *,
    every: float = 0.1,
    what: str = "",
    ignoring: tuple[type[BaseException], ...] = (),
) -> T: ...


@overload
async def eventually_async(
    predicate: Callable[[], T | None],
    within: float,
    *,
    every: float = 0.1,
    what: str = "",
    ignoring: tuple[type[BaseException], ...] = (),
) -> T: ...


async def eventually_async(
    predicate: Callable[[], object],
    within: float,
    *,
    every: float = 0.1,
    what: str = "",
    ignoring: tuple[type[BaseException], ...] = (),
) -> object:
    """`eventually` in a coroutine: `predicate` may return the value or an awaitable of it,
    and the wait between reads is `asyncio.sleep`, so the event loop goes on meanwhile."""
    seconds = within * TIME_SCALE
    deadline = time.monotonic() + seconds
    while True:
        last_chance = time.monotonic() >= deadline
        try:
            last = predicate()
            if inspect.isawaitable(last):
                last = await last
        except ignoring as err:
            last = err
        else:
            if last:
                return last
        if last_chance:
            raise _failure(seconds, what, last)
        await asyncio.sleep(every)
