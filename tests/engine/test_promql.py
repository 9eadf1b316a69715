"""The operator's PromQL (autoglm_operator.io.prom's table) against Debian's Prometheus scraping
the real engine: every query the adaptive pass issues finds data there, except GPU memory, which
a CPU has no NVML or DCGM for and which must then read as no data, never as a value.

The engine is the pod `POD` of namespace `NAMESPACE` by its scrape labels, as a PodMonitor
labels a serving pod; there is no router, so demand comes from the middleware's own counter
(prom.demand_query's fallback). A mode's own-class share reads only while a replica runs that
mode, so the test reads in streaming mode, then flips the engine to batching and reads again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from autoglm_operator.adaptive.signals import Availability, Reading
from autoglm_operator.io import prom
from autoglm_operator.resource.spec import PrometheusSource
from testkit.admin import set_mode_async
from testkit.engine import ADMIN_TOKEN, CLIENT_TIMEOUT, MODEL, OPENAI_TIMEOUT, POLL_SECONDS, Engine
from testkit.localprom import LocalPrometheus
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(400)
NAMESPACE, POD, DEPLOYMENT = "engine-tier", "phone-9b-streaming-5d8f7-x2x9q", "phone-9b"
# rate(...[1m]) needs two scrapes of a counter that moved; the engine answers /metrics seconds
# late while it decodes on 2 cores, so a scrape can fail and mark the series stale for a while.
SEEN_SECONDS = 150
NO_SERIES = {prom.GPU_MEMORY_PERCENT}  # no NVML or DCGM on a CPU
STREAMING_ONLY = {prom.STREAMING_OWN_SHARE}
BATCHING_ONLY = {prom.BATCHING_OWN_SHARE}


@pytest.fixture
def prometheus(engine: Engine, tmp_path: Path) -> Iterator[LocalPrometheus]:
    config = {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [{
            "job_name": "autoglm-runtime",
            "static_configs": [{"targets": [f"127.0.0.1:{engine.port}"],
                                "labels": {"namespace": NAMESPACE, "pod": POD}}],
        }],
    }  # fmt: skip
    server = LocalPrometheus(tmp_path, custom_config=config).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def traffic(engine: Engine) -> AsyncIterator[None]:
    """Streamed chats and non-streamed completions, two at a time, short, until the block ends."""
    client = AsyncOpenAI(base_url=f"{engine.base_url}/v1", api_key="EMPTY", max_retries=0,
                         timeout=OPENAI_TIMEOUT)

    async def chats() -> None:
        while True:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Tap the search box."}],
                max_tokens=8, temperature=0, stream=True)
            async for _ in stream:
                pass

    async def others() -> None:
        while True:
            await client.completions.create(model=MODEL, prompt="Tap the search box.",
                                            max_tokens=8, temperature=0)

    tasks = [asyncio.create_task(chats()), asyncio.create_task(others())]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        failed = [r for r in results if not isinstance(r, asyncio.CancelledError)]
        assert not failed, f"the traffic's requests failed: {failed}"


class Unseen(Exception):
    """A reading without a value yet for some of the wanted signals: a wait's "not yet"."""


async def values_seen(reader: prom.PrometheusReader, wanted: set[str]) -> dict[str, float]:
    """Each wanted signal's first value, reading every 2 s until all have one or time is up."""
    seen: dict[str, float] = {}
    readings: list[Reading] = []

    async def read() -> dict[str, float]:
        reading = await asyncio.to_thread(reader.read, NAMESPACE, [POD], deployment=DEPLOYMENT)
        readings.append(reading)
        for name, outcome in reading.outcomes.items():
            if name in wanted and outcome.value is not None:
                seen.setdefault(name, outcome.value)
            assert name not in NO_SERIES or outcome.failure is Availability.NO_DATA, outcome
        await asyncio.sleep(2)
        return seen

    async def all_seen() -> bool:
        found = await read()
        last = readings[-1]
        if missing := {name: last.outcomes[name].detail for name in wanted - set(found)}:
            raise Unseen(f"no data for {missing}; last: {last.message}")
        return True

    await eventually_async(all_seen, SEEN_SECONDS, every=POLL_SECONDS,
                           what="a value for each wanted signal", ignoring=(Unseen,))
    # A scrape the engine answered too late leaves a gap; the loop reads as usual around it.
    assert any(r.availability is Availability.OK for r in readings), [r.message for r in readings]
    return seen


async def test_every_operator_query_finds_data_on_the_real_engine(
    engine: Engine, prometheus: LocalPrometheus,
) -> None:
    reader = prom.PrometheusReader(PrometheusSource(url=prometheus.url))
    every = set(prom.SIGNALS) - NO_SERIES
    try:
        async with traffic(engine):
            streaming = await values_seen(reader, every - BATCHING_ONLY)
            await set_mode_async(engine.admin_url, ADMIN_TOKEN, "batching", CLIENT_TIMEOUT)
            try:
                batching = await values_seen(reader, BATCHING_ONLY)
            finally:
                await set_mode_async(engine.admin_url, ADMIN_TOKEN, "streaming",
                                     CLIENT_TIMEOUT)
    finally:
        reader.close()
    served = (prom.QPS, prom.CHAT_RATE, prom.OTHER_RATE, prom.STREAMING_COMPLETIONS,
              prom.TTFT_P95_SECONDS)
    assert all(streaming[name] > 0 for name in served), streaming
    # Half of what the engine received was its mode's own class (chats in streaming, the
    # completions in batching): a share strictly between none and all.
    for share in (streaming[prom.STREAMING_OWN_SHARE], batching[prom.BATCHING_OWN_SHARE]):
        assert 0 < share < 1, (streaming, batching)
