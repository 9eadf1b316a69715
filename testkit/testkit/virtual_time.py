"""Run asyncio code on a virtual clock: time jumps to the next timer instead of waiting for it.

Code that only sleeps (the sim's engine, its API server, closed-loop users in process) then runs
as fast as the CPU allows and in the order real time would run it, with no machine noise: the
sim-fidelity fit and the unit tests drive `autoglm_runtime.sim.engine.SimEngine` this way, with
`clock=loop.time`. Sockets still work, but their waits take no virtual time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
