"""This router's demand, as the operator reads it from the ops port (GET DEMAND_PATH).

The operator scales a deployment to zero after an idle window and wakes it when a router holds
requests (api/autoglm_api/standby.py has the contract). Only inference requests count: a
`GET /v1/models` poll, a health check or a scrape keeps no GPU awake. A held request counts
once it has waited WAKE_AFTER_SECONDS with its client still there (its ticket leaves the queue
when the client goes), so a client that connects and leaves at once wakes nothing. Requests in
flight count until their last byte: a stream longer than the idle window is never cut.

Pure but for the clock, which is monotonic: the report gives ages, never timestamps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from autoglm_api.standby import WAKE_AFTER_SECONDS, RouterReport


class DemandBook:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.inflight = 0
        self._last_activity: float | None = None
        self._last_wait: float | None = None

    def started(self) -> None:
        """An inference request goes to a replica."""
        self.inflight += 1
        self._last_activity = self._clock()

    def finished(self, held_seconds: float | None) -> None:
        """It ended (answered, cut or its client gone); `held_seconds`: how long it was held."""
        self.inflight -= 1
        self._last_activity = self._clock()
        if held_seconds:
            self._last_wait = held_seconds

    def report(self, held_since: Iterable[float]) -> RouterReport:
        """The report now, given when each request held now arrived (on the same clock)."""
        now = self._clock()
        waits = [now - since for since in held_since if now - since >= WAKE_AFTER_SECONDS]
        return RouterReport(
            holding=len(waits),
            held_for=max(waits, default=None),
            inflight=self.inflight,
            idle_for=None if self._last_activity is None else now - self._last_activity,
            last_wait=self._last_wait,
        )
