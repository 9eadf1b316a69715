"""`autoglm-router` in front of two real engines: each traffic class goes to its mode's replica,
a conversation stays on the replica whose prefix cache holds it (vLLM's own
vllm:prefix_cache_hits), and while one replica drains its requests go to the other, none lost.

Which engine served a request is read from the engines' own counters
(vllm:request_success_total), one request at a time where it matters, not from the router.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from autoglm_operator.resource import spec
from testkit.admin import set_mode_async
from testkit.agent import SYSTEM_PROMPT
from testkit.engine import (
    ADMIN_TOKEN,
    CLIENT_TIMEOUT,
    MODEL,
    OPENAI_TIMEOUT,
    POLL_SECONDS,
    Engine,
    metric_samples,
    running_engine,
)
from testkit.paths import REPO
from testkit.processes import RouterProcess
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(600)
SEEN_SECONDS = 120
FINISHED = ("stop", "length")
BLOCK_TOKENS = 128  # vLLM's CPU backend caches prompts in blocks of 128 tokens by default


@pytest.fixture(scope="module")
def second_engine(model_dir: Path, default_spec: spec.AutoGLMDeploymentSpec,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with running_engine(default_spec, model_dir, tmp_path_factory.mktemp("second")) as started:
        yield started


@pytest.fixture(scope="module")
def router(engine: Engine, second_engine: Engine,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    env = {"PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("api", "runtime", "router"))}
    process = RouterProcess([engine.base_url, second_engine.base_url], "--poll-interval", "0.5",
                            env=env, log_path=tmp_path_factory.mktemp("router") / "router.log")
    process.start(timeout=60.0)
    try:
        yield process
    finally:
        process.stop()
        # The session's engine, as it was.
        asyncio.run(set_mode_async(engine.admin_url, ADMIN_TOKEN, "streaming", CLIENT_TIMEOUT))


def client_of(router: RouterProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{router.base_url}/v1", api_key="EMPTY", max_retries=0,
                       timeout=OPENAI_TIMEOUT)


async def modes_seen(router: RouterProcess, replicas: dict[str, int]) -> None:
    """Wait until the router counts `replicas` ({mode: count}) taking requests."""
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT) as http:
        async def read() -> dict[str, int]:
            return (await http.get(router.health_url)).json()["replicas"]

        async def counted() -> bool:
            seen = await read()
            assert all(seen[m] == n for m, n in replicas.items()), seen
            return True

        await eventually_async(counted, SEEN_SECONDS, every=POLL_SECONDS,
                               what=f"the router counting {replicas}", ignoring=(AssertionError,))


async def counter(engine: Engine, name: str) -> float:
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT) as http:
        text = (await http.get(f"{engine.base_url}/metrics")).text
    return sum(value for _, value in metric_samples(text, name))


async def served(engines: tuple[Engine, ...]) -> tuple[float, ...]:
    return tuple([await counter(e, "vllm:request_success_total") for e in engines])


async def chat(client: AsyncOpenAI, messages: list[dict], *, stream: bool,
               session: str | None = None) -> tuple[str, int]:
    """The answer's text and the prompt's tokens (the usage vLLM reports). The routing is under
    test, not the tiny model's answer, so a turn cut at max_tokens counts as answered."""
    headers = {"X-Session-ID": session} if session else None
    if not stream:
        done = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=64, temperature=0, extra_headers=headers)
        assert done.choices[0].finish_reason in FINISHED and done.usage is not None
        return done.choices[0].message.content or "", done.usage.prompt_tokens
    text, prompt_tokens, finish = "", 0, None
    parts = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=64, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_headers=headers)
    async for part in parts:
        for choice in part.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        if part.usage is not None:
            prompt_tokens = part.usage.prompt_tokens
    assert finish in FINISHED and prompt_tokens > 0
    return text, prompt_tokens


async def test_each_class_goes_to_the_replica_in_its_mode(
    router: RouterProcess, engine: Engine, second_engine: Engine,
) -> None:
    pair = (engine, second_engine)
    await set_mode_async(engine.admin_url, ADMIN_TOKEN, "streaming", CLIENT_TIMEOUT)
    await set_mode_async(second_engine.admin_url, ADMIN_TOKEN, "batching", CLIENT_TIMEOUT)
    await modes_seen(router, {"streaming": 1, "batching": 1})
    client = client_of(router)
    messages = [{"role": "user", "content": "Tap the search box."}]
    before = await served(pair)
    for _ in range(4):
        await chat(client, messages, stream=True)
    middle = await served(pair)
    for _ in range(4):
        await chat(client, messages, stream=False)
    after = await served(pair)
    streamed = tuple(m - b for m, b in zip(middle, before, strict=True))
    other = tuple(a - m for a, m in zip(after, middle, strict=True))
    assert streamed == (4, 0), f"streamed chats served (streaming, batching): {streamed}"
    assert other == (0, 4), f"non-streamed chats served (streaming, batching): {other}"


