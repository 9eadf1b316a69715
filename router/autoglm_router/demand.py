"""This router's demand, told to the operator as an annotation on its AutoGLMDeployment.

The operator wakes a deployment at zero when a router holds requests, and lets it sleep after
an idle window (api/autoglm_api/standby.py has the contract). A router reports under its own
key, at once when it starts holding (the wake signal) and when it holds nothing again (with how
long its last request waited), and otherwise at most once per `interval` while requests arrive
(its latest request, for the idle window). A failed patch is logged and sent again
RETRY_SECONDS later at the earliest; no request ever waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from autoglm_api.standby import RouterDemand

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
CLOSE_SECONDS = 2.0


class Patch(Protocol):
    """Writes this router's annotation value (kube.AnnotationPatch); raises on failure."""

    async def __call__(self, value: str) -> None: ...

    async def close(self) -> None: ...


class DemandBook:
    """What this router would report now, what it last reported, and when the next report is
    due (pure; `clock` is Unix time, as the annotation's)."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.time,
                 retry_seconds: float = RETRY_SECONDS) -> None:
        self.interval = interval
        self._clock = clock
        self.retry_seconds = retry_seconds
        self._last_request_at: float | None = None
        self._holding = 0
        self._held_since: float | None = None
        self._last_wait: float | None = None
        self._sent: RouterDemand | None = None
        self.sending: RouterDemand | None = None
        self._next_at = 0.0  # the earliest an update that is no wake signal may go
        self._retry_at = 0.0  # the earliest anything may go (after a failure)

    def request(self) -> None:
        self._last_request_at = self._clock()

    def holding(self, count: int, held_since: float | None) -> None:
        if self._holding and not count:
            # Released, the held requests are served from now: the operator's idle window
            # starts here, not at their arrival, however long the replicas took to start.
            self._last_request_at = self._clock()
        self._holding = count
        self._held_since = held_since if count else None

    def waited(self, seconds: float) -> None:
        self._last_wait = seconds

    def current(self) -> RouterDemand | None:
        if self._last_request_at is None:
            return None  # no request yet: nothing to report
        return RouterDemand(self._last_request_at, self._holding, self._held_since,
                            self._last_wait)

    def due_in(self) -> float | None:
        """Seconds until the next report is due (0: now); None when there is nothing new to
        report or a report is on its way."""
        current = self.current()
        if current is None or self.sending is not None or current == self._sent:
            return None
        now = self._clock()
        if self._sent is None or (current.holding > 0) != (self._sent.holding > 0):
            return max(0.0, self._retry_at - now)  # the first report, a wake or an all-clear
        return max(0.0, self._next_at - now, self._retry_at - now)

    def begin(self) -> RouterDemand:
        current = self.current()
        assert current is not None
        self.sending = current
        return current

    def done(self, ok: bool) -> None:
        now = self._clock()
        if ok:
            self._sent = self.sending
            self._next_at = now + self.interval
        else:
            self._retry_at = now + self.retry_seconds
        self.sending = None


class DemandReporter:
    """Sends the book's reports through `patch` in the background, and calls `counted` with
    each one's success."""

    def __init__(self, book: DemandBook, patch: Patch,
                 counted: Callable[[bool], None] = lambda ok: None) -> None:
        self.book = book
        self._patch = patch
        self._counted = counted
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def changed(self) -> None:
        """Something to report may have changed: send it now, or look again once it is due."""
        due = self.book.due_in()
        if due is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due > 0:
            self._timer = asyncio.get_running_loop().call_later(due, self.changed)
            return
        self._task = asyncio.ensure_future(self._send(self.book.begin()))

    async def _send(self, demand: RouterDemand) -> None:
        try:
            await self._patch(demand.encode())
            ok = True
        except Exception as exc:  # the apiserver's answer, the network, a bad token: never fatal
            log.warning("Reporting demand failed: %r; again in %g s at the earliest", exc,
                        self.book.retry_seconds)
            ok = False
        self.book.done(ok)
        self._counted(ok)
        self.changed()

    async def close(self) -> None:
        """Stop reporting. A report on its way gets CLOSE_SECONDS to arrive, and so does the
        all-clear it may lead to: a drain answers every held request before the router stops,
        and the operator must not read this router's key as holding ever after."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_SECONDS):
                while self._task is not None and not self._task.done():
                    await self._task
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._patch.close()
