"""A live mode flip on a real engine, and the vllm:* metrics the sim claims to export."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from autoglm_api.profiles import MODE_PATH
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.admin import set_mode_async
from testkit.engine import (
    ADMIN_TOKEN,
    CLIENT_TIMEOUT,
    MODEL,
    OPENAI_TIMEOUT,
    POLL_SECONDS,
    Engine,
    running_engine,
)
from testkit.procfs import descendants, environ
from testkit.sim.metrics import SimMetrics
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(600)
STATE_SEEN_SECONDS = 120
# The flip test's engine has a context of its own, so that what must be in flight at the flip
# stays there however slowly this machine answers the admin endpoint: on 2 shared cores a poll
# can take seconds while the engine decodes, and a request of the default context's length
# can finish first (CI saw the 2048-token holders and 128-token streams all done before one
# poll saw them in flight).
FLIP_CONTEXT = 16384
# Most of that context: minutes of decode. The test's client leaves once the flip is done.
HOLD = {"model": MODEL, "messages": [{"role": "user", "content": "Hold the slot."}],
        "max_tokens": FLIP_CONTEXT - 384, "min_tokens": FLIP_CONTEXT - 384, "temperature": 0}
# Streams long enough to be in flight at the flip, short enough to finish soon after it: about
# a minute at the 150 tokens/s a sequence gets here with 16 decoding (3,000-token streams have
# finished while the admin endpoint could not answer a poll).
STREAM_TOKENS = 8000


@pytest.fixture(scope="module")
def flip_engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    spec = AutoGLMDeploymentSpec.model_validate({"maxModelLen": FLIP_CONTEXT})
    with running_engine(spec, model_dir, tmp_path_factory.mktemp("flip")) as started:
        yield started


async def streamed_chat(client: AsyncOpenAI, i: int) -> tuple[str, str | None]:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Step {i}: tap the search box."}],
        max_tokens=128, temperature=0, stream=True)
    text, finish = "", None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


async def long_stream(client: AsyncOpenAI, i: int) -> tuple[str | None, int | None]:
    """A stream of STREAM_TOKENS tokens: (its finish reason, the tokens its usage counts)."""
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Step {i}: tap the search box."}],
        max_tokens=STREAM_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"min_tokens": STREAM_TOKENS})
    finish, tokens = None, None
    async for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return finish, tokens


async def admin_state(admin: httpx.AsyncClient, done: Callable[[dict], bool]) -> dict:
    """The admin endpoint's state once `done` holds (the wait fails with the last one read, {}
    if it never answered). A 503, the engine's API server too busy to take the relayed call
    within its bound (CI saw it while 16 sequences decoded on 2 cores), is read again, as the
    operator retries it."""
    async def read() -> dict:
        reply = await admin.get(MODE_PATH)
        state = reply.json() if reply.status_code == 200 else {}
        assert state and done(state), state
        return state

    return await eventually_async(read, STATE_SEEN_SECONDS, every=POLL_SECONDS,
                                  what="the admin state", ignoring=(AssertionError,))


async def chat(client: AsyncOpenAI, i: int) -> tuple[str, str | None]:
    answer = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Step {i}: tap the search box."}],
        max_tokens=128, temperature=0)
    return answer.choices[0].message.content or "", answer.choices[0].finish_reason


async def test_live_flip_under_load_fails_and_drops_nothing(flip_engine: Engine,
                                                            answer: dict) -> None:
    action = answer["answer"].split("</think>", 1)[1]
    client = AsyncOpenAI(base_url=f"{flip_engine.base_url}/v1", api_key="EMPTY", max_retries=0,
                         timeout=OPENAI_TIMEOUT)
    async with httpx.AsyncClient(base_url=flip_engine.admin_url, headers=flip_engine.admin(),
                                 timeout=CLIENT_TIMEOUT) as admin, \
            httpx.AsyncClient(base_url=flip_engine.base_url, timeout=CLIENT_TIMEOUT) as http:
        start = (await admin.get(MODE_PATH)).json()
        assert start["mode"] == "streaming"
        cap = start["profile"]["maxConcurrency"]
        # Non-streamed holders fill the streaming cap, streamed chats run past it (the cap
        # bounds only what streams do not fill), and the non-streamed chats after them wait.
        # Each wait below is for a state that holds until the test ends it.
        holders = [asyncio.create_task(http.post("/v1/chat/completions", json=HOLD))
                   for _ in range(cap)]
        streamed: list[asyncio.Task] = []
        queued: list[asyncio.Task] = []
        try:
            await admin_state(admin, lambda s: s["inflight"] >= cap)
            streamed = [asyncio.create_task(long_stream(client, i)) for i in range(8)]
            await admin_state(admin, lambda s: s["inflight"] >= cap + len(streamed))
            queued = [asyncio.create_task(chat(client, i)) for i in range(12)]
            state = await admin_state(admin, lambda s: s["queued"] >= len(queued))
            assert (state.get("inflight"), state.get("queued")) == (cap + len(streamed),
                                                                   len(queued)), state
            # Each PUT again after a 503 (as above), and asserted: a 200 in the mode put.
            await set_mode_async(flip_engine.admin_url, ADMIN_TOKEN, "batching", CLIENT_TIMEOUT,
                                 busy_for=STATE_SEEN_SECONDS, every=POLL_SECONDS)
            await asyncio.sleep(0.3)
            await set_mode_async(flip_engine.admin_url, ADMIN_TOKEN, "streaming", CLIENT_TIMEOUT,
                                 busy_for=STATE_SEEN_SECONDS, every=POLL_SECONDS)
            for holder in holders:
                holder.cancel()  # their clients leave; vLLM aborts them
            results = await asyncio.gather(*queued)
            streams = await asyncio.gather(*streamed)
        finally:
            for task in (*holders, *streamed, *queued):
                task.cancel()
            await asyncio.gather(*holders, *streamed, *queued, return_exceptions=True)
        end = await admin_state(admin, lambda s: s["inflight"] == 0 and s["queued"] == 0)
    assert results == [(action, "stop")] * len(queued)
    assert streams == [("length", STREAM_TOKENS)] * len(streamed)
    assert (end.get("inflight"), end.get("queued")) == (0, 0), end


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """{family: (type, label names)} for the vllm:* families in a Prometheus exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            labels = {name for s in family.samples for name in s.labels if name != "le"}
            found[family.name] = (family.type, frozenset(labels))
    return found


