"""Reads each router pod's demand report: `GET http://<podIP>:9090/autoglm/v1/demand`, the
router's ops port (autoglm_api.standby has the contract).

The operator asks the routers, as it asks the runtimes for their modes, instead of the routers
writing to the Kubernetes API: the router keeps a Role of list and watch on pods alone. A
router that does not answer within READ_TIMEOUT_SECONDS keeps its last reading, which ages out
(autoglm_api.standby.activity_of); an answer that is not a report counts as no answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import aiohttp

from autoglm_api.keepalive import UPSTREAM_POOL_IDLE_SECONDS
from autoglm_api.standby import DEMAND_PATH, REPORT_LIMIT_BYTES, Reading, decode_report

log = logging.getLogger(__name__)

# One slow or lost router must not hold the reconcile loop: its reading ages instead.
READ_TIMEOUT_SECONDS = 1.0


class RouterReader:
    """One keep-alive session for one deployment's routers."""

    def __init__(self, port: int, timeout: float = READ_TIMEOUT_SECONDS) -> None:
        self.port = port
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def read(self, pods: Sequence[tuple[str, str]], max_count: int
                   ) -> dict[str, Reading]:  # fmt: skip
        """The reports of the routers that answered, by pod name; `pods` are (name, IP)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=UPSTREAM_POOL_IDLE_SECONDS))
        answers = await asyncio.gather(*(self._read_one(ip, max_count) for _, ip in pods))
        return {name: reading for (name, _), reading in zip(pods, answers, strict=True)
                if reading is not None}

    async def _read_one(self, ip: str, max_count: int) -> Reading | None:
        assert self._session is not None
        host = f"[{ip}]" if ":" in ip else ip
        try:
            # A redirect is not followed: a compromised router would send the operator's
            # GET anywhere in the cluster, and a report from another address is not its own.
            async with self._session.get(f"http://{host}:{self.port}{DEMAND_PATH}",
                                         timeout=self._timeout,
                                         allow_redirects=False) as response:
                body = await _body_within(response.content, REPORT_LIMIT_BYTES)
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("Router at %s did not report: %r", ip, exc)
            return None
        report = decode_report(body, max_count) if status == 200 else None
        if report is None:
            log.warning("Router at %s answered %s without a report; ignored", ip, status)
            return None
        return Reading(report, time.time())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _body_within(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The whole body, or `limit` + 1 bytes of it when it is longer (refused as too large):
    what arrives in a first packet is not the whole report."""
    body = bytearray()
    while len(body) <= limit and (chunk := await content.read(limit + 1 - len(body))):
        body += chunk
    return bytes(body)
