from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from asgi_kit import FakeEngine, MakeClient

from testkit.virtual_time import on_virtual_clock

CHAT = "/v1/chat/completions"


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "autoglm-phone-9b", "messages": [{"role": "user", "content": "hi"}], **extra}


def sample(middleware: Any, name: str, labels: dict[str, str] | None = None) -> float:
    """A sample the middleware exports; a name or label it does not export is a failure, not 0."""
    value = middleware.registry.get_sample_value(name, labels or {})
    assert value is not None, f"no sample {name}{labels or ''}"
    return value


async def test_rewrites_the_body(make_client: MakeClient, engine: FakeEngine) -> None:
    _, client = make_client()
    response = await client.post(CHAT, json=chat(enable_thinking=True, return_reasoning=False,
                                                 session_id="conv-7"))
    assert response.status_code == 200
    assert response.headers["x-autoglm-session-id"] == "conv-7"
    sent = engine.bodies[-1]
    assert sent["max_tokens"] == 512
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    assert sent["include_reasoning"] is False
    assert sent["priority"] == 1  # streaming mode, not streamed


async def test_bad_input_is_an_openai_400(make_client: MakeClient, engine: FakeEngine) -> None:
    middleware, client = make_client(max_body_bytes=2048)
    cases = [
        client.post(CHAT, content=b"{oops", headers={"content-type": "application/json"}),
        client.post(CHAT, json=chat(model="other")),
        client.post(CHAT, json=chat(max_tokens=-5)),
        client.post(CHAT, json=chat(max_tokens=10**40)),
        client.post(CHAT, json=chat(messages=[{"role": "user", "content": "x" * 4000}])),
    ]
    for response in await asyncio.gather(*cases):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        assert set(error) == {"message", "type", "param", "code"}
    assert engine.bodies == []
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "bad_request"}) == 5


async def test_prompt_over_context(make_client: MakeClient) -> None:
    _, client = make_client({"maxModelLen": 128, "defaultMaxTokens": 16})
    long = chat(messages=[{"role": "user", "content": "y" * (128 * 32 + 1)}])
    response = await client.post(CHAT, json=long)
    assert response.status_code == 400
    assert "maximum context length is 128" in response.json()["error"]["message"]


async def test_a_completion_budget_over_the_context_is_clamped_not_refused(
    make_client: MakeClient, engine: FakeEngine
) -> None:
    """The phone agent always asks max_tokens 3000; at a 2048 context the engine then gives it
    what its prompt leaves (vLLM's own clamp below the context)."""
    _, client = make_client({"maxModelLen": 2048})
    assert (await client.post(CHAT, json=chat(max_tokens=3000))).status_code == 200
    assert engine.bodies[-1]["max_tokens"] == 2048
    await client.post(CHAT, json=chat(max_completion_tokens=10**9))
    assert engine.bodies[-1]["max_completion_tokens"] == 2048
    await client.post(CHAT, json=chat(max_tokens=300))
    assert engine.bodies[-1]["max_tokens"] == 300


async def test_the_engines_context_full_answer_says_what_to_do(
    make_client: MakeClient, engine: FakeEngine
) -> None:
    vllm_says = ("This model's maximum context length is 2048 tokens. However, your prompt "
                 "contains 2100 input tokens, which exceeds this limit even without any output "
                 "tokens. Please reduce the length of the input prompt.")
    engine.answer = (400, {"error": {"message": vllm_says, "type": "BadRequestError",
                                     "param": "input_tokens", "code": 400}})
    _, client = make_client({"maxModelLen": 2048})
    response = await client.post(CHAT, json=chat(stream=True))
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(vllm_says) and "spec.maxModelLen" in message
    assert "context of 2048 tokens" in message
    assert int(response.headers["content-length"]) == len(response.content)
    engine.answer = (400, {"error": {"message": "`top_p` must be in (0, 1]", "code": 400}})
    other = await client.post(CHAT, json=chat())
    assert other.json()["error"]["message"] == "`top_p` must be in (0, 1]"


@on_virtual_clock  # the sleeps let the requests settle; the queue timeout is the clock's
async def test_queue_full_is_429_then_timeout_503(make_client: MakeClient,
                                                  engine: FakeEngine) -> None:
    profiles = {"streaming": {"maxConcurrency": 1, "maxQueue": 1, "queueTimeoutSeconds": 1}}
    middleware, client = make_client({"profiles": profiles})
    engine.release.clear()
    running = asyncio.create_task(client.post(CHAT, json=chat()))
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(client.post(CHAT, json=chat()))
    await asyncio.sleep(0.05)
    full = await client.post(CHAT, json=chat())
    assert full.status_code == 429
    assert int(full.headers["retry-after"]) >= 1
    assert (await waiting).status_code == 503  # waited past queueTimeoutSeconds
    engine.release.set()
    assert (await running).status_code == 200
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "queue_full"}) == 1
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "queue_timeout"}) == 1
    assert sample(middleware, "autoglm_requests_admitted_total") == 1
    assert sample(middleware, "autoglm_queue_wait_seconds_count") == 1


