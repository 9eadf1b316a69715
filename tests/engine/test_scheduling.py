"""What vLLM's own scheduler does with what the middleware writes: the mode's priority decides
the order requests are served in; a drain on SIGTERM finishes what was admitted.

One engine of its own, with --max-num-seqs 1, so the engine runs one request at a time and the
order in which requests finish is the order in which the scheduler chose them. The middleware's
streaming cap (8) admits every request here at once, so any order comes from vLLM, not from
the middleware's queue. The drain test ends this engine's life, so it runs last.

Each test holds the engine's one slot with a long request until vLLM's own queue is seen full,
then its client leaves. On 2 shared cores, /metrics can take seconds to answer while the engine
decodes (the API server shares a core with the engine core's loop), so that request must
outlast every wait for an answer: it has a context of its own, long enough for minutes of
decode, and a client deadline longer than the waits (CI once saw the blocker cut by a 120 s
client deadline before the streams had reached vLLM's queue).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.engine import (
    CLIENT_TIMEOUT,
    MODEL,
    POLL_SECONDS,
    Engine,
    metric_samples,
    running_engine,
)
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(600)
# The architecture's whole context, 65,536 tokens: an eighth of the KV cache (524,288 tokens at
# CPU_ENV's 1 GiB).
SERIAL_CONTEXT = 65536
# The context less room for the prompt: over 4 minutes of decode at this tier's fastest (270
# tokens/s at the start, slower as the context grows), where queueing the others takes well
# under a second when the server answers. A blocker of half this length has finished on CI
# while the requests sent behind it were still on their way to vLLM's queue and a /metrics poll
# had not answered.
BLOCKER_TOKENS = SERIAL_CONTEXT - 384
QUEUE_SEEN_SECONDS = 120
DRAIN_SECONDS = 300


@pytest.fixture(scope="module")
def serial_engine(model_dir: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    # The drain test's steps after SIGTERM (seeing the drain on /metrics, the refused probe, the
    # blocker's client leaving, three streams) must fit the drain grace, which follows
    # shutdownTimeoutSeconds; at the default 30 s, /metrics answering slowly while the engine
    # decodes once used it up, and vLLM's own shutdown then cut the queued streams.
    spec = AutoGLMDeploymentSpec.model_validate({
        "maxModelLen": SERIAL_CONTEXT, "engine": {"shutdownTimeoutSeconds": DRAIN_SECONDS}})
    with running_engine(spec, model_dir, tmp_path_factory.mktemp("serial"),
                        max_num_seqs=1) as started:
        yield started


def chat_body(i: int, stream: bool, tokens: int) -> dict:
    # min_tokens holds the end of turn off, so each request costs the same known decode.
    return {"model": MODEL, "messages": [{"role": "user", "content": f"Request {i}."}],
            "stream": stream, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0}


async def finish_time(http: httpx.AsyncClient, body: dict) -> tuple[float, int, str]:
    """(when it finished, status, the stream's last line or the finish reason)."""
    if body["stream"]:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = [line async for line in response.aiter_lines() if line.strip()]
            return time.monotonic(), response.status_code, lines[-1] if lines else ""
    response = await http.post("/v1/chat/completions", json=body)
    reason = response.json()["choices"][0]["finish_reason"] if response.status_code == 200 else ""
    return time.monotonic(), response.status_code, reason


async def waiting(http: httpx.AsyncClient, count: int,
                  gauge: str = "vllm:num_requests_waiting") -> None:
    """Until vLLM's own queue (or `gauge`) holds `count` requests."""
    async def read() -> dict[str, float]:
        text = (await http.get("/metrics")).text
        return {name: samples[0][1] for name in (
            gauge, "vllm:num_requests_running", "vllm:num_requests_waiting",
            "autoglm_requests_inflight", "autoglm_requests_queued")
            if (samples := metric_samples(text, name))}

    async def reached() -> dict[str, float]:
        seen = await read()
        assert seen.get(gauge, 0) >= count, f"last seen {seen}"
        return seen

    await eventually_async(reached, QUEUE_SEEN_SECONDS, every=POLL_SECONDS,
                           what=f"{gauge} at {count}", ignoring=(AssertionError,))


async def test_streamed_requests_are_served_before_earlier_batch_work(
        serial_engine: Engine) -> None:
    async with httpx.AsyncClient(base_url=serial_engine.base_url, timeout=CLIENT_TIMEOUT) as http:
        # It holds the engine's one slot until all six are queued, however fast this machine
        # decodes (a fixed length finished first on a quiet machine); then its client leaves.
        blocker = asyncio.create_task(finish_time(http, chat_body(0, False, BLOCKER_TOKENS)))
        await waiting(http, 1, "vllm:num_requests_running")
        batch = [asyncio.create_task(finish_time(http, chat_body(i, False, 24)))
                 for i in (1, 2, 3)]
        await waiting(http, 3)  # the batch work is queued first ...
        streams = [asyncio.create_task(finish_time(http, chat_body(i, True, 24)))
                   for i in (4, 5, 6)]
        await waiting(http, 6)  # ... then the streams arrive behind it
        blocker.cancel()  # a client that leaves: vLLM aborts it and serves its queue
        served = await asyncio.gather(*batch, *streams)
    assert [status for _, status, _ in served] == [200] * 6
    batch_done = [t for t, _, _ in served[:3]]
    streams_done = [t for t, _, _ in served[3:]]
    # Streaming mode writes priority 0 on streams, 1 on the rest; vLLM serves lower first.
    assert max(streams_done) < min(batch_done), (streams_done, batch_done)


async def test_sigterm_drains_admitted_streams_and_refuses_new_ones(
        serial_engine: Engine) -> None:
    async with httpx.AsyncClient(base_url=serial_engine.base_url, timeout=CLIENT_TIMEOUT) as http:
        # A long stream holds the engine's one slot, so the other three are still queued; its
        # client leaves once the refusal is seen, and the three queued ones must then finish.
        blocker = asyncio.create_task(finish_time(http, chat_body(0, True, BLOCKER_TOKENS)))
        await waiting(http, 1, "vllm:num_requests_running")
        streams = [asyncio.create_task(finish_time(http, chat_body(i, True, 48)))
                   for i in (1, 2, 3)]
        await waiting(http, 3)  # one running, three in vLLM's queue
        serial_engine.process.send_signal(signal.SIGTERM)
        # A request sent before the drain began would queue behind the blocker: probe once the
        # launcher has told the middleware to drain.
        await waiting(http, 1, "autoglm_draining")
        refused = await http.post("/v1/chat/completions", json=chat_body(9, False, 4))
        blocker.cancel()
        results = await asyncio.gather(*streams)
        health = None
        if serial_engine.process.poll() is None:
            try:
                health = (await http.get("/health")).status_code
            except httpx.TransportError:
                health = None
    assert [(status, last) for _, status, last in results] == [(200, "data: [DONE]")] * 3
    assert refused.status_code == 503, refused.text
    assert refused.headers.get("retry-after") is not None
    assert health in (None, 503), "a draining engine fails its readiness check"
    assert serial_engine.process.wait(timeout=120) == 0