async def test_a_conversation_stays_where_its_prefix_is_cached(
    router: RouterProcess, engine: Engine, second_engine: Engine,
) -> None:
    pair = (engine, second_engine)
    await set_mode_async(second_engine.admin_url, ADMIN_TOKEN, "streaming", CLIENT_TIMEOUT)
    await modes_seen(router, {"streaming": 2, "batching": 0})
    client = client_of(router)
    homes: dict[str, set[int]] = {}
    hit_tokens: list[tuple[int, int]] = []  # (cached, earlier prompt) per later turn
    # Conversations until each replica holds one (the ring places them by the replicas' ports,
    # which change every run): all twelve land on one replica once in 2^11 runs.
    for session in (f"task-{n}" for n in range(12)):
        if len(homes) >= 2 and set().union(*homes.values()) == {0, 1}:
            break
        # Each conversation differs from its first block on, so no replica holds another's.
        messages = [{"role": "system", "content": f"Session {session}.\n{SYSTEM_PROMPT}"},
                    {"role": "user", "content": "Open Settings and turn Wi-Fi on."}]
        previous_prompt = 0
        for turn in range(3):
            count_before = await served(pair)
            hits_before = [await counter(e, "vllm:prefix_cache_hits_total") for e in pair]
            text, prompt_tokens = await chat(client, messages, stream=True, session=session)
            count_after = await served(pair)
            where = [i for i in (0, 1) if count_after[i] > count_before[i]]
            assert len(where) == 1, (count_before, count_after)
            homes.setdefault(session, set()).add(where[0])
            hits = await counter(pair[where[0]], "vllm:prefix_cache_hits_total")
            hit = hits - hits_before[where[0]]
            if turn:
                # The whole earlier prompt, in whole blocks, came from this replica's cache.
                assert hit >= previous_prompt - 2 * BLOCK_TOKENS, (session, turn, hit)
                hit_tokens.append((int(hit), previous_prompt))
            previous_prompt = prompt_tokens
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"** Screen Info ** step {turn + 1}"}]
    assert all(len(home) == 1 for home in homes.values()), homes
    assert set().union(*homes.values()) == {0, 1}, f"every conversation on one replica: {homes}"
    print(f"homes {homes}; later turns' cached tokens / earlier prompt: {hit_tokens}")


async def test_while_a_replica_drains_its_requests_go_to_the_other_none_lost(
    router: RouterProcess, engine: Engine, second_engine: Engine,
) -> None:
    await modes_seen(router, {"streaming": 2})
    client = client_of(router)
    results: list[str] = []
    done = asyncio.Event()

    async def user(i: int) -> None:
        messages = [{"role": "user", "content": f"Step {i}: tap the search box."}]
        while not done.is_set():
            text, _ = await chat(client, messages, stream=True)
            results.append(text)

    users = [asyncio.create_task(user(i)) for i in range(4)]
    try:
        await asyncio.sleep(3)
        before = await counter(engine, "vllm:request_success_total")
        second_engine.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = await asyncio.to_thread(second_engine.process.wait, 120)
        drained = time.monotonic() - started
        await asyncio.sleep(3)  # requests after the replica is gone
    finally:
        done.set()
        outcomes = await asyncio.gather(*users, return_exceptions=True)
    failed = [o for o in outcomes if o is not None]
    assert not failed, f"requests failed while a replica drained: {failed}"
    assert code == 0, f"the draining engine exited with {code}:\n{second_engine.tail()}"
    after = await counter(engine, "vllm:request_success_total")
    assert after > before, "nothing was served by the remaining replica"
    assert results, "no request finished"
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT) as http:
        ops = (await http.get(f"{router.ops_url}/metrics")).text
    retries = {labels["reason"]: value for labels, value
               in metric_samples(ops, "autoglm_router_retries_total")}
    print(f"drained in {drained:.1f} s; {len(results)} requests, none failed; "
          f"the router's retries: {retries}")