async def test_switch_mode(make_client: MakeClient, engine: FakeEngine) -> None:
    middleware, client = make_client()
    state = middleware.relayed({"op": "state"})
    assert state["mode"] == "streaming" and state["switches"] == 0
    assert set(state) >= {"mode", "since", "switches", "inflight", "queued", "draining"}
    switched = middleware.relayed({"op": "mode", "mode": "batching"})
    assert switched["mode"] == "batching" and switched["switches"] == 1
    again = middleware.relayed({"op": "mode", "mode": "batching"})
    assert again["switches"] == 1 and again["since"] == switched["since"]
    assert sample(middleware, "autoglm_mode", {"mode": "batching"}) == 1
    assert sample(middleware, "autoglm_mode", {"mode": "streaming"}) == 0
    assert sample(middleware, "autoglm_mode_switches_total") == 1
    await client.post(CHAT, json=chat(stream=True))
    assert engine.bodies[-1]["priority"] == 0  # batching: no stream preference


async def test_since_is_the_moment_of_the_switch(make_client: MakeClient) -> None:
    # Timing tools (bench/adaptive_reaction.py) read it as the switch time, to the microsecond.
    middleware, _ = make_client()
    before = datetime.now(UTC)
    switched = middleware.relayed({"op": "mode", "mode": "batching"})
    after = datetime.now(UTC)
    assert before <= datetime.fromisoformat(switched["since"].replace("Z", "+00:00")) <= after


async def test_mode_from_labels(make_client: MakeClient) -> None:
    middleware, _ = make_client(labels='autoglm.io/mode="batching"\n')
    assert middleware.relayed({"op": "state"})["mode"] == "batching"


async def test_batching_coalesces_sse(make_client: MakeClient, engine: FakeEngine) -> None:
    sent: list[bytes] = []
    middleware, _ = make_client({"initialMode": "batching"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": httpx.Request(
            "POST", "http://t", json=chat(stream=True)).read(), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))

    scope = {"type": "http", "method": "POST", "path": CHAT, "headers": [],
             "query_string": b""}
    await middleware(scope, receive, send)
    body = b"".join(sent)
    assert body.count(b"data: ") == engine.events + 1
    assert body.endswith(b"data: [DONE]\n\n")
    assert len([s for s in sent if s]) == 2  # 6 events + DONE in groups of 4


@on_virtual_clock  # each sleep returns once the requests have gone as far as they can
async def test_drain_gates_health_and_new_requests(make_client: MakeClient,
                                                   engine: FakeEngine) -> None:
    middleware, client = make_client()
    assert (await client.get("/health")).status_code == 200
    engine.release.clear()
    running = asyncio.create_task(client.post(CHAT, json=chat()))
    await asyncio.sleep(0.05)
    drained = middleware.relayed({"op": "drain"})
    assert drained["draining"] is True and drained["inflight"] == 1
    assert (await client.get("/health")).status_code == 503
    refused = await client.post(CHAT, json=chat())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.headers["connection"] == "close"  # a retry must not reuse this connection
    engine.release.set()
    assert (await running).status_code == 200
    assert await middleware.drain(1) is True


async def test_non_admitted_paths_pass_through(make_client: MakeClient) -> None:
    _, client = make_client()
    response = await client.get("/health")
    assert response.status_code == 200


@on_virtual_clock  # each sleep returns once the requests have gone as far as they can
async def test_streamed_chats_run_past_the_streaming_cap_up_to_the_engine_limit(
    make_client: MakeClient, engine: FakeEngine
) -> None:
    profiles = {"streaming": {"maxConcurrency": 1, "maxQueue": 4, "queueTimeoutSeconds": 30}}
    middleware, client = make_client({"profiles": profiles}, engine_max_num_seqs=3)
    engine.release.clear()
    chats = [asyncio.create_task(client.post(CHAT, json=chat(stream=True))) for _ in range(4)]
    await asyncio.sleep(0.05)
    assert (middleware.controller.inflight, middleware.controller.queued) == (3, 1)
    other = asyncio.create_task(client.post(CHAT, json=chat()))  # non-streamed: over its cap
    await asyncio.sleep(0.05)
    assert (middleware.controller.inflight, middleware.controller.queued) == (3, 2)
    assert [body.get("stream") for body in engine.bodies] == [True] * 3
    engine.release.set()
    answers = await asyncio.gather(*chats, other)
    assert [answer.status_code for answer in answers] == [200] * 5
    assert (middleware.controller.inflight, middleware.controller.queued) == (0, 0)


