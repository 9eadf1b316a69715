"""Other routers' requests on each replica, and whether it sleeps, read from its own gauges.

Each router counts its own in-flight requests exactly, but with two or more routers that is
only its share of each replica's work, and two routers that each balance their own share can
still stack their requests on the same replicas. Every poll reads how many requests each
replica holds (admitted and queued) and subtracts what this router had open on it at that
moment: the rest belongs to the other routers, and routing adds it to this router's own count.
It is as old as the last poll, so it evens out load that lasts longer than a poll interval.

The same scrape says whether the replica's engine sleeps (`autoglm_sleeping`, scale to zero):
this is the one place the router learns it, whichever discovery it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from autoglm_api.standby import SLEEPING_METRIC
from autoglm_router.poller import Poller

log = logging.getLogger(__name__)

# The mode middleware's admitted + queued requests when the replica has it (vLLM's own gauges
# miss requests its admission queue holds back), else vLLM's running + waiting.
HELD_GAUGES = (
    ("autoglm_requests_inflight", "autoglm_requests_queued"),
    ("vllm:num_requests_running", "vllm:num_requests_waiting"),
)
_WANTED = frozenset({SLEEPING_METRIC, *(name for pair in HELD_GAUGES for name in pair)})


@dataclass(frozen=True)
class ReplicaGauges:
    held: float | None  # requests it holds; None when it exports neither pair
    asleep: bool = False


def parse_gauges(text: str) -> ReplicaGauges:
    """What a replica's /metrics text says of its load and sleep, in one pass."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _WANTED:
            with contextlib.suppress(ValueError, IndexError):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    held = next((sum(values.get(name, 0.0) for name in pair) for pair in HELD_GAUGES
                 if pair[0] in values), None)
    return ReplicaGauges(held, values.get(SLEEPING_METRIC, 0.0) >= 1.0)


class OtherRouters(Poller):
    """The other routers' requests on each replica, and which replicas sleep, as of the last
    poll (0 and awake when unknown).

    It polls the replicas' /metrics itself only when started; a discovery that scrapes them
    anyway (StaticDiscovery) hands each text to `read` instead, so nothing is scraped twice.
    """

    failure = "Reading the replicas' load failed"

    def __init__(self, replicas: Callable[[], list[str]], own: Callable[[str], int],
                 interval: float = 1.0, timeout: float = 2.0) -> None:
        super().__init__(interval, timeout)
        self._replicas = replicas
        self._own = own
        self._held: dict[str, float] = {}
        self._asleep: set[str] = set()

    def of(self, replica: str) -> float:
        return self._held.get(replica, 0.0)

    def asleep(self, replica: str) -> bool:
        return replica in self._asleep

    def read(self, replica: str, text: str) -> None:
        """Record the other routers' share and the sleep from a /metrics text just received
        ("": unknown)."""
        # Read as the answer arrives, the nearest this router gets to the replica's moment.
        gauges = parse_gauges(text)
        held = gauges.held
        self._held[replica] = max(0.0, held - self._own(replica)) if held is not None else 0.0
        if gauges.asleep:
            self._asleep.add(replica)
        else:
            self._asleep.discard(replica)

    async def poll_once(self) -> None:
        names = self._replicas()
        await asyncio.gather(*(self._scrape(name) for name in names))
        self._held = {name: self._held.get(name, 0.0) for name in names}
        self._asleep &= set(names)

    async def _scrape(self, replica: str) -> None:
        assert self._client is not None
        try:
            async with self._client.get(replica + "/metrics") as response:
                text = await response.text() if response.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("Reading %s's load failed: %r", replica, exc)
            text = ""
        self.read(replica, text)
