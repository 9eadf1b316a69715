"""A loop that polls the replicas over one kept HTTP session, about every `interval` seconds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiohttp

log = logging.getLogger(__name__)


class Poller:
    """Calls `poll_once` from `start` to `stop`; a failed poll is logged, never the loop's end."""

    # Whether `start` waits for a first poll (discovery: no request before the pool is known).
    poll_at_start = False
    failure = "Polling the replicas failed"

    def __init__(self, interval: float, timeout: float) -> None:
        self.interval = interval
        self._timeout = timeout
        self._client: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def poll_once(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))
        if self.poll_at_start:
            await self.poll_once()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.close()

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.poll_once()
            except Exception:  # one bad poll must not end the loop
                log.exception(self.failure)
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