@pytest.mark.parametrize("path", ["/v1/completions"])
async def test_completions_are_admitted(make_client: MakeClient, engine: FakeEngine,
                                        path: str) -> None:
    _, client = make_client()
    response = await client.post(path, json={"prompt": "hello"})
    assert response.status_code == 200
    assert engine.bodies[-1]["max_tokens"] == 512


@on_virtual_clock  # each sleep returns once the requests have gone as far as they can
async def test_a_client_leaving_the_queue_frees_its_place(make_client: MakeClient,
                                                          engine: FakeEngine) -> None:
    profiles = {"streaming": {"maxConcurrency": 1, "maxQueue": 4, "queueTimeoutSeconds": 30}}
    middleware, _ = make_client({"profiles": profiles})
    engine.release.clear()
    body = httpx.Request("POST", "http://t", json=chat()).read()

    def call(gone: asyncio.Event) -> Any:
        first = True

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            pass

        scope = {"type": "http", "method": "POST", "path": CHAT, "headers": [],
                 "query_string": b""}
        return asyncio.create_task(middleware(scope, receive, send))

    stay, leave = asyncio.Event(), asyncio.Event()
    running = call(stay)
    await asyncio.sleep(0.05)
    queued = call(leave)
    await asyncio.sleep(0.05)
    assert middleware.controller.queued == 1
    leave.set()
    await asyncio.wait_for(queued, 1)
    assert middleware.controller.queued == 0
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "client_gone"}) == 1
    engine.release.set()
    stay.set()
    await asyncio.wait_for(running, 1)
    assert len(engine.bodies) == 1 and middleware.controller.inflight == 0


async def test_a_client_leaving_mid_body_is_neither_forwarded_nor_answered(
        make_client: MakeClient, engine: FakeEngine) -> None:
    middleware, _ = make_client()
    whole = httpx.Request("POST", "http://t", json=chat()).read()
    # The first chunk alone parses: it must not reach the engine as a shorter request.
    pending = [{"type": "http.request", "body": whole, "more_body": True},
               {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return pending.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": CHAT, "headers": [], "query_string": b""}
    await middleware(scope, receive, send)
    assert engine.bodies == [] and sent == []
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "client_gone"}) == 1
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "bad_request"}) == 0


async def test_counts_received_requests_by_traffic_class(make_client: MakeClient) -> None:
    # The operator sizes each mode for its class's demand: streamed chats vs everything else,
    # as the router classes them, counted whether admitted or turned away.
    middleware, client = make_client()
    await client.post(CHAT, json=chat(stream=True))
    await client.post(CHAT, json=chat())
    await client.post("/v1/completions", json={"prompt": "hello", "stream": True})
    await client.post(CHAT, json=chat(max_tokens=-5))  # invalid: not demand
    received = "autoglm_requests_received_total"
    assert sample(middleware, received, {"traffic_class": "streamed_chat"}) == 1
    assert sample(middleware, received, {"traffic_class": "other"}) == 2


async def test_a_declared_class_sets_the_priority_the_label_and_leaves_the_engines_body(
    make_client: MakeClient, engine: FakeEngine
) -> None:
    """Streaming mode serves interactive requests first: declared ones too, and a streamed
    chat declared `flex` (an evaluation run through the agent's client) waits its turn."""
    middleware, client = make_client()  # streaming mode
    await client.post(CHAT, json={**chat(stream=True), "service_tier": "flex"})
    flex = engine.bodies[-1]
    assert flex["priority"] == 1 and "service_tier" not in flex
    await client.post(CHAT, json=chat(), headers={"X-AutoGLM-Traffic-Class": "interactive"})
    assert engine.bodies[-1]["priority"] == 0
    await client.post(CHAT, json={**chat(stream=True), "service_tier": ["odd"]})
    assert engine.bodies[-1]["priority"] == 0 and "service_tier" not in engine.bodies[-1]
    received = "autoglm_requests_received_total"
    assert sample(middleware, received, {"traffic_class": "streamed_chat"}) == 2
    assert sample(middleware, received, {"traffic_class": "other"}) == 1
    # The Responses API takes OpenAI's tiers itself: a valid one stays, another goes.
    await client.post("/v1/responses", json={"input": "hi", "service_tier": "flex"})
    assert engine.bodies[-1]["service_tier"] == "flex"
    await client.post("/v1/responses", json={"input": "hi", "service_tier": "bulk"})
    assert "service_tier" not in engine.bodies[-1]