async def test_every_sim_metric_exists_on_the_real_engine(engine: Engine) -> None:
    client = AsyncOpenAI(base_url=f"{engine.base_url}/v1", api_key="EMPTY",
                         timeout=OPENAI_TIMEOUT)
    await streamed_chat(client, 0)  # some series appear with the first finished request
    async with httpx.AsyncClient(base_url=engine.base_url, timeout=10) as http:
        real = families((await http.get("/metrics")).text)
    sim = sim_families(SimMetrics.create(MODEL, engine.settings.max_model_len))
    assert len(sim) > 15, "the sim exports almost nothing: the check is void"
    missing = sorted(set(sim) - set(real))
    assert not missing, f"the sim exports vllm:* families the real engine does not: {missing}"
    differ = {name: (sim[name], real[name]) for name in sim if sim[name] != real[name]}
    assert not differ, f"type or labels differ (sim, real): {differ}"


def sim_families(metrics: SimMetrics) -> dict[str, tuple[str, frozenset[str]]]:
    # From the declarations: a histogram has no samples, so no labels, before its first value.
    return {c._name: (c._type, frozenset(c._labelnames))  # type: ignore[attr-defined]
            for c in metrics.registry._collector_to_names}  # type: ignore[attr-defined]


async def test_the_admin_api_is_the_launchers_and_no_engine_process_holds_the_token(
    engine: Engine,
) -> None:
    """The launcher serves the admin API and keeps its token: vLLM's API server, engine core
    and every process they start run without it in their environment."""
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT) as http:
        on_the_api_port = await http.get(engine.base_url + MODE_PATH, headers=engine.admin())
        assert on_the_api_port.status_code == 404
        assert (await http.get(engine.admin_url + MODE_PATH)).status_code == 401
        state = await http.get(engine.admin_url + MODE_PATH, headers=engine.admin())
        assert state.status_code == 200 and state.json()["mode"] == "streaming"
    tree = descendants(engine.process.pid)
    assert len(tree) >= 2, tree  # vLLM's API server and its engine core, at least
    for pid in tree:
        env = environ(pid)
        assert not {"AUTOGLM_ADMIN_TOKEN", "AUTOGLM_ADMIN_TOKEN_FILE"} & env.keys(), pid
        assert not any(ADMIN_TOKEN in value for value in env.values()), pid
    # The API server got the relay's socket, in a folder only the pod's user may enter.
    sockets = {environ(pid).get("AUTOGLM_ADMIN_SOCKET") for pid in tree} - {None}
    (socket_path,) = sockets
    assert Path(str(socket_path)).parent.stat().st_mode & 0o777 == 0o700
