"""Where the replicas are and what state each is in.

Discovery is an interface so a Kubernetes pod watch can replace the static list; the proxy only
reads `endpoints()` and reports what it learns on the data path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import aiohttp

from autoglm_api.profiles import Mode
from autoglm_router.poller import Poller

log = logging.getLogger(__name__)

_MODE_LINE = re.compile(r'^autoglm_mode\{[^}]*mode="([a-z]+)"[^}]*\}\s+(\S+)')
_DRAINING_LINE = re.compile(r"^autoglm_draining(?:\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True)
class Endpoint:
    name: str  # base URL, no trailing slash
    mode: Mode | None = None
    ready: bool = False
    draining: bool = False
    # What metrics call it: the pod's name under a pod watch (not its IP), else the URL.
    label: str = field(default="", compare=False)


class Discovery(Protocol):
    def endpoints(self) -> list[Endpoint]: ...

    def report_unreachable(self, name: str) -> None:
        """A connect error on the data path: out until the next good poll."""

    def report_draining(self, name: str) -> None:
        """A draining 503 on the data path: out at once, before the next poll says so."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def parse_runtime_metrics(text: str) -> tuple[Mode | None, bool]:
    """The active mode (`autoglm_mode{mode=...} 1`) and `autoglm_draining` from /metrics."""
    mode: Mode | None = None
    draining = False
    for line in text.splitlines():
        if not line.startswith("autoglm_"):
            continue
        found = _MODE_LINE.match(line)
        if found and _is_one(found.group(2)):
            with contextlib.suppress(ValueError):
                mode = Mode(found.group(1))
            continue
        found = _DRAINING_LINE.match(line)
        if found:
            draining = _is_one(found.group(1))
    return mode, draining


def _is_one(value: str) -> bool:
    try:
        return float(value) >= 1.0
    except ValueError:
        return False


# Called with (replica, its /metrics text; "" when it did not answer 200) on every scrape.
MetricsReader = Callable[[str, str], None]


class StaticDiscovery(Poller):
    """A fixed list of base URLs, each polled about every `interval` seconds.

    Ready means `/health` answered 200; mode and draining come from the runtime's public
    `/metrics`, so no admin token is needed. Each `/metrics` text also goes to the
    `metrics_readers` (the replicas' load and sleep), so one scrape per replica per poll serves
    all.
    """

    poll_at_start = True
    failure = "Polling the endpoints failed"

    def __init__(self, urls: list[str], interval: float = 1.0, timeout: float = 2.0) -> None:
        names = [url.rstrip("/") for url in urls]
        super().__init__(interval, timeout)
        self._state = {name: Endpoint(name) for name in names}
        self.metrics_readers: list[MetricsReader] = []
        self.polls = 0

    def endpoints(self) -> list[Endpoint]:
        return list(self._state.values())

    def report_unreachable(self, name: str) -> None:
        if name in self._state:
            self._state[name] = replace(self._state[name], ready=False)

    def report_draining(self, name: str) -> None:
        if name in self._state:
            self._state[name] = replace(self._state[name], draining=True)

    async def poll_once(self) -> None:
        names = list(self._state)
        results = await asyncio.gather(*(self._probe(name) for name in names))
        for name, endpoint in zip(names, results, strict=True):
            previous = self._state[name]
            if (previous.mode, previous.ready, previous.draining) != (
                endpoint.mode, endpoint.ready, endpoint.draining
            ):
                log.info("Endpoint %s is now mode=%s ready=%s draining=%s", name,
                         endpoint.mode, endpoint.ready, endpoint.draining)
            self._state[name] = endpoint
        self.polls += 1

    async def _probe(self, name: str) -> Endpoint:
        assert self._client is not None
        try:
            (health, _), text = await asyncio.gather(
                self._get(name + "/health"), self._metrics(name))
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("Probing %s failed: %r", name, exc)
            return Endpoint(name)
        mode, draining = parse_runtime_metrics(text)
        return Endpoint(name, mode=mode, ready=health == 200, draining=draining)

    async def _metrics(self, name: str) -> str:
        """The replica's /metrics text ("" unless 200), passed to the readers as it arrives."""
        try:
            status, body = await self._get(name + "/metrics")
        except (aiohttp.ClientError, TimeoutError):
            self._tell_readers(name, "")  # nothing known of its load now
            raise
        text = body if status == 200 else ""
        self._tell_readers(name, text)
        return text

    def _tell_readers(self, name: str, text: str) -> None:
        for read in self.metrics_readers:
            read(name, text)

    async def _get(self, url: str) -> tuple[int, str]:
        assert self._client is not None
        async with self._client.get(url) as response:
            return response.status, await response.text()
