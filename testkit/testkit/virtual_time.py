"""Run asyncio code on a virtual clock: time jumps to the next timer instead of waiting for it.

Code that only sleeps (the sim's engine, its API server, closed-loop users in process) then runs
as fast as the CPU allows and in the order real time would run it, with no machine noise: the
sim-fidelity fit and the unit tests drive `testkit.sim.engine.SimEngine` this way, with
`clock=loop.time`. Sockets still work, but their waits take no virtual time.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if not ready and timeout is not None and timeout > 0:
            self.now += timeout  # nothing to do until the next timer: go there
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now


def run_virtual(coroutine: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a VirtualClockLoop."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(coroutine)


def on_virtual_clock(test: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """Run an async test with `run_virtual` instead of on pytest-asyncio's loop. Its sleeps and
    timeouts take no real time, and the clock moves only when no task can run: a sleep returns
    once all that could happen before it has, so what the test asserts next does not depend on
    the machine's speed. For code that does no real I/O; pytest still passes the test its
    fixtures (synchronous ones: an async fixture would run on another loop)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_virtual(test(*args, **kwargs))

    return run
